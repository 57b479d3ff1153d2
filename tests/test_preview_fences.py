"""Previews under the fences of SPEC §7, through the preview service.

Each fence is tested both ways: a preview is published while it holds, and the next
one is refused with FAILED_PRECONDITION and the fence's reason once it does not. A
refusal at staging writes no bytes at all; a refusal after the bytes are written
(between StageObject and RecordPreview) leaves them to the next cleanup pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import grpc
import pytest

from services.coordinator.auth import Grant, ScopeName
from services.coordinator.maintenance import Maintenance
from services.preview.settings import PreviewSettings
from services.preview.storage import ObjectStore
from tests.coordinator_leases import Setup, claim, complete_request, empty_result, setup
from tests.coordinator_world import DAY, error_reason, put_recording, run_request
from tests.harness.coordinator import CoordinatorHarness
from tests.harness.preview import PreviewHarness, publish_request, running_preview
from tests.harness.s3 import S3Bucket
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


@pytest.mark.parametrize(
    ("breach", "reason"),
    [
        (lapse, "LEASE_MISMATCH"),
        (cancel, "JOB_CANCELLED"),
        (replace_recording, "SOURCE_CHANGED"),
        (revoke_creator, "AUTHORITY_REVOKED"),
        (raise_policy, "POLICY_CHANGED"),
    ],
)
async def test_a_broken_fence_refuses_the_preview_before_any_byte_is_written(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket, breach: Breach, reason: str
) -> None:
    c = coordinator
    s, job = await started(c, full=True)
    async with running_preview(c, s3_bucket) as p:
        accepted = await p.stub.PublishPreview(publish_request(job, 0), metadata=s.processor)
        await breach(c)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await p.stub.PublishPreview(publish_request(job, 1), metadata=s.processor)
        code, got, _ = error_reason(caught.value)
        assert (code, got) == (grpc.StatusCode.FAILED_PRECONDITION, reason)
        assert caught.value.details()  # the coordinator's message, passed through
        assert await p.keys() == [accepted.object_key]  # the refused attempt wrote nothing
        async with c.db.connection() as connection:
            staged = await connection.fetchval(
                "SELECT count(*) FROM staged_objects WHERE slot_index = 1"
            )
        assert staged == 0
        await cleanup_pass(c, p)
        assert "previews/r1/j0/1/1.jpg" not in await p.keys()


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
async def test_bytes_refused_between_stage_and_publish_are_deleted_by_the_next_pass(
    coordinator: CoordinatorHarness,
    s3_bucket: S3Bucket,
    breach: Breach,
    reason: str,
    full: bool,
) -> None:
    c = coordinator
    s, job = await started(c, full=full)
    stores: list[HookedStore] = []

    def hooked(settings: PreviewSettings) -> ObjectStore:
        stores.append(HookedStore(settings))
        return stores[-1]

    async with running_preview(c, s3_bucket, store_factory=hooked) as p:
        first = await p.stub.PublishPreview(publish_request(job, 0), metadata=s.processor)
        stores[0].after_put = lambda: breach(c)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await p.stub.PublishPreview(publish_request(job, 1), metadata=s.processor)
        assert error_reason(caught.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, reason)
        refused_key = first.object_key.replace("/0.jpg", "/1.jpg")
        assert sorted(await p.keys()) == sorted([first.object_key, refused_key])
        async with c.db.connection() as connection:
            published = await connection.fetchval(
                "SELECT published_at FROM staged_objects WHERE object_key = $1", refused_key
            )
        assert published is None

        report = await cleanup_pass(c, p)
        remaining = await p.keys()
        assert refused_key not in remaining
        # A test run's published preview lives out its hour; a full run's ends with its job.
        assert remaining == ([] if full else [first.object_key])
        assert report.previews_deleted == (2 if full else 1)
        async with c.db.connection() as connection:
            deleted = await connection.fetchval(
                "SELECT deleted_at FROM staged_objects WHERE object_key = $1", refused_key
            )
        assert deleted == c.clock.now()


async def test_a_test_runs_refused_preview_bytes_are_collected_after_its_job_completes(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> None:
    c = coordinator
    s, job = await started(c, full=False)
    async with running_preview(c, s3_bucket) as p:
        await p.stub.PublishPreview(publish_request(job, 2), metadata=s.processor)
        with pytest.raises(grpc.aio.AioRpcError) as caught:  # out of order: refused after put
            await p.stub.PublishPreview(publish_request(job, 1), metadata=s.processor)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "workshop-tests/previews/r1/j0/1/1.jpg" in await p.keys()
        await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
        c.clock.advance(timedelta(minutes=61))
        await cleanup_pass(c, p)
        assert await p.keys() == []
