"""A bucket's dataset export: an uncompressed tar archive written in chunks (docs/review.md).

`dataset_archive(format, bucket_id, classes)` opens a `DatasetArchive`; `add(item, image)`
adds one exported item (its image and, for YOLO, its label file) and `finish()` the
index that closes the archive (COCO `annotations.json`, YOLO `classes.txt`). Each hands
back the archive's next bytes as chunks of at most CHUNK_BYTES, taken lazily, to be
consumed before the next call, so a caller streams them on as they come.

Memory stays flat at any bucket size:
- tarfile writes in stream mode ("w|") into a spool the chunks are taken from, and
  forgets each member once written (TarFile keeps a TarInfo per member otherwise);
- the COCO index has to come after the images (a tar member's size precedes its
  bytes), so its image and annotation entries are written while the images stream, to
  temporary files that stay in memory up to SPOOL_BYTES and spill to disk beyond; so
  does the spool itself while that index (or a very large image) passes through it.

Pure apart from those temporary files: the caller reads the images; `add` checks that
they are the bytes that were reviewed and JPEGs whose size the labels are scaled to.
"""

from __future__ import annotations

import io
import json
import re
import struct
import tarfile
import tempfile
from collections import deque
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import IO, Any

from services.preview.errors import ImageChanged, ImageNotExportable
from services.preview.images import JPEG, ImageError, inspect_image
from workshop.kit.hashing import sha256_hex
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import run_pb2

MIB = 1024 * 1024
CHUNK_BYTES = MIB  # ExportBucketResponse.data: up to 1 MiB
# In memory per temporary file before it spills to disk: three of them (the spool and
# COCO's two arrays) bound what an export holds besides the images read ahead.
SPOOL_BYTES = 2 * MIB
FILE_MODE = 0o644
# Item ids become file names: the coordinator's are "it_<hex>"; nothing else may reach a
# path in the archive (no "/", no "..").
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class DatasetArchive:
    """The tar stream and the class list; COCO and YOLO say what goes into it."""

    def __init__(self, bucket_id: str, classes: Sequence[str]) -> None:
        self.bucket_id = bucket_id
        self.classes = ClassList(classes)
        self.items = 0
        self._tar = TarStream()
        self._latest = 0  # newest frame time so far: the index's mtime

    def add(self, item: pub.ExportItem, image: bytes) -> Iterator[bytes]:
        """Adds one item (checked, see `jpeg_size`); the archive's next full chunks."""
        width, height = jpeg_size(item, image)
        if SAFE_NAME.fullmatch(item.item_id) is None:
            raise ValueError(f"item id {item.item_id!r} cannot be a file name")
        mtime = item.frame_time.seconds
        self._latest = max(self._latest, mtime)
        self.items += 1
        self._tar.add(f"images/{item.item_id}.jpg", io.BytesIO(image), len(image), mtime)
        self._add_labels(item, width, height, mtime)
        return self._tar.chunks()

    def finish(self) -> Iterator[bytes]:
        """Adds the index and closes the archive; every remaining chunk, the last shorter."""
        self._add_index(self._latest)
        return self._tar.close()

    def _add_labels(self, item: pub.ExportItem, width: int, height: int, mtime: int) -> None:
        raise NotImplementedError

    def _add_index(self, mtime: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Drops the temporary files (also after a failed or abandoned export)."""
        self._tar.discard()

    def __enter__(self) -> DatasetArchive:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


class CocoArchive(DatasetArchive):
    """images/<item id>.jpg for each item, then annotations.json (COCO object detection)."""

    def __init__(self, bucket_id: str, classes: Sequence[str]) -> None:
        super().__init__(bucket_id, classes)
        self._images = JsonArray()
        self._annotations = JsonArray()

    def _add_labels(self, item: pub.ExportItem, width: int, height: int, mtime: int) -> None:
        image_id = self.items
        self._images.append(
            {
                "id": image_id,
                "file_name": f"images/{item.item_id}.jpg",
                "width": width,
                "height": height,
                "workshop_item_id": item.item_id,
                "camera_id": item.camera_id,
                "frame_time": item.frame_time.ToJsonString(),
            }
        )
        for box in item.boxes:
            # Pixels, unrounded: box * size divided by the size again gives back the float32.
            bbox = [box.x * width, box.y * height, box.w * width, box.h * height]
            self._annotations.append(
                {
                    "id": self._annotations.count + 1,
                    "image_id": image_id,
                    "category_id": self.classes.index(box.class_name) + 1,
                    "bbox": bbox,
                    "area": bbox[2] * bbox[3],
                    "iscrowd": 0,
                    "score": float(float32_text(box.score)),
                }
            )

    def _add_index(self, mtime: int) -> None:
        info = {"description": f"Workshop bucket {self.bucket_id}", "bucket_id": self.bucket_id}
        categories = [{"id": n + 1, "name": name} for n, name in enumerate(self.classes.names)]
        head = f'{{"info":{_json(info)},"images":['.encode()
        middle = b'],"annotations":['
        tail = f'],"categories":{_json(categories)}}}'.encode()
        parts: list[bytes | IO[bytes]] = [
            head,
            self._images.reader(),
            middle,
            self._annotations.reader(),
            tail,
        ]
        size = len(head) + self._images.size + len(middle) + self._annotations.size + len(tail)
        self._tar.add("annotations.json", Joined(parts), size, mtime)

    def close(self) -> None:
        self._images.close()
        self._annotations.close()
        super().close()


class YoloArchive(DatasetArchive):
    """images/<item id>.jpg and labels/<item id>.txt for each item, then classes.txt."""

    def _add_labels(self, item: pub.ExportItem, width: int, height: int, mtime: int) -> None:
        lines = "".join(
            f"{self.classes.index(box.class_name)} {float32_text(box.x + box.w / 2)} "
            f"{float32_text(box.y + box.h / 2)} {float32_text(box.w)} {float32_text(box.h)}\n"
            for box in item.boxes
        ).encode()
        self._tar.add(f"labels/{item.item_id}.txt", io.BytesIO(lines), len(lines), mtime)

    def _add_index(self, mtime: int) -> None:
        text = "".join(f"{name}\n" for name in self.classes.names).encode()
        self._tar.add("classes.txt", io.BytesIO(text), len(text), mtime)


FORMATS: dict[int, type[DatasetArchive]] = {
    run_pb2.DATASET_FORMAT_COCO: CocoArchive,
    run_pb2.DATASET_FORMAT_YOLO: YoloArchive,
}
SUFFIXES = {run_pb2.DATASET_FORMAT_COCO: "coco", run_pb2.DATASET_FORMAT_YOLO: "yolo"}


def dataset_archive(
    dataset_format: run_pb2.DatasetFormat.ValueType, bucket_id: str, classes: Sequence[str]
) -> DatasetArchive:
    """The archive of `dataset_format` (COCO or YOLO), from the bucket's `classes` on."""
    return FORMATS[dataset_format](bucket_id, classes)


def jpeg_size(item: pub.ExportItem, image: bytes) -> tuple[int, int]:
    """Width and height of the item's JPEG (its SOFn header); ImageChanged when the bytes
    are not the ones recorded, ImageNotExportable when they are no complete JPEG."""
    if sha256_hex(image) != item.sha256:
        raise ImageChanged(
            item.item_id,
            f"The stored bytes of item {item.item_id} no longer match their recorded digest; "
            "the export stopped.",
        )
    try:
        info = inspect_image(image)
    except ImageError as error:
        raise ImageNotExportable(item.item_id, f"Item {item.item_id}: {error}") from None
    if info.content_type != JPEG:
        raise ImageNotExportable(
            item.item_id,
            f"Item {item.item_id} is {info.content_type}; a dataset export holds JPEGs only.",
        )
    return info.width, info.height


class ClassList:
    """Class names in index order: the bucket's sorted list, then classes met later."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        for name in names:
            self.index(name)

    def index(self, name: str) -> int:
        """The class's 0-based index, appending a class not seen before."""
        found = self._index.get(name)
        if found is None:
            found = self._index[name] = len(self.names)
            self.names.append(name)
        return found


def float32_text(value: float) -> str:
    """A short decimal that reads back as the same float32. Boxes are float32 in the
    contract: 0.1 rather than 0.10000000149011612 (9 significant digits always suffice)."""
    single = _float32(value)
    for digits in range(6, 10):
        text = f"{single:.{digits}g}"
        if _float32(float(text)) == single:
            return text
    return repr(single)  # not reached: 9 digits round-trip every float32


def _float32(value: float) -> float:
    result: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return result


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _spooled() -> IO[bytes]:
    # Closed by its owner's close(): the archive closes every one however the export ends
    # (DatasetArchive is a context manager).
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)


class JsonArray:
    """Entries of a JSON array (without its brackets) in a spooled temporary file."""

    def __init__(self) -> None:
        self._file = _spooled()
        self.count = 0
        self.size = 0

    def append(self, value: dict[str, Any]) -> None:
        text = ("," if self.count else "") + _json(value)
        data = text.encode()
        self._file.write(data)
        self.count += 1
        self.size += len(data)

    def reader(self) -> IO[bytes]:
        self._file.seek(0)
        return self._file

    def close(self) -> None:
        self._file.close()


class Joined:
    """Reads byte strings and files one after another, as one file (annotations.json)."""

    def __init__(self, parts: Sequence[bytes | IO[bytes]]) -> None:
        self._parts: deque[IO[bytes]] = deque(
            io.BytesIO(part) if isinstance(part, bytes) else part for part in parts
        )

    def read(self, size: int = -1) -> bytes:
        # tarfile's copy wants exactly `size` bytes unless the end is reached.
        out = bytearray()
        while self._parts and (size < 0 or len(out) < size):
            piece = self._parts[0].read(-1 if size < 0 else size - len(out))
            if piece:
                out += piece
            else:
                self._parts.popleft()
        return bytes(out)


class _ForgetfulTarFile(tarfile.TarFile):
    """A TarFile that keeps no TarInfo of the members it wrote (nothing reads them when
    writing a stream), so 100,000 items cost no memory once they are out."""

    members: list[tarfile.TarInfo]

    def addfile(self, tarinfo: tarfile.TarInfo, fileobj: Any = None) -> None:
        super().addfile(tarinfo, fileobj)
        self.members.clear()


class TarStream:
    """An uncompressed ustar archive written in stream mode; its bytes come out in chunks."""

    def __init__(self) -> None:
        self._spool = Spool()
        self._tar = _ForgetfulTarFile.open(
            fileobj=self._spool, mode="w|", format=tarfile.USTAR_FORMAT
        )

    def add(self, name: str, data: Any, size: int, mtime: int) -> None:
        """Writes one regular file of `size` bytes read from `data`."""
        info = tarfile.TarInfo(name)
        info.size = size
        info.mtime = mtime
        info.mode = FILE_MODE
        self._tar.addfile(info, data)

    def chunks(self) -> Iterator[bytes]:
        """The full chunks written so far (the rest waits for more)."""
        return self._spool.take(whole=False)

    def close(self) -> Iterator[bytes]:
        """Ends the archive (end-of-archive blocks, padding); every remaining chunk."""
        self._tar.close()
        return self._spool.take(whole=True)

    def discard(self) -> None:
        self._spool.close()


class Spool:
    """A first-in first-out byte store: tarfile writes at its end and chunks are taken
    from its front. In memory up to SPOOL_BYTES, in a temporary file beyond."""

    def __init__(self) -> None:
        self._file = _spooled()
        self._start = 0  # first byte not taken yet
        self._end = 0

    def write(self, data: bytes) -> int:
        self._file.seek(self._end)
        self._file.write(data)
        self._end += len(data)
        return len(data)

    def take(self, *, whole: bool) -> Iterator[bytes]:
        """Chunks of CHUNK_BYTES while there are that many (`whole`: and the rest)."""
        while self._end - self._start >= CHUNK_BYTES or (whole and self._end > self._start):
            self._file.seek(self._start)
            chunk = self._file.read(min(CHUNK_BYTES, self._end - self._start))
            self._start += len(chunk)
            yield chunk
        if self._start:
            self._compact()

    def _compact(self) -> None:
        # Once chunks were taken, what is left (under a chunk) moves to a fresh file, so
        # the store never grows past one member and one chunk, and is back in memory
        # after a member that spilled it to disk.
        self._file.seek(self._start)
        rest = self._file.read(self._end - self._start)
        self._file.close()
        self._file = _spooled()
        self._file.write(rest)
        self._start, self._end = 0, len(rest)

    # The rest of the file protocol tarfile asks of its fileobj; a stream only writes.
    def read(self, size: int = -1) -> bytes:
        raise io.UnsupportedOperation("the spool is written by tarfile, not read")

    def tell(self) -> int:
        return self._end

    def seek(self, position: int) -> int:
        raise io.UnsupportedOperation("the spool is written in order")

    def close(self) -> None:
        self._file.close()
