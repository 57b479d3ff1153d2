"""Dataset versions through the real stack (docs/datasets.md): freezing, the content id,
the diff, the versions of an item, and exports made from a version (byte-identical, immune
to later review, resumable at any offset).

The world is test_dataset_export's: a full run whose items carry real JPEGs in SeaweedFS,
some sightings confirmed, relabelled or rejected.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path, PurePosixPath
from typing import cast

import grpc
import httpx
import pytest
import yaml  # type: ignore[import-untyped]
from prometheus_client.parser import text_string_to_metric_families
from pycocotools.coco import COCO

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_world import error_reason
from testbed.harness.gateway import GatewayHarness
from tests.cli_runner import workshop
from tests.service.test_dataset_export import (
    COCO_FORMAT,
    CONFIRM,
    NONE,
    YOLO_FORMAT,
    World,
    world_fixture,  # noqa: F401
)
from workshop.v1 import common_pb2, dataset_pb2_grpc, run_pb2
from workshop.v1 import dataset_pb2 as dpb
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import workshop_pb2 as ws

ACCEPTED, PENDING = common_pb2.REVIEW_STATE_ACCEPTED, common_pb2.REVIEW_STATE_PENDING


def datasets(world: World) -> dataset_pb2_grpc.DatasetServiceAsyncStub:
    return cast(
        "dataset_pb2_grpc.DatasetServiceAsyncStub",
        dataset_pb2_grpc.DatasetServiceStub(world.c.channel),
    )


async def freeze(
    world: World,
    name: str = "v1",
    seed: int = 0,
    val_fraction: float | None = 0.5,
    wanted: run_pb2.BucketItemFilter | None = None,
) -> dpb.CreateDatasetVersionResponse:
    request = dpb.CreateDatasetVersionRequest(bucket_id="yard", name=name, seed=seed, filter=wanted)
    if val_fraction is not None:
        request.val_fraction = val_fraction
    answer: dpb.CreateDatasetVersionResponse = await datasets(world).CreateDatasetVersion(
        request, metadata=world.c.admin
    )
    return answer


def split_of(item_id: str, seed: int, val_fraction: float) -> str:
    """The split as docs/datasets.md states it."""
    digest = hashlib.sha256(f"{seed}:{item_id}".encode()).hexdigest()
    return "val" if int(digest[:13], 16) / 16**13 < val_fraction else "train"


async def test_freezing_is_content_addressed_and_idempotent(world: World) -> None:
    first = await freeze(world)
    assert first.created
    version = first.version
    assert version.version_id.startswith("dv_")
    assert len(version.version_id) == 67
    expected = world.items("yard")
    assert version.item_count == len(expected)
    assert list(version.filter.review_states) == [ACCEPTED]
    assert version.classes == ["person", "truck", "worker"]
    again = await freeze(world, name="another name")
    assert not again.created
    assert again.version.version_id == version.version_id
    assert again.version.name == "v1"  # the first name stays
    other = await freeze(world, seed=7)
    assert other.created
    assert other.version.version_id != version.version_id
    listed = await datasets(world).ListDatasetVersions(
        dpb.ListDatasetVersionsRequest(bucket_id="yard", page_size=1), metadata=world.c.admin
    )
    assert len(listed.versions) == 1
    assert listed.next_page_token
    rest = await datasets(world).ListDatasetVersions(
        dpb.ListDatasetVersionsRequest(bucket_id="yard", page_token=listed.next_page_token),
        metadata=world.c.admin,
    )
    assert {v.version_id for v in [*listed.versions, *rest.versions]} == {
        version.version_id,
        other.version.version_id,
    }
    assert not rest.next_page_token
    # the run and score filters: stored with the version and part of its content (every
    # box of this world scores 0.9)
    same = await freeze(world, wanted=run_pb2.BucketItemFilter(run_id="r1", max_score=0.95))
    assert same.created
    assert same.version.item_count == len(expected)
    assert (same.version.filter.run_id, same.version.filter.HasField("min_score")) == ("r1", False)
    assert same.version.filter.max_score == pytest.approx(0.95)
    for empty in (
        run_pb2.BucketItemFilter(run_id="r2"),
        run_pb2.BucketItemFilter(min_score=0.95),
    ):
        none = await freeze(world, wanted=empty)
        assert none.version.item_count == 0, empty


async def test_bad_input_is_refused_precisely(world: World) -> None:
    stub, admin = datasets(world), world.c.admin
    cases = [
        (
            dpb.CreateDatasetVersionRequest(bucket_id="yard"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "name",
        ),
        (
            dpb.CreateDatasetVersionRequest(bucket_id="yard", name="x", val_fraction=1.0),
            grpc.StatusCode.INVALID_ARGUMENT,
            "val_fraction",
        ),
        (
            dpb.CreateDatasetVersionRequest(bucket_id="nowhere", name="x"),
            grpc.StatusCode.NOT_FOUND,
            None,
        ),
    ]
    for request, code, field in cases:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CreateDatasetVersion(request, metadata=admin)
        got, _, metadata = error_reason(caught.value)
        assert got == code
        if field:
            assert metadata["field"] == field
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetDatasetVersion(
            dpb.GetDatasetVersionRequest(version_id="dv_nope"), metadata=admin
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def export_bytes(
    world: World,
    version_id: str,
    dataset_format: run_pb2.DatasetFormat.ValueType,
    offset: int = 0,
    *,
    with_size: bool = False,
    stop_after: int | None = None,
) -> tuple[bytes, list[pb.ExportBucketResponse]]:
    """A version's archive from `offset` on; `stop_after` bytes: the download breaks there."""
    request = pb.ExportBucketRequest(
        dataset_version_id=version_id, format=dataset_format, offset=offset, with_size=with_size
    )
    data = bytearray()
    responses = []
    call = world.p.stub.ExportBucket(request, metadata=world.c.admin)
    async for response in call:
        responses.append(response)
        data += response.data
        if stop_after is not None and len(data) >= stop_after:
            call.cancel()
            break
    return bytes(data[:stop_after] if stop_after is not None else data), responses


def members(data: bytes) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            extracted = tar.extractfile(member)
            assert extracted is not None
            files[member.name] = extracted.read()
    return files


async def decide_differently(world: World) -> str:
    """A later review of the bucket: an accepted yard item of one sighting decided None
    (out of the next version), another item's boxes corrected. Returns the corrected item."""
    c = world.c
    review = await c.workshop.GetReview(ws.GetReviewRequest(run_id="r1"), metadata=c.admin)
    accepted = world.items("yard")
    entries = [entry for entry in review.items if entry.item.item_id in accepted]
    single = next(entry for entry in entries if len(entry.sighting_ids) == 1)
    await c.workshop.DecideSighting(
        ws.DecideSightingRequest(run_id="r1", sighting_id=single.sighting_ids[0], decision=NONE),
        metadata=c.admin,
    )
    corrected = next(e for e in entries if e is not single).item.item_id
    await c.workshop.CorrectItemBoxes(
        ws.CorrectItemBoxesRequest(
            item_id=corrected,
            boxes=[
                ws.BoxCorrectionInput(
                    source_box_index=-1, class_name="vehicle", x=0.5, y=0.5, w=0.25, h=0.25
                )
            ],
        ),
        metadata=c.admin,
    )
    return corrected


async def test_a_version_export_is_byte_identical_and_unaffected_by_later_review(
    world: World,
) -> None:
    version = (await freeze(world)).version
    made: dict[run_pb2.DatasetFormat.ValueType, bytes] = {}
    for dataset_format in (COCO_FORMAT, YOLO_FORMAT):
        first, responses = await export_bytes(world, version.version_id, dataset_format)
        second, _ = await export_bytes(world, version.version_id, dataset_format)
        assert first == second
        assert responses[0].file_name == f"yard-{version.version_id[:15]}-" + (
            "coco.tar" if dataset_format == COCO_FORMAT else "yolo.tar"
        )
        assert responses[-1].items == version.item_count
        made[dataset_format] = first
    await decide_differently(world)
    for dataset_format, before in made.items():
        after, _ = await export_bytes(world, version.version_id, dataset_format)
        assert after == before
    # the bucket itself changed: a live export and a new version see it
    later = (await freeze(world, name="v2")).version
    assert later.version_id != version.version_id
    assert later.item_count == version.item_count - 1


async def test_the_diff_of_two_versions(world: World) -> None:
    version = (await freeze(world)).version
    corrected = await decide_differently(world)
    review = await world.c.workshop.GetReview(
        ws.GetReviewRequest(run_id="r1"), metadata=world.c.admin
    )
    pending = [e for e in review.items if e.item.review_state == PENDING and e.sighting_ids]
    await world.c.workshop.DecideSighting(
        ws.DecideSightingRequest(
            run_id="r1", sighting_id=pending[0].sighting_ids[0], decision=CONFIRM
        ),
        metadata=world.c.admin,
    )
    relabel = next(
        e
        for e in review.items
        if e.item.item_id in version_items(world)
        and e.item.item_id != corrected
        and e.item.review_state == ACCEPTED
        and len(e.sighting_ids) == 1
    )
    await world.c.workshop.DecideSighting(
        ws.DecideSightingRequest(
            run_id="r1",
            sighting_id=relabel.sighting_ids[0],
            decision=ws.REVIEW_DECISION_RELABEL,
            class_name="cyclist",
        ),
        metadata=world.c.admin,
    )
    later = (await freeze(world, name="v2")).version
    stub = datasets(world)
    changes: list[dpb.DatasetItemChange] = []
    token = ""
    counts = None
    while True:
        page = await stub.DiffDatasetVersions(
            dpb.DiffDatasetVersionsRequest(
                from_version_id=version.version_id,
                to_version_id=later.version_id,
                page_size=1,
                page_token=token,
            ),
            metadata=world.c.admin,
        )
        if not token:
            counts = page.counts
        changes.extend(page.changes)
        token = page.next_page_token
        if not token:
            break
    kinds = {change.item_id: change.kind for change in changes}
    assert kinds[corrected] == dpb.DATASET_CHANGE_KIND_BOXES_CHANGED
    assert kinds[pending[0].item.item_id] == dpb.DATASET_CHANGE_KIND_ADDED
    assert kinds[relabel.item.item_id] == dpb.DATASET_CHANGE_KIND_RELABELLED
    assert list(kinds.values()).count(dpb.DATASET_CHANGE_KIND_REMOVED) == 1
    assert [change.item_id for change in changes] == sorted(kinds)
    assert counts is not None
    assert (counts.added, counts.removed, counts.relabelled, counts.boxes_changed) == (1, 1, 1, 1)
    relabelled = next(c for c in changes if c.item_id == relabel.item.item_id)
    assert [b.class_name for b in relabelled.after] == ["cyclist"]
    # an item shows the versions that hold it (the test's clock stands still: both were
    # made at the same instant, so their order is by id)
    held = await stub.ListItemVersions(
        dpb.ListItemVersionsRequest(item_id=relabel.item.item_id), metadata=world.c.admin
    )
    assert {v.version_id for v in held.versions} == {later.version_id, version.version_id}
    added = await stub.ListItemVersions(
        dpb.ListItemVersionsRequest(item_id=pending[0].item.item_id), metadata=world.c.admin
    )
    assert [v.version_id for v in added.versions] == [later.version_id]


def version_items(world: World) -> set[str]:
    return set(world.items("yard"))


@pytest.mark.parametrize("dataset_format", [COCO_FORMAT, YOLO_FORMAT])
async def test_a_broken_download_resumes_to_the_same_bytes(
    world: World, dataset_format: run_pb2.DatasetFormat.ValueType, tmp_path: Path
) -> None:
    seed, fraction = 11, 0.5
    version = (await freeze(world, seed=seed, val_fraction=fraction)).version
    whole, responses = await export_bytes(world, version.version_id, dataset_format)
    assert not responses[0].HasField("total_bytes")
    _, measured = await export_bytes(world, version.version_id, dataset_format, with_size=True)
    assert measured[0].total_bytes == len(whole)
    # broken mid-image, at a header, one byte in, one byte before the end
    for cut in (1, 512, 700_000, len(whole) // 2, len(whole) - 1):
        broken, _ = await export_bytes(world, version.version_id, dataset_format, stop_after=cut)
        assert len(broken) == cut
        rest, answers = await export_bytes(world, version.version_id, dataset_format, cut)
        assert answers[0].total_bytes == len(whole)
        assert broken + rest == whole
    files = members(whole)
    expected = world.items("yard")
    if dataset_format == COCO_FORMAT:
        path = tmp_path / "annotations.json"
        path.write_bytes(files["annotations.json"])
        coco = COCO(str(path))  # the reference reader loads it
        index = json.loads(files["annotations.json"])
        assert index["info"]["dataset_version_id"] == version.version_id
        assert index["info"]["version"] == version.version_id
        assert [c["name"] for c in index["categories"]] == list(version.classes)
        for image in coco.loadImgs(coco.getImgIds()):
            shot = expected[image["workshop_item_id"]]
            assert (image["width"], image["height"]) == (shot.width, shot.height)
            assert files[image["file_name"]] == shot.image()
            assert image["workshop_split"] == split_of(image["workshop_item_id"], seed, fraction)
    else:
        data = yaml.safe_load(files["data.yaml"])  # as Ultralytics reads it
        assert data["nc"] == len(version.classes)
        assert data["names"] == dict(enumerate(version.classes))
        assert "path" not in data  # the yaml's own directory is the root
        listed: dict[str, str] = {}
        for split in ("train", "val"):
            assert data[split] in files
            for line in files[data[split]].decode().splitlines():
                name = str(PurePosixPath(line))
                assert name in files  # an image of the archive
                label = name.replace("images/", "labels/").rsplit(".", 1)[0] + ".txt"
                assert label in files  # where Ultralytics looks for its labels
                listed[name.removeprefix("images/").removesuffix(".jpg")] = split
        assert listed == {item: split_of(item, seed, fraction) for item in expected}
        assert f"seed: {seed}, val_fraction: {fraction}" in files["data.yaml"].decode()
        assert version.val_count == sum(1 for s in listed.values() if s == "val")


async def export_reads(world: World) -> dict[str, float]:
    """The preview service's own count of the objects its exports read, by kind, and of
    its stored layouts by outcome (layout_<outcome>), from its /metrics."""
    assert world.p.metrics_port
    async with httpx.AsyncClient() as client:
        answer = await client.get(f"http://127.0.0.1:{world.p.metrics_port}/metrics")
    assert answer.status_code == 200
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            if sample.name == "workshop_preview_export_reads_total":
                found[sample.labels["kind"]] = sample.value
            if sample.name == "workshop_preview_export_layouts_total":
                found["layout_" + sample.labels["outcome"]] = sample.value
    return found


def reads_since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {
        kind: after[kind] - before.get(kind, 0)
        for kind in after
        if after[kind] != before.get(kind, 0)
    }


def images_past(whole: bytes, cut: int) -> int:
    """Images of the archive whose members reach past byte `cut` (a resume reads those)."""
    with tarfile.open(fileobj=io.BytesIO(whole), mode="r:") as tar:
        return sum(
            1
            for member in tar
            if member.name.startswith("images/") and member.offset_data + member.size > cut
        )


def image_starts(whole: bytes) -> list[int]:
    """Where each image's bytes start in the archive."""
    with tarfile.open(fileobj=io.BytesIO(whole), mode="r:") as tar:
        return [member.offset_data for member in tar if member.name.startswith("images/")]


async def test_a_resume_reads_the_stored_layout_not_the_skipped_images(world: World) -> None:
    """A whole export stores the version's layout; a resume then reads that one object and
    the images past its offset, no header of any image before it, and gives the same bytes.
    A corrupt layout is laid out again (and stored again); the other format's resume takes
    the images' facts from the first format's layout."""
    version = (await freeze(world, name="layout", seed=5)).version
    vid = version.version_id
    yolo_key = f"exports/layouts/{vid}/yolo.json.gz"
    before = await export_reads(world)
    whole, _ = await export_bytes(world, vid, YOLO_FORMAT)
    spent = reads_since(before, await export_reads(world))
    assert spent == {"image": version.item_count, "layout_stored": 1}
    assert await world.p.keys(f"exports/layouts/{vid}/") == [yolo_key]

    cut = image_starts(whole)[-2] + 5  # in the second last image
    assert images_past(whole, cut) == 2
    before = await export_reads(world)
    rest, answers = await export_bytes(world, vid, YOLO_FORMAT, cut)
    spent = reads_since(before, await export_reads(world))
    assert spent == {"layout": 1, "layout_found": 1, "image": images_past(whole, cut)}
    assert answers[0].total_bytes == len(whole)
    assert whole[:cut] + rest == whole

    # a corrupt layout: laid out again from the headers, the same bytes, stored anew
    stored = await world.p.object_bytes(yolo_key)
    await world.p.store.put_unrecorded(yolo_key, stored[:-9] + b"x" * 9, "application/gzip")
    before = await export_reads(world)
    rest, _ = await export_bytes(world, vid, YOLO_FORMAT, cut)
    spent = reads_since(before, await export_reads(world))
    assert spent["header"] == version.item_count
    assert (spent["layout_bad"], spent["layout_stored"]) == (1, 1)
    assert whole[:cut] + rest == whole
    assert await world.p.object_bytes(yolo_key) == stored  # the same layout again

    # COCO, never exported whole: its layout from YOLO's facts, no header read
    coco, _ = await export_bytes(world, vid, COCO_FORMAT)
    await world.p.store.remove([f"exports/layouts/{vid}/coco.json.gz"])
    middle = len(coco) // 2
    before = await export_reads(world)
    rest, answers = await export_bytes(world, vid, COCO_FORMAT, middle)
    spent = reads_since(before, await export_reads(world))
    assert "header" not in spent
    assert spent["layout_stored"] == 1
    assert spent["image"] == images_past(coco, middle)
    assert answers[0].total_bytes == len(coco)
    assert coco[:middle] + rest == coco


async def test_resuming_refuses_what_it_cannot_resume(world: World) -> None:
    version = (await freeze(world)).version
    whole, _ = await export_bytes(world, version.version_id, YOLO_FORMAT)
    stub, admin = world.p.stub, world.c.admin

    async def refused(
        request: pb.ExportBucketRequest,
    ) -> tuple[grpc.StatusCode, str, dict[str, str]]:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.ExportBucket(request, metadata=admin):
                pass
        return error_reason(caught.value)

    past = pb.ExportBucketRequest(
        dataset_version_id=version.version_id, format=YOLO_FORMAT, offset=len(whole)
    )
    code, reason, metadata = await refused(past)
    assert (code, reason, metadata["total_bytes"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "OFFSET_PAST_END",
        str(len(whole)),
    )
    live = pb.ExportBucketRequest(bucket_id="yard", format=YOLO_FORMAT, offset=10)
    assert (await refused(live))[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "NOT_RESUMABLE")
    filtered = pb.ExportBucketRequest(
        dataset_version_id=version.version_id,
        format=YOLO_FORMAT,
        filter=run_pb2.BucketItemFilter(camera_id="cam-a"),
    )
    assert (await refused(filtered))[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    unknown = pb.ExportBucketRequest(dataset_version_id="dv_" + "0" * 64, format=YOLO_FORMAT)
    assert (await refused(unknown))[0] == grpc.StatusCode.NOT_FOUND


async def test_an_http_download_resumes_with_range(world: World, gateway: GatewayHarness) -> None:
    agent = await gateway.agent(Grant(ScopeName.WORKSHOP))
    made = await agent.post("/v1/workshop/buckets/yard/versions", json={"name": "http", "seed": 5})
    assert made.status_code == 200, made.text
    version_id = made.json()["version"]["version_id"]
    url = f"/v1/workshop/versions/{version_id}/export"
    whole = await agent.get(url, params={"format": "yolo"})
    assert whole.status_code == 200, whole.text
    assert whole.headers["accept-ranges"] == "bytes"
    etag = whole.headers["etag"]
    size = len(whole.content)
    for start in (0, 1000, size - 10):
        part = await agent.get(url, params={"format": "yolo"}, headers={"range": f"bytes={start}-"})
        assert part.status_code == 206, part.text
        assert part.headers["content-range"] == f"bytes {start}-{size - 1}/{size}"
        assert part.content == whole.content[start:]
    # If-Range of another representation: the whole archive
    other = await agent.get(
        url, params={"format": "yolo"}, headers={"range": "bytes=10-", "if-range": '"other"'}
    )
    assert other.status_code == 200
    assert other.content == whole.content
    same = await agent.get(
        url, params={"format": "yolo"}, headers={"range": "bytes=10-", "if-range": etag}
    )
    assert same.status_code == 206
    past = await agent.get(url, params={"format": "yolo"}, headers={"range": f"bytes={size}-"})
    assert (past.status_code, past.json()["reason"]) == (416, "OFFSET_PAST_END")
    closed = await agent.get(url, params={"format": "yolo"}, headers={"range": "bytes=0-99"})
    assert (closed.status_code, closed.json()["reason"]) == (400, "INVALID_FIELD")
    live = await agent.get(
        "/v1/workshop/buckets/yard/export", params={"format": "yolo"}, headers={"range": "bytes=5-"}
    )
    assert (live.status_code, live.json()["reason"]) == (409, "NOT_RESUMABLE")


async def test_the_cli_freezes_compares_and_resumes_an_export(world: World, tmp_path: Path) -> None:
    c, preview = world.c, f"127.0.0.1:{world.p.port}"
    made = await workshop(
        c, "-o", "json", "datasets", "freeze", "yard", "--name", "cli", "--seed", "3"
    )
    assert made.code == 0, made.err
    version = json.loads(made.out)
    assert version["created"] is True
    again = await workshop(
        c, "-o", "json", "datasets", "freeze", "yard", "--name", "x", "--seed", "3"
    )
    assert json.loads(again.out)["version_id"] == version["version_id"]
    assert json.loads(again.out)["created"] is False
    listed = await workshop(c, "-o", "json", "datasets", "list", "yard")
    assert [v["version_id"] for v in json.loads(listed.out)] == [version["version_id"]]
    shown = await workshop(c, "datasets", "show", version["version_id"])
    assert shown.code == 0
    assert "cli" in shown.out
    # the run and score filters: every box here scores 0.9
    sure = await workshop(
        c,
        "-o",
        "json",
        "datasets",
        "freeze",
        "yard",
        "--name",
        "sure",
        "--run",
        "r1",
        "--min-score",
        "0.95",
    )
    assert sure.code == 0, sure.err
    frozen = json.loads(sure.out)
    assert frozen["item_count"] == 0
    assert frozen["filter"]["run_id"] == "r1"
    assert frozen["filter"]["min_score"] == pytest.approx(0.95)
    await decide_differently(world)
    later = json.loads(
        (await workshop(c, "-o", "json", "datasets", "freeze", "yard", "--name", "v2")).out
    )
    diffed = await workshop(
        c, "-o", "json", "datasets", "diff", version["version_id"], later["version_id"]
    )
    assert diffed.code == 0, diffed.err
    assert json.loads(diffed.out)["counts"]["removed"] == 1
    # a download broken off after 5,000 bytes: the same command resumes it
    whole, _ = await export_bytes(world, version["version_id"], YOLO_FORMAT)
    out = tmp_path / "v.tar"
    (tmp_path / "v.tar.part").write_bytes(whole[:5000])
    got = await workshop(
        c,
        "-o",
        "json",
        "--preview",
        preview,
        "datasets",
        "export",
        version["version_id"],
        "--out",
        str(out),
    )
    assert got.code == 0, got.err
    assert json.loads(got.out)["resumed_at"] == 5000
    assert out.read_bytes() == whole
    assert not (tmp_path / "v.tar.part").exists()
