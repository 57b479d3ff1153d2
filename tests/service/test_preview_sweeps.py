"""Sweeps for preview bytes written but never recorded, and group commit of records.

A preview's bytes are written before the coordinator records them, so a preview
service that stops in between leaves bytes no row knows. Once every preview of the
job has expired (a full run's when the job ended, a test run's when its hour passed)
and ten minutes have gone by since the job ended (the coordinator's SWEEP_GRACE, on
its clock), a cleanup pass lists the job's preview prefix, the coordinator records
what it did not know as collectable, and the same pass deletes it.

Concurrent publishes of one processor share RecordPreviews calls (services/preview/
recorder.py); a refusal of one preview in such a call is that preview's alone.

Real gRPC, SeaweedFS, Postgres, coordinator and preview service. Objects "written but
never recorded" are put straight into the bucket with the service's own store.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, timedelta
from typing import Any

import grpc
import pytest
import urllib3

from services.coordinator.platform.db import Record
from services.preview.settings import PreviewSettings
from services.preview.storage import ObjectStore
from testbed.coordinator_leases import (
    Setup,
    claim,
    claimed,
    complete_request,
    create_run,
    empty_result,
    leased,
    setup,
)
from testbed.coordinator_world import CODE, error_reason, run_request, save_workflow, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import (
    CountingStore,
    PreviewHarness,
    box,
    jpeg_bytes,
    publish_request,
    running_preview,
)
from testbed.harness.s3 import S3Bucket
from workshop.kit.errors import FailedPrecondition, WorkshopError
from workshop.kit.hashing import sha256_hex
from workshop.kit.object_keys import object_key
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

SWEEP_GRACE = timedelta(minutes=10)
SECOND = timedelta(seconds=1)


def preview_key(job: jobs_pb2.ClaimedJob, slot: int, *, test: bool, generation: int = 0) -> str:
    """The key the preview service writes `slot`'s preview under for `job`'s lease."""
    lease = job.lease
    return object_key(
        "preview",
        lease.run_id,
        lease.job_id,
        generation or lease.generation,
        slot,
        test=test,
        content_type="image/jpeg",
    )


async def put_unrecorded(p: PreviewHarness, keys: Sequence[str], image: bytes) -> None:
    """Bytes as a preview service leaves them when it stops between the write and the
    record: in the bucket, under the lease's key, with no row."""
    await asyncio.gather(*(p.store.put(key, image, "image/jpeg") for key in keys))


async def row_for(c: CoordinatorHarness, key: str) -> Record | None:
    async with c.db.connection() as connection:
        row: Record | None = await connection.fetchrow(
            "SELECT published_at, collectable_at, deleted_at, byte_size FROM staged_objects "
            "WHERE object_key = $1",
            key,
        )
    return row


async def cleanup(c: CoordinatorHarness, p: PreviewHarness) -> pb.RunCleanupResponse:
    reply: pb.RunCleanupResponse = await p.stub.RunCleanup(pb.RunCleanupRequest(), metadata=c.admin)
    return reply


def found_and_deleted(report: pb.RunCleanupResponse) -> tuple[int, int]:
    return report.unrecorded_previews_found, report.previews_deleted


async def end_job(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, how: str) -> None:
    if how == "complete":
        await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
    else:
        run = ws.CancelRunRequest(run_id=job.lease.run_id)
        await c.workshop.CancelRun(run, metadata=c.admin)


@pytest.mark.parametrize(
    ("full", "how"),
    [
        pytest.param(True, "complete", id="full-run-completed"),
        pytest.param(True, "cancel", id="full-run-cancelled"),
        pytest.param(False, "complete", id="test-run-completed"),
    ],
)
async def test_bytes_written_but_never_recorded_are_swept_once_the_job_has_ended(
    coordinator: CoordinatorHarness, preview: PreviewHarness, full: bool, how: str
) -> None:
    c, p = coordinator, preview
    s = await setup(c)
    await create_run(c, s, full=full)
    job = await claimed(c, s)
    recorded = await p.stub.PublishPreview(publish_request(job, 0), metadata=s.processor)
    orphan = preview_key(job, 1, test=not full)
    image = jpeg_bytes(seed=1)
    await put_unrecorded(p, [orphan], image)  # the service stopped before recording slot 1
    assert await row_for(c, orphan) is None
    await end_job(c, s, job, how)

    # A full run's recorded preview expires with its job; the sweep waits out its grace.
    c.clock.advance(SWEEP_GRACE - SECOND)
    early = await cleanup(c, p)
    assert found_and_deleted(early) == ((0, 1) if full else (0, 0))
    assert await p.keys() == ([orphan] if full else sorted([recorded.object_key, orphan]))
    if not full:
        # a test run's previews live out the run's hour, and so do unrecorded bytes
        hour_left = job.input.expires_at.ToDatetime(tzinfo=UTC) - c.clock.now()
        assert hour_left > SECOND
        c.clock.advance(hour_left - SECOND)
        assert found_and_deleted(await cleanup(c, p)) == (0, 0)
        assert await p.keys() == sorted([recorded.object_key, orphan])
    c.clock.advance(SECOND)

    swept = await cleanup(c, p)
    assert found_and_deleted(swept) == ((1, 1) if full else (1, 2))
    unrecorded_row = await row_for(c, orphan)
    assert unrecorded_row is not None
    assert unrecorded_row["published_at"] is None  # collectable, never shown
    assert unrecorded_row["deleted_at"] == c.clock.now()
    assert unrecorded_row["byte_size"] == len(image)  # the size S3 listed
    assert await p.keys() == []
    assert found_and_deleted(await cleanup(c, p)) == (0, 0)


@pytest.mark.parametrize("full", [True, False], ids=["full-run", "test-run"])
async def test_whatever_a_lease_grant_wrote_and_no_record_named_is_swept(
    coordinator: CoordinatorHarness, preview: PreviewHarness, full: bool
) -> None:
    """A lease grant lets the processor write any key under the lease's preview prefix, not
    only its slots' keys: every such object (a slot's key never recorded, another
    extension, deeper paths, a name the store normalises) is under the job's preview
    prefix, so its sweep records and deletes it; the recorded preview stays until it
    expires with the job, then goes as any other."""
    c, p = coordinator, preview
    s = await setup(c)
    await create_run(c, s, full=full)
    job = await claimed(c, s)
    request = pb.GrantPreviewWritesRequest(
        lease=job.lease, code_sha256=CODE, content_type="image/jpeg", lease_grant=True
    )
    grant = (await p.stub.GrantPreviewWrites(request, metadata=s.processor)).lease_grant
    prefix = grant.key_prefix
    image = jpeg_bytes(seed=2)
    written = [
        f"{prefix}0.jpg",  # recorded below
        f"{prefix}1.jpg",  # a slot's key, never recorded
        f"{prefix}1.png",
        f"{prefix}extra/deeper/1.jpg",
        f"{prefix}%2e%2e/1.jpg",
        f"{prefix}/7.jpg",  # SeaweedFS stores it as {prefix}7.jpg
        f"{prefix}{'x' * 200}/{'y' * 200}/{'z' * 200}.jpg",  # long keys (255 a segment)
    ]
    http = urllib3.PoolManager()
    for key in written:
        fields: dict[str, Any] = dict(grant.fields)
        fields["key"] = key
        fields["file"] = ("image", image, "image/jpeg")
        response = await asyncio.to_thread(http.request, "POST", grant.url, fields=fields)
        assert response.status == 204, (key, response.data[:300])
    stored = await p.keys()
    assert len(stored) == len(written)
    assert all(key.startswith(prefix) for key in stored)
    first = pb.WrittenPreview(
        lease=job.lease,
        code_sha256=CODE,
        slot_index=0,
        object_key=written[0],
        frame_time=job.input.slots[0].start,
        byte_size=len(image),
        sha256=sha256_hex(image),
        content_type="image/jpeg",
    )
    reply = await p.stub.RecordWrittenPreviews(
        pb.RecordWrittenPreviewsRequest(previews=[first]), metadata=s.processor
    )
    assert reply.outcomes[0].recorded.object_key == written[0]
    await end_job(c, s, job, "complete")
    if not full:  # a test run's previews live out the run's hour
        c.clock.advance(job.input.expires_at.ToDatetime(tzinfo=UTC) - c.clock.now())
    c.clock.advance(SWEEP_GRACE)
    found, deleted = found_and_deleted(await cleanup(c, p))
    assert (found, deleted) == (len(written) - 1, len(written))
    assert await p.keys() == []
    for key in stored:
        if key != written[0]:
            row = await row_for(c, key)
            assert row is not None, key
            assert row["published_at"] is None, key


async def test_two_replicas_sweeping_at_once_delete_each_unrecorded_object_exactly_once(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> None:
    c = coordinator
    s = await setup(c, spec_kwargs={"cameras": ("cam-a", "cam-b")})  # 4 one-hour jobs
    await create_run(c, s, full=True)
    jobs = [await claimed(c, s) for _ in range(4)]
    swept, late = jobs[:3], jobs[3]
    stores: list[CountingStore] = []

    def counting(settings: PreviewSettings) -> ObjectStore:
        stores.append(CountingStore(settings))
        return stores[-1]

    async with (
        running_preview(c, s3_bucket, store_factory=counting) as a,
        running_preview(c, s3_bucket, store_factory=counting) as b,
    ):
        for job in jobs:
            for slot in (0, 1):
                await a.stub.PublishPreview(publish_request(job, slot), metadata=s.processor)
        orphans = [preview_key(job, slot, test=False) for job in swept for slot in range(2, 42)]
        await put_unrecorded(a, orphans, b"x")
        for job in swept:
            await end_job(c, s, job, "complete")
        # the swept jobs' recorded previews expired with them and go first, alone
        assert found_and_deleted(await cleanup(c, a)) == (0, 6)
        await advance_holding(c, s, late, SWEEP_GRACE)
        await end_job(c, s, late, "complete")  # its previews expire now; its sweep waits
        late_previews = [preview_key(late, slot, test=False) for slot in (0, 1)]
        assert await a.keys("previews/r1/") == sorted(orphans + late_previews)
        for store in stores:
            store.removed.clear()
        for replica in (a, b):  # small batches, so that the passes interleave
            replica.app.cleanup.preview_batch = 1

        reports = await asyncio.gather(cleanup(c, a), cleanup(c, b))
        assert sum(r.previews_deleted for r in reports) == len(orphans) + 2 == 122
        assert sum(r.unrecorded_previews_found for r in reports) == len(orphans)
        assert all(store.removed for store in stores)  # both took part
        removals = Counter(key for store in stores for key in store.removed)
        assert sorted(removals) == sorted(orphans + late_previews)
        assert set(removals.values()) == {1}
        assert [store.failures for store in stores] == [[], []]
        assert await a.keys() == []
        again = await asyncio.gather(cleanup(c, a), cleanup(c, b))
        assert [found_and_deleted(r) for r in again] == [(0, 0), (0, 0)]


async def advance_holding(
    c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, span: timedelta
) -> None:
    """Moves the clock by `span`, renewing `job`'s 5-minute lease as a processor does."""
    step = timedelta(minutes=4)
    while span > timedelta(0):
        c.clock.advance(min(step, span))
        span -= step
        await c.jobs.Heartbeat(jobs_pb2.HeartbeatRequest(lease=job.lease), metadata=s.processor)


class ListingHookedStore(ObjectStore):
    """Runs `after_listing` once a sweep's prefix is listed, before the pass settles it."""

    after_listing: Callable[[], Awaitable[object]] | None = None

    async def list_under(self, prefix: str) -> list[tuple[str, int]]:
        found = await super().list_under(prefix)
        if self.after_listing is not None:
            await self.after_listing()
        return found


async def test_a_preview_deleted_by_another_replica_during_a_sweep_is_not_found_again(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> None:
    c = coordinator
    s, job = await leased(c)
    hooked: list[ListingHookedStore] = []

    def hooking(settings: PreviewSettings) -> ObjectStore:
        hooked.append(ListingHookedStore(settings))
        return hooked[-1]

    async with (
        running_preview(c, s3_bucket, store_factory=hooking) as a,
        running_preview(c, s3_bucket) as b,
    ):
        for slot in (0, 1):
            await a.stub.PublishPreview(publish_request(job, slot), metadata=s.processor)
        orphan = preview_key(job, 2, test=False)
        await put_unrecorded(a, [orphan], b"x")
        await end_job(c, s, job, "cancel")  # both previews collectable now
        c.clock.advance(SWEEP_GRACE)
        # a's pass holds slot 0's preview and the job's sweep; b's pass, run while a's
        # sweep has listed the prefix, takes slot 1's preview and deletes it
        a.app.cleanup.preview_batch = 1
        b_reports: list[pb.RunCleanupResponse] = []

        async def b_passes() -> None:
            hooked[0].after_listing = None
            b_reports.append(await cleanup(c, b))

        hooked[0].after_listing = b_passes
        a_report = await cleanup(c, a)
        assert [found_and_deleted(r) for r in b_reports] == [(0, 1)]
        assert await a.keys() == []
        assert found_and_deleted(a_report) == (1, 2)  # the orphan and slot 0's preview


# group commit -------------------------------------------------------------------------------

SLOTS = 10
CANCEL_AFTER = 5  # slots the cancelled job publishes before its run is cancelled


async def five_jobs_of_one_processor(
    c: CoordinatorHarness,
) -> tuple[Setup, list[jobs_pb2.ClaimedJob]]:
    """r1 (tracking runtime): 4 jobs over cam-a and cam-b; r2 (the plain runtime, so it
    runs beside r1): 1 job over cam-b 08:00-09:00. All claimed with one processor key."""
    s = await setup(c, spec_kwargs={"cameras": ("cam-a", "cam-b")})
    await create_run(c, s, "r1", full=True)
    await save_workflow(c, "yard-b", workflow_spec(cameras=("cam-b",), window=(8, 9)))
    await c.workshop.CreateRun(
        run_request("r2", "yard-b", s.world.plain_runtime, mode=common_pb2.RUN_MODE_FULL),
        metadata=c.admin,
    )
    jobs = [await claimed(c, s) for _ in range(4)]
    assert await claim(c, s) is None
    reply = await c.jobs.Claim(
        jobs_pb2.ClaimRequest(runtime_id=s.world.plain_runtime, code_sha256=CODE),
        metadata=s.processor,
    )
    assert reply.HasField("job")
    jobs.append(reply.job)
    assert [(job.lease.run_id, len(job.input.slots) >= SLOTS) for job in jobs] == [
        ("r1", True)
    ] * 4 + [("r2", True)]
    return s, jobs


class Batches:
    """Spies on the service's RecordPreviews calls: each call's outcomes (True: recorded)."""

    def __init__(self, p: PreviewHarness, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[bool]] = []
        coordinator = p.app.api.coordinator
        record_previews = coordinator.record_previews

        async def spy(
            requests: Sequence[pub.RecordPreviewRequest], processor: str
        ) -> list[pub.RecordPreviewResponse | WorkshopError]:
            outcomes = await record_previews(requests, processor)
            self.calls.append([not isinstance(o, WorkshopError) for o in outcomes])
            return outcomes

        monkeypatch.setattr(coordinator, "record_previews", spy)


async def test_concurrent_publishes_of_one_processor_succeed_and_a_cancelled_job_is_refused_alone(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = coordinator
    s, jobs = await five_jobs_of_one_processor(c)
    cancelled = jobs[-1]
    # the lease answers outlive the test, so every refusal is the record's, after the write
    async with running_preview(c, s3_bucket, lease_check_seconds=600.0) as p:
        batches = Batches(p, monkeypatch)

        async def publish_in_order(job: jobs_pb2.ClaimedJob) -> list[str | tuple[Any, ...]]:
            outcomes: list[str | tuple[Any, ...]] = []
            for slot in range(SLOTS):
                if job is cancelled and slot == CANCEL_AFTER:
                    run = ws.CancelRunRequest(run_id=job.lease.run_id)
                    await c.workshop.CancelRun(run, metadata=c.admin)
                try:
                    reply = await p.stub.PublishPreview(
                        publish_request(job, slot), metadata=s.processor
                    )
                except grpc.aio.AioRpcError as error:
                    outcomes.append(error_reason(error)[:2])
                else:
                    assert reply.object_key == preview_key(job, slot, test=False)
                    outcomes.append(reply.item_id)
            return outcomes

        results = await asyncio.gather(*(publish_in_order(job) for job in jobs))

        refusal = (grpc.StatusCode.FAILED_PRECONDITION, "JOB_CANCELLED")
        assert results[-1][CANCEL_AFTER:] == [refusal] * (SLOTS - CANCEL_AFTER)
        item_ids = [
            outcome for outcomes in results for outcome in outcomes if isinstance(outcome, str)
        ]
        assert len(item_ids) == 4 * SLOTS + CANCEL_AFTER  # every other publish succeeded
        assert len(set(item_ids)) == len(item_ids)
        shown = await c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin)
        shown_ids = {image.item_id for image in shown.detail.recent_images}
        assert shown_ids
        assert shown_ids <= set(item_ids)

        outcomes = [outcome for call in batches.calls for outcome in call]
        assert len(outcomes) == 5 * SLOTS  # each publish recorded once, refusals included
        assert outcomes.count(False) == SLOTS - CANCEL_AFTER
        # whether records share calls here depends on timing; the next test batches for sure

        # the cancelled job's bytes (refused or published) go with the next pass
        report = await cleanup(c, p)
        assert report.previews_deleted == SLOTS
        assert await p.keys("previews/r2/") == []
        assert len(await p.keys("previews/r1/")) == 4 * SLOTS


def record_request(job: jobs_pb2.ClaimedJob, slot: int, image: bytes) -> pub.RecordPreviewRequest:
    """What the preview service records for `slot` once its bytes are written."""
    return pub.RecordPreviewRequest(
        lease=job.lease,
        code_sha256=CODE,
        slot_index=slot,
        object_key=preview_key(job, slot, test=False),
        frame_time=job.input.slots[slot].start,
        boxes=[box()],
        byte_size=len(image),
        sha256=sha256_hex(image),
        content_type="image/jpeg",
    )


async def test_a_refusal_in_a_batch_of_records_is_that_previews_alone(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = coordinator
    s, jobs = await five_jobs_of_one_processor(c)
    image = jpeg_bytes()
    async with running_preview(c, s3_bucket) as p:
        batches = Batches(p, monkeypatch)
        # r2's job, whose run is cancelled, in the middle of r1's
        requests = [record_request(job, 0, image) for job in (*jobs[:2], jobs[4], *jobs[2:4])]
        await put_unrecorded(p, [request.object_key for request in requests], image)
        await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r2"), metadata=c.admin)
        # all five queue before the recorder's sender task first runs: one call
        outcomes = await asyncio.gather(
            *(p.app.api.recorder.record(s.processor_secret, request) for request in requests),
            return_exceptions=True,
        )
        assert batches.calls == [[True, True, False, True, True]]
        refused = outcomes.pop(2)
        assert isinstance(refused, FailedPrecondition)
        assert refused.reason == "JOB_CANCELLED"
        assert all(isinstance(one, pub.RecordPreviewResponse) for one in outcomes)
        assert len({one.item_id for one in outcomes if not isinstance(one, BaseException)}) == 4
        refused_request = requests.pop(2)
        for request in requests:
            row = await row_for(c, request.object_key)
            assert row is not None
            assert row["published_at"] == c.clock.now()
        refused_row = await row_for(c, refused_request.object_key)
        assert refused_row is not None
        assert (refused_row["published_at"], refused_row["collectable_at"]) == (
            None,
            c.clock.now(),
        )
