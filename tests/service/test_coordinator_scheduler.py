"""Daily schedules (docs/workflows.md): one full run per workflow and local day, never doubled."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest

from services.coordinator.runs.runs import Runs
from services.coordinator.runs.scheduler import Scheduler
from testbed.coordinator_world import World, build_world, save_workflow, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness
from workshop.v1 import common_pb2, workflow_pb2
from workshop.v1 import workshop_pb2 as ws

PREVIOUS_DAY = workflow_pb2.INPUT_DAY_PREVIOUS_DAY


def scheduler(c: CoordinatorHarness) -> Scheduler:
    return Scheduler(c.db, c.clock, Runs(c.db, c.clock), interval_seconds=60)


async def seen(c: CoordinatorHarness, runtime_id: str, minutes_ago: int = 0) -> None:
    async with c.db.connection() as connection:
        await connection.execute(
            "UPDATE runtimes SET last_seen_at = $2 WHERE runtime_id = $1",
            runtime_id,
            c.clock.now() - timedelta(minutes=minutes_ago),
        )


@pytest.fixture
async def world(coordinator: CoordinatorHarness) -> World:
    built = await build_world(coordinator)
    await save_workflow(coordinator, "yard", workflow_spec(day=PREVIOUS_DAY, schedule=(13, 30)))
    return built


async def test_creates_the_days_run_once_on_the_newest_runtime(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator  # the frozen clock says 2026-11-30 12:00 UTC
    await seen(c, world.tracking_runtime, minutes_ago=600)
    await seen(c, world.plain_runtime, minutes_ago=5)
    assert await scheduler(c).run_once() == []  # 13:30 has not come yet
    c.clock.advance(timedelta(hours=1, minutes=30))
    assert await scheduler(c).run_once() == ["yard-2026-11-30"]
    assert await scheduler(c).run_once() == []  # a restart finds the run and does nothing
    run = (
        await c.workshop.GetRun(ws.GetRunRequest(run_id="yard-2026-11-30"), metadata=c.admin)
    ).detail.run
    assert run.mode == common_pb2.RUN_MODE_FULL
    assert run.runtime_id == world.plain_runtime  # newest seen, even if hours ago
    assert run.created_by.kind == common_pb2.PRINCIPAL_KIND_SCHEDULER
    assert run.counts.jobs_total == 2  # cam-a's recordings of the previous day
    c.clock.advance(timedelta(days=1))
    assert await scheduler(c).run_once() == []  # the next day's input has no media


async def test_two_replicas_never_double_a_run(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    await seen(c, world.tracking_runtime)
    c.clock.advance(timedelta(hours=2))
    results = await asyncio.gather(*(scheduler(c).run_once() for _ in range(4)))
    assert sorted(run for created in results for run in created) == ["yard-2026-11-30"]
    assert await c.count("runs") == 1


async def test_schedule_follows_the_workflows_time_zone(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator  # 12:00 UTC is 21:00 in Tokyo
    await seen(c, world.tracking_runtime)
    await save_workflow(
        c,
        "tokyo",
        workflow_spec(day=PREVIOUS_DAY, schedule=(20, 0), time_zone="Asia/Tokyo", window=(0, 23)),
    )
    assert await scheduler(c).run_once() == ["tokyo-2026-11-30"]


async def test_without_any_runtime_nothing_is_created(
    coordinator: CoordinatorHarness, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    c = coordinator
    c.clock.advance(timedelta(hours=2))
    worker = scheduler(c)
    with caplog.at_level(logging.WARNING):
        assert await worker.run_once() == []
        assert await worker.run_once() == []  # reported once, not at every pass
    assert caplog.text.count("not created") == 1
    assert await c.count("runs") == 0


async def test_deleted_and_unscheduled_workflows_are_skipped(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    await seen(c, world.tracking_runtime)
    await save_workflow(c, "yard", workflow_spec(day=PREVIOUS_DAY), expected=1)
    c.clock.advance(timedelta(hours=2))
    assert await scheduler(c).run_once() == []


async def test_worker_runs_passes_until_stopped(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    await seen(c, world.tracking_runtime)
    c.clock.advance(timedelta(hours=2))
    worker = Scheduler(c.db, c.clock, Runs(c.db, c.clock), interval_seconds=0.05)
    await worker.start()
    try:
        for _ in range(200):
            if await c.count("runs"):
                break
            await asyncio.sleep(0.02)
    finally:
        await worker.stop()
    assert await c.count("runs") == 1
