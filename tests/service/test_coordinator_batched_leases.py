"""Batched leases (docs/leases-and-fences.md#batched-leases) on real Postgres: a Claim of
several jobs, one Heartbeat for many leases, a progress report that renews its lease,
and a Complete that claims the next job. Every lease of a batch keeps its own
generation and token, and each fence is tested both ways on these paths."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest

from services.coordinator.leases.maintenance import Maintenance
from testbed.coordinator_leases import (
    Setup,
    claimed,
    complete_request,
    create_run,
    empty_result,
    refused,
    setup,
)
from testbed.coordinator_world import CODE
from testbed.harness.coordinator import CoordinatorHarness
from testbed.session_jobs import JOB_TRANSPORTS
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import workshop_pb2 as ws

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT
NO_LEASE = "00000000-0000-0000-0000-000000000000"


@pytest.fixture(params=JOB_TRANSPORTS)
def job_transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs twice: on JobService's unary calls and on a Session stream."""
    return str(request.param)


@pytest.fixture
async def s(coordinator: CoordinatorHarness) -> Setup:
    built = await setup(coordinator)
    await create_run(coordinator, built)  # r1: jobs j0 and j1
    return built


def claim_request(s: Setup, max_jobs: int, request_id: str = "") -> jobs_pb2.ClaimRequest:
    return jobs_pb2.ClaimRequest(
        runtime_id=s.world.tracking_runtime,
        code_sha256=CODE,
        max_jobs=max_jobs,
        request_id=request_id,
    )


async def claim_many(
    c: CoordinatorHarness, s: Setup, max_jobs: int, request_id: str = ""
) -> list[jobs_pb2.ClaimedJob]:
    reply = await c.jobs.Claim(claim_request(s, max_jobs, request_id), metadata=s.processor)
    return [reply.job, *reply.more_jobs] if reply.HasField("job") else []


async def beat(
    c: CoordinatorHarness, s: Setup, *leases: common_pb2.LeaseRef
) -> list[jobs_pb2.LeaseRenewal]:
    reply = await c.jobs.Heartbeat(
        jobs_pb2.HeartbeatRequest(leases=list(leases)), metadata=s.processor
    )
    assert not reply.HasField("lease_expires_at")
    return list(reply.renewals)


def stale(lease: common_pb2.LeaseRef) -> common_pb2.LeaseRef:
    other = common_pb2.LeaseRef()
    other.CopyFrom(lease)
    other.token = NO_LEASE
    return other


def names(jobs: list[jobs_pb2.ClaimedJob]) -> list[tuple[str, str, int]]:
    return [(j.lease.run_id, j.lease.job_id, j.lease.generation) for j in jobs]


async def job_state(c: CoordinatorHarness, run_id: str, index: int) -> str:
    async with c.db.connection() as connection:
        state: str = await connection.fetchval(
            "SELECT state FROM jobs WHERE run_id = $1 AND job_index = $2", run_id, index
        )
    return state


# claims -------------------------------------------------------------------------------------


async def test_a_claim_leases_up_to_max_jobs_in_claim_order_each_under_its_own_lease(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    await create_run(c, s, "r2")
    jobs = await claim_many(c, s, 5)
    # r1's two jobs; r2 waits behind r1 while r1 has leased jobs, however many were asked
    assert names(jobs) == [("r1", "j0", 1), ("r1", "j1", 1)]
    assert jobs[0].lease.token != jobs[1].lease.token
    for job in jobs:
        assert job.lease_expires_at.ToDatetime() == (c.clock.now() + timedelta(minutes=5)).replace(
            tzinfo=None
        )
        assert len(job.input.slots) == 60
        assert job.snapshot.run_id == "r1"
    assert [j.input.recording.recording_id for j in jobs] == ["cam-a-0", "cam-a-1"]
    assert await claim_many(c, s, 5) == []
    # each lease is its own: ending one leaves the other held
    await c.jobs.Release(jobs_pb2.ReleaseRequest(lease=jobs[0].lease), metadata=s.processor)
    assert [r.renewed for r in await beat(c, s, jobs[0].lease, jobs[1].lease)] == [False, True]
    again = await claim_many(c, s, 3)
    assert names(again) == [("r1", "j0", 2)]


async def test_max_jobs_zero_and_one_lease_one_job_and_over_100_is_refused(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    assert names(await claim_many(c, s, 0)) == [("r1", "j0", 1)]
    assert names(await claim_many(c, s, 1)) == [("r1", "j1", 1)]
    code, reason = await refused(c.jobs.Claim(claim_request(s, 101), metadata=s.processor))
    assert (code, reason) == (INVALID_ARGUMENT, "INVALID_FIELD")


async def test_a_batched_claim_asked_again_answers_its_held_leases_and_nothing_more(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    await create_run(c, s, "r2")
    first = await claim_many(c, s, 2, "batch-1")
    again = await claim_many(c, s, 2, "batch-1")
    assert [j.lease for j in again] == [j.lease for j in first]  # same generations and tokens
    await c.jobs.Complete(complete_request(first[0], empty_result(first[0])), metadata=s.processor)
    # the lease of the batch still held is answered; the ended one is not replaced
    assert [j.lease for j in await claim_many(c, s, 2, "batch-1")] == [first[1].lease]
    await c.jobs.Complete(complete_request(first[1], empty_result(first[1])), metadata=s.processor)
    # every lease of that batch ended: the id is forgotten and this is a new claim (r2)
    assert names(await claim_many(c, s, 2, "batch-1")) == [("r2", "j0", 1), ("r2", "j1", 1)]


# heartbeats -----------------------------------------------------------------------------------


async def test_one_heartbeat_renews_every_lease_and_answers_each_lost_one_alone(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    j0, j1 = await claim_many(c, s, 2)
    c.clock.advance(timedelta(minutes=4))
    renewals = await beat(c, s, j1.lease, stale(j0.lease), j0.lease)
    # in the order sent, a stale token refused for its lease only
    assert [(r.lease.job_id, r.renewed, r.reason) for r in renewals] == [
        ("j1", True, ""),
        ("j0", False, "LEASE_MISMATCH"),
        ("j0", True, ""),
    ]
    until = (c.clock.now() + timedelta(minutes=5)).replace(tzinfo=None)
    assert renewals[0].lease_expires_at.ToDatetime() == until
    assert renewals[2].lease_expires_at.ToDatetime() == until
    assert not renewals[1].HasField("lease_expires_at")
    # a stale generation: j0 lapses and is claimed again; its old lease is lost, j1 renews
    c.clock.advance(timedelta(minutes=4, seconds=59))
    assert [r.renewed for r in await beat(c, s, j1.lease)] == [True]
    c.clock.advance(timedelta(seconds=2))  # j0 lapsed (renewed 5:01 ago), j1 renewed 0:02 ago
    lapsed = await beat(c, s, j0.lease, j1.lease)
    assert [(r.renewed, r.reason) for r in lapsed] == [(False, "LEASE_MISMATCH"), (True, "")]
    await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
    (j0_again,) = await claim_many(c, s, 2)
    assert names([j0_again]) == [("r1", "j0", 2)]
    renewed = await beat(c, s, j0.lease, j0_again.lease)
    assert [(r.renewed, r.reason) for r in renewed] == [(False, "LEASE_MISMATCH"), (True, "")]


async def test_a_batched_heartbeat_says_cancelled_finished_and_source_changed_per_lease(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    await create_run(c, s, "r2")
    j0, j1 = await claim_many(c, s, 2)
    await c.jobs.Complete(complete_request(j0, empty_result(j0)), metadata=s.processor)
    answers = await beat(c, s, j0.lease, j1.lease)
    assert [(r.renewed, r.reason) for r in answers] == [(False, "JOB_FINISHED"), (True, "")]
    await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)
    r2 = await claim_many(c, s, 2)
    answers = await beat(c, s, j1.lease, r2[0].lease, r2[1].lease)
    assert [(r.renewed, r.reason) for r in answers] == [
        (False, "JOB_CANCELLED"),
        (True, ""),
        (True, ""),
    ]


async def test_a_batched_heartbeat_refuses_malformed_requests_precisely(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    (job,) = await claim_many(c, s, 1)
    both = jobs_pb2.HeartbeatRequest(lease=job.lease, leases=[job.lease])
    assert await refused(c.jobs.Heartbeat(both, metadata=s.processor)) == (
        INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    bad = common_pb2.LeaseRef()
    bad.CopyFrom(job.lease)
    bad.token = "not-a-token"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.jobs.Heartbeat(
            jobs_pb2.HeartbeatRequest(leases=[job.lease, bad]), metadata=s.processor
        )
    assert caught.value.code() == INVALID_ARGUMENT
    assert "leases[1]" in (caught.value.details() or "")
    many = jobs_pb2.HeartbeatRequest(leases=[job.lease] * 1001)
    assert await refused(c.jobs.Heartbeat(many, metadata=s.processor)) == (
        INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    # nothing renewed by the refused calls: the lease is as Claim left it
    assert [r.renewed for r in await beat(c, s, job.lease)] == [True]


# progress renews its lease ----------------------------------------------------------------------


async def test_a_progress_report_renews_its_lease_stored_or_not(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job, other = await claim_many(c, s, 2)

    async def progress(percent: int) -> jobs_pb2.ReportProgressResponse:
        reply: jobs_pb2.ReportProgressResponse = await c.jobs.ReportProgress(
            jobs_pb2.ReportProgressRequest(lease=job.lease, percent=percent),
            metadata=s.processor,
        )
        return reply

    for percent in (40, 10):  # the lower one is ignored, not stored, and still renews
        c.clock.advance(timedelta(minutes=4))
        reply = await progress(percent)
        assert (reply.percent, reply.persisted) == (40, percent == 40)
        until = (c.clock.now() + timedelta(minutes=5)).replace(tzinfo=None)
        assert reply.lease_expires_at.ToDatetime() == until
    # 8 minutes after the claim without a heartbeat: j0 holds, j1 (no progress) lapsed
    answers = await beat(c, s, job.lease, other.lease)
    assert [(r.renewed, r.reason) for r in answers] == [(True, ""), (False, "LEASE_MISMATCH")]
    wrong = jobs_pb2.ReportProgressRequest(lease=stale(job.lease), percent=50)
    assert await refused(c.jobs.ReportProgress(wrong, metadata=s.processor)) == (
        FAILED_PRECONDITION,
        "LEASE_MISMATCH",
    )


# complete and claim the next ----------------------------------------------------------------------


def then_claim(
    job: jobs_pb2.ClaimedJob, s: Setup, *, max_jobs: int = 1, request_id: str = ""
) -> jobs_pb2.CompleteRequest:
    request = complete_request(job, empty_result(job))
    request.then_claim.CopyFrom(claim_request(s, max_jobs, request_id))
    return request


async def test_complete_claims_the_next_job_in_the_same_call(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    first = await claimed(c, s)
    reply = await c.jobs.Complete(then_claim(first, s, max_jobs=3), metadata=s.processor)
    assert (reply.receipt.job_id, reply.already_committed) == ("j0", False)
    assert reply.HasField("claimed")
    assert names([reply.claimed.job, *reply.claimed.more_jobs]) == [("r1", "j1", 1)]
    second = reply.claimed.job
    last = await c.jobs.Complete(then_claim(second, s), metadata=s.processor)
    assert last.receipt.job_id == "j1"
    assert last.HasField("claimed")
    assert not last.claimed.HasField("job")
    assert last.claimed.retry_after.seconds == 2
    assert (
        await c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin)
    ).detail.run.status == (common_pb2.RUN_STATUS_COMPLETED)


async def test_a_refused_complete_claims_nothing(coordinator: CoordinatorHarness, s: Setup) -> None:
    c = coordinator
    job = await claimed(c, s)
    wrong = then_claim(job, s)
    wrong.lease.token = NO_LEASE
    assert await refused(c.jobs.Complete(wrong, metadata=s.processor)) == (
        FAILED_PRECONDITION,
        "LEASE_MISMATCH",
    )
    assert await job_state(c, "r1", 1) == "queued"
    # a next claim that is itself invalid is refused before the commit: nothing commits
    waiting = then_claim(job, s)
    waiting.then_claim.wait_seconds = 5
    assert await refused(c.jobs.Complete(waiting, metadata=s.processor)) == (
        INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    other_code = then_claim(job, s)
    other_code.then_claim.code_sha256 = "0" * 64
    assert await refused(c.jobs.Complete(other_code, metadata=s.processor)) == (
        FAILED_PRECONDITION,
        "CODE_MISMATCH",
    )
    assert [await job_state(c, "r1", i) for i in (0, 1)] == ["leased", "queued"]
    assert await c.count("receipts") == 0
    done = await c.jobs.Complete(then_claim(job, s), metadata=s.processor)
    assert names([done.claimed.job]) == [("r1", "j1", 1)]


async def test_a_next_claim_that_fails_leaves_the_commit_committed_and_its_receipt_answered(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    """A result that saves nothing commits and claims in one statement: when the claim
    fails in the database, that statement rolls back whole, the commit runs alone and
    answers its receipt, and the next job stays queued for the next Claim."""
    c = coordinator
    job = await claimed(c, s)
    async with c.db.connection() as connection:
        await connection.execute(
            """
            CREATE FUNCTION test_refuse_lease() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'leases refused by the test'; END $$;
            CREATE TRIGGER test_refuse_lease BEFORE UPDATE ON jobs FOR EACH ROW
                WHEN (NEW.state = 'leased') EXECUTE FUNCTION test_refuse_lease();
            """
        )
    try:
        reply = await c.jobs.Complete(then_claim(job, s), metadata=s.processor)
    finally:
        async with c.db.connection() as connection:
            await connection.execute(
                "DROP TRIGGER test_refuse_lease ON jobs; DROP FUNCTION test_refuse_lease()"
            )
    assert (reply.receipt.job_id, reply.already_committed) == ("j0", False)
    assert not reply.HasField("claimed")  # the next Claim hears why
    assert [await job_state(c, "r1", i) for i in (0, 1)] == ["completed", "queued"]
    assert await c.count("receipts") == 1
    assert names(await claim_many(c, s, 1)) == [("r1", "j1", 1)]


async def test_a_repeated_complete_and_claim_answers_the_same_receipt_and_next_lease(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    request = then_claim(job, s, request_id="next-after-j0")
    first = await c.jobs.Complete(request, metadata=s.processor)
    again = await c.jobs.Complete(request, metadata=s.processor)  # its answer was lost
    assert (first.already_committed, again.already_committed) == (False, True)
    assert again.receipt == first.receipt
    assert again.claimed.job.lease == first.claimed.job.lease
    assert await c.count("receipts") == 1


# a processor of the previous version ------------------------------------------------------------


async def test_todays_requests_are_answered_as_before(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    """A processor built on the previous protos sends none of the new fields: one job per
    Claim, a single-lease Heartbeat answered with its expiry or refused, a Complete that
    claims nothing. Its requests and answers, byte for byte, use only the old fields."""
    c = coordinator
    request = jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE)
    reply = await c.jobs.Claim(request, metadata=s.processor)
    assert reply.HasField("job")
    assert list(reply.more_jobs) == []
    job = reply.job
    renewed = await c.jobs.Heartbeat(
        jobs_pb2.HeartbeatRequest(lease=job.lease), metadata=s.processor
    )
    assert renewed.HasField("lease_expires_at")
    assert list(renewed.renewals) == []
    lost = jobs_pb2.HeartbeatRequest(lease=stale(job.lease))
    assert await refused(c.jobs.Heartbeat(lost, metadata=s.processor)) == (
        FAILED_PRECONDITION,
        "LEASE_MISMATCH",
    )
    done = await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
    assert not done.HasField("claimed")
    assert await job_state(c, "r1", 1) == "queued"
