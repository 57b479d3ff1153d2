"""Previews under the fences of docs/leases-and-fences.md, through the preview service.

Each fence is tested both ways: a preview is published while it holds, and the next
one is refused with FAILED_PRECONDITION and the fence's reason once it does not.
"Stale lease, cancelled job, replaced recording, revoked key: each refuses the preview
and the bytes are collected by the next pass." The preview service checks a lease
once and reuses the answer for a while (PreviewSettings.lease_check_seconds, 10 s by
default), so a fence broken within that time lets the next publish write its bytes;
the coordinator refuses the record, keeps the object as collectable, and the next
cleanup pass deletes it. A lease that never passed the check (a wrong token, an
unknown run or job, or a check made after the breach) gets no byte written at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.leases.maintenance import Maintenance
from services.coordinator.platform.db import Record
from services.preview.settings import PreviewSettings
from services.preview.storage import ObjectStore
from testbed.coordinator_leases import Setup, claim, complete_request, empty_result, setup
from testbed.coordinator_world import DAY, error_reason, put_recording, run_request
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness, publish_request, running_preview
from testbed.harness.s3 import S3Bucket
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import workshop_pb2 as ws

Breach = Callable[[CoordinatorHarness], Awaitable[object]]


async def cancel(c: CoordinatorHarness) -> None:
    await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)


async def lapse(c: CoordinatorHarness) -> None:
    c.clock.advance(timedelta(minutes=6))


async def lapse_and_rescue(c: CoordinatorHarness) -> None:
    c.clock.advance(timedelta(minutes=6))
    await Maintenance(c.db, c.clock, interval_seconds=1).run_once()


async def replace_recording(c: CoordinatorHarness) -> None:
    await put_recording(c, "cam-a-0", "cam-a", DAY + timedelta(hours=8))  # identical bytes


async def revoke_creator(c: CoordinatorHarness) -> None:
    async with c.db.connection() as connection:
        key_id = await connection.fetchval("SELECT key_id FROM keys WHERE name = 'creator'")
    await c.operator.RevokeKey(op.RevokeKeyRequest(key_id=key_id), metadata=c.admin)


async def raise_policy(c: CoordinatorHarness) -> None:
    await c.operator.RaisePolicyRevision(op.RaisePolicyRevisionRequest(), metadata=c.admin)


# Each breach, its reason, and whether it ends the job (a full run's published previews
# then expire with it, so the same pass collects them too). A cancel ends it at once; a
# fence that can never pass again ends it in the call it refuses.
BREACHES = [
    pytest.param(lapse, "LEASE_MISMATCH", False, id="stale-lease"),
    pytest.param(cancel, "JOB_CANCELLED", True, id="cancelled-job"),
    pytest.param(replace_recording, "SOURCE_CHANGED", True, id="replaced-recording"),
    pytest.param(revoke_creator, "AUTHORITY_REVOKED", True, id="revoked-key"),
    pytest.param(raise_policy, "POLICY_CHANGED", True, id="policy-raised"),
]


async def started(c: CoordinatorHarness, *, full: bool) -> tuple[Setup, jobs_pb2.ClaimedJob]:
    """A run created by an Agent key named 'creator' (so it can be revoked); j0 claimed."""
    s = await setup(c)
    creator = await c.key(Grant(ScopeName.WORKSHOP), name="creator")
    mode = common_pb2.RUN_MODE_FULL if full else common_pb2.RUN_MODE_TEST
    await c.workshop.CreateRun(
        run_request("r1", "yard", s.world.tracking_runtime, mode=mode),
        metadata=bearer_metadata(creator),
    )
    job = await claim(c, s)
    assert job is not None
    return s, job


async def cleanup_pass(c: CoordinatorHarness, p: PreviewHarness) -> pb.RunCleanupResponse:
    reply: pb.RunCleanupResponse = await p.stub.RunCleanup(pb.RunCleanupRequest(), metadata=c.admin)
    return reply


async def row_for(c: CoordinatorHarness, key: str) -> Record | None:
    """The coordinator's row for an object key, if any."""
    async with c.db.connection() as connection:
        row: Record | None = await connection.fetchrow(
            "SELECT published_at, collectable_at, deleted_at FROM staged_objects "
            "WHERE object_key = $1",
            key,
        )
    return row


async def refused_publish(
    p: PreviewHarness, s: Setup, request: pb.PublishPreviewRequest
) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await p.stub.PublishPreview(request, metadata=s.processor)
    assert caught.value.details()  # the coordinator's message, passed through
    code, reason, _ = error_reason(caught.value)
    return code, reason


def slot_key(first: str, slot: int) -> str:
    """The key the same lease writes for another slot (keys are deterministic)."""
    return first.replace("/0.jpg", f"/{slot}.jpg")


@pytest.mark.parametrize(("breach", "reason", "ends_job"), BREACHES)
async def test_a_fence_broken_after_a_publish_refuses_the_next_and_the_next_pass_collects_it(
    coordinator: CoordinatorHarness,
    s3_bucket: S3Bucket,
    breach: Breach,
    reason: str,
    ends_job: bool,
) -> None:
    c = coordinator
    s, job = await started(c, full=True)
    async with running_preview(c, s3_bucket) as p:
        assert p.settings.lease_check_seconds == 10.0  # the default: the answer is reused
        accepted = await p.stub.PublishPreview(publish_request(job, 0), metadata=s.processor)
        await breach(c)
        refused = await refused_publish(p, s, publish_request(job, 1))
        assert refused == (grpc.StatusCode.FAILED_PRECONDITION, reason)
        refused_key = slot_key(accepted.object_key, 1)
        # the lease held when last checked: the bytes were written, then the record refused
        assert await p.keys() == [accepted.object_key, refused_key]
        row = await row_for(c, refused_key)
        assert row is not None
        assert row["published_at"] is None
        assert row["collectable_at"] == c.clock.now()

        report = await cleanup_pass(c, p)
        assert report.previews_deleted == (2 if ends_job else 1)
        assert report.unrecorded_previews_found == 0  # the refusal recorded the object
        assert await p.keys() == ([] if ends_job else [accepted.object_key])
        row = await row_for(c, refused_key)
        assert row is not None
        assert row["deleted_at"] == c.clock.now()
        assert (await cleanup_pass(c, p)).previews_deleted == 0


@pytest.mark.parametrize(("breach", "reason", "ends_job"), BREACHES)
async def test_with_the_lease_checked_on_every_publish_a_broken_fence_writes_no_bytes(
    coordinator: CoordinatorHarness,
    s3_bucket: S3Bucket,
    breach: Breach,
    reason: str,
    ends_job: bool,
) -> None:
    c = coordinator
    s, job = await started(c, full=True)
    async with running_preview(c, s3_bucket, lease_check_seconds=0.0) as p:
        accepted = await p.stub.PublishPreview(publish_request(job, 0), metadata=s.processor)
        await breach(c)
        refused = await refused_publish(p, s, publish_request(job, 1))
        assert refused == (grpc.StatusCode.FAILED_PRECONDITION, reason)
        assert await p.keys() == [accepted.object_key]  # CheckLease refused: nothing written
        assert await row_for(c, slot_key(accepted.object_key, 1)) is None
        report = await cleanup_pass(c, p)
        assert report.previews_deleted == (1 if ends_job else 0)


def wrong_token(request: pb.PublishPreviewRequest) -> None:
    request.lease.token = "00000000-0000-4000-8000-000000000000"


def unknown_run(request: pb.PublishPreviewRequest) -> None:
    request.lease.run_id = "nope"


def unknown_job(request: pb.PublishPreviewRequest) -> None:
    request.lease.job_id = "j99"


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        pytest.param(wrong_token, (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_MISMATCH")),
        pytest.param(unknown_run, (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")),
        pytest.param(unknown_job, (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")),
    ],
)
async def test_a_lease_that_never_held_gets_no_bytes_written(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    change: Callable[[pb.PublishPreviewRequest], None],
    refusal: tuple[grpc.StatusCode, str],
) -> None:
    c, p = coordinator, preview
    s, job = await started(c, full=False)
    request = publish_request(job, 0)
    change(request)
    assert await refused_publish(p, s, request) == refusal
    assert await p.keys() == []
    assert await c.count("staged_objects") == 0
    # the true lease still publishes through the same service
    published = await p.stub.PublishPreview(publish_request(job, 0), metadata=s.processor)
    assert await p.keys() == [published.object_key]


class HookedStore(ObjectStore):
    """Runs `after_put` once the bytes are in the bucket: a fence breaks mid-publish."""

    after_put: Callable[[], Awaitable[object]] | None = None

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        await super().put(key, data, content_type)
        if self.after_put is not None:
            await self.after_put()


@pytest.mark.parametrize(
    ("breach", "reason", "full"),
    [
        (cancel, "JOB_CANCELLED", False),
        (cancel, "JOB_CANCELLED", True),
        (lapse_and_rescue, "LEASE_MISMATCH", True),
    ],
)
async def test_bytes_refused_between_write_and_record_are_deleted_by_the_next_pass(
    coordinator: CoordinatorHarness,
    s3_bucket: S3Bucket,
    breach: Breach,
    reason: str,
    full: bool,
) -> None:
    """Even a lease checked on every publish breaks between the write and the record."""
    c = coordinator
    s, job = await started(c, full=full)
    stores: list[HookedStore] = []

    def hooked(settings: PreviewSettings) -> ObjectStore:
        stores.append(HookedStore(settings))
        return stores[-1]

    async with running_preview(c, s3_bucket, store_factory=hooked, lease_check_seconds=0.0) as p:
        first = await p.stub.PublishPreview(publish_request(job, 0), metadata=s.processor)
        stores[0].after_put = lambda: breach(c)
        refused = await refused_publish(p, s, publish_request(job, 1))
        assert refused == (grpc.StatusCode.FAILED_PRECONDITION, reason)
        refused_key = slot_key(first.object_key, 1)
        assert await p.keys() == sorted([first.object_key, refused_key])
        row = await row_for(c, refused_key)
        assert row is not None
        assert row["published_at"] is None

        report = await cleanup_pass(c, p)
        remaining = await p.keys()
        assert refused_key not in remaining
        # A test run's published preview lives out its hour; a full run's ends with its job.
        assert remaining == ([] if full else [first.object_key])
        assert report.previews_deleted == (2 if full else 1)
        row = await row_for(c, refused_key)
        assert row is not None
        assert row["deleted_at"] == c.clock.now()


async def test_a_preview_out_of_slot_order_is_refused_and_its_bytes_collected_by_the_next_pass(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> None:
    c = coordinator
    s, job = await started(c, full=False)
    async with running_preview(c, s3_bucket) as p:
        kept = await p.stub.PublishPreview(publish_request(job, 2), metadata=s.processor)
        # out of order: the lease holds, so the bytes are written and the record refused
        code, reason = await refused_publish(p, s, publish_request(job, 1))
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
        refused_key = "workshop-tests/previews/r1/j0/1/1.jpg"
        assert await p.keys() == [refused_key, kept.object_key]
        # a slot the job does not have is refused before any byte is written
        beyond = publish_request(job, 2)
        beyond.slot_index = len(job.input.slots)
        code, reason = await refused_publish(p, s, beyond)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")

        report = await cleanup_pass(c, p)  # while the job still runs
        assert report.previews_deleted == 1
        assert await p.keys() == [kept.object_key]  # the published one lives out its hour
        await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
        c.clock.advance(timedelta(minutes=61))
        assert (await cleanup_pass(c, p)).previews_deleted == 1
        assert await p.keys() == []
