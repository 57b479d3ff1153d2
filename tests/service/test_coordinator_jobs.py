"""Leases, fences, progress, completion and receipts (docs/leases-and-fences.md) on real Postgres.

Every fence is tested both ways: the write is accepted while the fence holds,
and refused with FAILED_PRECONDITION and its reason once it does not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, timedelta

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
    frame_result,
    leased,
    on_behalf,
    record_request,
    refused,
    setup,
    stage_upload,
)
from testbed.coordinator_world import (
    CODE,
    DAY,
    build_world,
    error_reason,
    put_recording,
    save_workflow,
    workflow_spec,
)
from testbed.harness.coordinator import CoordinatorHarness
from testbed.session_jobs import JOB_TRANSPORTS
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture(params=JOB_TRANSPORTS)
def job_transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs twice: on JobService's unary calls and on a Session stream."""
    return str(request.param)


@pytest.fixture
async def s(coordinator: CoordinatorHarness) -> Setup:
    built = await setup(coordinator)
    await create_run(coordinator, built)
    return built


def heartbeat(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob) -> Awaitable[object]:
    return c.jobs.Heartbeat(jobs_pb2.HeartbeatRequest(lease=job.lease), metadata=s.processor)


async def job_row(c: CoordinatorHarness, run_id: str, index: int) -> dict[str, object]:
    async with c.db.connection() as connection:
        row = await connection.fetchrow(
            "SELECT * FROM jobs WHERE run_id = $1 AND job_index = $2", run_id, index
        )
    return dict(row)


async def run_detail(c: CoordinatorHarness, run_id: str = "r1") -> ws.GetRunResponse:
    reply: ws.GetRunResponse = await c.workshop.GetRun(
        ws.GetRunRequest(run_id=run_id), metadata=c.admin
    )
    return reply


# claims -------------------------------------------------------------------------------------


async def test_claim_leases_in_job_order_with_input_and_snapshot(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    first = await claimed(c, s)
    assert (first.lease.run_id, first.lease.job_id, first.lease.generation) == ("r1", "j0", 1)
    assert first.lease_expires_at.ToDatetime() == (c.clock.now() + timedelta(minutes=5)).replace(
        tzinfo=None
    )
    assert first.heartbeat_interval.seconds == 45
    assert first.input.recording.recording_id == "cam-a-0"
    assert len(first.input.slots) == 60
    assert first.input.slots[1].start.ToDatetime() == (DAY + timedelta(hours=8, minutes=1)).replace(
        tzinfo=None
    )
    assert first.snapshot.code_sha256 == CODE
    assert first.snapshot.run_id == "r1"
    second = await claimed(c, s)
    assert second.lease.job_id == "j1"
    assert await claim(c, s) is None
    run = (await run_detail(c)).detail.run
    assert run.status == common_pb2.RUN_STATUS_RUNNING
    assert run.counts.jobs_leased == 2
    async with c.db.connection() as connection:
        seen = await connection.fetchval(
            "SELECT last_seen_at FROM runtimes WHERE runtime_id = $1", s.world.tracking_runtime
        )
    assert seen == c.clock.now()


async def test_a_runs_jobs_wait_for_older_runs_on_the_runtime(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    await create_run(c, s, "r2")
    jobs = [await claimed(c, s), await claimed(c, s)]
    assert [j.lease.run_id for j in jobs] == ["r1", "r1"]
    assert await claim(c, s) is None  # r1 still has leased jobs: r2 waits
    second = (await run_detail(c, "r2")).detail.run
    assert second.status == common_pb2.RUN_STATUS_QUEUED
    assert list(second.waiting_behind) == ["r1"]
    for job in jobs:
        await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
    nxt = await claimed(c, s)
    assert nxt.lease.run_id == "r2"


async def test_claim_only_covers_the_keys_cameras_and_device(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    cam_b_only = bearer_metadata(
        await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box", camera_ids=("cam-b",)))
    )
    request = jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE)
    reply = await c.jobs.Claim(request, metadata=cam_b_only)
    assert not reply.HasField("job")  # r1 reads cam-a only
    await c.operator.RegisterDevice(op.RegisterDeviceRequest(device_id="other"), metadata=c.admin)
    other = bearer_metadata(await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="other")))
    assert await refused(c.jobs.Claim(request, metadata=other)) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "SCOPE_MISSING",
    )
    wrong_code = jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256="f" * 64)
    assert await refused(c.jobs.Claim(wrong_code, metadata=s.processor)) == (
        FAILED_PRECONDITION,
        "CODE_MISMATCH",
    )


# fence 1: the lease ---------------------------------------------------------------------------


async def test_heartbeat_renews_only_the_current_lease(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    c.clock.advance(timedelta(minutes=4))
    renewed = await heartbeat(c, s, job)
    assert renewed.lease_expires_at.ToDatetime() == (  # type: ignore[attr-defined]
        c.clock.now() + timedelta(minutes=5)
    ).replace(tzinfo=None)
    wrong_token = jobs_pb2.ClaimedJob()
    wrong_token.CopyFrom(job)
    wrong_token.lease.token = "00000000-0000-0000-0000-000000000000"
    assert await refused(heartbeat(c, s, wrong_token)) == (FAILED_PRECONDITION, "LEASE_MISMATCH")
    c.clock.advance(timedelta(minutes=6))  # lapsed, not yet rescued
    assert await refused(heartbeat(c, s, job)) == (FAILED_PRECONDITION, "LEASE_MISMATCH")
    await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
    again = await claimed(c, s)
    assert (again.lease.job_id, again.lease.generation) == ("j0", 2)
    assert await refused(heartbeat(c, s, job)) == (FAILED_PRECONDITION, "LEASE_MISMATCH")
    stale = complete_request(job, empty_result(job))
    assert await refused(c.jobs.Complete(stale, metadata=s.processor)) == (
        FAILED_PRECONDITION,
        "LEASE_MISMATCH",
    )
    await heartbeat(c, s, again)


async def test_third_lapse_fails_with_attempts_exhausted(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    maintenance = Maintenance(c.db, c.clock, interval_seconds=1)
    for attempt in range(1, 4):
        job = await claimed(c, s)
        assert (job.lease.job_id, job.lease.generation) == ("j0", attempt)
        last_lapse = c.clock.now() + timedelta(minutes=5)
        await claimed(c, s)  # j1 lapses too; keeps the head run busy
        c.clock.advance(timedelta(minutes=5, seconds=1))
        done = await maintenance.run_once()
        assert done.requeued + done.exhausted == 2
    row = await job_row(c, "r1", 0)
    assert (row["state"], row["failure_reason"], row["lapses"]) == (
        "failed",
        "attempts_exhausted",
        3,
    )
    assert await claim(c, s) is None
    detail = (await run_detail(c)).detail
    assert detail.run.status == common_pb2.RUN_STATUS_FAILED
    assert detail.jobs[0].failure_reason == common_pb2.FAILURE_REASON_ATTEMPTS_EXHAUSTED
    # the coordinator's note for the reason it set: how many lapsed, and when the last did
    assert detail.jobs[0].failure_message == (
        "3 leases lapsed without a result (no processor reported on the job before its "
        f"lease ran out); the last lapsed at {last_lapse:%Y-%m-%d %H:%M:%S} UTC."
    )


async def test_release_hands_back_without_spending_an_attempt(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    await c.jobs.Release(jobs_pb2.ReleaseRequest(lease=job.lease), metadata=s.processor)
    assert (await job_row(c, "r1", 0))["lapses"] == 0
    again = await claimed(c, s)
    assert (again.lease.job_id, again.lease.generation) == ("j0", 2)
    assert await refused(heartbeat(c, s, job)) == (FAILED_PRECONDITION, "LEASE_MISMATCH")


async def test_fail_ends_the_job_without_retry(coordinator: CoordinatorHarness, s: Setup) -> None:
    c = coordinator
    job = await claimed(c, s)
    await c.jobs.Fail(
        jobs_pb2.FailRequest(
            lease=job.lease,
            reason=common_pb2.FAILURE_REASON_PROCESSOR_FAILED,
            message="decoder: invalid NAL unit " + "x" * 3000,
        ),
        metadata=s.processor,
    )
    row = await job_row(c, "r1", 0)
    assert row["state"] == "failed"
    assert row["failure_reason"] == "processor_failed"
    assert len(str(row["failure_message"])) == 2000
    assert (await claimed(c, s)).lease.job_id == "j1"
    assert await refused(heartbeat(c, s, job)) == (FAILED_PRECONDITION, "JOB_FINISHED")
    bad = jobs_pb2.FailRequest(lease=job.lease, reason=common_pb2.FAILURE_REASON_ATTEMPTS_EXHAUSTED)
    assert (await refused(c.jobs.Fail(bad, metadata=s.processor)))[0] == (
        grpc.StatusCode.INVALID_ARGUMENT
    )


async def test_cancel_refuses_later_writes_and_keeps_completed_results(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    done, running = await claimed(c, s), await claimed(c, s)
    await c.jobs.Complete(complete_request(done, empty_result(done)), metadata=s.processor)
    await heartbeat(c, s, running)
    cancelled = await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)
    assert cancelled.jobs_cancelled == 1
    assert cancelled.run.status == common_pb2.RUN_STATUS_CANCELLED
    assert await refused(heartbeat(c, s, running)) == (FAILED_PRECONDITION, "JOB_CANCELLED")
    late = complete_request(running, empty_result(running))
    assert await refused(c.jobs.Complete(late, metadata=s.processor)) == (
        FAILED_PRECONDITION,
        "JOB_CANCELLED",
    )
    assert (await job_row(c, "r1", 0))["state"] == "completed"
    assert await c.count("receipts") == 1
    again = await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)
    assert again.jobs_cancelled == 0


# fence 2: the source recording ----------------------------------------------------------------


@pytest.mark.parametrize("change", ["replace", "delete"])
async def test_a_changed_source_fences_the_job(
    coordinator: CoordinatorHarness, s: Setup, change: str
) -> None:
    c = coordinator
    job, other = await claimed(c, s), await claimed(c, s)
    await heartbeat(c, s, job)
    if change == "replace":  # identical bytes still make a new generation
        await put_recording(c, "cam-a-0", "cam-a", DAY + timedelta(hours=8))
    else:
        await c.operator.DeleteRecording(
            op.DeleteRecordingRequest(recording_id="cam-a-0"), metadata=c.admin
        )
    assert await refused(heartbeat(c, s, job)) == (FAILED_PRECONDITION, "SOURCE_CHANGED")
    # the refusal can never pass again: it ended the job (test_coordinator_unclaimable.py)
    assert (await job_row(c, "r1", 0))["failure_reason"] == "source_changed"
    stale = complete_request(job, empty_result(job))
    assert await refused(c.jobs.Complete(stale, metadata=s.processor)) == (
        FAILED_PRECONDITION,
        "JOB_FINISHED",
    )
    await heartbeat(c, s, other)  # the other recording is untouched


# fence 3: the creator's authority and the policy revision --------------------------------------


async def test_raising_the_policy_revision_stops_every_later_write(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    await heartbeat(c, s, job)
    await c.operator.RaisePolicyRevision(op.RaisePolicyRevisionRequest(), metadata=c.admin)
    assert await refused(heartbeat(c, s, job)) == (FAILED_PRECONDITION, "POLICY_CHANGED")


async def test_revoking_the_creating_key_stops_its_runs(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await setup(c)
    creator = await c.key(Grant(ScopeName.WORKSHOP), name="agent")
    await c.workshop.CreateRun(
        ws.CreateRunRequest(
            run_id="r1",
            workflow_id="yard",
            runtime_id=s.world.tracking_runtime,
            revision=1,
            mode=common_pb2.RUN_MODE_FULL,
        ),
        metadata=bearer_metadata(creator),
    )
    job = await claimed(c, s)
    await heartbeat(c, s, job)
    async with c.db.connection() as connection:
        key_id = await connection.fetchval("SELECT key_id FROM keys WHERE name = 'agent'")
    await c.operator.RevokeKey(op.RevokeKeyRequest(key_id=key_id), metadata=c.admin)
    assert await refused(heartbeat(c, s, job)) == (FAILED_PRECONDITION, "AUTHORITY_REVOKED")


@pytest.mark.parametrize("revocation", ["revoke-session", "disable-user"])
async def test_a_sessions_runs_lose_authority(
    coordinator: CoordinatorHarness, revocation: str
) -> None:
    c = coordinator
    s = await setup(c)
    await c.operator.CreateUser(op.CreateUserRequest(user_id="ada"), metadata=c.admin)
    session = await c.operator.CreateSession(
        op.CreateSessionRequest(user_id="ada"), metadata=c.admin
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
    job = await claimed(c, s)
    await heartbeat(c, s, job)
    if revocation == "revoke-session":
        await c.operator.RevokeSession(
            op.RevokeSessionRequest(session_id=session.session.session_id), metadata=c.admin
        )
    else:
        await c.operator.DisableUser(op.DisableUserRequest(user_id="ada"), metadata=c.admin)
    assert await refused(heartbeat(c, s, job)) == (FAILED_PRECONDITION, "AUTHORITY_REVOKED")


# fence 4: the reporting key and the code ------------------------------------------------------


async def test_only_a_key_for_the_runtimes_device_may_report(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    await c.operator.RegisterDevice(op.RegisterDeviceRequest(device_id="other"), metadata=c.admin)
    other = bearer_metadata(await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="other")))
    request = jobs_pb2.HeartbeatRequest(lease=job.lease)
    assert await refused(c.jobs.Heartbeat(request, metadata=other)) == (
        FAILED_PRECONDITION,
        "REPORTER_NOT_AUTHORIZED",
    )
    await c.jobs.Heartbeat(request, metadata=c.admin)  # an admin may, by hand
    await c.jobs.Heartbeat(request, metadata=s.processor)


async def test_a_result_from_other_code_is_refused(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    other_code = complete_request(job, empty_result(job), code="e" * 64)
    assert await refused(c.jobs.Complete(other_code, metadata=s.processor)) == (
        FAILED_PRECONDITION,
        "CODE_MISMATCH",
    )
    await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)


# progress -------------------------------------------------------------------------------------


async def test_progress_is_monotonic_and_capped_without_errors(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)

    async def report(percent: int, phase: int | None = None) -> jobs_pb2.ReportProgressResponse:
        request = jobs_pb2.ReportProgressRequest(lease=job.lease, percent=percent)
        if phase is not None:
            request.phase = phase  # type: ignore[assignment]
        reply: jobs_pb2.ReportProgressResponse = await c.jobs.ReportProgress(
            request, metadata=s.processor
        )
        return reply

    assert (await report(40)).persisted
    lower = await report(10)
    assert (lower.percent, lower.persisted) == (40, False)
    assert (await job_row(c, "r1", 0))["progress"] == 40
    phases = [common_pb2.JOB_PHASE_DECODING, common_pb2.JOB_PHASE_LABELING]
    persisted = sum([(await report(40, phases[i % 2])).persisted for i in range(120)])
    assert persisted == 99  # 1 + 99 = the 100 persisted updates a job may have
    capped = await report(90)
    assert (capped.percent, capped.persisted) == (40, False)  # coalesced, never an error
    too_much = jobs_pb2.ReportProgressRequest(lease=job.lease, percent=101)
    assert (await refused(c.jobs.ReportProgress(too_much, metadata=s.processor)))[0] == (
        grpc.StatusCode.INVALID_ARGUMENT
    )


# completion -----------------------------------------------------------------------------------


async def test_completion_commits_items_and_a_receipt_once(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    result = await frame_result(c, s, job, frames=3)
    first = await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    assert not first.already_committed
    assert first.receipt.items_saved == 3
    # a retry after a lost answer finds the receipt, even after the lease is gone
    c.clock.advance(timedelta(minutes=10))
    retry = await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    assert retry.already_committed
    assert retry.receipt == first.receipt
    other = empty_result(job)
    assert await refused(c.jobs.Complete(complete_request(job, other), metadata=s.processor)) == (
        grpc.StatusCode.ABORTED,
        "RESULT_CONFLICT",
    )
    assert await c.count("bucket_items") == 3
    assert await c.count("receipts") == 1
    row = await job_row(c, "r1", 0)
    assert (row["state"], row["progress"], row["decoder"]) == ("completed", 100, "pyav")


async def test_a_refused_commit_writes_nothing(coordinator: CoordinatorHarness, s: Setup) -> None:
    c = coordinator
    job = await claimed(c, s)
    result = await frame_result(c, s, job, frames=2)
    result.slots[1].upload_sha256 = "0" * 64  # not what was staged
    assert await refused(c.jobs.Complete(complete_request(job, result), metadata=s.processor)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "RESULT_INVALID",
    )
    assert await c.count("bucket_items") == 0
    assert await c.count("receipts") == 0
    assert (await job_row(c, "r1", 0))["state"] == "leased"


def _drop(result: jobs_pb2.JobResult, job: jobs_pb2.ClaimedJob) -> None:
    result.slots[0].outcome = common_pb2.SLOT_OUTCOME_DROPPED
    result.slots[0].frame_time.CopyFrom(job.input.slots[0].start)


def _shift_frame_out_of_slot(result: jobs_pb2.JobResult, job: jobs_pb2.ClaimedJob) -> None:
    result.slots[0].frame_time.CopyFrom(job.input.slots[1].start)


def _lose_a_slot(result: jobs_pb2.JobResult, job: jobs_pb2.ClaimedJob) -> None:
    del result.slots[-1]


def _repeat_a_slot(result: jobs_pb2.JobResult, job: jobs_pb2.ClaimedJob) -> None:
    result.slots[1].slot_index = 0


def _unknown_output(result: jobs_pb2.JobResult, job: jobs_pb2.ClaimedJob) -> None:
    result.slots[0].outputs[0].step_id = "drop"


@pytest.mark.parametrize(
    "spoil", [_shift_frame_out_of_slot, _lose_a_slot, _repeat_a_slot, _unknown_output]
)
async def test_results_must_account_for_every_slot_once(
    coordinator: CoordinatorHarness,
    s: Setup,
    spoil: Callable[[jobs_pb2.JobResult, jobs_pb2.ClaimedJob], None],
) -> None:
    c = coordinator
    job = await claimed(c, s)
    result = await frame_result(c, s, job, frames=1)
    spoil(result, job)
    code, reason = await refused(
        c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "RESULT_INVALID")


async def test_dropped_needs_a_do_nothing_step(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await setup(c, spec_kwargs={"drop_unmatched": False})
    await create_run(c, s)
    job = await claimed(c, s)
    result = empty_result(job)
    _drop(result, job)
    assert await refused(c.jobs.Complete(complete_request(job, result), metadata=s.processor)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "RESULT_INVALID",
    )


async def test_dropped_is_accepted_with_a_do_nothing_step(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    result = empty_result(job)
    _drop(result, job)
    await c.jobs.Complete(complete_request(job, result), metadata=s.processor)


async def test_result_digest_must_match(coordinator: CoordinatorHarness, s: Setup) -> None:
    c = coordinator
    job = await claimed(c, s)
    request = complete_request(job, empty_result(job))
    request.result_sha256 = "0" * 64
    assert await refused(c.jobs.Complete(request, metadata=s.processor)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )


# expiry -------------------------------------------------------------------------------------


async def test_test_runs_expire_after_their_hour(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s, job = await leased(c, full=False)
    assert job.input.expires_at.ToDatetime() == (c.clock.now() + timedelta(hours=1)).replace(
        tzinfo=None
    )
    for _ in range(29):  # heartbeats keep the lease for 58 minutes
        c.clock.advance(timedelta(minutes=2))
        renewed = await heartbeat(c, s, job)
    assert renewed.lease_expires_at == job.input.expires_at  # type: ignore[attr-defined]
    c.clock.advance(timedelta(minutes=3))
    done = await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
    assert done.expired == 1
    row = await job_row(c, "r1", 0)
    assert (row["state"], row["input_cleared"]) == ("expired", True)
    assert await refused(heartbeat(c, s, job)) == (FAILED_PRECONDITION, "JOB_FINISHED")
    assert (await run_detail(c)).detail.run.status == common_pb2.RUN_STATUS_EXPIRED


async def test_jobs_expire_with_their_recording(coordinator: CoordinatorHarness, s: Setup) -> None:
    c = coordinator
    c.clock.advance(timedelta(days=40, minutes=1))
    done = await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
    assert done.expired == 2
    assert await claim(c, s) is None


# previews and staged uploads under the same fences ----------------------------------------------


async def test_previews_are_fenced_like_results(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s, job = await leased(c, full=False)
    stage = pub.StageObjectRequest(
        lease=job.lease,
        code_sha256=CODE,
        kind=common_pb2.OBJECT_KIND_PREVIEW,
        slot_index=0,
        sha256="a" * 64,
        byte_size=10,
        content_type="image/jpeg",
    )
    # staging first still names the key the record must carry
    staged = await c.publication.StageObject(stage, metadata=on_behalf(s))
    assert staged.object_key == "workshop-tests/previews/r1/j0/1/0.jpg"
    record = record_request(job, 0, test=True)
    assert record.object_key == staged.object_key
    published = await c.publication.RecordPreview(record, metadata=on_behalf(s))
    assert published.expires_at == job.input.expires_at
    not_its_key = pub.RecordPreviewRequest()
    not_its_key.CopyFrom(record)
    not_its_key.object_key = "previews/r1/j0/1/0.jpg"  # a full run's key
    assert await refused(c.publication.RecordPreview(not_its_key, metadata=on_behalf(s))) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)
    for call in (
        c.publication.StageObject(stage, metadata=on_behalf(s)),
        c.publication.RecordPreview(record, metadata=on_behalf(s)),
    ):
        assert await refused(call) == (FAILED_PRECONDITION, "JOB_CANCELLED")
    # the processor's key alone is not a service key
    for call in (
        c.publication.StageObject(stage, metadata=s.processor),
        c.publication.RecordPreview(record, metadata=s.processor),
    ):
        assert (await refused(call))[0] == grpc.StatusCode.PERMISSION_DENIED


async def test_staging_checks_lease_and_slot(coordinator: CoordinatorHarness, s: Setup) -> None:
    c = coordinator
    job = await claimed(c, s)
    key, _ = await stage_upload(c, s, job, 3, b"bytes")
    assert key == "uploads/r1/j0/1/3.jpg"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stage_upload(c, s, job, 60, b"bytes")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    c.clock.advance(timedelta(minutes=6))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stage_upload(c, s, job, 4, b"bytes")
    assert error_reason(caught.value)[:2] == (FAILED_PRECONDITION, "LEASE_MISMATCH")


# items after the fact ---------------------------------------------------------------------------


async def test_items_report_output_current_until_their_source_changes(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    await c.jobs.Complete(
        complete_request(job, await frame_result(c, s, job, frames=2)), metadata=s.processor
    )

    async def current() -> list[bool]:
        async with c.db.connection() as connection:
            rows = await connection.fetch(
                "SELECT output_current FROM bucket_items_current ORDER BY slot_index"
            )
        return [row["output_current"] for row in rows]

    assert await current() == [True, True]
    await put_recording(c, "cam-a-0", "cam-a", DAY + timedelta(hours=8))
    assert await current() == [False, False]


async def test_deleting_a_bucket_deletes_its_items_and_releases_their_uploads(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    await c.jobs.Complete(
        complete_request(job, await frame_result(c, s, job, frames=2)), metadata=s.processor
    )
    deleted = await c.operator.DeleteBucket(
        op.DeleteBucketRequest(bucket_id="yard"), metadata=c.admin
    )
    assert deleted.items_deleted == 2
    assert list(deleted.cancelled_run_ids) == ["r1"]  # its other job was still queued
    async with c.db.connection() as connection:
        released = await connection.fetchval(
            "SELECT count(*) FROM staged_objects WHERE kind = 'upload' AND collectable_at = $1",
            c.clock.now(),
        )
    assert released == 2
    assert await c.count("bucket_items") == 0


async def test_a_stale_lease_cannot_settle_on_a_later_generations_receipt(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    stale = await claimed(c, s)
    await claimed(c, s)
    c.clock.advance(timedelta(minutes=6))
    await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
    fresh = await claimed(c, s)
    assert (fresh.lease.job_id, fresh.lease.generation) == ("j0", 2)
    result = empty_result(fresh)
    await c.jobs.Complete(complete_request(fresh, result), metadata=s.processor)
    same_result_old_lease = complete_request(stale, result)
    assert await refused(c.jobs.Complete(same_result_old_lease, metadata=s.processor)) == (
        FAILED_PRECONDITION,
        "JOB_FINISHED",
    )


# fractional intervals -------------------------------------------------------------------------

HALF_SECOND = timedelta(milliseconds=500)
EIGHT = DAY + timedelta(hours=8)


async def half_second_setup(c: CoordinatorHarness) -> Setup:
    """A run sampling 08:00-08:01 every 0.5 s over three recordings (41, 5 and 40 slots)."""
    world = await build_world(c, recordings_per_camera=0)
    # 07:59:00-08:00:20.25: the grid points 08:00:00.0 .. 08:00:20.0
    await put_recording(c, "a0", "cam-a", EIGHT - timedelta(minutes=1), timedelta(seconds=80.25))
    # 08:00:10.2-08:00:13.0: 10.5, 11.0, 11.5, 12.0, 12.5
    await put_recording(c, "b0", "cam-b", EIGHT + timedelta(seconds=10.2), timedelta(seconds=2.8))
    # from 08:00:40.0 on, clipped by the window: 40.0 .. 59.5
    await put_recording(c, "a1", "cam-a", EIGHT + timedelta(seconds=40))
    spec = workflow_spec(cameras=["cam-a", "cam-b"], interval=0.5, window=(8, 8))
    spec.graph.steps[0].input.window_end.minutes = 1
    await save_workflow(c, "yard", spec)
    secret = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="processor")
    service = await c.key(Grant(ScopeName.SERVICE), name="preview-service")
    built = Setup(world, bearer_metadata(secret), bearer_metadata(service), secret)
    await create_run(c, built)
    return built


def slot_bounds(job: jobs_pb2.ClaimedJob) -> list[tuple[timedelta, timedelta]]:
    """Each slot's [start, end) as the time since 08:00."""
    return [
        (
            slot.start.ToDatetime(tzinfo=UTC) - EIGHT,
            slot.end.ToDatetime(tzinfo=UTC) - EIGHT,
        )
        for slot in job.input.slots
    ]


async def test_half_second_slots_are_planned_claimed_and_committed_exactly(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s = await half_second_setup(c)
    detail = (await run_detail(c)).detail
    assert [(j.recording_id, j.slot_count) for j in detail.jobs] == [
        ("a0", 41),
        ("b0", 5),
        ("a1", 40),
    ]
    assert detail.run.counts.slots_expected == 86
    async with c.db.connection() as connection:
        assert await connection.fetch("SELECT DISTINCT interval_ms FROM jobs") == [(500,)]
    snapshot = await c.workshop.GetRunSnapshot(
        ws.GetRunSnapshotRequest(run_id="r1"), metadata=c.admin
    )
    assert snapshot.snapshot.sampling.interval_seconds == 0.5

    a0, b0, a1 = [await claimed(c, s) for _ in range(3)]
    assert slot_bounds(a0) == [(k * HALF_SECOND, (k + 1) * HALF_SECOND) for k in range(41)]
    assert slot_bounds(b0) == [
        (k * HALF_SECOND, (k + 1) * HALF_SECOND) for k in range(21, 26)
    ]  # 10.5 s .. 12.5 s
    assert slot_bounds(a1)[-1] == (timedelta(seconds=59.5), timedelta(seconds=60))

    # a frame 499 ms into its half-second slot is inside it
    result = await frame_result(c, s, a0, frames=2)
    for slot in result.slots[:2]:
        start = a0.input.slots[slot.slot_index].start.ToDatetime(tzinfo=UTC)
        slot.frame_time.FromDatetime(start + timedelta(milliseconds=499))
    receipt = (await c.jobs.Complete(complete_request(a0, result), metadata=s.processor)).receipt
    assert receipt.items_saved == 2
    async with c.db.connection() as connection:
        times = await connection.fetch(
            "SELECT frame_time FROM bucket_items WHERE job_index = 0 ORDER BY slot_index"
        )
    assert [row["frame_time"] - EIGHT for row in times] == [
        timedelta(milliseconds=499),
        timedelta(milliseconds=999),
    ]

    # at its slot's end (the next slot's start) or before its start, a frame is outside
    result = await frame_result(c, s, b0, frames=1)
    start = b0.input.slots[0].start.ToDatetime(tzinfo=UTC)
    for outside in (start + HALF_SECOND, start - timedelta(microseconds=1)):
        result.slots[0].frame_time.FromDatetime(outside)
        assert await refused(
            c.jobs.Complete(complete_request(b0, result), metadata=s.processor)
        ) == (grpc.StatusCode.INVALID_ARGUMENT, "RESULT_INVALID")
    assert (await job_row(c, "r1", 1))["state"] == "leased"
    result.slots[0].frame_time.FromDatetime(start + HALF_SECOND - timedelta(microseconds=1))
    receipt = (await c.jobs.Complete(complete_request(b0, result), metadata=s.processor)).receipt
    assert receipt.items_saved == 1
    assert await c.count("receipts") == 2
