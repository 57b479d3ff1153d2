"""The coordinator when its database cannot be reached, on real Postgres (see
docs/leases-and-fences.md): dropped connections and a stopped server are UNAVAILABLE
(safe to ask again), never INTERNAL, and once the database is back the same call goes
through as if nothing happened.

Each fault is made at a gate, so it happens where the test says: a statement held in
flight behind a row lock the test holds when its connection is terminated; a pooled
connection whose end of stream a proxy holds back after the server's goodbye.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable

import grpc
import pytest

from services.coordinator.platform.db import Database
from services.coordinator.platform.errors import DatabaseUnavailable
from testbed.coordinator_leases import Setup, claimed, leased, on_behalf, record_request
from testbed.coordinator_world import error_reason
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from testbed.harness.postgres import PostgresDatabase, stopped, terminate_connections
from testbed.harness.tcp_proxy import HeldEndProxy, held_end_proxy
from tests.processor_gates import until
from workshop.v1 import jobs_pb2
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


async def unavailable(call: Awaitable[object]) -> str:
    """The call fails UNAVAILABLE (reason UNAVAILABLE); its message."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    code, reason, _ = error_reason(caught.value)
    assert (code, reason) == (UNAVAILABLE, "UNAVAILABLE"), caught.value.details()
    return caught.value.details() or ""


def record_previews(
    c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, slot: int
) -> Awaitable[pub.RecordPreviewsResponse]:
    request = pub.RecordPreviewsRequest(previews=[record_request(job, slot, test=False)])
    return c.publication.RecordPreviews(request, metadata=on_behalf(s))


@pytest.fixture
async def proxy(pg_database: PostgresDatabase) -> AsyncIterator[HeldEndProxy]:
    cluster = pg_database.cluster
    async with held_end_proxy(cluster.host, cluster.port) as started:
        yield started


async def test_a_connection_the_server_dropped_while_idle_is_unavailable_not_internal(
    pg_database: PostgresDatabase, proxy: HeldEndProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """The trial's `cannot switch to state 12; another operation (2) is in progress` from
    RecordPreviews. No two coroutines share a connection: state 2 is asyncpg's
    ERROR_CONSUME. pg_terminate_backend on an idle pooled connection makes the server send
    FATAL 57P01 and close; asyncpg reads the FATAL with no operation in progress and
    waits for a ReadyForQuery that never comes, and until it reads the end of the stream
    the pool still hands the connection out, so the next statement on it fails at once.
    The proxy holds that window open: the coordinator answers UNAVAILABLE (it answered
    INTERNAL), and when the stream ends the same call is recorded, once."""
    cluster, database = pg_database.cluster, pg_database.name
    through_proxy = f"postgresql://{cluster.superuser}@127.0.0.1:{proxy.port}/{database}"
    async with running_coordinator(through_proxy, pool_size=1) as c:
        s, job = await leased(c)
        await record_previews(c, s, job, 0)  # the pool's one connection, warm and idle

        try:
            terminated = await terminate_connections(cluster, database)
            assert terminated >= 2  # the pool's connection and the run events' LISTEN
            await until(lambda: proxy.held == terminated, "every goodbye delivered, no end")
            await asyncio.sleep(0.1)  # one turn of the loop reads the FATAL; nothing ends it
            with caplog.at_level(logging.WARNING, logger="services.coordinator.platform.db"):
                await unavailable(record_previews(c, s, job, 1))
            messages = [record.message for record in caplog.records]
            assert any("another operation (2) is in progress" in m for m in messages), messages
        finally:
            proxy.gate.set()  # the stream ends: asyncpg closes it, the pool connects anew

        async def recorded() -> bool:
            try:
                await record_previews(c, s, job, 1)
            except grpc.aio.AioRpcError as error:
                if error.code() != UNAVAILABLE:
                    raise
                return False
            return True

        await until(recorded, "the record once the connection is replaced")
        detail = await c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin)
        assert detail.detail.run.counts.previews_published == 2


async def test_a_statement_whose_connection_is_terminated_in_flight_is_unavailable(
    coordinator: CoordinatorHarness, pg_database: PostgresDatabase
) -> None:
    """A heartbeat waits on the job's row lock (the test holds it) when every connection
    of the coordinator is terminated: AdminShutdownError under the statement, UNAVAILABLE
    to the processor. The lease is untouched and the next heartbeat renews it."""
    c = coordinator
    s, job = await leased(c)
    heartbeat = jobs_pb2.HeartbeatRequest(lease=job.lease)
    locker = await c.db.pool.acquire()
    try:
        async with locker.transaction():
            await locker.execute("SELECT 1 FROM jobs WHERE job_index = 0 FOR UPDATE")
            blocked = asyncio.ensure_future(c.jobs.Heartbeat(heartbeat, metadata=s.processor))

            async def waiting() -> bool:
                # from another connection: pg_stat_activity is read once per transaction
                async with c.db.connection() as watcher:
                    count: int = await watcher.fetchval(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                return count >= 1

            await until(waiting, "the heartbeat to wait on the job's lock")
            sparing = [await locker.fetchval("SELECT pg_backend_pid()")]
            await terminate_connections(pg_database.cluster, pg_database.name, sparing=sparing)
            await unavailable(blocked)
    finally:
        await c.db.pool.release(locker)
    renewed = await c.jobs.Heartbeat(heartbeat, metadata=s.processor)
    assert renewed.HasField("lease_expires_at")
    async with c.db.connection() as connection:
        assert await connection.fetchval("SELECT state FROM jobs WHERE job_index = 0") == "leased"


async def test_a_stopped_database_is_unavailable_and_nothing_is_lost_when_it_is_back(
    coordinator: CoordinatorHarness, pg_database: PostgresDatabase
) -> None:
    """While the cluster is stopped, every kind of call (a lease call, a claim, a preview
    record, a read) is UNAVAILABLE; once it is started again they all go through."""
    c = coordinator
    s, job = await leased(c)
    heartbeat = jobs_pb2.HeartbeatRequest(lease=job.lease)
    async with stopped(pg_database.cluster):
        await unavailable(c.jobs.Heartbeat(heartbeat, metadata=s.processor))
        claim = jobs_pb2.ClaimRequest(
            runtime_id=s.world.tracking_runtime, code_sha256=job.snapshot.code_sha256
        )
        await unavailable(c.jobs.Claim(claim, metadata=s.processor))
        await unavailable(record_previews(c, s, job, 0))
        await unavailable(c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin))
    await c.jobs.Heartbeat(heartbeat, metadata=s.processor)
    await record_previews(c, s, job, 0)
    assert (await claimed(c, s)).lease.job_id == "j1"


async def test_a_transaction_whose_session_ends_under_it_is_unavailable(pg_dsn: str) -> None:
    """The session ends in the middle of a transaction (the server shutting down does this
    to every Complete in flight; here the backend terminates itself). The statement fails,
    the rollback finds the connection closed, and asyncpg has already handed the
    connection back to the pool, so asking it is_closed() raises InterfaceError too: that
    is UNAVAILABLE, as any error on a closed connection is. It escaped as INTERNAL, which
    the restart-under-load test (tests/system/test_restarts_under_load.py) met on a Complete."""
    async with Database.open(pg_dsn, size=1) as db:
        with pytest.raises(DatabaseUnavailable):
            async with db.transaction() as connection:
                await connection.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        async with db.connection() as connection:  # the pool connects anew
            assert await connection.fetchval("SELECT 1") == 1
