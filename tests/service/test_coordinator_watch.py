"""Live run events (docs/runs-and-jobs.md): WatchRun streams the run detail on subscribe and
after each change, across coordinator replicas, and survives a database restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from testbed.coordinator_leases import (
    Setup,
    claim,
    complete_request,
    create_run,
    empty_result,
    frame_result,
    setup,
)
from testbed.coordinator_world import CODE
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from testbed.harness.postgres import PostgresCluster
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import workshop_pb2 as ws

WAIT = 10.0  # seconds: generous bound for an event to arrive on a busy CI machine


class Watcher:
    """Reads a WatchRun stream on a task so a test can await each message."""

    def __init__(self, c: CoordinatorHarness, run_id: str) -> None:
        self.call = c.workshop.WatchRun(ws.WatchRunRequest(run_id=run_id), metadata=c.admin)
        self.messages: asyncio.Queue[ws.WatchRunResponse] = asyncio.Queue()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.call:
            await self.messages.put(message)

    async def next(self) -> ws.WatchRunResponse:
        return await asyncio.wait_for(self.messages.get(), WAIT)

    async def until(self, predicate: object) -> ws.WatchRunResponse:
        while True:
            message = await self.next()
            if predicate(message):  # type: ignore[operator]
                return message

    def close(self) -> None:
        self.call.cancel()
        self.task.cancel()


@pytest.fixture
async def s(coordinator: CoordinatorHarness) -> Setup:
    built = await setup(coordinator)
    await create_run(coordinator, built)
    return built


@pytest.fixture
async def watcher(coordinator: CoordinatorHarness, s: Setup) -> AsyncIterator[Watcher]:
    watching = Watcher(coordinator, "r1")
    try:
        yield watching
    finally:
        watching.close()


async def test_watch_sends_detail_then_every_change_until_final(
    coordinator: CoordinatorHarness, s: Setup, watcher: Watcher
) -> None:
    c = coordinator
    first = await watcher.next()
    assert first.detail.run.status == common_pb2.RUN_STATUS_QUEUED
    assert not first.final
    jobs = [await claim(c, s), await claim(c, s)]
    assert jobs[0] is not None
    assert jobs[1] is not None
    running = await watcher.until(lambda m: m.detail.run.counts.jobs_leased == 2)
    assert running.detail.run.status == common_pb2.RUN_STATUS_RUNNING
    # each leased job shows when its lease lapses unless renewed
    leased = {job.job_id: job for job in running.detail.jobs}
    assert leased["j0"].lease_expires_at == jobs[0].lease_expires_at
    assert leased["j1"].lease_expires_at == jobs[1].lease_expires_at
    await c.jobs.ReportProgress(
        jobs_pb2.ReportProgressRequest(lease=jobs[0].lease, percent=42), metadata=s.processor
    )
    progressed = await watcher.until(lambda m: m.detail.jobs[0].progress_percent == 42)
    assert progressed.detail.jobs[0].job_id == "j0"
    result = await frame_result(c, s, jobs[0], frames=2)
    await c.jobs.Complete(complete_request(jobs[0], result), metadata=s.processor)
    await watcher.until(lambda m: m.detail.run.counts.jobs_completed == 1)
    await c.jobs.Complete(complete_request(jobs[1], empty_result(jobs[1])), metadata=s.processor)
    last = await watcher.until(lambda m: m.final)
    assert last.detail.run.status == common_pb2.RUN_STATUS_COMPLETED
    assert not any(job.HasField("lease_expires_at") for job in last.detail.jobs)
    counts = last.detail.run.counts
    assert (counts.slots_frame, counts.slots_empty, counts.items_saved) == (2, 118, 2)
    assert [image.source for image in last.detail.recent_images] == [2, 2]  # bucket items
    await asyncio.wait_for(watcher.task, WAIT)  # the stream ended after the final message


async def test_cancel_is_announced_as_final(
    coordinator: CoordinatorHarness, s: Setup, watcher: Watcher
) -> None:
    await watcher.next()
    await coordinator.workshop.CancelRun(
        ws.CancelRunRequest(run_id="r1"), metadata=coordinator.admin
    )
    last = await watcher.until(lambda m: m.final)
    assert last.detail.run.status == common_pb2.RUN_STATUS_CANCELLED


async def test_a_closed_watch_changes_nothing(coordinator: CoordinatorHarness, s: Setup) -> None:
    c = coordinator
    watching = Watcher(c, "r1")
    await watching.next()
    watching.close()
    job = await claim(c, s)
    assert job is not None
    await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
    assert await c.count("receipts") == 1


async def test_events_cross_coordinator_replicas(
    coordinator: CoordinatorHarness, s: Setup, watcher: Watcher, pg_dsn: str
) -> None:
    """The watcher is on one coordinator; the write goes through another, with its own
    pool and LISTEN connection, on the same database."""
    await watcher.next()
    async with running_coordinator(pg_dsn, clock=coordinator.clock) as other:
        reply = await other.jobs.Claim(
            jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE),
            metadata=s.processor,
        )
        assert reply.HasField("job")
        seen = await watcher.until(lambda m: m.detail.run.counts.jobs_leased == 1)
        assert seen.detail.jobs[0].generation == 1


async def test_watch_survives_a_database_restart(
    coordinator: CoordinatorHarness, s: Setup, watcher: Watcher, pg_cluster: PostgresCluster
) -> None:
    c = coordinator
    await watcher.next()
    pg_cluster.restart()
    # the pool reconnects on use; the hub reconnects on its own and re-announces
    for _ in range(50):
        try:
            job = await claim(c, s)
            break
        except Exception:
            await asyncio.sleep(0.2)
    assert job is not None
    seen = await watcher.until(lambda m: m.detail.run.counts.jobs_leased == 1)
    assert seen.detail.run.status == common_pb2.RUN_STATUS_RUNNING
