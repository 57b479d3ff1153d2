"""The export archive of the preview service (pure: services/preview/export.py).

The stack-level behaviour (paging, reads, who sees what) is in test_dataset_export.py;
this covers what the real stack cannot easily produce: a class that appears after the
first page, images that are not JPEGs, and an index larger than what stays in memory.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.preview import export
from services.preview.errors import ImageChanged, ImageNotExportable
from services.preview.export import CHUNK_BYTES, dataset_archive, float32_text
from testbed.harness.preview import jpeg_bytes, png_bytes
from workshop.kit.hashing import sha256_hex
from workshop.v1 import common_pb2, dataset_pb2, run_pb2
from workshop.v1 import publication_pb2 as pub

IMAGE = jpeg_bytes(64, 48, seed=7)


def item(n: int, *classes: str, image: bytes = IMAGE) -> pub.ExportItem:
    return pub.ExportItem(
        item_id=f"it_{n:06d}",
        object_key=f"uploads/{n}.jpg",
        sha256=sha256_hex(image),
        camera_id="cam-a",
        boxes=[
            common_pb2.Box(class_name=name, score=0.5, x=0.1, y=0.2, w=0.3, h=0.4)
            for name in classes
        ],
    )


def write(
    dataset_format: run_pb2.DatasetFormat.ValueType,
    classes: list[str],
    items: list[pub.ExportItem],
) -> tuple[list[bytes], dict[str, bytes]]:
    """The archive's chunks and its files by name."""
    chunks: list[bytes] = []
    with dataset_archive(dataset_format, "yard", classes) as archive:
        for one in items:
            chunks.extend(archive.add(one, IMAGE))
        chunks.extend(archive.finish())
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:") as tar:
        files = {}
        for member in tar:
            extracted = tar.extractfile(member)
            assert extracted is not None
            files[member.name] = extracted.read()
    return chunks, files


def test_a_class_met_after_the_first_page_is_appended() -> None:
    items = [item(1, "person"), item(2, "dog", "person"), item(3, "cat")]
    _, coco = write(run_pb2.DATASET_FORMAT_COCO, ["person", "vehicle"], items)
    index = json.loads(coco["annotations.json"])
    names = {cat["id"]: cat["name"] for cat in index["categories"]}
    assert names == {1: "person", 2: "vehicle", 3: "dog", 4: "cat"}
    assert [names[ann["category_id"]] for ann in index["annotations"]] == [
        "person",
        "dog",
        "person",
        "cat",
    ]
    _, yolo = write(run_pb2.DATASET_FORMAT_YOLO, ["person", "vehicle"], items)
    assert yolo["classes.txt"] == b"person\nvehicle\ndog\ncat\n"
    assert yolo["labels/it_000002.txt"].split(b"\n")[0].startswith(b"2 ")


def test_only_the_recorded_jpeg_is_exported() -> None:
    with dataset_archive(run_pb2.DATASET_FORMAT_COCO, "yard", []) as archive:
        with pytest.raises(ImageChanged, match="no longer match"):
            archive.add(item(1), IMAGE + b"\0")
        png = png_bytes()
        with pytest.raises(ImageNotExportable, match="JPEGs only"):
            archive.add(item(2, image=png), png)
        cut = IMAGE[:-2]
        with pytest.raises(ImageNotExportable, match="EOI"):
            archive.add(item(3, image=cut), cut)
        odd = item(4)
        odd.item_id = "../escape"
        with pytest.raises(ValueError, match="file name"):
            archive.add(odd, IMAGE)


def test_an_index_larger_than_memory_spills_and_chunks_stay_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With temporary files kept in memory up to 64 KiB only, annotations.json (about
    450 KiB) and the spool it passes through spill to disk; the archive is unchanged:
    every chunk but the last is exactly CHUNK_BYTES, and the index reads back whole."""
    monkeypatch.setattr(export, "SPOOL_BYTES", 64 * 1024)
    items = [item(n, "person", "vehicle", "person", "dog") for n in range(800)]
    chunks, files = write(run_pb2.DATASET_FORMAT_COCO, ["person"], items)
    assert len(files["annotations.json"]) > 400_000
    assert all(len(chunk) == CHUNK_BYTES for chunk in chunks[:-1])
    assert 0 < len(chunks[-1]) <= CHUNK_BYTES
    index = json.loads(files["annotations.json"])
    assert len(index["images"]) == 800
    assert len(index["annotations"]) == 3200
    assert [image["id"] for image in index["images"]] == list(range(1, 801))
    assert files["images/it_000799.jpg"] == IMAGE


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_float32_text_reads_back_as_the_same_float32(value: float) -> None:
    text = float32_text(value)
    assert struct.pack("<f", float(text)) == struct.pack("<f", value)
    assert len(text.lstrip("-").replace(".", "").split("e")[0].lstrip("0")) <= 9


def test_float32_text_is_short_for_the_usual_values() -> None:
    assert [float32_text(v) for v in (0.1, 0.25, 0.30000001192092896, 1.0, 0.0)] == [
        "0.1",
        "0.25",
        "0.3",
        "1",
        "0",
    ]


def _tarfile_bytes(members: list[tuple[str, bytes, int]]) -> bytes:
    """The archive as tarfile's stream mode writes it (the writer export.py matches)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
        for name, data, mtime in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@given(
    st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 2**31)), min_size=0, max_size=6),
    st.data(),
)
def test_the_tar_stream_is_tarfiles_bytes_from_any_start(
    sizes: list[tuple[int, int]], data: st.DataObject
) -> None:
    """Byte for byte what tarfile writes, and from any start the same bytes' tail, the
    members before the start only counted (no data)."""
    members = [
        (f"m/{n}.bin", bytes([n % 251]) * size, mtime) for n, (size, mtime) in enumerate(sizes)
    ]
    whole = _tarfile_bytes(members)
    start = data.draw(st.integers(0, len(whole) - 1))
    stream = export.TarStream(start)
    chunks: list[bytes] = []
    for name, body, mtime in members:
        skipped = stream.position + export.member_span(len(body)) <= start
        stream.add(name, None if skipped else io.BytesIO(body), len(body), mtime)
        chunks.extend(stream.chunks())
    chunks.extend(stream.close())
    stream.discard()
    assert stream.position == len(whole)
    assert b"".join(chunks) == whole[start:]


def test_a_versions_yolo_index_states_the_split() -> None:
    version = dataset_pb2.DatasetVersion(
        version_id="dv_" + "a" * 64, name="night", seed=7, val_fraction=0.5, classes=["car"]
    )
    chunks: list[bytes] = []
    items = [item(n, "car") for n in range(20)]
    for one in items:
        one.split = export.split_of(one.item_id, 7, 0.5)
    with dataset_archive(run_pb2.DATASET_FORMAT_YOLO, "yard", ["car"], version=version) as archive:
        for one in items:
            chunks.extend(archive.add(one, IMAGE))
        chunks.extend(archive.finish())
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    text = files["data.yaml"].decode()
    assert "seed: 7, val_fraction: 0.5" in text
    val = files["val.txt"].decode().splitlines()
    assert sorted(val) == sorted(
        f"./images/{one.item_id}.jpg" for one in items if one.split == "val"
    )
    assert 0 < len(val) < 20
