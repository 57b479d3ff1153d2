"""Claim with a request id (idempotent Claim) on real Postgres over gRPC.

A Claim whose answer is lost (the coordinator stopped after committing, a reset
connection, a deadline) is asked again with the same request id; it must answer the
lease the first call took, not lease another job and strand that one until its lease
lapses (five minutes and one of three attempts). Each test throws the first answer
away, as the network would, and asks again.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.leases.maintenance import Maintenance
from testbed.coordinator_leases import (
    Metadata,
    Setup,
    complete_request,
    create_run,
    empty_result,
    setup,
)
from testbed.coordinator_world import CODE, error_reason
from testbed.harness.coordinator import CoordinatorHarness
from testbed.session_jobs import JOB_TRANSPORTS
from workshop.kit.auth import bearer_metadata
from workshop.v1 import jobs_pb2

FIRST = "3f2a9c0e5b7d4e11a0c2b4d6e8f01234"  # a uuid4 hex, as the processor sends
SECOND = "claim:2.b_c-d"


@pytest.fixture(params=JOB_TRANSPORTS)
def job_transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs twice: on JobService's unary calls and on a Session stream."""
    return str(request.param)


@pytest.fixture
async def s(coordinator: CoordinatorHarness) -> Setup:
    built = await setup(coordinator)
    await create_run(coordinator, built)  # r1: j0 (cam-a-0) and j1 (cam-a-1)
    return built


async def claim(
    c: CoordinatorHarness, s: Setup, request_id: str, metadata: Metadata | None = None
) -> jobs_pb2.ClaimedJob | None:
    reply = await c.jobs.Claim(
        jobs_pb2.ClaimRequest(
            runtime_id=s.world.tracking_runtime, code_sha256=CODE, request_id=request_id
        ),
        metadata=metadata or s.processor,
    )
    return reply.job if reply.HasField("job") else None


async def claimed(
    c: CoordinatorHarness, s: Setup, request_id: str, metadata: Metadata | None = None
) -> jobs_pb2.ClaimedJob:
    job = await claim(c, s, request_id, metadata)
    assert job is not None
    return job


async def leased(c: CoordinatorHarness) -> list[tuple[str, int, int]]:
    """(run, job index, generation) of every leased job."""
    async with c.db.connection() as connection:
        rows = await connection.fetch(
            "SELECT run_id, job_index, generation FROM jobs WHERE state = 'leased' "
            "ORDER BY run_id, job_index"
        )
    return [(r["run_id"], r["job_index"], r["generation"]) for r in rows]


def lease_of(job: jobs_pb2.ClaimedJob) -> tuple[str, str, int, str]:
    return (job.lease.run_id, job.lease.job_id, job.lease.generation, job.lease.token)


async def test_the_same_request_id_answers_the_same_lease_and_leases_nothing_else(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    first = await claimed(c, s, FIRST)  # its answer "lost": asked again
    c.clock.advance(timedelta(seconds=30))
    again = await claimed(c, s, FIRST)
    assert lease_of(again) == lease_of(first)
    assert again.lease_expires_at == first.lease_expires_at  # as stored, not renewed
    assert again.input == first.input
    assert again.snapshot == first.snapshot
    assert await leased(c) == [("r1", 0, 1)]  # j1 is still queued
    other = await claimed(c, s, SECOND)
    assert (other.lease.job_id, other.lease.generation) == ("j1", 1)
    assert await leased(c) == [("r1", 0, 1), ("r1", 1, 1)]
    # the answered-again lease is the live one: heartbeat and commit under it
    await c.jobs.Heartbeat(jobs_pb2.HeartbeatRequest(lease=again.lease), metadata=s.processor)
    await c.jobs.Complete(complete_request(again, empty_result(again)), metadata=s.processor)


async def test_a_heartbeat_renewal_is_answered_as_stored(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    first = await claimed(c, s, FIRST)
    c.clock.advance(timedelta(minutes=4))
    renewed = await c.jobs.Heartbeat(
        jobs_pb2.HeartbeatRequest(lease=first.lease), metadata=s.processor
    )
    again = await claimed(c, s, FIRST)
    assert lease_of(again) == lease_of(first)
    assert again.lease_expires_at == renewed.lease_expires_at != first.lease_expires_at


async def test_another_keys_claim_with_the_same_id_gets_its_own_job(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    other_key = bearer_metadata(
        await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="processor-2")
    )
    mine = await claimed(c, s, FIRST)
    theirs = await claimed(c, s, FIRST, other_key)
    assert (mine.lease.job_id, theirs.lease.job_id) == ("j0", "j1")
    assert lease_of(await claimed(c, s, FIRST, other_key)) == lease_of(theirs)
    assert lease_of(await claimed(c, s, FIRST)) == lease_of(mine)
    assert await leased(c) == [("r1", 0, 1), ("r1", 1, 1)]


async def test_after_the_lease_ends_the_same_id_claims_anew(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    done = await claimed(c, s, FIRST)
    await c.jobs.Complete(complete_request(done, empty_result(done)), metadata=s.processor)
    after_complete = await claimed(c, s, FIRST)
    assert (after_complete.lease.job_id, after_complete.lease.generation) == ("j1", 1)
    await c.jobs.Release(jobs_pb2.ReleaseRequest(lease=after_complete.lease), metadata=s.processor)
    after_release = await claimed(c, s, FIRST)  # j1 again, under a fresh lease
    assert (after_release.lease.job_id, after_release.lease.generation) == ("j1", 2)
    assert after_release.lease.token != after_complete.lease.token
    assert lease_of(await claimed(c, s, FIRST)) == lease_of(after_release)
    assert await leased(c) == [("r1", 1, 2)]


async def test_a_lapsed_lease_is_not_answered_again(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    """A lease past its lapse time is refused by fence 1, so answering it again would
    strand the claim: the same id leases the next job instead, even before maintenance
    rescued the lapsed one."""
    c = coordinator
    lapsed = await claimed(c, s, FIRST)
    c.clock.advance(timedelta(minutes=5, seconds=1))
    nxt = await claimed(c, s, FIRST)
    assert (nxt.lease.job_id, nxt.lease.generation) == ("j1", 1)
    assert lease_of(await claimed(c, s, FIRST)) == lease_of(nxt)
    done = await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
    assert done.requeued == 1  # j0
    rescued = await claimed(c, s, SECOND)
    assert (rescued.lease.job_id, rescued.lease.generation) == ("j0", 2)
    assert rescued.lease.token != lapsed.lease.token
    assert lease_of(await claimed(c, s, FIRST)) == lease_of(nxt)  # j1's memory kept


async def test_a_malformed_request_id_is_invalid_and_leases_nothing(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    for bad in ("x" * 65, "has space", "slash/no", "newline\n", "é"):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await claim(c, s, bad)
        code, reason, _ = error_reason(caught.value)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"), bad
        assert "request_id" in (caught.value.details() or ""), bad
    assert await leased(c) == []
    longest = "aZ09._:-" * 8  # 64 characters of every kind allowed
    assert (await claimed(c, s, longest)).lease.job_id == "j0"


async def test_without_a_request_id_each_claim_leases_another_job(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    jobs = [await claimed(c, s, ""), await claimed(c, s, "")]
    assert [job.lease.job_id for job in jobs] == ["j0", "j1"]
    async with c.db.connection() as connection:
        ids = await connection.fetchval("SELECT count(claim_request_id) FROM jobs")
    assert ids == 0


async def test_a_retry_that_overlaps_its_original_answers_the_same_lease(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    """The retry arrives while the call it repeats still runs (a deadline passed on the
    client, not yet on the server): both wait on the jobs table, held by another
    transaction, and go on together. The claims of one key and id take turns, so the
    second answers the first's lease; without that the second, running beside the first,
    skipped its locked job and answered "no job" (or leased another)."""
    c = coordinator
    assert await claim(c, s, "warm-up") is not None  # runtime_seen now writes nothing
    async with c.db.connection() as holder, holder.transaction():
        await holder.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        claims = [asyncio.create_task(claim(c, s, FIRST)) for _ in range(2)]
        async with c.db.connection() as watcher:
            for _ in range(500):
                waiting = await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND query LIKE '%job_claim%'"
                )
                if waiting == 2:
                    break
                await asyncio.sleep(0.01)
            assert waiting == 2, "the two claims never both waited"
    first, second = await asyncio.wait_for(asyncio.gather(*claims), 10)
    assert first is not None, "the first claim answered no job"
    assert second is not None, "the retry answered no job"
    assert lease_of(first) == lease_of(second)
    assert await leased(c) == [("r1", 0, 1), ("r1", 1, 1)]  # warm-up's j0 and the retried j1
