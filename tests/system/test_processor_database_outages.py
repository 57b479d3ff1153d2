"""The coordinator's database dropping out while a processor holds three jobs of a full
run, on the real components (see docs/leases-and-fences.md): every connection terminated
under a statement in flight, and Postgres stopped for five seconds and started again.

Neither is any job's fault, so neither may fail a job or spend one of its attempts: the
coordinator answers UNAVAILABLE (never INTERNAL), the preview service passes that on, the
processor asks again under the same leases, and the run completes within seconds of the
database's return. Before, the coordinator answered INTERNAL, the processor failed the job
with processor_failed, and when even that Fail got no answer the lease was left to lapse.

The fault is made at gates: the three jobs' previews of slot 2 are held until the
database is broken, so all three are leased and mid-job by construction.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import asyncpg
import pytest

from testbed.coordinator_world import run_request, save_workflow
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.postgres import PostgresDatabase, stopped, terminate_connections
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.processor_gates import Call, Spy, rows, until
from tests.processor_world import (
    SECONDS,
    build_world,
    finished,
    running_processor,
    yard_spec,
)
from workshop.v1 import common_pb2, preview_pb2_grpc

pytestmark = pytest.mark.triton
THREE = ("cam-a", "cam-b", "cam-c")
SLOTS = SECONDS // 2  # slots per job
HELD_SLOT = 2
OUTAGE_SECONDS = 5.0
# A correctness bound, not a speed claim: a lapsed lease would take five minutes.
BACK_WITHIN_SECONDS = 30.0

log = logging.getLogger(__name__)


async def three_job_run(
    c: CoordinatorHarness, preview: PreviewHarness, triton: TritonServer, tmp: Path
) -> str:
    """Full run r1 over cam-a, cam-b and cam-c (one job each); the runtime's id."""
    world = await build_world(c, preview, triton, tmp, cameras=THREE)
    await save_workflow(c, "yard", yard_spec(world.model, THREE))
    await c.workshop.CreateRun(
        run_request("r1", "yard", world.runtime_id, mode=common_pb2.RUN_MODE_FULL),
        metadata=c.admin,
    )
    return world.runtime_id


def held_previews(preview: PreviewHarness, log_: list[Call]) -> Spy:
    return Spy(
        preview_pb2_grpc.PreviewServiceStub(preview.channel),
        log_,
        hold=lambda method, request: method == "PublishPreview" and request.slot_index == HELD_SLOT,
    )


async def assert_completed_without_a_lapse(c: CoordinatorHarness) -> None:
    detail = await finished(c, "r1")
    assert detail.run.status == common_pb2.RUN_STATUS_COMPLETED, detail
    assert [(job.state, job.generation) for job in detail.jobs] == [
        (common_pb2.JOB_STATE_COMPLETED, 1)
    ] * 3  # each under its first lease: no hand-back, no lapse
    assert (detail.run.counts.slots_frame, detail.run.counts.items_saved) == (3 * SLOTS,) * 2
    lapses = await rows(c, "SELECT lapses FROM jobs WHERE run_id = 'r1' ORDER BY job_index")
    assert lapses == [{"lapses": 0}] * 3
    receipts = await rows(c, "SELECT generation FROM receipts WHERE run_id = 'r1'")
    assert receipts == [{"generation": 1}] * 3


async def waiting_on_locks(pg_database: PostgresDatabase) -> int:
    """Backends of the test's database waiting for a lock (read on an admin connection:
    the coordinator's pool may be all waiting)."""
    connection = await asyncpg.connect(pg_database.cluster.admin_dsn)
    try:
        count: int = await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
            pg_database.name,
        )
    finally:
        await connection.close()
    return count


async def test_every_database_connection_terminated_mid_run_fails_no_job(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    pg_database: PostgresDatabase,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The three jobs' records of slot 2 wait behind row locks the test holds when every
    connection of the database is terminated (pg_terminate_backend): the statements in
    flight die with AdminShutdownError, the idle pooled connections and the LISTEN one are
    dropped. No job fails, none is handed back or lapses, and the run completes."""
    c = coordinator
    runtime_id = await three_job_run(c, preview, triton_server, tmp_path)
    calls: list[Call] = []
    previews = held_previews(preview, calls)
    loop = asyncio.get_running_loop()
    async with running_processor(
        c,
        preview,
        triton_server,
        runtime_id,
        previews=previews,
        heartbeat_seconds=1.0,
        direct_writes=False,  # one PublishPreview per frame: three jobs held at once
    ) as processor:
        await until(lambda: previews.waiting == 3, "all three jobs at slot 2's preview")
        locker = await asyncpg.connect(pg_database.dsn)
        try:
            await locker.execute("BEGIN")
            await locker.execute("SELECT 1 FROM jobs WHERE run_id = 'r1' FOR UPDATE")
            previews.gate.set()
            await until(lambda: waiting_on_locks(pg_database), "a write waiting on a lock")
            sparing = [await locker.fetchval("SELECT pg_backend_pid()")]
            with caplog.at_level(logging.WARNING, logger="services.coordinator.platform.db"):
                terminated = await terminate_connections(
                    pg_database.cluster, pg_database.name, sparing=sparing
                )
                await locker.execute("ROLLBACK")
                returned = loop.time()
                await assert_completed_without_a_lapse(c)
                completed = loop.time()
        finally:
            await locker.close()
        await until(lambda: processor.completed == 3, "the processor to count them")
        assert (processor.failed, processor.handed_back) == (0, 0)

    unreachable = [r.message for r in caplog.records if "database unreachable" in r.message]
    assert unreachable, "no statement met the terminated connections"
    log.warning(
        "terminated %d connections; the run completed %.1f s after the database returned",
        terminated,
        completed - returned,
    )
    assert completed - returned < BACK_WITHIN_SECONDS


async def test_postgres_stopped_for_five_seconds_mid_run_fails_no_job(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    pg_database: PostgresDatabase,
    tmp_path: Path,
) -> None:
    """Postgres is stopped (fast shutdown: every session ends with AdminShutdownError,
    new ones are refused) while the three jobs hold slot 2's preview, and started again
    five seconds later. Every call meanwhile is UNAVAILABLE and asked again; no job fails,
    none is handed back or lapses, and the run completes soon after the database is back."""
    c = coordinator
    runtime_id = await three_job_run(c, preview, triton_server, tmp_path)
    calls: list[Call] = []
    previews = held_previews(preview, calls)
    loop = asyncio.get_running_loop()
    async with running_processor(
        c,
        preview,
        triton_server,
        runtime_id,
        previews=previews,
        heartbeat_seconds=1.0,
        direct_writes=False,  # one PublishPreview per frame: three jobs held at once
    ) as processor:
        await until(lambda: previews.waiting == 3, "all three jobs at slot 2's preview")
        async with stopped(pg_database.cluster):
            previews.gate.set()
            await until(
                lambda: any(call.outcome == "UNAVAILABLE" for call in calls),
                "a publish that got no answer",
            )
            await asyncio.sleep(OUTAGE_SECONDS)
        returned = loop.time()
        await assert_completed_without_a_lapse(c)
        completed = loop.time()
        await until(lambda: processor.completed == 3, "the processor to count them")
        assert (processor.failed, processor.handed_back) == (0, 0)

    unanswered = {call.job for call in calls if call.outcome == "UNAVAILABLE"}
    assert unanswered == {"r1/j0", "r1/j1", "r1/j2"}  # each asked again under its lease
    assert {call.outcome for call in calls} <= {"ok", "UNAVAILABLE"}
    log.warning(
        "Postgres down %.0f s; the run completed %.1f s after it was back",
        OUTAGE_SECONDS,
        completed - returned,
    )
    assert completed - returned < BACK_WITHIN_SECONDS
