"""Jobs that can never commit end at once instead of waiting out three lapsed leases.

Fences 2 and 3 of docs/leases-and-fences.md (the source recording at its admitted generation; the
run creator's authority and the policy revision) are checked by Claim for the job
it picks: a job that fails one is failed with FAILURE_REASON_SOURCE_CHANGED or
FAILURE_REASON_AUTHORITY_LOST, never leased, and the same Claim goes on to the next
job. Any fenced call refused by those fences (heartbeat, progress, lease check, staged
upload, preview record, complete, fail, release) fails the job the same way, in the
refusing transaction, with no lapse. Each test also shows the other side: the jobs
whose fences hold are leased as usual. Run status follows docs/runs-and-jobs.md (failed
once nothing is queued or leased).
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import timedelta

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.leases.maintenance import Maintenance
from testbed.coordinator_leases import (
    Setup,
    claim,
    claimed,
    complete_request,
    create_run,
    empty_result,
    on_behalf,
    record_request,
    refused,
    setup,
    stage_upload,
)
from testbed.coordinator_world import CODE, DAY, put_recording
from testbed.harness.coordinator import CoordinatorHarness
from testbed.session_jobs import JOB_TRANSPORTS
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
SOURCE_CHANGED = common_pb2.FAILURE_REASON_SOURCE_CHANGED
AUTHORITY_LOST = common_pb2.FAILURE_REASON_AUTHORITY_LOST
FAILED = common_pb2.JOB_STATE_FAILED
LEASED = common_pb2.JOB_STATE_LEASED
COMPLETED = common_pb2.JOB_STATE_COMPLETED


@pytest.fixture(params=JOB_TRANSPORTS)
def job_transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs twice: on JobService's unary calls and on a Session stream."""
    return str(request.param)


@pytest.fixture
async def s(coordinator: CoordinatorHarness) -> Setup:
    """Run r1 (admin key): j0 on recording cam-a-0, j1 on cam-a-1."""
    built = await setup(coordinator)
    await create_run(coordinator, built)
    return built


async def detail(c: CoordinatorHarness, run_id: str = "r1") -> ws.GetRunResponse:
    reply: ws.GetRunResponse = await c.workshop.GetRun(
        ws.GetRunRequest(run_id=run_id), metadata=c.admin
    )
    return reply


async def jobs_of(c: CoordinatorHarness, run_id: str = "r1") -> list[tuple[object, ...]]:
    """(job, state, failure reason, failure message, lease generation) of each job."""
    return [
        (j.job_id, j.state, j.failure_reason, j.failure_message, j.generation)
        for j in (await detail(c, run_id)).detail.jobs
    ]


async def complete(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob) -> None:
    await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)


# fence 2 at Claim ---------------------------------------------------------------------------


@pytest.mark.parametrize("change", ["replace", "delete"])
async def test_claim_fails_a_job_whose_recording_changed_and_leases_the_next(
    coordinator: CoordinatorHarness, s: Setup, change: str
) -> None:
    c = coordinator
    if change == "replace":  # identical bytes still make a new generation
        put = await put_recording(c, "cam-a-0", "cam-a", DAY + timedelta(hours=8))
        assert put.recording.generation == 2
        message = "Recording cam-a-0 was replaced after the run was admitted (generation 1 → 2)."
    else:
        await c.operator.DeleteRecording(
            op.DeleteRecordingRequest(recording_id="cam-a-0"), metadata=c.admin
        )
        message = "Recording cam-a-0 was deleted after the run was admitted."

    job = await claimed(c, s)
    assert (job.lease.job_id, job.lease.generation) == ("j1", 1)  # its source is untouched
    assert await jobs_of(c) == [
        ("j0", FAILED, SOURCE_CHANGED, message, 0),  # never leased
        ("j1", LEASED, common_pb2.FAILURE_REASON_UNSPECIFIED, "", 1),
    ]
    assert (await detail(c)).detail.run.status == common_pb2.RUN_STATUS_RUNNING
    assert await claim(c, s) is None

    await complete(c, s, job)
    run = (await detail(c)).detail.run
    assert run.status == common_pb2.RUN_STATUS_FAILED  # §8: nothing queued or leased
    assert (run.counts.jobs_failed, run.counts.jobs_completed) == (1, 1)


async def test_a_lapsed_lease_on_a_replaced_recording_fails_at_the_next_claim(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    """The processor on j0 stops when its writes are refused; once maintenance requeues the
    lapsed job, the next claim fails it instead of leasing it for a second attempt."""
    c = coordinator
    first = await claimed(c, s)
    assert first.lease.job_id == "j0"
    await put_recording(c, "cam-a-0", "cam-a", DAY + timedelta(hours=8))
    c.clock.advance(timedelta(minutes=5, seconds=1))
    assert (await Maintenance(c.db, c.clock, interval_seconds=1).run_once()).requeued == 1

    job = await claimed(c, s)
    assert (job.lease.job_id, job.lease.generation) == ("j1", 1)
    states = [(j[0], j[1], j[2], j[4]) for j in await jobs_of(c)]
    assert states == [("j0", FAILED, SOURCE_CHANGED, 1), ("j1", LEASED, 0, 1)]


# fence 3 at Claim ---------------------------------------------------------------------------


async def test_claim_fails_every_job_of_a_run_whose_creating_key_was_revoked(
    coordinator: CoordinatorHarness,
) -> None:
    """r1 was created with an agent key that is then revoked; r2 (admin key) is behind it.
    One Claim fails both of r1's jobs and leases r2's first job."""
    c = coordinator
    s = await setup(c)
    agent = await c.key(Grant(ScopeName.WORKSHOP), name="agent")
    await c.workshop.CreateRun(
        ws.CreateRunRequest(
            run_id="r1",
            workflow_id="yard",
            runtime_id=s.world.tracking_runtime,
            revision=1,
            mode=common_pb2.RUN_MODE_FULL,
        ),
        metadata=bearer_metadata(agent),
    )
    await create_run(c, s, "r2")
    async with c.db.connection() as connection:
        key_id = await connection.fetchval("SELECT key_id FROM keys WHERE name = 'agent'")
    await c.operator.RevokeKey(op.RevokeKeyRequest(key_id=key_id), metadata=c.admin)

    job = await claimed(c, s)
    assert (job.lease.run_id, job.lease.job_id) == ("r2", "j0")
    lost = "The key that created the run was revoked or expired."
    assert await jobs_of(c, "r1") == [
        ("j0", FAILED, AUTHORITY_LOST, lost, 0),
        ("j1", FAILED, AUTHORITY_LOST, lost, 0),
    ]
    assert (await detail(c, "r1")).detail.run.status == common_pb2.RUN_STATUS_FAILED
    assert (await detail(c, "r2")).detail.run.status == common_pb2.RUN_STATUS_RUNNING


@pytest.mark.parametrize("loss", ["session revoked", "user disabled"])
async def test_claim_fails_the_jobs_of_a_run_whose_creating_session_lost_authority(
    coordinator: CoordinatorHarness, loss: str
) -> None:
    """r1 was created on the website (a user's session); r2 (admin key) is behind it."""
    c = coordinator
    s = await setup(c)
    await c.operator.CreateUser(
        op.CreateUserRequest(user_id="ana", display_name="Ana"), metadata=c.admin
    )
    session = await c.operator.CreateSession(
        op.CreateSessionRequest(user_id="ana"), metadata=c.admin
    )
    await c.workshop.CreateRun(
        ws.CreateRunRequest(
            run_id="r1",
            workflow_id="yard",
            runtime_id=s.world.tracking_runtime,
            revision=1,
            mode=common_pb2.RUN_MODE_FULL,
        ),
        metadata=bearer_metadata(session.secret),
    )
    await create_run(c, s, "r2")
    if loss == "session revoked":
        await c.operator.RevokeSession(
            op.RevokeSessionRequest(session_id=session.session.session_id), metadata=c.admin
        )
        lost = "The session that created the run was revoked or expired."
    else:
        await c.operator.DisableUser(op.DisableUserRequest(user_id="ana"), metadata=c.admin)
        lost = "User ana, who created the run, was disabled."

    job = await claimed(c, s)
    assert (job.lease.run_id, job.lease.job_id) == ("r2", "j0")
    assert await jobs_of(c, "r1") == [
        ("j0", FAILED, AUTHORITY_LOST, lost, 0),
        ("j1", FAILED, AUTHORITY_LOST, lost, 0),
    ]


async def test_claim_fails_the_jobs_of_runs_admitted_before_a_policy_raise(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    await c.operator.RaisePolicyRevision(op.RaisePolicyRevisionRequest(), metadata=c.admin)
    await create_run(c, s, "r2")  # admitted under the new revision

    job = await claimed(c, s)
    assert (job.lease.run_id, job.lease.job_id) == ("r2", "j0")
    raised = "The policy revision was raised after the run was admitted (revision 1 → 2)."
    assert await jobs_of(c, "r1") == [
        ("j0", FAILED, AUTHORITY_LOST, raised, 0),
        ("j1", FAILED, AUTHORITY_LOST, raised, 0),
    ]
    await complete(c, s, job)
    assert (await claimed(c, s)).lease.job_id == "j1"  # r2's fences hold: leased as usual


# refused fenced calls ------------------------------------------------------------------------


def fenced_call(
    c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, call: str
) -> Awaitable[object]:
    """One fenced call about `job`, as the processor or the preview service for it makes it."""
    lease, md = job.lease, s.processor
    if call == "Heartbeat":
        return c.jobs.Heartbeat(jobs_pb2.HeartbeatRequest(lease=lease), metadata=md)
    if call == "ReportProgress":
        progress = jobs_pb2.ReportProgressRequest(lease=lease, percent=50)
        return c.jobs.ReportProgress(progress, metadata=md)
    if call == "Complete":
        return c.jobs.Complete(complete_request(job, empty_result(job)), metadata=md)
    if call == "Fail":
        reason = common_pb2.FAILURE_REASON_PROCESSOR_FAILED
        return c.jobs.Fail(jobs_pb2.FailRequest(lease=lease, reason=reason), metadata=md)
    if call == "Release":
        return c.jobs.Release(jobs_pb2.ReleaseRequest(lease=lease), metadata=md)
    if call == "CheckLease":
        check = pub.CheckLeaseRequest(lease=lease, code_sha256=CODE)
        return c.publication.CheckLease(check, metadata=on_behalf(s))
    if call == "StageObject":
        return stage_upload(c, s, job, 0, b"jpeg")
    assert call == "RecordPreview"
    record = record_request(job, 0, test=False)
    return c.publication.RecordPreview(record, metadata=on_behalf(s))


FENCED_CALLS = [
    "Heartbeat",
    "ReportProgress",
    "CheckLease",
    "StageObject",
    "RecordPreview",
    "Complete",
    "Fail",
    "Release",
]


@pytest.mark.parametrize("call", FENCED_CALLS)
async def test_any_call_refused_for_a_replaced_recording_fails_the_job_at_once(
    coordinator: CoordinatorHarness, s: Setup, call: str
) -> None:
    """The first fenced call after the replacement, whichever it is, is refused with
    SOURCE_CHANGED and ends the job in the same transaction: failed source_changed under
    its first lease, no lapse, and the run no longer waits for it. Anything sent under
    the lease afterwards hears JOB_FINISHED."""
    c = coordinator
    job, other = await claimed(c, s), await claimed(c, s)
    await put_recording(c, "cam-a-0", "cam-a", DAY + timedelta(hours=8))

    assert await refused(fenced_call(c, s, job, call)) == (FAILED_PRECONDITION, "SOURCE_CHANGED")
    message = "Recording cam-a-0 was replaced after the run was admitted (generation 1 → 2)."
    assert (await jobs_of(c))[0] == ("j0", FAILED, SOURCE_CHANGED, message, 1)
    async with c.db.connection() as connection:
        assert await connection.fetchval("SELECT lapses FROM jobs WHERE job_index = 0") == 0
    heartbeat = c.jobs.Heartbeat(jobs_pb2.HeartbeatRequest(lease=job.lease), metadata=s.processor)
    assert await refused(heartbeat) == (FAILED_PRECONDITION, "JOB_FINISHED")

    await complete(c, s, other)  # its recording is untouched
    assert [j[1] for j in await jobs_of(c)] == [FAILED, COMPLETED]
    assert (await detail(c)).detail.run.status == common_pb2.RUN_STATUS_FAILED


@pytest.mark.parametrize("call", ["Heartbeat", "CheckLease", "Fail"])
async def test_a_call_refused_after_a_policy_raise_fails_the_job_as_authority_lost(
    coordinator: CoordinatorHarness, s: Setup, call: str
) -> None:
    c = coordinator
    job = await claimed(c, s)
    await c.operator.RaisePolicyRevision(op.RaisePolicyRevisionRequest(), metadata=c.admin)
    assert await refused(fenced_call(c, s, job, call)) == (FAILED_PRECONDITION, "POLICY_CHANGED")
    raised = "The policy revision was raised after the run was admitted (revision 1 → 2)."
    assert (await jobs_of(c))[0] == ("j0", FAILED, AUTHORITY_LOST, raised, 1)


async def test_a_refusal_that_may_pass_ends_nothing(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    """A refusal that is about the caller, not the job (another code, a key of another
    device), leaves the job leased: another processor may still commit it."""
    c = coordinator
    job = await claimed(c, s)
    stale = complete_request(job, empty_result(job), code="0" * 64)
    assert await refused(c.jobs.Complete(stale, metadata=s.processor)) == (
        FAILED_PRECONDITION,
        "CODE_MISMATCH",
    )
    assert (await jobs_of(c))[0][1] == LEASED
