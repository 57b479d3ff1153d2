"""JobService.Session, the stream's own rules (docs/leases-and-fences.md#sessions).

What each call answers is its unary RPC's: the lease and fence tests run on both paths
(their modules' `job_transport` fixture, `testbed.session_jobs`). These are what only a
stream has: one authentication when it opens, while every write stays fenced in SQL;
calls in flight at once, answered by request_id in the order they finish, at most 64 of
them; the requests that end the stream; a half-close that answers what is in flight; and
a stream broken mid-Complete, which loses nothing committed and half-writes nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.servicers.jobs import MAX_SESSION_CALLS
from testbed.coordinator_leases import (
    Setup,
    complete_request,
    empty_result,
    frame_result,
    leased,
    refused,
)
from testbed.coordinator_world import CODE, error_reason
from testbed.harness.coordinator import CoordinatorHarness
from testbed.session_jobs import SessionCallError, SessionStream
from workshop.kit.auth import bearer_metadata
from workshop.kit.metrics import REGISTRY
from workshop.v1 import jobs_pb2, jobs_pb2_grpc
from workshop.v1 import operator_pb2 as op

OK = grpc.StatusCode.OK
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


def stub(c: CoordinatorHarness) -> jobs_pb2_grpc.JobServiceAsyncStub:
    jobs: jobs_pb2_grpc.JobServiceAsyncStub = jobs_pb2_grpc.JobServiceStub(c.channel)
    return jobs


def session(c: CoordinatorHarness, metadata: Any, timeout: float | None = None) -> Any:
    """A raw Session call: its requests written, its answers read, by the test."""
    return stub(c).Session(metadata=metadata, timeout=timeout)


def waiting_claim(s: Setup, request_id: int, wait_seconds: int) -> jobs_pb2.SessionRequest:
    """A Claim that waits: nothing is queued for the plain runtime (r1 is the tracking one's)."""
    return jobs_pb2.SessionRequest(
        request_id=request_id,
        claim=jobs_pb2.ClaimRequest(
            runtime_id=s.world.plain_runtime, code_sha256=CODE, wait_seconds=wait_seconds
        ),
    )


def heartbeat(request_id: int, job: jobs_pb2.ClaimedJob) -> jobs_pb2.SessionRequest:
    return jobs_pb2.SessionRequest(
        request_id=request_id, heartbeat=jobs_pb2.HeartbeatRequest(lease=job.lease)
    )


def refusal(answer: jobs_pb2.SessionResponse) -> tuple[grpc.StatusCode, str]:
    assert answer.WhichOneof("answer") == "error", answer
    code, reason, _ = error_reason(SessionCallError(answer.error))
    return code, reason


async def ended_with(call: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """The status a stream ends with, read past any answers still on it."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await read_to_the_end(call)
    return error_reason(caught.value)


async def read_to_the_end(call: Any) -> None:
    while await call.read() is not grpc.aio.EOF:
        pass


async def job_row(c: CoordinatorHarness, job: jobs_pb2.ClaimedJob) -> tuple[str, int]:
    async with c.db.connection() as connection:
        row = await connection.fetchrow(
            "SELECT state, generation FROM jobs WHERE run_id = $1 AND job_index = $2",
            job.lease.run_id,
            job.input.job_index,
        )
    assert row is not None
    return row["state"], row["generation"]


# one authentication per stream; every write fenced -----------------------------------------


async def test_a_session_authenticates_once_and_its_writes_are_still_fenced(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    stream = SessionStream(stub(c), s.processor)
    try:
        renewed = await stream.ask("heartbeat", jobs_pb2.HeartbeatRequest(lease=job.lease))
        assert renewed.HasField("heartbeat")
        async with c.db.connection() as connection:
            key_id = await connection.fetchval("SELECT key_id FROM keys WHERE name = 'processor'")
        # RevokeKey empties this coordinator's principal cache: a unary call authenticates
        # afresh and its credential is refused ...
        await c.operator.RevokeKey(op.RevokeKeyRequest(key_id=key_id), metadata=c.admin)
        unary = stub(c).Heartbeat(jobs_pb2.HeartbeatRequest(lease=job.lease), metadata=s.processor)
        assert await refused(unary) == (UNAUTHENTICATED, "CREDENTIAL_REJECTED")
        # ... while the stream, authenticated once when it opened, is not asked again: its
        # writes reach the SQL, which refuses them there (fence 4, the claiming key).
        answer = await stream.ask("heartbeat", jobs_pb2.HeartbeatRequest(lease=job.lease))
        assert refusal(answer) == (FAILED_PRECONDITION, "REPORTER_NOT_AUTHORIZED")
        answer = await stream.ask("complete", complete_request(job, empty_result(job)))
        assert refusal(answer) == (FAILED_PRECONDITION, "REPORTER_NOT_AUTHORIZED")
        claim = jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE)
        answer = await stream.ask("claim", claim)
        assert refusal(answer) == (UNAUTHENTICATED, "CREDENTIAL_REJECTED")
        assert stream.ended is None  # refusals are answers: the stream goes on
    finally:
        await stream.close()
    assert await c.count("receipts") == 0
    assert await job_row(c, job) == ("leased", 1)
    # a new stream with the revoked key is refused when it opens
    fresh = SessionStream(stub(c), s.processor)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await fresh.ask("heartbeat", jobs_pb2.HeartbeatRequest(lease=job.lease))
    finally:
        await fresh.close()
    assert error_reason(caught.value)[:2] == (UNAUTHENTICATED, "CREDENTIAL_REJECTED")


@pytest.mark.parametrize(
    ("credential", "expected"),
    [
        ("none", (UNAUTHENTICATED, "CREDENTIAL_MISSING")),
        ("workshop", (grpc.StatusCode.PERMISSION_DENIED, "SCOPE_MISSING")),
    ],
)
async def test_a_session_no_call_of_which_is_allowed_ends_when_it_opens(
    coordinator: CoordinatorHarness, credential: str, expected: tuple[grpc.StatusCode, str]
) -> None:
    c = coordinator
    metadata = (
        bearer_metadata(await c.key(Grant(ScopeName.WORKSHOP), name="agent"))
        if credential == "workshop"
        else ()
    )
    call = session(c, metadata)
    # nothing sent: the refusal comes before any request is read
    assert (await ended_with(call))[:2] == expected


# concurrency and order ---------------------------------------------------------------------


async def test_calls_run_at_once_and_are_answered_as_they_finish(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    call = session(c, s.processor)
    began = time.monotonic()
    await call.write(waiting_claim(s, 7, wait_seconds=1))
    await call.write(heartbeat(3, job))
    first = await call.read()
    # the heartbeat, sent second, is not held back by the claim waiting before it
    assert first.request_id == 3
    assert first.HasField("heartbeat")
    assert time.monotonic() - began < 1
    second = await call.read()
    assert second.request_id == 7
    assert second.claim.retry_after.ToTimedelta().total_seconds() == 0  # waited, no job
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == OK


async def test_a_half_closed_session_answers_the_calls_in_flight_then_ends(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    call = session(c, s.processor)
    await call.write(waiting_claim(s, 1, wait_seconds=1))
    await call.write(heartbeat(2, job))
    await call.done_writing()
    answered = []
    while (answer := await call.read()) is not grpc.aio.EOF:
        answered.append((answer.request_id, answer.WhichOneof("answer")))
    assert sorted(answered) == [(1, "claim"), (2, "heartbeat")]
    assert await call.code() == OK


async def test_at_most_64_calls_are_in_flight_on_a_session(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    call = session(c, s.processor)
    assert MAX_SESSION_CALLS == 64
    for request_id in range(1, MAX_SESSION_CALLS + 1):
        await call.write(waiting_claim(s, request_id, wait_seconds=2))
    await call.write(heartbeat(100, job))  # one more: refused at once, not queued
    refused_answer = await call.read()
    assert refused_answer.request_id == 100
    assert refusal(refused_answer) == (RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED")
    assert refused_answer.error.metadata["limit"] == "64"
    claims = {(await call.read()).request_id for _ in range(MAX_SESSION_CALLS)}
    assert claims == set(range(1, MAX_SESSION_CALLS + 1))
    # the calls in flight answered: the next call is taken
    await call.write(heartbeat(100, job))
    again = await call.read()
    assert again.request_id == 100
    assert again.HasField("heartbeat")
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF


# requests that end the stream --------------------------------------------------------------


async def test_a_request_id_reused_while_in_flight_ends_the_session(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    call = session(c, s.processor)
    # an id may be used again once answered ...
    for _ in range(2):
        await call.write(heartbeat(5, job))
        answer = await call.read()
        assert (answer.request_id, answer.WhichOneof("answer")) == (5, "heartbeat")
    # ... but not while its call is in flight: the stream ends, the waiting claim with it
    began = time.monotonic()
    await call.write(waiting_claim(s, 9, wait_seconds=10))
    await call.write(heartbeat(9, job))
    code, reason, metadata = await ended_with(call)
    assert (code, reason, metadata) == (INVALID_ARGUMENT, "INVALID_FIELD", {"field": "request_id"})
    assert time.monotonic() - began < 5


async def test_a_request_without_a_call_ends_the_session(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s, _ = await leased(c)
    call = session(c, s.processor)
    await call.write(jobs_pb2.SessionRequest(request_id=1))
    assert await ended_with(call) == (INVALID_ARGUMENT, "INVALID_FIELD", {"field": "call"})


# a broken stream ---------------------------------------------------------------------------


async def backends_waiting_on_a_lock(c: CoordinatorHarness) -> int:
    async with c.db.connection() as connection:
        count: int = await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    return count


async def until(predicate: Any, what: str) -> None:
    for _ in range(500):
        if await predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting until {what}")


async def test_a_session_broken_mid_complete_writes_nothing_and_the_retry_commits(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    result = await frame_result(c, s, job)  # items: the commit's transaction
    request = complete_request(job, result)
    async with c.db.transaction() as holder:
        # hold the job's row: the Complete waits on it inside its transaction
        await holder.execute(
            "SELECT 1 FROM jobs WHERE run_id = $1 AND job_index = $2 FOR UPDATE",
            job.lease.run_id,
            job.input.job_index,
        )
        call = session(c, s.processor)
        await call.write(jobs_pb2.SessionRequest(request_id=1, complete=request))

        async def blocked() -> bool:
            return await backends_waiting_on_a_lock(c) == 1

        async def released() -> bool:
            return await backends_waiting_on_a_lock(c) == 0

        await until(blocked, "the Complete waits on the job's row")
        call.cancel()  # the client goes away mid-Complete
        await until(released, "the cancelled Complete's statement ends")
    # the cancelled call's transaction rolled back: nothing of it is written
    assert await job_row(c, job) == ("leased", 1)
    assert await c.count("receipts") == 0
    assert await c.count("bucket_items") == 0
    # asked again on a new stream, the Complete commits; asked once more, it is a retry
    stream = SessionStream(stub(c), s.processor)
    try:
        first = await stream.ask("complete", request)
        assert not first.complete.already_committed
        assert first.complete.receipt.items_saved == 2
        again = await stream.ask("complete", request)
        assert again.complete.already_committed
        assert again.complete.receipt == first.complete.receipt
    finally:
        await stream.close()
    assert await job_row(c, job) == ("completed", 1)


async def test_a_session_broken_after_a_commit_loses_nothing_and_the_retry_answers_it(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    request = complete_request(job, await frame_result(c, s, job))
    call = session(c, s.processor)
    await call.write(jobs_pb2.SessionRequest(request_id=1, complete=request))

    async def committed() -> bool:
        return await c.count("receipts") == 1

    await until(committed, "the Complete commits")
    call.cancel()  # its answer is never read: lost with the stream
    assert await job_row(c, job) == ("completed", 1)
    assert await c.count("bucket_items") == 2
    stream = SessionStream(stub(c), s.processor)
    try:
        retried = await stream.ask("complete", request)
    finally:
        await stream.close()
    assert retried.complete.already_committed
    assert retried.complete.receipt.items_saved == 2
    assert await c.count("receipts") == 1
    assert await c.count("bucket_items") == 2


# metrics -----------------------------------------------------------------------------------


def counted(series: str, method: str, **labels: str) -> float:
    """The value of the coordinator-test's `series` sample for `method` (and `labels`)."""
    wanted = {"service": "coordinator-test", "method": method, **labels}
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == series and all(
                sample.labels.get(name) == value for name, value in wanted.items()
            ):
                return float(sample.value)
    return 0.0


async def test_each_call_on_a_session_is_counted_as_a_call_of_its_own(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    on_stream = "workshop.v1.JobService/Session/Heartbeat"
    unary = "workshop.v1.JobService/Heartbeat"
    before = (
        counted("workshop_rpc_requests_total", on_stream, code="OK"),
        counted("workshop_rpc_requests_total", on_stream, code="FAILED_PRECONDITION"),
        counted("workshop_rpc_refusals_total", on_stream, reason="LEASE_MISMATCH"),
        counted("workshop_rpc_requests_total", unary, code="OK"),
    )
    forged = jobs_pb2.ClaimedJob()
    forged.CopyFrom(job)
    forged.lease.token = "00000000-0000-4000-8000-000000000000"
    call = session(c, s.processor)
    for request_id, lease in enumerate((job, job, forged), start=1):
        await call.write(heartbeat(request_id, lease))
        await call.read()
    await call.done_writing()
    await read_to_the_end(call)
    after = (
        counted("workshop_rpc_requests_total", on_stream, code="OK"),
        counted("workshop_rpc_requests_total", on_stream, code="FAILED_PRECONDITION"),
        counted("workshop_rpc_refusals_total", on_stream, reason="LEASE_MISMATCH"),
        counted("workshop_rpc_requests_total", unary, code="OK"),
    )
    # two renewals and a refusal on the stream; no unary Heartbeat was answered
    assert [b - a for a, b in zip(before, after, strict=True)] == [2, 1, 1, 0]
