"""Publishing previews, staging uploads and reading images through the preview service.

Real gRPC, real SeaweedFS and the in-process coordinator on real Postgres: what the
service answers, what lands in the bucket and what the coordinator then shows.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable
from datetime import timedelta

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_leases import (
    Setup,
    claimed,
    complete_request,
    create_run,
    empty_result,
    setup,
)
from testbed.coordinator_world import error_reason
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import (
    PreviewHarness,
    box,
    jpeg_bytes,
    png_bytes,
    publish_request,
    upload_request,
)
from workshop.kit.auth import bearer_metadata
from workshop.kit.hashing import sha256_hex
from workshop.v1 import common_pb2, run_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import workshop_pb2 as ws

MIB = 1024 * 1024
GIF = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00!\xf9\x04\x00\x00\x00\x00\x00,"


async def refusal(call: Awaitable[object]) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return error_reason(caught.value)


@pytest.fixture
async def s(coordinator: CoordinatorHarness) -> Setup:
    return await setup(coordinator)


async def recent_images(c: CoordinatorHarness, run_id: str = "r1") -> list[run_pb2.RunImage]:
    reply = await c.workshop.GetRun(ws.GetRunRequest(run_id=run_id), metadata=c.admin)
    return list(reply.detail.recent_images)


async def test_a_published_preview_is_stored_listed_and_readable_by_who_may_see_its_camera(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    c, p = coordinator, preview
    await create_run(c, s, full=False)
    job = await claimed(c, s)
    request = publish_request(job, 0)
    published = await p.stub.PublishPreview(request, metadata=s.processor)
    assert published.object_key == "workshop-tests/previews/r1/j0/1/0.jpg"
    assert published.expires_at == job.input.expires_at  # the test's hour
    assert await p.keys() == [published.object_key]
    assert await p.object_bytes(published.object_key) == request.image
    images = await recent_images(c)
    assert [(i.item_id, i.source, i.slot_index, i.camera_id) for i in images] == [
        (published.item_id, run_pb2.IMAGE_SOURCE_PREVIEW, 0, "cam-a")
    ]
    assert list(images[0].boxes) == [box()]

    await c.operator.CreateUser(op.CreateUserRequest(user_id="ada"), metadata=c.admin)
    session = await c.operator.CreateSession(
        op.CreateSessionRequest(user_id="ada"), metadata=c.admin
    )
    readers = {
        "session": session.secret,
        "agent": await c.key(Grant(ScopeName.WORKSHOP), name="agent"),
        "footage": await c.key(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-a",))),
    }
    read_request = pb.ReadImageRequest(run_id="r1", item_id=published.item_id)
    for who, secret in readers.items():
        read = await p.stub.ReadImage(read_request, metadata=bearer_metadata(secret))
        assert read.image == request.image, who
        assert (read.content_type, read.camera_id) == ("image/jpeg", "cam-a")
        assert list(read.boxes) == [box()]
        assert read.frame_time == request.frame_time
        assert read.expires_at == published.expires_at

    other_camera = await c.key(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-b",)))
    denied = await refusal(p.stub.ReadImage(read_request, metadata=bearer_metadata(other_camera)))
    assert denied[0] == grpc.StatusCode.PERMISSION_DENIED
    unknown = pb.ReadImageRequest(run_id="r1", item_id="pv_nope")
    missing = await refusal(p.stub.ReadImage(unknown, metadata=bearer_metadata(readers["agent"])))
    assert missing[:2] == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    anonymous = await refusal(p.stub.ReadImage(read_request))
    assert anonymous[:2] == (grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_MISSING")


async def test_staged_uploads_commit_as_items_and_the_full_runs_previews_are_then_collected(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    c, p = coordinator, preview
    await create_run(c, s, full=True)
    job = await claimed(c, s)
    previews = [
        await p.stub.PublishPreview(publish_request(job, slot), metadata=s.processor)
        for slot in (0, 1)
    ]
    assert previews[0].object_key == "previews/r1/j0/1/0.jpg"
    assert not previews[0].HasField("expires_at")  # until the job ends
    uploads = [upload_request(job, slot) for slot in (0, 1)]
    uploads[0].sha256 = sha256_hex(uploads[0].image)  # the end-to-end check is optional
    staged = [await p.stub.StageUpload(upload, metadata=s.processor) for upload in uploads]
    assert [u.object_key for u in staged] == ["uploads/r1/j0/1/0.jpg", "uploads/r1/j0/1/1.jpg"]
    assert [(u.sha256, u.byte_size) for u in staged] == [
        (sha256_hex(upload.image), len(upload.image)) for upload in uploads
    ]

    result = empty_result(job)
    for slot, upload in zip(result.slots[:2], staged, strict=True):
        slot.outcome = common_pb2.SLOT_OUTCOME_FRAME
        slot.frame_time.CopyFrom(job.input.slots[slot.slot_index].start)
        slot.boxes.append(box())
        slot.outputs.add(step_id="save", boxes=[box()])
        slot.upload_key, slot.upload_sha256 = upload.object_key, upload.sha256
    await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    assert await c.count("bucket_items") == 2

    agent = bearer_metadata(await c.key(Grant(ScopeName.WORKSHOP), name="agent"))
    gone = pb.ReadImageRequest(run_id="r1", item_id=previews[0].item_id)
    assert (await refusal(p.stub.ReadImage(gone, metadata=agent)))[:2] == (
        grpc.StatusCode.NOT_FOUND,
        "EXPIRED",
    )
    items = [i for i in await recent_images(c) if i.source == run_pb2.IMAGE_SOURCE_ITEM]
    assert sorted(i.slot_index for i in items) == [0, 1]

    report = await p.stub.RunCleanup(pb.RunCleanupRequest(), metadata=c.admin)
    preview_bytes = sum(len(publish_request(job, slot).image) for slot in (0, 1))
    assert (report.previews_deleted, report.uploads_deleted) == (2, 0)
    assert report.bytes_deleted == preview_bytes
    assert not report.uploads_remaining
    assert await p.keys() == ["uploads/r1/j0/1/0.jpg", "uploads/r1/j0/1/1.jpg"]
    for item in items:
        read = await p.stub.ReadImage(
            pb.ReadImageRequest(run_id="r1", item_id=item.item_id), metadata=agent
        )
        assert read.image == uploads[item.slot_index].image
        assert not read.HasField("expires_at")  # a full run's items stay
    again = await p.stub.RunCleanup(pb.RunCleanupRequest(), metadata=c.admin)
    assert (again.previews_deleted, again.uploads_deleted, again.bytes_deleted) == (0, 0, 0)


async def test_a_png_is_stored_under_a_png_key(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    await create_run(coordinator, s, full=False)
    job = await claimed(coordinator, s)
    request = publish_request(job, 0, png_bytes(), content_type="")  # the bytes tell the type
    published = await preview.stub.PublishPreview(request, metadata=s.processor)
    assert published.object_key == "workshop-tests/previews/r1/j0/1/0.png"


@pytest.mark.parametrize(
    ("image", "content_type", "field"),
    [
        (GIF, "image/jpeg", "image"),
        (GIF, "image/gif", "content_type"),
        (bytes(range(256)) * 64, "image/jpeg", "image"),
        (jpeg_bytes(size=20_000)[:-2], "image/jpeg", "image"),  # truncated: no EOI
        (jpeg_bytes()[:1500], "image/jpeg", "image"),
        (png_bytes(), "image/jpeg", "content_type"),
        (b"", "image/jpeg", "image"),
    ],
)
async def test_images_that_are_not_complete_jpegs_or_pngs_are_invalid_and_nothing_is_written(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    s: Setup,
    image: bytes,
    content_type: str,
    field: str,
) -> None:
    await create_run(coordinator, s, full=False)
    job = await claimed(coordinator, s)
    for call in (
        preview.stub.PublishPreview(
            publish_request(job, 0, image, content_type=content_type), metadata=s.processor
        ),
        preview.stub.StageUpload(
            pb.StageUploadRequest(
                lease=job.lease, slot_index=0, image=image, content_type=content_type
            ),
            metadata=s.processor,
        ),
    ):
        code, reason, metadata = await refusal(call)
        assert (code, reason, metadata.get("field")) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            field,
        )
    assert await coordinator.count("staged_objects") == 0
    assert await preview.keys() == []


async def test_a_box_value_not_finite_is_invalid_and_nothing_is_written(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    """Refused before the bytes are written: the coordinator would refuse the record."""
    await create_run(coordinator, s, full=False)
    job = await claimed(coordinator, s)
    request = publish_request(job, 0)
    request.boxes[0].h = -math.inf
    code, reason, metadata = await refusal(
        preview.stub.PublishPreview(request, metadata=s.processor)
    )
    assert (code, reason, metadata) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
        {"field": "boxes[0].h"},
    )
    assert await coordinator.count("staged_objects") == 0
    assert await preview.keys() == []


async def test_an_image_over_4_mib_is_payload_too_large_from_the_service_itself(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    await create_run(coordinator, s, full=False)
    job = await claimed(coordinator, s)
    largest = publish_request(job, 0, jpeg_bytes(size=4 * MIB))
    assert len(largest.image) == 4 * MIB
    await preview.stub.PublishPreview(largest, metadata=s.processor)
    too_large = publish_request(job, 1, jpeg_bytes(size=4 * MIB + 1))
    code, reason, metadata = await refusal(
        preview.stub.PublishPreview(too_large, metadata=s.processor)
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "PAYLOAD_TOO_LARGE")
    assert metadata == {"limit_bytes": str(4 * MIB)}
    upload = upload_request(job, 1, jpeg_bytes(size=5 * MIB))
    code, reason, _ = await refusal(preview.stub.StageUpload(upload, metadata=s.processor))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "PAYLOAD_TOO_LARGE")
    assert await preview.keys() == ["workshop-tests/previews/r1/j0/1/0.jpg"]


async def test_a_wrong_upload_digest_is_invalid_and_nothing_is_staged(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    await create_run(coordinator, s)
    job = await claimed(coordinator, s)
    upload = upload_request(job, 0, sha256="ab" * 32)
    code, reason, metadata = await refusal(preview.stub.StageUpload(upload, metadata=s.processor))
    assert (code, reason, metadata) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
        {"field": "sha256"},
    )
    assert await coordinator.count("staged_objects") == 0


async def test_previews_are_accepted_in_slot_order_only(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    await create_run(coordinator, s, full=False)
    job = await claimed(coordinator, s)
    await preview.stub.PublishPreview(publish_request(job, 2), metadata=s.processor)
    again = await preview.stub.PublishPreview(publish_request(job, 2), metadata=s.processor)
    assert again.object_key.endswith("/2.jpg")  # the same slot again replaces it
    code, reason, _ = await refusal(
        preview.stub.PublishPreview(publish_request(job, 1), metadata=s.processor)
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    await preview.stub.PublishPreview(publish_request(job, 3), metadata=s.processor)
    assert sorted(i.slot_index for i in await recent_images(coordinator)) == [2, 3]


async def test_a_test_run_past_its_hour_shows_no_image_and_its_bytes_are_collected(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    c, p = coordinator, preview
    await create_run(c, s, full=False)
    job = await claimed(c, s)
    published = await p.stub.PublishPreview(publish_request(job, 0), metadata=s.processor)
    agent = bearer_metadata(await c.key(Grant(ScopeName.WORKSHOP), name="agent"))
    request = pb.ReadImageRequest(run_id="r1", item_id=published.item_id)
    await p.stub.ReadImage(request, metadata=agent)
    early = await p.stub.RunCleanup(pb.RunCleanupRequest(), metadata=c.admin)
    assert early.previews_deleted == 0
    c.clock.advance(timedelta(minutes=61))
    assert (await refusal(p.stub.ReadImage(request, metadata=agent)))[:2] == (
        grpc.StatusCode.NOT_FOUND,
        "EXPIRED",
    )
    assert await recent_images(c) == []
    report = await p.stub.RunCleanup(pb.RunCleanupRequest(), metadata=c.admin)
    assert report.previews_deleted == 1
    assert await p.keys() == []


async def test_calls_need_the_right_credential_and_an_existing_job(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    await create_run(coordinator, s, full=False)
    job = await claimed(coordinator, s)
    request = publish_request(job, 0)
    assert (await refusal(preview.stub.PublishPreview(request)))[:2] == (
        grpc.StatusCode.UNAUTHENTICATED,
        "CREDENTIAL_MISSING",
    )
    stranger = bearer_metadata("wk_not_a_key")
    assert (await refusal(preview.stub.PublishPreview(request, metadata=stranger)))[:2] == (
        grpc.StatusCode.UNAUTHENTICATED,
        "CREDENTIAL_REJECTED",
    )
    elsewhere = publish_request(job, 0)
    elsewhere.lease.run_id = "nope"
    assert (await refusal(preview.stub.PublishPreview(elsewhere, metadata=s.processor)))[:2] == (
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )
    cleanup = pb.RunCleanupRequest()
    assert (await refusal(preview.stub.RunCleanup(cleanup, metadata=s.processor)))[0] == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert (await refusal(preview.stub.RunCleanup(cleanup)))[0] == grpc.StatusCode.UNAUTHENTICATED
    assert await coordinator.count("staged_objects") == 0
