"""Claim with wait_seconds (a long poll) on real Postgres over gRPC.

A Claim that finds no job waits until a job of its runtime becomes claimable: the
trigger of migration 0009 announces every job queued or ended on `workshop_jobs` with
its runtime id, and the coordinator's LISTEN connection wakes the Claims waiting for that
runtime. The first tests listen on a connection of their own, as another replica
would; the others wait in Claims and check what they answer. A Claim that was not
woken answers no job when its wait ends, so every "answers a job" below fails (after
the wait) when the wake does not work, among them the next run's job that becomes
claimable when the head run's last job ends.

Ordering without sleeps: a waiting Claim is known to be waiting once its first try
committed, and that try marks the runtime seen at the (frozen, advanced) clock's now.
It subscribed before that try, so anything queued afterwards wakes it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import asyncpg
import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.leases.maintenance import Maintenance
from testbed.coordinator_leases import (
    Metadata,
    Setup,
    claimed,
    complete_request,
    create_run,
    empty_result,
    on_behalf,
    record_request,
    refused,
    setup,
)
from testbed.coordinator_world import CODE, run_request, save_workflow, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness
from testbed.session_jobs import JOB_TRANSPORTS
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

JOBS_CHANNEL = "workshop_jobs"
RUN_CHANNEL = "workshop_run"
FENCE_CHANNEL = "claim_wait_test_fence"
LONG_WAIT = 30  # a woken Claim answers long before; an unwoken one fails the test
SHORT_WAIT = 2  # for a Claim that must answer no job


@pytest.fixture(params=JOB_TRANSPORTS)
def job_transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs twice: on JobService's unary calls and on a Session stream."""
    return str(request.param)


@pytest.fixture
async def s(coordinator: CoordinatorHarness) -> Setup:
    built = await setup(coordinator)
    # `one` plans a single job: cam-a's 08:00 recording
    await save_workflow(coordinator, "one", workflow_spec(window=(8, 9)))
    return built


class Announcements:
    """What `workshop_jobs` carried, heard on a LISTEN connection of the test's own."""

    def __init__(self, connection: asyncpg.Connection) -> None:
        self._connection = connection
        self._heard: list[str] = []
        self._fences: dict[str, asyncio.Event] = {}

    def notified(self, _connection: Any, _pid: int, channel: str, payload: str) -> None:
        if channel == JOBS_CHANNEL:
            self._heard.append(payload)
        elif payload in self._fences:
            self._fences[payload].set()

    async def since_last(self, c: CoordinatorHarness) -> list[str]:
        """The runtime ids announced since the last call. Notifications arrive in commit
        order, so once a fence notified after the calls under test has arrived, all they
        announced has too: an empty list means nothing was announced."""
        if c.events is not None:  # the coordinator announces some commits after them
            await c.events.sent()
        token = uuid.uuid4().hex
        arrived = self._fences[token] = asyncio.Event()
        async with c.db.connection() as connection:
            await connection.execute("SELECT pg_notify($1, $2)", FENCE_CHANNEL, token)
        await asyncio.wait_for(arrived.wait(), 10)
        del self._fences[token]
        heard, self._heard = self._heard, []
        return heard


@asynccontextmanager
async def announcements(c: CoordinatorHarness) -> AsyncIterator[Announcements]:
    connection = await asyncpg.connect(c.db.dsn)
    try:
        heard = Announcements(connection)
        await connection.add_listener(JOBS_CHANNEL, heard.notified)
        await connection.add_listener(FENCE_CHANNEL, heard.notified)
        yield heard
    finally:
        await connection.close()


def claim_request(
    runtime_id: str, wait_seconds: int, request_id: str = ""
) -> jobs_pb2.ClaimRequest:
    return jobs_pb2.ClaimRequest(
        runtime_id=runtime_id, code_sha256=CODE, request_id=request_id, wait_seconds=wait_seconds
    )


async def claim(
    c: CoordinatorHarness,
    s: Setup,
    wait_seconds: int,
    *,
    runtime_id: str = "",
    metadata: Metadata | None = None,
    deadline: float | None = None,
) -> jobs_pb2.ClaimResponse:
    reply: jobs_pb2.ClaimResponse = await c.jobs.Claim(
        claim_request(runtime_id or s.world.tracking_runtime, wait_seconds),
        metadata=metadata or s.processor,
        timeout=deadline,  # seconds
    )
    return reply


async def waiting(
    c: CoordinatorHarness, runtime_id: str, call: Coroutine[Any, Any, jobs_pb2.ClaimResponse]
) -> asyncio.Task[jobs_pb2.ClaimResponse]:
    """Starts the Claim `call` and returns once it waits: its first try committed (it
    marked the runtime seen at a now no earlier call used) and it has not answered."""
    now = c.clock.advance(timedelta(seconds=2))  # runtime_seen writes after 1 s
    task = asyncio.create_task(call)
    async with c.db.connection() as connection:
        for _ in range(1000):
            seen = await connection.fetchval(
                "SELECT last_seen_at FROM runtimes WHERE runtime_id = $1", runtime_id
            )
            if seen == now or task.done():
                break
            await asyncio.sleep(0.01)
    assert not task.done(), f"the claim answered at once: {task.result()}"
    assert seen == now, "the claim never tried"
    return task


async def jobs_by_state(c: CoordinatorHarness) -> list[tuple[str, int, str, int]]:
    """(run, job index, state, generation) of every job."""
    async with c.db.connection() as connection:
        rows = await connection.fetch(
            "SELECT run_id, job_index, state, generation FROM jobs ORDER BY run_id, job_index"
        )
    return [(r["run_id"], r["job_index"], r["state"], r["generation"]) for r in rows]


async def other_processor(c: CoordinatorHarness) -> Metadata:
    secret = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="processor-2")
    return bearer_metadata(secret)


def job_of(reply: jobs_pb2.ClaimResponse) -> tuple[str, str, int]:
    assert reply.HasField("job"), f"no job: {reply}"
    return (reply.job.lease.run_id, reply.job.lease.job_id, reply.job.lease.generation)


def no_job(reply: jobs_pb2.ClaimResponse) -> timedelta:
    """The retry_after of a no-job answer."""
    assert not reply.HasField("job"), f"a job: {reply.job.lease}"
    assert reply.HasField("retry_after")
    return reply.retry_after.ToTimedelta()


# 1. The trigger, and the commits announced after them


class Senders:
    """Every notification on the run events' channels: (channel, payload, sending backend)."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, str, int]] = []

    def notified(self, _connection: Any, pid: int, channel: str, payload: str) -> None:
        self.heard.append((channel, payload, pid))


async def test_claims_completes_and_records_notify_nothing_and_are_announced_after_commit(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    """Their transactions notify nothing themselves (Postgres serializes every notifying
    commit: migration 0018); the coordinator announces them after they commit, from its
    LISTEN connection, where another replica hears them: the run on `workshop_run`, and a
    completed job's runtime on `workshop_jobs`."""
    c = coordinator
    assert c.events is not None
    assert c.events.listener_pid is not None
    await create_run(c, s)
    senders = Senders()
    async with announcements(c) as heard:
        connection = heard._connection
        for channel in (RUN_CHANNEL, JOBS_CHANNEL):
            await connection.add_listener(channel, senders.notified)
        await heard.since_last(c)
        senders.heard.clear()
        job = await claimed(c, s)
        await heard.since_last(c)
        assert senders.heard == [(RUN_CHANNEL, "r1", c.events.listener_pid)], "a Claim"
        senders.heard.clear()
        reply = await c.publication.RecordPreviews(
            pub.RecordPreviewsRequest(previews=[record_request(job, 0, test=False)]),
            metadata=on_behalf(s),
        )
        assert reply.outcomes[0].HasField("recorded")
        await heard.since_last(c)
        assert senders.heard == [(RUN_CHANNEL, "r1", c.events.listener_pid)], "a record"
        senders.heard.clear()
        await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
        assert await heard.since_last(c) == [s.world.tracking_runtime]
        assert sorted(senders.heard) == [
            (JOBS_CHANNEL, s.world.tracking_runtime, c.events.listener_pid),
            (RUN_CHANNEL, "r1", c.events.listener_pid),
        ], "a Complete"


async def test_announcements_made_while_not_listening_are_sent_after_the_reconnect(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    """The LISTEN connection lost (its backend terminated): a commit announced meanwhile
    wakes this process's waiters at once and reaches the other replicas once the
    connection is back."""
    c = coordinator
    assert c.events is not None
    await create_run(c, s)
    async with announcements(c) as heard:
        await heard.since_last(c)
        async with c.db.connection() as connection:
            await connection.execute("SELECT pg_terminate_backend($1)", c.events.listener_pid)
        job = await claimed(c, s)
        async with c.events.claimable(s.world.tracking_runtime) as woken:
            await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
            await asyncio.wait_for(woken.wait(), 1)  # at once, before any reconnect
        await asyncio.wait_for(c.events.sent(), 10)  # after the reconnect (1 s)
        assert await heard.since_last(c) == [s.world.tracking_runtime]


async def test_a_created_run_announces_its_runtime_once(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    async with announcements(c) as heard:
        assert await heard.since_last(c) == []
        await create_run(c, s)  # two jobs in one transaction
        assert await jobs_by_state(c) == [("r1", 0, "queued", 0), ("r1", 1, "queued", 0)]
        assert await heard.since_last(c) == [s.world.tracking_runtime]
        await c.workshop.CreateRun(
            run_request("p1", "yard", s.world.plain_runtime), metadata=c.admin
        )
        assert await heard.since_last(c) == [s.world.plain_runtime]


async def test_a_release_a_rescue_and_an_end_announce_what_the_lease_calls_do_not(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    runtime = s.world.tracking_runtime
    await create_run(c, s)
    async with announcements(c) as heard:
        await heard.since_last(c)
        j0 = await claimed(c, s)
        j1 = await claimed(c, s)
        assert await heard.since_last(c) == [], "a Claim"
        await c.jobs.Heartbeat(jobs_pb2.HeartbeatRequest(lease=j0.lease), metadata=s.processor)
        assert await heard.since_last(c) == [], "a Heartbeat"
        await c.jobs.ReportProgress(
            jobs_pb2.ReportProgressRequest(
                lease=j0.lease, percent=42, phase=common_pb2.JOB_PHASE_LABELING
            ),
            metadata=s.processor,
        )
        assert await heard.since_last(c) == [], "a ReportProgress"
        await c.jobs.Complete(complete_request(j0, empty_result(j0)), metadata=s.processor)
        assert await heard.since_last(c) == [runtime], "a Complete (a job that ended)"
        await c.jobs.Release(jobs_pb2.ReleaseRequest(lease=j1.lease), metadata=s.processor)
        assert await heard.since_last(c) == [runtime], "a Release"
        assert await jobs_by_state(c) == [("r1", 0, "completed", 1), ("r1", 1, "queued", 1)]

        lapsing = await claimed(c, s)
        assert lapsing.lease.job_id == "j1"
        assert await heard.since_last(c) == []
        c.clock.advance(timedelta(minutes=5, seconds=1))
        done = await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
        assert done.requeued == 1
        assert await heard.since_last(c) == [runtime], "a rescued lapsed lease"
        assert await jobs_by_state(c) == [("r1", 0, "completed", 1), ("r1", 1, "queued", 2)]


async def test_a_cancel_announces_its_runtime_once(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    await create_run(c, s)
    await claimed(c, s)  # one job leased, one queued: both end
    async with announcements(c) as heard:
        await heard.since_last(c)
        reply = await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)
        assert reply.jobs_cancelled == 2
        assert await heard.since_last(c) == [s.world.tracking_runtime]


# 2. The answers without a wake


async def test_a_wait_on_an_empty_queue_answers_no_job_and_asks_again_at_once(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    assert no_job(await claim(c, s, 1)) == timedelta(0)
    assert no_job(await claim(c, s, 0)) == timedelta(seconds=2)  # the old poll


async def test_a_wait_over_60_seconds_is_invalid_and_leases_nothing(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    await create_run(c, s)
    code, reason = await refused(claim(c, s, 61))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    assert await jobs_by_state(c) == [("r1", 0, "queued", 0), ("r1", 1, "queued", 0)]
    assert job_of(await claim(c, s, 60)) == ("r1", "j0", 1)  # the most allowed


# 3. Woken by a queued job


async def test_a_waiting_claim_gets_the_job_of_a_run_created_meanwhile(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    runtime = s.world.tracking_runtime
    task = await waiting(c, runtime, claim(c, s, LONG_WAIT))
    await create_run(c, s)
    assert job_of(await task) == ("r1", "j0", 1)
    assert await jobs_by_state(c) == [("r1", 0, "leased", 1), ("r1", 1, "queued", 0)]


async def test_a_waiting_claim_gets_a_job_another_key_released(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    runtime = s.world.tracking_runtime
    await create_run(c, s)
    other = await other_processor(c)
    theirs = [await claim(c, s, 0, metadata=other) for _ in range(2)]
    assert [job_of(reply) for reply in theirs] == [("r1", "j0", 1), ("r1", "j1", 1)]
    task = await waiting(c, runtime, claim(c, s, LONG_WAIT))
    await c.jobs.Release(jobs_pb2.ReleaseRequest(lease=theirs[1].job.lease), metadata=other)
    assert job_of(await task) == ("r1", "j1", 2)
    assert await jobs_by_state(c) == [("r1", 0, "leased", 1), ("r1", 1, "leased", 2)]


# 4. Not woken into another runtime's job


async def test_a_claim_waiting_for_one_runtime_does_not_get_anothers_job(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    tracking, plain = s.world.tracking_runtime, s.world.plain_runtime
    task = await waiting(c, tracking, claim(c, s, SHORT_WAIT))
    await c.workshop.CreateRun(run_request("p1", "one", plain), metadata=c.admin)
    assert no_job(await task) == timedelta(0)
    assert await jobs_by_state(c) == [("p1", 0, "queued", 0)]
    assert job_of(await claim(c, s, 0, runtime_id=plain)) == ("p1", "j0", 1)  # it was there


# 5. The call's deadline


async def test_a_deadline_shorter_than_the_wait_answers_no_job_before_it(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    # the wait ends a second before the 2 s deadline; without that cut it ran into it
    assert no_job(await claim(c, s, LONG_WAIT, deadline=2)) == timedelta(0)
    await create_run(c, s)
    assert job_of(await claim(c, s, 0)) == ("r1", "j0", 1)  # nothing leased meanwhile


# 6. Two waiting, one job


async def test_two_waiting_claims_and_one_job_lease_it_once(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    runtime = s.world.tracking_runtime
    other = await other_processor(c)
    first = await waiting(c, runtime, claim(c, s, SHORT_WAIT))
    second = await waiting(c, runtime, claim(c, s, SHORT_WAIT, metadata=other))
    await c.workshop.CreateRun(
        run_request("r1", "one", runtime, mode=common_pb2.RUN_MODE_FULL), metadata=c.admin
    )
    replies = await asyncio.gather(first, second)
    got = [reply for reply in replies if reply.HasField("job")]
    assert len(got) == 1, f"{len(got)} claims got the one job"
    assert job_of(got[0]) == ("r1", "j0", 1)
    assert [no_job(reply) for reply in replies if not reply.HasField("job")] == [timedelta(0)]
    assert await jobs_by_state(c) == [("r1", 0, "leased", 1)]


# Claimable without being queued: the claim order is run by run (job_claim leases from the
# oldest run of the runtime with unfinished jobs), so a queued job of a later run becomes
# claimable when the head run's last job ends; the trigger announces ended jobs too.


async def test_a_waiting_claim_gets_the_next_runs_job_when_the_head_run_ends(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    runtime = s.world.tracking_runtime
    await create_run(c, s, "r1")
    await create_run(c, s, "r2")  # queued behind r1
    other = await other_processor(c)
    theirs = [(await claim(c, s, 0, metadata=other)).job for _ in range(2)]
    assert [job.lease.run_id for job in theirs] == ["r1", "r1"]
    task = await waiting(c, runtime, claim(c, s, 3))
    for job in theirs:
        await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=other)
    assert job_of(await task) == ("r2", "j0", 1)
