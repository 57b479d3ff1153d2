"""ExportBucket on the real stack: a coordinator on Postgres, the preview service on SeaweedFS.

A full run (testbed/review_world.py) saves real JPEGs, staged through the preview
service's StageUpload so their bytes are in object storage, with chosen boxes; some
sightings are confirmed, relabelled or rejected, some left pending. The archives are
read back with tarfile, and COCO's annotations.json with pycocotools, the reference
reader: every box must round-trip to its float32, every image be the uploaded bytes.
"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest
from pycocotools.coco import COCO

from services.coordinator.identity.auth import Grant, ScopeName
from services.preview import exporting
from testbed.coordinator_leases import Setup
from testbed.coordinator_world import error_reason
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness, jpeg_bytes, png_bytes
from testbed.review_world import Frame, box, commit_images, review_world, start_run
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2, run_pb2
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import workshop_pb2 as ws

COCO_FORMAT = run_pb2.DATASET_FORMAT_COCO
YOLO_FORMAT = run_pb2.DATASET_FORMAT_YOLO
PENDING, ACCEPTED = common_pb2.REVIEW_STATE_PENDING, common_pb2.REVIEW_STATE_ACCEPTED
CONFIRM, NONE, RELABEL = (
    ws.REVIEW_DECISION_CONFIRM,
    ws.REVIEW_DECISION_NONE,
    ws.REVIEW_DECISION_RELABEL,
)
CHUNK_LIMIT = 1024 * 1024
BIG = 700_000  # two such images make the archive span several chunks

Decision = tuple[ws.ReviewDecision.ValueType, str] | None  # None: left pending
Metadata = tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Shot:
    """One saved frame: where, what it shows, how big, and the decision on each box (one
    decision for a frame without boxes: its sighting of box-less items)."""

    camera: str
    slot: int
    step: str  # "save": bucket yard, "keep": bucket lot
    boxes: tuple[common_pb2.Box, ...]
    decisions: tuple[Decision, ...]
    width: int
    height: int
    size: int = 0

    @property
    def bucket(self) -> str:
        return "yard" if self.step == "save" else "lot"

    @property
    def state(self) -> common_pb2.ReviewState.ValueType:
        if any(decision is None for decision in self.decisions):
            return PENDING
        if all(decision[0] == NONE for decision in self.decisions if decision is not None):
            return common_pb2.REVIEW_STATE_REJECTED
        return ACCEPTED

    def kept(self) -> list[tuple[str, common_pb2.Box]]:
        """The boxes an export must hold, with their class after review."""
        if not self.boxes:
            return []
        found = []
        for shown, decision in zip(self.boxes, self.decisions, strict=True):
            if decision is None:  # pending: as detected
                found.append((shown.class_name, shown))
            elif decision[0] != NONE:
                found.append((decision[1] or shown.class_name, shown))
        return found

    def image(self) -> bytes:
        return jpeg_bytes(
            self.width, self.height, size=self.size, seed=self.slot + len(self.camera)
        )


SHOTS = (
    Shot(
        "cam-a",
        0,
        "save",
        (
            box("person", 0.1234567, 0.2345678, 0.0987654, 0.3456789),
            box("vehicle", 0.61, 0.55, 0.2),
        ),
        ((CONFIRM, ""), (RELABEL, "truck")),
        96,
        54,
        BIG,
    ),
    Shot(
        "cam-a",
        10,
        "save",
        (box("person", 0.05, 0.1, 0.1, 0.2), box("person", 0.7, 0.6, 0.1, 0.2)),
        ((CONFIRM, ""), (NONE, "")),
        80,
        60,
    ),
    Shot("cam-a", 20, "save", (box("person", 0.3, 0.3, 0.1),), ((NONE, ""),), 64, 48),
    Shot("cam-a", 30, "save", (box("person", 0.4, 0.4, 0.1),), (None,), 48, 64),
    Shot("cam-a", 40, "keep", (), ((CONFIRM, ""),), 64, 48),
    Shot("cam-a", 50, "keep", (box("vehicle", 0.2, 0.3, 0.3, 0.3),), ((CONFIRM, ""),), 64, 48),
    Shot("cam-b", 5, "save", (box("person", 0.2, 0.2, 0.2, 0.2),), ((CONFIRM, ""),), 120, 90, BIG),
    Shot(
        "cam-b", 15, "save", (box("person", 0.5, 0.5, 0.3, 0.25),), ((RELABEL, "worker"),), 64, 48
    ),
)


@dataclasses.dataclass
class World:
    c: CoordinatorHarness
    p: PreviewHarness
    s: Setup
    shots: dict[str, Shot]  # by item id

    def items(self, bucket: str, *states: common_pb2.ReviewState.ValueType) -> dict[str, Shot]:
        wanted = states or (ACCEPTED,)
        return {
            item: shot
            for item, shot in self.shots.items()
            if shot.bucket == bucket and shot.state in wanted
        }


@pytest.fixture(name="world")
async def world_fixture(coordinator: CoordinatorHarness, preview: PreviewHarness) -> World:
    c, p = coordinator, preview
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    for camera in ("cam-a", "cam-b"):
        job = _first_job(jobs, camera)
        taken = [shot for shot in SHOTS if shot.camera == camera]
        frames = [Frame(shot.slot, shot.step, shot.boxes) for shot in taken]
        images = {shot.slot: shot.image() for shot in taken}
        await commit_images(c, s, p.stub, job, frames, images)
    review = await c.workshop.GetReview(ws.GetReviewRequest(run_id="r1"), metadata=c.admin)
    assert not review.has_more
    by_place = {(shot.camera, shot.slot): shot for shot in SHOTS}
    shots: dict[str, Shot] = {}
    for entry in review.items:
        shot = by_place[entry.item.camera_id, entry.item.slot_index]
        shots[entry.item.item_id] = shot
        assert len(entry.sighting_ids) == len(shot.decisions)
        for sighting, decision in zip(entry.sighting_ids, shot.decisions, strict=True):
            if decision is not None:
                await c.workshop.DecideSighting(
                    ws.DecideSightingRequest(
                        run_id="r1",
                        sighting_id=sighting,
                        decision=decision[0],
                        class_name=decision[1],
                    ),
                    metadata=c.admin,
                )
    assert len(shots) == len(SHOTS)
    return World(c, p, s, shots)


def _first_job(jobs: Sequence[jobs_pb2.ClaimedJob], camera: str) -> jobs_pb2.ClaimedJob:
    """The job of the camera's first recording (slots from 08:00)."""
    return min(
        (job for job in jobs if job.input.recording.camera_id == camera),
        key=lambda job: job.input.recording.start.seconds,
    )


@dataclasses.dataclass
class Archive:
    responses: list[pb.ExportBucketResponse]
    names: list[str]  # members in archive order
    files: dict[str, bytes]


async def export(
    p: PreviewHarness,
    metadata: Metadata,
    bucket: str = "yard",
    dataset_format: run_pb2.DatasetFormat.ValueType = COCO_FORMAT,
    states: Sequence[common_pb2.ReviewState.ValueType] = (),
    camera: str = "",
) -> Archive:
    request = pb.ExportBucketRequest(
        bucket_id=bucket,
        format=dataset_format,
        filter=run_pb2.BucketItemFilter(review_states=states, camera_id=camera),
    )
    responses = [response async for response in p.stub.ExportBucket(request, metadata=metadata)]
    data = b"".join(response.data for response in responses)
    names: list[str] = []
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            assert member.isfile()
            names.append(member.name)
            extracted = tar.extractfile(member)
            assert extracted is not None
            files[member.name] = extracted.read()
    return Archive(responses, names, files)


async def refusal(
    p: PreviewHarness, request: pb.ExportBucketRequest, metadata: Metadata
) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in p.stub.ExportBucket(request, metadata=metadata):
            pass
    return error_reason(caught.value)


def f32(value: float) -> np.float32:
    return np.float32(value)


def check_stream(archive: Archive, file_name: str, items: int) -> None:
    """The chunking contract: name first, count last, no chunk over 1 MiB."""
    first, last = archive.responses[0], archive.responses[-1]
    assert first.file_name == file_name
    assert all(not response.file_name for response in archive.responses[1:])
    assert last.last
    assert last.items == items
    assert all(not response.last for response in archive.responses[:-1])
    assert all(len(response.data) <= CHUNK_LIMIT for response in archive.responses)


def check_coco(world: World, archive: Archive, expected: dict[str, Shot], tmp_path: Path) -> None:
    names = [f"images/{item}.jpg" for item in expected]
    assert sorted(archive.names[:-1]) == sorted(names)
    assert archive.names[-1] == "annotations.json"
    path = tmp_path / "annotations.json"
    path.write_bytes(archive.files["annotations.json"])
    coco = COCO(str(path))
    categories = {cat["id"]: cat["name"] for cat in coco.loadCats(coco.getCatIds())}
    assert sorted(categories) == list(range(1, len(categories) + 1))
    images = coco.loadImgs(coco.getImgIds())
    assert sorted(image["id"] for image in images) == list(range(1, len(expected) + 1))
    assert {image["workshop_item_id"] for image in images} == set(expected)
    for image in images:
        item = image["workshop_item_id"]
        shot = expected[item]
        assert image["file_name"] == f"images/{item}.jpg"
        assert archive.files[image["file_name"]] == shot.image()  # byte-identical
        assert (image["width"], image["height"]) == (shot.width, shot.height)
        assert image["camera_id"] == shot.camera
        assert image["frame_time"].endswith("Z")
        found = []
        for ann in coco.loadAnns(coco.getAnnIds(imgIds=[image["id"]])):
            x, y, w, h = ann["bbox"]
            assert ann["area"] == w * h
            assert ann["iscrowd"] == 0
            assert ann["score"] == pytest.approx(0.9)
            width, height = image["width"], image["height"]
            found.append(
                (
                    categories[ann["category_id"]],
                    f32(x / width),
                    f32(y / height),
                    f32(w / width),
                    f32(h / height),
                )
            )
        wanted = [
            (name, f32(shown.x), f32(shown.y), f32(shown.w), f32(shown.h))
            for name, shown in shot.kept()
        ]
        assert sorted(found) == sorted(wanted)
    # every annotation's id is unique and 1-based, as COCO tools expect
    ann_ids = sorted(coco.getAnnIds())
    assert ann_ids == list(range(1, len(ann_ids) + 1))


async def test_a_coco_export_round_trips_every_box_and_image(world: World, tmp_path: Path) -> None:
    before = await world.p.keys()
    archive = await export(world.p, world.c.admin)
    expected = world.items("yard")
    assert {shot.slot for shot in expected.values()} == {0, 10, 5, 15}  # no rejected, no pending
    check_stream(archive, "yard-coco.tar", len(expected))
    assert len(archive.responses) >= 2  # two large images: more than one chunk
    check_coco(world, archive, expected, tmp_path)
    index = json.loads(archive.files["annotations.json"])
    # the bucket's sorted classes first; relabels are classes too
    assert [cat["name"] for cat in index["categories"]] == ["person", "truck", "worker"]
    assert await world.p.keys() == before  # an export writes nothing to object storage


async def test_pending_items_are_exported_when_the_filter_asks(
    world: World, tmp_path: Path
) -> None:
    archive = await export(world.p, world.c.admin, states=[PENDING, ACCEPTED])
    expected = world.items("yard", PENDING, ACCEPTED)
    assert {shot.slot for shot in expected.values()} == {0, 10, 30, 5, 15}
    check_stream(archive, "yard-coco.tar", len(expected))
    check_coco(world, archive, expected, tmp_path)


async def test_a_yolo_export_has_normalized_lines_and_the_class_index(world: World) -> None:
    for bucket in ("yard", "lot"):
        archive = await export(world.p, world.c.admin, bucket, YOLO_FORMAT)
        expected = world.items(bucket)
        check_stream(archive, f"{bucket}-yolo.tar", len(expected))
        assert archive.names[-4:] == ["train.txt", "val.txt", "data.yaml", "classes.txt"]
        assert sorted(archive.names[:-4]) == sorted(
            name for item in expected for name in (f"images/{item}.jpg", f"labels/{item}.txt")
        )
        classes = archive.files["classes.txt"].decode().splitlines()
        assert len(set(classes)) == len(classes)
        for item, shot in expected.items():
            assert archive.files[f"images/{item}.jpg"] == shot.image()
            found = []
            for line in archive.files[f"labels/{item}.txt"].decode().splitlines():
                index, cx, cy, w, h = line.split(" ")
                found.append(
                    (
                        classes[int(index)],
                        f32(float(cx)),
                        f32(float(cy)),
                        f32(float(w)),
                        f32(float(h)),
                    )
                )
                assert all(0.0 <= float(value) <= 1.0 for value in (cx, cy, w, h))
            wanted = [
                (
                    name,
                    f32(shown.x + shown.w / 2),
                    f32(shown.y + shown.h / 2),
                    f32(shown.w),
                    f32(shown.h),
                )
                for name, shown in shot.kept()
            ]
            assert sorted(found) == sorted(wanted)
        if bucket == "lot":
            empty = [item for item, shot in expected.items() if not shot.boxes]
            assert len(empty) == 1
            assert archive.files[f"labels/{empty[0]}.txt"] == b""
            assert classes == ["vehicle"]
        else:
            assert classes == ["person", "truck", "worker"]
            relabelled = [item for item, shot in expected.items() if shot.camera == "cam-b"]
            lines = {archive.files[f"labels/{item}.txt"].decode() for item in relabelled}
            assert {classes[int(text.split(" ")[0])] for text in lines} == {"person", "worker"}


async def test_a_footage_key_exports_only_its_cameras(world: World, tmp_path: Path) -> None:
    c = world.c
    cam_a = bearer_metadata(await c.key(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-a",))))
    archive = await export(world.p, cam_a)
    expected = {item: shot for item, shot in world.items("yard").items() if shot.camera == "cam-a"}
    assert expected
    check_stream(archive, "yard-coco.tar", len(expected))
    check_coco(world, archive, expected, tmp_path)
    # and it cannot ask for the other camera's items by name
    other = await export(world.p, cam_a, camera="cam-b")
    assert other.responses[-1].items == 0


async def test_bad_input_is_refused_and_writes_nothing(world: World) -> None:
    p, c = world.p, world.c
    before = await p.keys()
    request = pb.ExportBucketRequest(bucket_id="yard", format=COCO_FORMAT)
    unknown = pb.ExportBucketRequest(bucket_id="nowhere", format=YOLO_FORMAT)
    assert (await refusal(p, unknown, c.admin))[:2] == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    unset = pb.ExportBucketRequest(bucket_id="yard")
    code, reason, metadata = await refusal(p, unset, c.admin)
    assert (code, reason, metadata.get("field")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
        "format",
    )
    nameless = pb.ExportBucketRequest(format=COCO_FORMAT)
    assert (await refusal(p, nameless, c.admin))[0] == grpc.StatusCode.INVALID_ARGUMENT
    bad_filter = pb.ExportBucketRequest(
        bucket_id="yard",
        format=COCO_FORMAT,
        filter=run_pb2.BucketItemFilter(review_states=[common_pb2.REVIEW_STATE_UNSPECIFIED]),
    )
    assert (await refusal(p, bad_filter, c.admin))[0] == grpc.StatusCode.INVALID_ARGUMENT
    # a workshop:run key (the processor's) reads no bucket
    code, reason, _ = await refusal(p, request, world.s.processor)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert (await refusal(p, request, ()))[0] == grpc.StatusCode.UNAUTHENTICATED
    assert await p.keys() == before


async def test_an_image_whose_bytes_changed_stops_the_export(world: World) -> None:
    p = world.p
    item = next(iter(world.items("yard")))
    async with world.c.db.connection() as connection:
        key = await connection.fetchval(
            "SELECT object_key FROM bucket_items WHERE item_id = $1", item
        )
    other = jpeg_bytes(64, 48, seed=999)
    await p.store.put(key, other, "image/jpeg")
    request = pb.ExportBucketRequest(bucket_id="yard", format=COCO_FORMAT)
    code, reason, metadata = await refusal(p, request, world.c.admin)
    assert (code, reason, metadata) == (
        grpc.StatusCode.DATA_LOSS,
        "IMAGE_CHANGED",
        {"item_id": item},
    )
    await p.store.remove([key])
    code, reason, metadata = await refusal(p, request, world.c.admin)
    assert (code, reason, metadata) == (
        grpc.StatusCode.DATA_LOSS,
        "IMAGE_CHANGED",
        {"item_id": item},
    )


async def test_many_pages_stream_in_order(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of two items: the next page is asked for while one is written, reads run
    ahead across page boundaries, and the archive is the same as with one page."""
    whole = await export(world.p, world.c.admin, states=[PENDING, ACCEPTED])
    monkeypatch.setattr(exporting, "PAGE_SIZE", 2)
    monkeypatch.setattr(exporting, "READ_AHEAD", 3)
    paged = await export(world.p, world.c.admin, states=[PENDING, ACCEPTED])
    assert paged.names == whole.names
    assert paged.files == whole.files
    check_coco(world, paged, world.items("yard", PENDING, ACCEPTED), tmp_path)


async def test_a_png_item_cannot_be_exported_as_a_jpeg(
    coordinator: CoordinatorHarness, preview: PreviewHarness
) -> None:
    c, p = coordinator, preview
    s = await review_world(c)
    job = _first_job(await start_run(c, s, "r1"), "cam-a")
    png = png_bytes(8, 6)
    frames = [Frame(3, "save", (box("person", 0.1, 0.1, 0.1),))]
    await commit_images(c, s, p.stub, job, frames, {3: png})
    request = pb.ExportBucketRequest(
        bucket_id="yard",
        format=YOLO_FORMAT,
        filter=run_pb2.BucketItemFilter(review_states=[PENDING]),
    )
    code, reason, metadata = await refusal(p, request, c.admin)
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "IMAGE_NOT_JPEG")
    assert "item_id" in metadata


async def test_an_empty_bucket_is_an_archive_with_only_its_index(
    coordinator: CoordinatorHarness, preview: PreviewHarness
) -> None:
    c, p = coordinator, preview
    await review_world(c)
    coco = await export(p, c.admin, "lot")
    check_stream(coco, "lot-coco.tar", 0)
    assert coco.names == ["annotations.json"]
    index = json.loads(coco.files["annotations.json"])
    assert (index["images"], index["annotations"], index["categories"]) == ([], [], [])
    yolo = await export(p, c.admin, "lot", YOLO_FORMAT)
    assert yolo.names == ["train.txt", "val.txt", "data.yaml", "classes.txt"]
    assert yolo.files["classes.txt"] == b""
    assert yolo.files["train.txt"] == yolo.files["val.txt"] == b""


async def test_exports_write_corrected_boxes_and_follow_item_decisions(world: World) -> None:
    """A correction (a detected box moved, one deleted, one added) is what COCO and YOLO
    write for its item, and the bucket's classes follow it; an item decided None alone
    leaves the default (accepted) export."""
    c = world.c
    corrected = next(
        item for item, shot in world.shots.items() if (shot.camera, shot.slot) == ("cam-a", 0)
    )
    rejected = next(
        item for item, shot in world.shots.items() if (shot.camera, shot.slot) == ("cam-b", 5)
    )
    await c.workshop.CorrectItemBoxes(
        ws.CorrectItemBoxesRequest(
            item_id=corrected,
            boxes=[
                ws.BoxCorrectionInput(
                    source_box_index=0, class_name="person", x=0.2, y=0.2, w=0.3, h=0.3
                ),
                ws.BoxCorrectionInput(
                    source_box_index=-1, class_name="vehicle", x=0.5, y=0.5, w=0.25, h=0.25
                ),
            ],
        ),
        metadata=c.admin,
    )
    await c.workshop.DecideItem(
        ws.DecideItemRequest(item_id=rejected, decision=NONE), metadata=c.admin
    )
    # (class, cx, cy, w, h) as YOLO writes them, rounded past float32's noise
    wanted = [("person", 0.35, 0.35, 0.3, 0.3), ("vehicle", 0.625, 0.625, 0.25, 0.25)]
    yolo = await export(world.p, c.admin, "yard", YOLO_FORMAT)
    classes = yolo.files["classes.txt"].decode().splitlines()
    assert classes == ["person", "vehicle", "worker"]  # "truck" was the deleted box's relabel
    assert f"labels/{rejected}.txt" not in yolo.files
    found = []
    for line in yolo.files[f"labels/{corrected}.txt"].decode().splitlines():
        index, cx, cy, w, h = line.split(" ")
        found.append((classes[int(index)], *(round(float(v), 5) for v in (cx, cy, w, h))))
    assert sorted(found) == wanted
    coco = await export(world.p, c.admin, "yard", COCO_FORMAT)
    index = json.loads(coco.files["annotations.json"])
    (image,) = [i for i in index["images"] if i["workshop_item_id"] == corrected]
    names = {category["id"]: category["name"] for category in index["categories"]}
    boxes = sorted(
        (names[a["category_id"]], [round(v, 3) for v in a["bbox"]])
        for a in index["annotations"]
        if a["image_id"] == image["id"]
    )
    width, height = image["width"], image["height"]
    assert boxes == [
        ("person", [round(v, 3) for v in (0.2 * width, 0.2 * height, 0.3 * width, 0.3 * height)]),
        (
            "vehicle",
            [round(v, 3) for v in (0.5 * width, 0.5 * height, 0.25 * width, 0.25 * height)],
        ),
    ]
    assert rejected not in [i["workshop_item_id"] for i in index["images"]]


def _strict_json(text: bytes) -> object:
    """JSON as the standard has it: NaN and Infinity are not numbers there."""

    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


async def test_a_box_an_earlier_release_stored_not_finite_is_left_out(world: World) -> None:
    """Rows stored before non-finite box values were refused at input may hold one (as
    protobuf's JSON writes it); an export leaves such a box out instead of writing NaN
    into annotations.json or a label line, and keeps the item's other boxes."""
    first = next(item for item, shot in world.shots.items() if shot.slot == 0)
    second = next(item for item, shot in world.shots.items() if shot.slot == 10)
    async with world.c.db.connection() as connection:
        await connection.execute(
            "UPDATE bucket_items SET boxes = jsonb_set(boxes, '{0,x}', '\"NaN\"') "
            "WHERE item_id = $1",
            first,
        )
        await connection.execute(
            "UPDATE bucket_items SET boxes = jsonb_set(boxes, '{0,score}', '\"Infinity\"') "
            "WHERE item_id = $1",
            second,
        )
    coco = await export(world.p, world.c.admin)
    index = _strict_json(coco.files["annotations.json"])
    assert isinstance(index, dict)
    item_of = {image["id"]: image["workshop_item_id"] for image in index["images"]}
    boxes = Counter(item_of[ann["image_id"]] for ann in index["annotations"])
    expected = world.items("yard")
    assert {item: boxes[item] for item in item_of.values()} == {
        item: len(shot.kept()) - (item in (first, second)) for item, shot in expected.items()
    }
    yolo = await export(world.p, world.c.admin, "yard", YOLO_FORMAT)
    for item, shot in expected.items():
        lines = yolo.files[f"labels/{item}.txt"].decode().splitlines()
        assert len(lines) == len(shot.kept()) - (item in (first, second))
        assert all("nan" not in line.lower() and "inf" not in line.lower() for line in lines)
