"""Direct writes: grants (S3 POST policies) and batched records of what was written with them.

Real gRPC, the real SeaweedFS and the in-process coordinator on real Postgres: every
write goes to the store with the grant exactly as a processor sends it, so what the
store refuses here it really refuses.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
import urllib3
from minio.datatypes import PostPolicy

from services.coordinator.identity.auth import Grant, ScopeName
from services.preview.grants import WriteGrants
from services.processor.direct_writes import DirectPreviews
from testbed.coordinator_leases import (
    Setup,
    claimed,
    complete_request,
    create_run,
    empty_result,
    setup,
)
from testbed.coordinator_world import CODE, error_reason
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import (
    PreviewHarness,
    box,
    jpeg_bytes,
    object_store,
    running_preview,
)
from testbed.harness.s3 import S3Bucket
from workshop.kit.auth import bearer_metadata
from workshop.kit.hashing import sha256_hex
from workshop.kit.object_keys import object_key
from workshop.v1 import common_pb2, jobs_pb2, run_pb2
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import workshop_pb2 as ws

JPEG = "image/jpeg"
HTTP = urllib3.PoolManager()


@pytest.fixture
async def s(coordinator: CoordinatorHarness) -> Setup:
    return await setup(coordinator)


async def refusal(call: Awaitable[object]) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return error_reason(caught.value)


def grant_request(
    job: jobs_pb2.ClaimedJob, slots: list[int], content_type: str = JPEG
) -> pb.GrantPreviewWritesRequest:
    return pb.GrantPreviewWritesRequest(
        lease=job.lease, code_sha256=CODE, slot_indices=slots, content_type=content_type
    )


def lease_grant_request(
    job: jobs_pb2.ClaimedJob, slots: list[int] | None = None, content_type: str = JPEG
) -> pb.GrantPreviewWritesRequest:
    return pb.GrantPreviewWritesRequest(
        lease=job.lease,
        code_sha256=CODE,
        slot_indices=slots or [],
        content_type=content_type,
        lease_grant=True,
    )


async def post(
    grant: pb.PreviewWriteGrant | pb.LeasePreviewWriteGrant,
    image: bytes,
    *,
    content_type: str = JPEG,
    key: str | None = None,
) -> tuple[int, str]:
    """POSTs `image` with the grant's fields, as a processor does (optionally another key;
    a lease grant's fields name none, so one is needed)."""
    fields: dict[str, str | tuple[str, bytes, str]] = dict(grant.fields)
    fields["Content-Type"] = content_type
    if key is not None:
        fields["key"] = key
    fields["file"] = ("image", image, content_type)
    response = await asyncio.to_thread(HTTP.request, "POST", grant.url, fields=fields)
    return response.status, response.data.decode(errors="replace")


def written(
    job: jobs_pb2.ClaimedJob, grant: pb.PreviewWriteGrant, image: bytes
) -> pb.WrittenPreview:
    return pb.WrittenPreview(
        lease=job.lease,
        code_sha256=CODE,
        slot_index=grant.slot_index,
        object_key=grant.object_key,
        frame_time=job.input.slots[grant.slot_index].start,
        boxes=[box()],
        byte_size=len(image),
        sha256=sha256_hex(image),
        content_type=JPEG,
    )


async def test_written_previews_are_recorded_in_one_call_and_a_full_runs_commit_names_them(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    c, p = coordinator, preview
    await create_run(c, s, full=True)
    job = await claimed(c, s)
    grants = (
        await p.stub.GrantPreviewWrites(grant_request(job, [0, 1]), metadata=s.processor)
    ).grants
    assert [g.object_key for g in grants] == ["previews/r1/j0/1/0.jpg", "previews/r1/j0/1/1.jpg"]
    # Within PREVIEW_GRANT_SECONDS (60) of now, real time: the store's clock, not the
    # coordinator's (frozen here), decides when a grant stops working.
    left = [g.expires_at.ToDatetime(tzinfo=UTC) - datetime.now(UTC) for g in grants]
    assert all(timedelta(seconds=40) < each <= timedelta(seconds=60) for each in left)
    images = [jpeg_bytes(seed=slot) for slot in (0, 1)]
    for grant, image in zip(grants, images, strict=True):
        assert (await post(grant, image))[0] == 204
    assert await p.keys() == [g.object_key for g in grants]
    assert await c.count("staged_objects") == 0  # written, not yet recorded

    reply = await p.stub.RecordWrittenPreviews(
        pb.RecordWrittenPreviewsRequest(
            previews=[written(job, g, i) for g, i in zip(grants, images, strict=True)]
        ),
        metadata=s.processor,
    )
    recorded = [outcome.recorded for outcome in reply.outcomes]
    assert [(r.object_key, r.sha256) for r in recorded] == [
        (g.object_key, sha256_hex(i)) for g, i in zip(grants, images, strict=True)
    ]
    agent = bearer_metadata(await c.key(Grant(ScopeName.WORKSHOP), name="agent"))
    read = await p.stub.ReadImage(
        pb.ReadImageRequest(run_id="r1", item_id=recorded[1].item_id), metadata=agent
    )
    assert (read.image, read.content_type) == (images[1], JPEG)

    result = empty_result(job)
    for slot, grant, image in zip(result.slots[:2], grants, images, strict=True):
        slot.outcome = common_pb2.SLOT_OUTCOME_FRAME
        slot.frame_time.CopyFrom(job.input.slots[slot.slot_index].start)
        slot.boxes.append(box())
        slot.outputs.add(step_id="save", boxes=[box()])
        slot.upload_key, slot.upload_sha256 = grant.object_key, sha256_hex(image)
    await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    assert await c.count("bucket_items") == 2
    detail = await c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin)
    items = [i for i in detail.detail.recent_images if i.source == run_pb2.IMAGE_SOURCE_ITEM]
    for item in items:
        read = await p.stub.ReadImage(
            pb.ReadImageRequest(run_id="r1", item_id=item.item_id), metadata=agent
        )
        assert read.image == images[item.slot_index]
    report = await p.stub.RunCleanup(pb.RunCleanupRequest(), metadata=c.admin)
    assert report.previews_deleted == 0  # both became the items' images
    assert await p.keys() == [g.object_key for g in grants]


async def test_a_grant_writes_only_its_own_key_type_and_size(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket, s: Setup
) -> None:
    c = coordinator
    async with running_preview(c, s3_bucket, max_image_bytes=20_000) as p:
        await create_run(c, s, full=False)
        job = await claimed(c, s)
        grant = (
            await p.stub.GrantPreviewWrites(grant_request(job, [0]), metadata=s.processor)
        ).grants[0]
        assert grant.max_bytes == 20_000
        image = jpeg_bytes()
        # Another slot of the same lease, another lease generation's key, another job's.
        for key in (
            "workshop-tests/previews/r1/j0/1/1.jpg",
            "workshop-tests/previews/r1/j0/2/0.jpg",
            "workshop-tests/previews/r1/j1/1/0.jpg",
            "previews/r1/j0/1/0.jpg",
        ):
            status, body = await post(grant, image, key=key)
            assert (status, "Policy" in body) == (403, True), key
        status, body = await post(grant, b"<html></html>", content_type="text/html")
        assert status == 403
        status, body = await post(grant, jpeg_bytes(size=30_000))
        assert (status, "EntityTooLarge" in body) == (400, True)
        assert await p.keys() == []
        assert (await post(grant, image))[0] == 204
        assert await p.keys() == [grant.object_key]


@pytest.mark.parametrize("kind", ["slot", "lease"])
async def test_a_grant_stops_working_when_it_expires(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket, s: Setup, kind: str
) -> None:
    c = coordinator
    async with running_preview(c, s3_bucket, grant_seconds=1) as p:
        await create_run(c, s, full=False)
        job = await claimed(c, s)
        key = "workshop-tests/previews/r1/j0/1/0.jpg"
        if kind == "slot":
            reply = await p.stub.GrantPreviewWrites(grant_request(job, [0]), metadata=s.processor)
            grant: pb.PreviewWriteGrant | pb.LeasePreviewWriteGrant = reply.grants[0]
        else:
            reply = await p.stub.GrantPreviewWrites(lease_grant_request(job), metadata=s.processor)
            grant = reply.lease_grant
        # until the grant's own expiry has passed on the store's clock, which reads the
        # policy's whole seconds
        left = grant.expires_at.ToDatetime(tzinfo=UTC) - datetime.now(UTC)
        await asyncio.sleep(max(left.total_seconds(), 0.0) + 1.0)
        status, body = await post(grant, jpeg_bytes(), key=key)
        assert (status, "expired" in body.lower()) == (403, True)
        assert await p.keys() == []


async def test_a_grant_never_outlives_its_lease(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket, s: Setup
) -> None:
    """Both kinds of grant end when the lease does as the coordinator last saw it (less the
    time a lease check is reused), however long PREVIEW_GRANT_SECONDS allows."""
    c = coordinator
    async with running_preview(c, s3_bucket, grant_seconds=600) as p:
        await create_run(c, s, full=False)
        job = await claimed(c, s)
        lease_left = job.lease_expires_at.ToDatetime(tzinfo=UTC) - c.clock.now()
        c.clock.advance(lease_left - timedelta(seconds=30))
        for request in (grant_request(job, [0]), lease_grant_request(job)):
            reply = await p.stub.GrantPreviewWrites(request, metadata=s.processor)
            grant = reply.lease_grant if request.lease_grant else reply.grants[0]
            left = grant.expires_at.ToDatetime(tzinfo=UTC) - datetime.now(UTC)
            # 30 s of lease left, less the 10 s a check is reused; whole seconds
            assert timedelta(seconds=15) < left <= timedelta(seconds=20), request.lease_grant


async def test_a_lease_grant_writes_its_slots_keys_and_nothing_outside_its_prefix(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket, s: Setup
) -> None:
    """One policy for every slot: the store takes any key under the lease's own preview
    prefix, with the content type and size it names, and nothing else; only the lease's
    key for a slot can be recorded (the rest is left to the job's sweep)."""
    c = coordinator
    async with running_preview(c, s3_bucket, max_image_bytes=20_000) as p:
        await create_run(c, s, full=False)
        job = await claimed(c, s)
        reply = await p.stub.GrantPreviewWrites(lease_grant_request(job), metadata=s.processor)
        assert len(reply.grants) == 0
        grant = reply.lease_grant
        prefix = "workshop-tests/previews/r1/j0/1/"
        assert (grant.key_prefix, grant.key_suffix) == (prefix, ".jpg")
        assert (grant.max_bytes, grant.content_type, grant.url) == (
            20_000,
            JPEG,
            p.store.bucket_url,
        )
        assert "key" not in grant.fields
        left = grant.expires_at.ToDatetime(tzinfo=UTC) - datetime.now(UTC)
        assert timedelta(seconds=40) < left <= timedelta(seconds=60)
        last = len(job.input.slots) - 1
        keys = [f"{prefix}{slot}{grant.key_suffix}" for slot in (0, last)]
        assert keys == [
            object_key("preview", "r1", "j0", 1, slot, test=True, content_type=JPEG)
            for slot in (0, last)
        ]
        images = [jpeg_bytes(seed=slot) for slot in (0, 1)]
        for key, image in zip(keys, images, strict=True):
            assert (await post(grant, image, key=key))[0] == 204, key
        image = jpeg_bytes()
        # Other lease generations (10 starts with 1: the prefix's "/" keeps it out), another
        # job's, another mode's, the job's uploads.
        for key in (
            "workshop-tests/previews/r1/j0/2/0.jpg",
            "workshop-tests/previews/r1/j0/10/0.jpg",
            "workshop-tests/previews/r1/j0/0.jpg",
            "workshop-tests/previews/r1/j1/1/0.jpg",
            "previews/r1/j0/1/0.jpg",
            "workshop-tests/uploads/r1/j0/1/0.jpg",
        ):
            status, body = await post(grant, image, key=key)
            assert (status, "Policy" in body) == (403, True), key
        # Dot segments that would climb out of the prefix: SeaweedFS refuses the key.
        for key in (f"{prefix}../2/0.jpg", f"{prefix}../../j1/1/0.jpg", f"{prefix}x/../../2/0.jpg"):
            status, body = await post(grant, image, key=key)
            assert (status, "InvalidRequest" in body) == (400, True), key
        status, body = await post(grant, b"<html></html>", content_type="text/html", key=keys[0])
        assert (status, "Policy" in body) == (403, True)
        status, body = await post(grant, jpeg_bytes(size=30_000), key=keys[0])
        assert (status, "EntityTooLarge" in body) == (400, True)
        assert await p.keys() == sorted(keys)
        # Any other key under the prefix is written, but no record may name it.
        stray = f"{prefix}extra/1.jpg"
        assert (await post(grant, image, key=stray))[0] == 204
        one = pb.WrittenPreview(
            lease=job.lease,
            code_sha256=CODE,
            slot_index=0,
            object_key=keys[0],
            frame_time=job.input.slots[0].start,
            byte_size=len(images[0]),
            sha256=sha256_hex(images[0]),
            content_type=JPEG,
        )
        other = pb.WrittenPreview()
        other.CopyFrom(one)
        other.slot_index, other.object_key = 1, stray
        other.frame_time.CopyFrom(job.input.slots[1].start)
        other.sha256 = sha256_hex(image)
        answered = await p.stub.RecordWrittenPreviews(
            pb.RecordWrittenPreviewsRequest(previews=[one, other]), metadata=s.processor
        )
        recorded, refused = answered.outcomes
        assert recorded.recorded.object_key == keys[0]
        assert (refused.refused.code, refused.refused.reason) == (
            grpc.StatusCode.INVALID_ARGUMENT.value[0],
            "INVALID_FIELD",
        )


async def test_a_refused_record_leaves_its_object_collectable_and_others_in_the_batch_stand(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    c, p = coordinator, preview
    await create_run(c, s, full=False)
    job = await claimed(c, s)
    grants = (
        await p.stub.GrantPreviewWrites(grant_request(job, [0, 1]), metadata=s.processor)
    ).grants
    images = [jpeg_bytes(seed=slot) for slot in (0, 1)]
    for grant, image in zip(grants, images, strict=True):
        assert (await post(grant, image))[0] == 204
    stale = written(job, grants[1], images[1])
    stale.lease.token = "00000000-0000-4000-8000-000000000000"
    malformed = written(job, grants[0], images[0])
    malformed.sha256 = "abc"
    not_finite = written(job, grants[1], images[1])
    not_finite.boxes[0].x = math.nan  # the coordinator's refusal, passed on
    reply = await p.stub.RecordWrittenPreviews(
        pb.RecordWrittenPreviewsRequest(
            previews=[written(job, grants[0], images[0]), stale, malformed, not_finite]
        ),
        metadata=s.processor,
    )
    first, refused, bad, nan = reply.outcomes
    assert first.recorded.object_key == grants[0].object_key
    assert (refused.refused.code, refused.refused.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION.value[0],
        "LEASE_MISMATCH",
    )
    assert (bad.refused.code, bad.refused.reason, bad.refused.metadata["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        "INVALID_FIELD",
        "sha256",
    )
    assert (nan.refused.code, nan.refused.reason, nan.refused.metadata["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        "INVALID_FIELD",
        "boxes[0].x",
    )
    report = await p.stub.RunCleanup(pb.RunCleanupRequest(), metadata=c.admin)
    assert report.previews_deleted == 1
    assert await p.keys() == [grants[0].object_key]


async def test_grants_are_refused_for_leases_that_do_not_hold_and_for_bad_requests(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    c, p = coordinator, preview
    await create_run(c, s, full=False)
    job = await claimed(c, s)
    stale = grant_request(job, [0])
    stale.lease.token = "00000000-0000-4000-8000-000000000000"
    code, reason, _ = await refusal(p.stub.GrantPreviewWrites(stale, metadata=s.processor))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_MISMATCH")
    for request, field in (
        (grant_request(job, []), "slot_indices"),
        (grant_request(job, list(range(257))), "slot_indices"),
        (grant_request(job, [len(job.input.slots)]), "slot_indices"),
        (grant_request(job, [0], content_type="image/gif"), "content_type"),
        (grant_request(job, [0], content_type=""), "content_type"),
        (lease_grant_request(job, list(range(257))), "slot_indices"),
        (lease_grant_request(job, [len(job.input.slots)]), "slot_indices"),
        (lease_grant_request(job, content_type="image/gif"), "content_type"),
    ):
        code, reason, metadata = await refusal(
            p.stub.GrantPreviewWrites(request, metadata=s.processor)
        )
        assert (code, reason, metadata.get("field")) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            field,
        )
    code, reason, metadata = await refusal(
        p.stub.RecordWrittenPreviews(pb.RecordWrittenPreviewsRequest(), metadata=s.processor)
    )
    assert (code, reason, metadata.get("field")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
        "previews",
    )
    code, reason, _ = await refusal(p.stub.GrantPreviewWrites(grant_request(job, [0])))
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_MISSING")
    code, reason, _ = await refusal(p.stub.GrantPreviewWrites(lease_grant_request(job)))
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_MISSING")
    stale = lease_grant_request(job)
    stale.lease.token = "00000000-0000-4000-8000-000000000000"
    code, reason, _ = await refusal(p.stub.GrantPreviewWrites(stale, metadata=s.processor))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_MISMATCH")
    assert await p.keys() == []


def test_grants_signed_together_carry_the_sdks_own_fields(s3_bucket: S3Bucket) -> None:
    """ObjectStore.post_policies signs many keys with one signing key: each key's fields are
    exactly what the SDK's presigned_post_policy writes for it at the same second."""
    store = object_store(s3_bucket.server, s3_bucket.name)
    expires = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=60)
    keys = ["previews/r1/j0/1/0.jpg", 'workshop-tests/previews/r"1/j0/1/7.jpg']
    for _ in range(5):  # the SDK reads the clock itself: retry if a second passed between
        together = store.post_policies(keys, "image/jpeg", 4096, expires)
        one_by_one = [store.post_policy(key, "image/jpeg", 4096, expires) for key in keys]
        if {f["x-amz-date"] for f in together + one_by_one} == {together[0]["x-amz-date"]}:
            break
    assert together == one_by_one


def test_a_lease_grant_carries_the_sdks_own_fields(s3_bucket: S3Bucket) -> None:
    """ObjectStore.prefix_post_policy is what the SDK's presigned_post_policy writes for a
    policy whose key starts with the prefix, at the same second (plus Content-Type)."""
    store = object_store(s3_bucket.server, s3_bucket.name)
    expires = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=60)
    prefix = "workshop-tests/previews/r1/j0/3/"
    for _ in range(5):  # the SDK reads the clock itself: retry if a second passed between
        ours = store.prefix_post_policy(prefix, "image/png", 4096, expires)
        policy = PostPolicy(s3_bucket.name, expires)
        policy.add_equals_condition("Content-Type", "image/png")
        policy.add_starts_with_condition("key", prefix)
        policy.add_content_length_range_condition(1, 4096)
        sdks = store._client.presigned_post_policy(policy)
        if ours["x-amz-date"] == sdks["x-amz-date"]:
            break
    assert ours == {**sdks, "Content-Type": "image/png"}


class CountedGrants:
    """The preview service's stub as the processor sees it, counting its grant calls."""

    def __init__(self, preview: PreviewHarness) -> None:
        self.stub = preview.stub
        self.grants: list[pb.GrantPreviewWritesResponse] = []

    async def GrantPreviewWrites(
        self, request: pb.GrantPreviewWritesRequest, **kwargs: Any
    ) -> pb.GrantPreviewWritesResponse:
        reply = await self.stub.GrantPreviewWrites(request, **kwargs)
        self.grants.append(reply)
        return reply

    async def RecordWrittenPreviews(
        self, request: pb.RecordWrittenPreviewsRequest, **kwargs: Any
    ) -> pb.RecordWrittenPreviewsResponse:
        return await self.stub.RecordWrittenPreviews(request, **kwargs)


@pytest.mark.parametrize("older", [False, True], ids=["lease-grant", "older-preview-service"])
async def test_the_processor_writes_a_leases_previews_with_one_grant_or_per_slot_grants(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    s: Setup,
    monkeypatch: pytest.MonkeyPatch,
    older: bool,
) -> None:
    """The processor's direct writes ask for a lease grant and name their next slots too: one
    call and one signature for all of a job's slots from this preview service; one from
    before lease grants (which ignores the field) answers per-slot grants, used instead."""
    c, p = coordinator, preview
    if older:
        grants: WriteGrants = p.app.api.grants
        granted = grants.grant

        async def as_before(
            processor: str, request: pb.GrantPreviewWritesRequest
        ) -> pb.GrantPreviewWritesResponse:
            request.ClearField("lease_grant")
            return await granted(processor, request)

        monkeypatch.setattr(grants, "grant", as_before)
    await create_run(c, s, full=False)
    job = await claimed(c, s)
    stub = CountedGrants(p)

    async def call(method: Any, request: Any) -> Any:
        return await method(request, metadata=s.processor)

    direct = DirectPreviews(stub, call, lambda refused: RuntimeError(refused.message), CODE)
    images = [jpeg_bytes(seed=slot) for slot in range(5)]
    keys = []
    try:
        for slot, image in enumerate(images):
            keys.append(
                await direct.publish(
                    job,
                    slot,
                    job.input.slots[slot].start,
                    image,
                    JPEG,
                    [box()],
                    sha256_hex(image),
                )
            )
        await direct.settle(job.lease)
    finally:
        direct.close()
    assert keys == [
        object_key("preview", "r1", "j0", 1, slot, test=True, content_type=JPEG)
        for slot in range(5)
    ]
    assert await p.keys() == sorted(keys)
    assert len(stub.grants) == 1
    (reply,) = stub.grants
    if older:
        assert (reply.HasField("lease_grant"), len(reply.grants)) == (False, len(job.input.slots))
    else:
        assert (reply.HasField("lease_grant"), len(reply.grants)) == (True, 0)
