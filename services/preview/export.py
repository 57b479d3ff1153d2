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

The archive is a deterministic function of its items (a dataset version's are frozen), so
it can start at any byte (`start`, a resumed download): members that end before it are
only counted, from their sizes (`add_known`: an image's byte size and, for COCO, its
width and height, read from its header), and the bytes before it are left out of the
chunks. Every tar header is written as tarfile's stream mode writes it (ustar, no owner
names), so an archive is the same bytes whichever way it was made.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
import struct
import tarfile
import tempfile
from collections import deque
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import IO, Any, Protocol

from services.preview.errors import ImageChanged, ImageNotExportable
from services.preview.images import JPEG, ImageError, inspect_image
from workshop.kit.box_values import all_finite
from workshop.kit.hashing import sha256_hex
from workshop.v1 import common_pb2, dataset_pb2, run_pb2
from workshop.v1 import publication_pb2 as pub

MIB = 1024 * 1024
CHUNK_BYTES = MIB  # ExportBucketResponse.data: up to 1 MiB
# In memory per temporary file before it spills to disk: three of them (the spool and
# COCO's two arrays) bound what an export holds besides the images read ahead.
SPOOL_BYTES = 2 * MIB
FILE_MODE = 0o644
# Item ids become file names: the coordinator's are "it_<hex>"; nothing else may reach a
# path in the archive (no "/", no "..").
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# The split of a live export's items (a version's are frozen with the version's own seed
# and fraction): the same function of the item id (`split_of`), seed 0, a fifth in val.
LIVE_SEED = 0
LIVE_VAL_FRACTION = 0.2
BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE


@dataclasses.dataclass(frozen=True)
class ImageFacts:
    """What laying out an image's members takes without its bytes."""

    size: int  # bytes
    width: int
    height: int


class FactsLog(Protocol):
    """Takes the facts of each item as it is added (a version's stored layout)."""

    def append(self, one: ImageFacts) -> None: ...


def split_of(item_id: str, seed: int, val_fraction: float) -> str:
    """ "val" when the first 13 hex digits of SHA-256("<seed>:<item id>"), as a fraction of
    16^13, are below val_fraction, else "train" (as the coordinator freezes a version)."""
    digest = hashlib.sha256(f"{seed}:{item_id}".encode()).hexdigest()
    return "val" if int(digest[:13], 16) < val_fraction * 16**13 else "train"


def exported_boxes(item: pub.ExportItem) -> Sequence[common_pb2.Box]:
    """The item's boxes an archive writes: all of them but a box holding a NaN or infinite
    value, which only rows stored before box values were refused at input can hold
    (docs/datasets.md): it can be neither drawn nor trained on, and JSON has no number for
    it. The common case, every value finite, is one check of the item's boxes."""
    if all_finite(item.boxes):
        return item.boxes
    return [box for box in item.boxes if all_finite((box,))]


def member_span(size: int) -> int:
    """Bytes a member of `size` bytes takes in the archive: its header and padded data."""
    return BLOCK + -(-size // BLOCK) * BLOCK


class DatasetArchive:
    """The tar stream and the class list; COCO and YOLO say what goes into it."""

    def __init__(
        self,
        bucket_id: str,
        classes: Sequence[str],
        *,
        version: dataset_pb2.DatasetVersion | None = None,
        start: int = 0,
    ) -> None:
        self.bucket_id = bucket_id
        self.classes = ClassList(classes)
        self.version = version
        self.items = 0
        # Where each added item's facts go, when the caller keeps the archive's layout.
        self.recording: FactsLog | None = None
        self._tar = TarStream(start)
        self._latest = 0  # newest frame time so far: the index's mtime

    @property
    def size(self) -> int:
        """Bytes of the archive so far (the whole archive once finished)."""
        return self._tar.position

    def add(self, item: pub.ExportItem, image: bytes) -> Iterator[bytes]:
        """Adds one item (checked, see `jpeg_size`); the archive's next full chunks."""
        width, height = jpeg_size(item, image)
        self._add(item, io.BytesIO(image), ImageFacts(len(image), width, height))
        return self._tar.chunks()

    def skips(self, item: pub.ExportItem, facts: ImageFacts) -> bool:
        """Whether the item's members all end before the archive's start (`add_known`
        may add it without its bytes)."""
        span = member_span(facts.size) + sum(member_span(n) for n in self._label_sizes(item))
        return self._tar.position + span <= self._tar.start

    def add_known(self, item: pub.ExportItem, facts: ImageFacts) -> None:
        """Adds an item that `skips`: its members are counted, not written."""
        self._add(item, None, facts)

    def _add(self, item: pub.ExportItem, image: IO[bytes] | None, facts: ImageFacts) -> None:
        if SAFE_NAME.fullmatch(item.item_id) is None:
            raise ValueError(f"item id {item.item_id!r} cannot be a file name")
        mtime = item.frame_time.seconds
        self._latest = max(self._latest, mtime)
        self.items += 1
        if self.recording is not None:
            self.recording.append(facts)
        self._tar.add(f"images/{item.item_id}.jpg", image, facts.size, mtime)
        self._add_labels(item, facts.width, facts.height, mtime)

    def _label_sizes(self, item: pub.ExportItem) -> list[int]:
        """Sizes of the item's members besides its image."""
        return []

    def split(self, item: pub.ExportItem) -> str:
        """The item's split: the version's, else the live default (LIVE_SEED)."""
        if self.version is not None:
            return item.split
        return split_of(item.item_id, LIVE_SEED, LIVE_VAL_FRACTION)

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

    def __init__(
        self,
        bucket_id: str,
        classes: Sequence[str],
        *,
        version: dataset_pb2.DatasetVersion | None = None,
        start: int = 0,
    ) -> None:
        super().__init__(bucket_id, classes, version=version, start=start)
        self._images = JsonArray()
        self._annotations = JsonArray()

    def _add_labels(self, item: pub.ExportItem, width: int, height: int, mtime: int) -> None:
        image_id = self.items
        entry: dict[str, Any] = {
            "id": image_id,
            "file_name": f"images/{item.item_id}.jpg",
            "width": width,
            "height": height,
            "workshop_item_id": item.item_id,
            "camera_id": item.camera_id,
            "frame_time": item.frame_time.ToJsonString(),
        }
        if self.version is not None:
            entry["workshop_split"] = item.split
        self._images.append(entry)
        for box in exported_boxes(item):
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
        info: dict[str, Any] = {
            "description": f"Workshop bucket {self.bucket_id}",
            "bucket_id": self.bucket_id,
        }
        if self.version is not None:
            version = self.version
            info = {
                "description": f"Workshop dataset version {version.name!r} of bucket "
                f"{self.bucket_id}",
                "version": version.version_id,
                "date_created": version.created_at.ToJsonString(),
                "bucket_id": self.bucket_id,
                "dataset_version_id": version.version_id,
                "dataset_version_name": version.name,
                "split": {"seed": version.seed, "val_fraction": version.val_fraction},
            }
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
    """images/<item id>.jpg and labels/<item id>.txt for each item, then the Ultralytics
    index: train.txt and val.txt (the split's image paths), data.yaml, classes.txt."""

    def __init__(
        self,
        bucket_id: str,
        classes: Sequence[str],
        *,
        version: dataset_pb2.DatasetVersion | None = None,
        start: int = 0,
    ) -> None:
        super().__init__(bucket_id, classes, version=version, start=start)
        self._lists = {"train": Lines(), "val": Lines()}

    def _labels(self, item: pub.ExportItem) -> bytes:
        return "".join(
            f"{self.classes.index(box.class_name)} {float32_text(box.x + box.w / 2)} "
            f"{float32_text(box.y + box.h / 2)} {float32_text(box.w)} {float32_text(box.h)}\n"
            for box in exported_boxes(item)
        ).encode()

    def _label_sizes(self, item: pub.ExportItem) -> list[int]:
        return [len(self._labels(item))]

    def _add_labels(self, item: pub.ExportItem, width: int, height: int, mtime: int) -> None:
        lines = self._labels(item)
        self._tar.add(f"labels/{item.item_id}.txt", io.BytesIO(lines), len(lines), mtime)
        self._lists[self.split(item)].append(f"./images/{item.item_id}.jpg\n")

    def _add_index(self, mtime: int) -> None:
        for split, lines in self._lists.items():
            self._tar.add(f"{split}.txt", lines.reader(), lines.size, mtime)
        data = self._data_yaml().encode()
        self._tar.add("data.yaml", io.BytesIO(data), len(data), mtime)
        text = "".join(f"{name}\n" for name in self.classes.names).encode()
        self._tar.add("classes.txt", io.BytesIO(text), len(text), mtime)

    def _data_yaml(self) -> str:
        """Ultralytics' dataset file: the split lists, nc, names; the split stated."""
        version = self.version
        seed = version.seed if version else LIVE_SEED
        fraction = version.val_fraction if version else LIVE_VAL_FRACTION
        if version is not None:
            title = (
                f"# Workshop dataset version {version.version_id} ({_json(version.name)}) "
                f"of bucket {self.bucket_id}.\n"
            )
        else:
            title = (
                f"# Workshop bucket {self.bucket_id} as it was when exported (not a frozen "
                "version: freeze one for a dataset that stays the same).\n"
            )
        train, val = self._lists["train"].count, self._lists["val"].count
        names = "".join(f"  {n}: {_json(name)}\n" for n, name in enumerate(self.classes.names))
        return (
            title + "# Train/val split, seeded: an item is in val when the first 13 hex digits "
            'of SHA-256("<seed>:<item id>"),\n'
            f"# as a fraction of 16^13, are below val_fraction. seed: {seed}, val_fraction: "
            f"{fraction!r}; {train} train, {val} val images.\n"
            "# No `path`: Ultralytics then takes this file's directory as the dataset root, "
            "wherever the archive is extracted.\n"
            "train: train.txt\n"
            "val: val.txt\n"
            f"nc: {len(self.classes.names)}\n"
            "names:\n" + names
        )

    def close(self) -> None:
        for lines in self._lists.values():
            lines.close()
        super().close()


FORMATS: dict[int, type[DatasetArchive]] = {
    run_pb2.DATASET_FORMAT_COCO: CocoArchive,
    run_pb2.DATASET_FORMAT_YOLO: YoloArchive,
}
SUFFIXES = {run_pb2.DATASET_FORMAT_COCO: "coco", run_pb2.DATASET_FORMAT_YOLO: "yolo"}


def dataset_archive(
    dataset_format: run_pb2.DatasetFormat.ValueType,
    bucket_id: str,
    classes: Sequence[str],
    *,
    version: dataset_pb2.DatasetVersion | None = None,
    start: int = 0,
) -> DatasetArchive:
    """The archive of `dataset_format` (COCO or YOLO), from the bucket's `classes` on; a
    version's (`version`) from byte `start` on."""
    return FORMATS[dataset_format](bucket_id, classes, version=version, start=start)


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


class _Entries:
    """Entries written one after another to a spooled temporary file, counted and sized,
    then read back from the start."""

    def __init__(self) -> None:
        self._file = _spooled()
        self.count = 0
        self.size = 0

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self.count += 1
        self.size += len(data)

    def reader(self) -> IO[bytes]:
        self._file.seek(0)
        return self._file

    def close(self) -> None:
        self._file.close()


class JsonArray(_Entries):
    """Entries of a JSON array (without its brackets) in a spooled temporary file."""

    def append(self, value: dict[str, Any]) -> None:
        self._write((("," if self.count else "") + _json(value)).encode())


class Lines(_Entries):
    """Text lines in a spooled temporary file (YOLO's train.txt and val.txt)."""

    def append(self, line: str) -> None:
        self._write(line.encode())


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


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class TarStream:
    """An uncompressed ustar archive, written member by member as tarfile's stream mode
    ("w|") writes it (header, data, padding to a block; two zero blocks and padding to a
    record at the end), its bytes from `start` on coming out in chunks. Nothing of a
    member is kept once written, so 100,000 items cost no memory."""

    def __init__(self, start: int = 0) -> None:
        self._spool = Spool()
        self.start = start
        self.position = 0  # bytes of the archive so far, the ones before `start` included

    def add(self, name: str, data: Readable | None, size: int, mtime: int) -> None:
        """Writes one regular file of `size` bytes read from `data`; None: a member that
        ends before `start`, only counted."""
        if data is None:
            if self.position + member_span(size) > self.start:
                raise ValueError(f"{name}: the bytes of a member after the start are needed")
            self.position += member_span(size)
            return
        info = tarfile.TarInfo(name)
        info.size = size
        info.mtime = mtime
        info.mode = FILE_MODE
        self._emit(info.tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape"))
        left = size
        while left:
            piece = data.read(min(left, CHUNK_BYTES))
            if not piece:
                raise ValueError(f"{name}: {left} of its {size} bytes are missing")
            self._emit(piece)
            left -= len(piece)
        self._emit(tarfile.NUL * (-size % BLOCK))

    def _emit(self, data: bytes) -> None:
        skip = self.start - self.position
        self.position += len(data)
        if skip <= 0:
            self._spool.write(data)
        elif skip < len(data):
            self._spool.write(data[skip:])

    def chunks(self) -> Iterator[bytes]:
        """The full chunks written so far (the rest waits for more)."""
        return self._spool.take(whole=False)

    def close(self) -> Iterator[bytes]:
        """Ends the archive (end-of-archive blocks, padding); every remaining chunk."""
        self._emit(tarfile.NUL * (2 * BLOCK))
        self._emit(tarfile.NUL * (-self.position % RECORD))
        return self._spool.take(whole=True)

    def discard(self) -> None:
        self._spool.close()


class Spool:
    """A first-in first-out byte store: the archive is written at its end and chunks are
    taken from its front. In memory up to SPOOL_BYTES, in a temporary file beyond."""

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

    def close(self) -> None:
        self._file.close()
