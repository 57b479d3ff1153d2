"""The gateway's live channel (docs/live.md): one WatchRun stream per run fanned out to
WebSockets through a real uvicorn server, on real coordinators over gRPC and real Postgres,
read by real WebSocket clients."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
import uvicorn
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close

from services.coordinator.identity.auth import Grant, ScopeName
from services.gateway import live_socket
from services.gateway.live import UNAVAILABLE_REASON, LiveHub
from testbed.coordinator_leases import (
    Setup,
    claimed,
    complete_request,
    create_run,
    empty_result,
    setup,
)
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.v1 import jobs_pb2, workshop_pb2_grpc
from workshop.v1 import workshop_pb2 as ws

WAIT = 10.0  # seconds: generous bound for a message on a busy 2-core machine
PATH = "/api/workshop/runs/{run_id}/live"
Metadata = tuple[tuple[str, str], ...]


def encode(message: ws.WatchRunResponse) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


@dataclasses.dataclass
class Gateway:
    hub: LiveHub
    port: int
    opened: list[str]  # run ids of every WatchRun the hub opened
    received: list[ws.WatchRunResponse]  # every message those streams brought

    def url(self, run_id: str = "r1") -> str:
        return f"ws://127.0.0.1:{self.port}{PATH.format(run_id=run_id)}"


@contextlib.asynccontextmanager
async def gateway(
    target: str,
    metadata: Metadata,
    *,
    client: Metadata | None = None,
    encoder: Callable[..., dict[str, Any]] = encode,
    **kw: Any,
) -> AsyncIterator[Gateway]:
    """A hub streaming from the coordinator at `target` with `metadata` (the gateway's key)
    behind a uvicorn server with only the live route, which reads the run with `client`
    (the socket's credential; default the same); stops both, also on failure."""
    channel = open_channel(target)
    stub = workshop_pb2_grpc.WorkshopServiceStub(channel)
    opened: list[str] = []
    received: list[ws.WatchRunResponse] = []

    async def open_watch(run_id: str) -> AsyncIterator[ws.WatchRunResponse]:
        opened.append(run_id)
        call = stub.WatchRun(ws.WatchRunRequest(run_id=run_id), metadata=metadata)
        try:
            async for message in call:
                received.append(message)
                yield message
        finally:
            call.cancel()

    hub = LiveHub(open_watch, encoder, **kw)

    async def live(websocket: WebSocket) -> None:
        # The route author's part: check the client's credential, fetch the run, accept.
        run_id = websocket.path_params["run_id"]
        first = await stub.GetRun(ws.GetRunRequest(run_id=run_id), metadata=client or metadata)
        await websocket.accept()
        await hub.serve(websocket, run_id, first)

    app = Starlette(routes=[WebSocketRoute(PATH, live)])
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, lifespan="off", log_config=None, access_log=False, timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), "uvicorn stopped during start-up"
            await asyncio.sleep(0.01)
        yield Gateway(hub, sock.getsockname()[1], opened, received)
    finally:
        await hub.close()
        server.should_exit = True
        await task
        await channel.close()


class Reader:
    """A WebSocket client that reads every message on a task, with its arrival time."""

    def __init__(self, client: ClientConnection) -> None:
        self.client = client
        self.messages: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for text in self.client:
                self.messages.put_nowait((time.monotonic(), json.loads(text)))

    async def next(self) -> dict[str, Any]:
        return (await asyncio.wait_for(self.messages.get(), WAIT))[1]

    async def until(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        while True:
            message = await self.next()
            if predicate(message):
                return message

    def drained(self) -> list[dict[str, Any]]:
        found = []
        while not self.messages.empty():
            found.append(self.messages.get_nowait()[1])
        return found

    async def closed(self) -> tuple[int | None, str | None]:
        """The close code and reason, once the server closed the socket."""
        await asyncio.wait_for(self.task, WAIT)
        await asyncio.wait_for(self.client.wait_closed(), WAIT)
        received = self.client.protocol.close_rcvd
        return (received.code, received.reason) if received else (None, None)


@contextlib.asynccontextmanager
async def reading(url: str, **kw: Any) -> AsyncIterator[Reader]:
    async with connect(url, ping_interval=None, open_timeout=WAIT, **kw) as client:
        reader = Reader(client)
        try:
            yield reader
        finally:
            reader.task.cancel()


def progress(message: dict[str, Any], job: int = 0) -> int:
    return int(message["detail"]["jobs"][job].get("progress_percent", 0))


async def report(
    c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, percent: int
) -> jobs_pb2.ReportProgressResponse:
    reply: jobs_pb2.ReportProgressResponse = await c.jobs.ReportProgress(
        jobs_pb2.ReportProgressRequest(lease=job.lease, percent=percent), metadata=s.processor
    )
    return reply


@pytest.fixture
async def s(coordinator: CoordinatorHarness) -> Setup:
    built = await setup(coordinator)
    await create_run(coordinator, built)
    return built


@pytest.fixture
async def hub_key(coordinator: CoordinatorHarness) -> Metadata:
    """The gateway's own key: a workshop key may watch any run."""
    return bearer_metadata(await coordinator.key(Grant(ScopeName.WORKSHOP), name="gateway"))


@pytest.fixture
async def g(coordinator: CoordinatorHarness, s: Setup, hub_key: Metadata) -> AsyncIterator[Gateway]:
    async with gateway(f"127.0.0.1:{coordinator.port}", hub_key, linger_seconds=0.3) as found:
        yield found


async def test_detail_on_connect_then_an_update_after_progress(
    coordinator: CoordinatorHarness, s: Setup, g: Gateway
) -> None:
    c = coordinator
    async with reading(g.url()) as reader:
        first = await reader.next()
        assert first["seq"] == 0
        assert first["final"] is False
        assert first["detail"]["run"]["run_id"] == "r1"
        assert first["detail"]["run"]["status"] == "RUN_STATUS_QUEUED"
        assert first["sent_at"].endswith("Z")
        job = await claimed(c, s)
        leased = await reader.until(lambda m: m["detail"]["run"]["counts"].get("jobs_leased") == 1)
        assert leased["seq"] >= 1
        await report(c, s, job, 42)
        seen = await reader.until(lambda m: progress(m) == 42)
        assert seen["detail"]["run"]["status"] == "RUN_STATUS_RUNNING"
        assert seen["seq"] > leased["seq"]
    assert g.hub.stats()["streams_opened"] == 1


PADDING = 32 * 1024  # bytes added to each message's detail: a few fill every buffer


def padded(message: ws.WatchRunResponse) -> dict[str, Any]:
    encoded = encode(message)
    encoded["detail"]["padding"] = secrets.token_hex(PADDING // 2)  # incompressible
    return encoded


async def read_to_the_end(client: ClientConnection) -> tuple[list[dict[str, Any]], Close | None]:
    """Every message until the connection closes, and the close frame received."""
    received = []
    with contextlib.suppress(ConnectionClosed):
        while True:
            received.append(json.loads(await asyncio.wait_for(client.recv(), WAIT)))
    return received, client.protocol.close_rcvd


async def test_a_slow_reader_is_closed_and_never_delays_another(
    coordinator: CoordinatorHarness, s: Setup, hub_key: Metadata
) -> None:
    """A client that stops reading (tiny receive buffer, tiny frame queue) fills its
    buffers; its send stalls for stall_seconds and it is closed with 1013, holding at most
    one pending message meanwhile; a reader on the same run gets every update at once."""
    c = coordinator
    target = f"127.0.0.1:{c.port}"
    async with gateway(target, hub_key, encoder=padded, stall_seconds=1.0) as g:
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: small window
        raw.setblocking(False)
        await asyncio.get_running_loop().sock_connect(raw, ("127.0.0.1", g.port))
        async with (
            reading(g.url()) as fast,
            connect(g.url(), sock=raw, ping_interval=None, max_queue=1, compression=None) as slow,
        ):
            await fast.next()
            job = await claimed(c, s)
            await fast.until(lambda m: m["detail"]["run"]["counts"].get("jobs_leased") == 1)
            lags, buffered = [], []
            for percent in range(1, 31):
                committed = time.monotonic()
                await report(c, s, job, percent)
                await fast.until(lambda m, p=percent: progress(m) == p)  # type: ignore[misc]
                lags.append(time.monotonic() - committed)
                buffered.append(g.hub.stats()["buffered_bytes"])
                if g.hub.stats()["slow_closes"]:
                    break
                await asyncio.sleep(0.15)  # one update per window: each state is sent
            else:
                pytest.fail(f"the slow reader was never closed: {g.hub.stats()}")
            assert max(lags) < 1.0, lags  # the fast reader never waited on the slow one
            # the slow socket holds its transport's buffer (asyncio pauses writes at 64 KiB,
            # plus the frame that crossed it) and at most one pending message
            message = PADDING + 2048
            assert max(buffered) <= 64 * 1024 + 3 * message, buffered
            # the slow client reads again: what was buffered, then the close
            received, closed = await read_to_the_end(slow)
            assert closed is not None
            assert (closed.code, closed.reason) == (live_socket.CLOSE_SLOW, live_socket.SLOW_REASON)
            seqs = [m["seq"] for m in received]
            assert seqs == sorted(set(seqs))
            assert len(received) < percent  # it got a few buffered states, not every one
            # the fast reader goes on
            await report(c, s, job, 99)
            await fast.until(lambda m: progress(m) == 99)
        assert g.hub.stats()["slow_closes"] == 1


async def commit_progress(c: CoordinatorHarness, events: list[tuple[int, int]]) -> float:
    """Commits (job index, percent) events of r1 one transaction each, as the coordinator's
    job_progress does after its fences (the job row and the run's NOTIFY together), straight
    to the database; returns the seconds it took. Through ReportProgress, 50 RPCs take
    110-190 ms here: the coordinator in this process re-reads the run for its WatchRun
    between them, on the same event loop, on a 2-core machine."""
    async with c.db.connection() as connection:
        began = time.monotonic()
        for job_index, percent in events:
            await connection.execute(PROGRESS, "r1", job_index, percent)
        return time.monotonic() - began


PROGRESS = (
    "WITH moved AS (UPDATE jobs SET progress = $3, progress_updates = progress_updates + 1"
    " WHERE run_id = $1 AND job_index = $2 RETURNING run_id)"
    " SELECT pg_notify('workshop_run', run_id) FROM moved"
)


async def test_a_burst_of_50_events_arrives_as_one_or_two_messages(
    coordinator: CoordinatorHarness, s: Setup, g: Gateway
) -> None:
    c = coordinator
    jobs = [await claimed(c, s), await claimed(c, s)]
    async with reading(g.url()) as reader:
        await report(c, s, jobs[1], 1)
        seen = await reader.until(lambda m: progress(m, 1) == 1)
        window = g.hub.window_seconds
        # a quiet period (two windows): the burst's first event is a leading edge
        await asyncio.sleep(2 * window)
        last_seq = max(m["seq"] for m in [seen, *reader.drained()])
        # 50 events: progress 1..25 on each job, interleaved
        span = await commit_progress(c, [(n % 2, n // 2 + 1) for n in range(50)])
        burst = [await reader.next()]
        while [progress(burst[-1], 0), progress(burst[-1], 1)] != [25, 25]:
            burst.append(await reader.next())  # until the latest state has arrived
        await asyncio.sleep(2 * window)  # and no stray update after it
        burst += reader.drained()
    # the leading edge, then one merged update per window the burst spans: two when the
    # commits take under one window (about 0.02 s on an idle machine), more only on a
    # machine so loaded that they took longer (0.113 s was seen at load 15)
    windows = max(1, math.ceil(span / window))
    assert 1 <= len(burst) <= 1 + windows, ([m["seq"] for m in burst], f"{span:.3f} s")
    assert [m["seq"] for m in burst] == list(range(last_seq + 1, last_seq + 1 + len(burst)))
    assert [progress(burst[-1], 0), progress(burst[-1], 1)] == [25, 25]  # the latest won


async def test_one_stream_per_run_however_many_sockets(
    coordinator: CoordinatorHarness, s: Setup, g: Gateway
) -> None:
    c = coordinator
    async with contextlib.AsyncExitStack() as stack:
        readers = [await stack.enter_async_context(reading(g.url())) for _ in range(20)]
        assert [(await reader.next())["seq"] for reader in readers[:1]] == [0]
        for reader in readers[1:]:
            await reader.next()
        job = await claimed(c, s)
        await report(c, s, job, 7)
        for reader in readers:
            await reader.until(lambda m: progress(m) == 7)
        assert g.opened == ["r1"]
        stats = g.hub.stats()
        assert (stats["runs"], stats["streams"], stats["sockets"]) == (1, 1, 20)
        assert stats["updates"] >= 1  # the lease and the progress (one, within a window)
        assert stats["messages"] >= 20 * 2  # every socket: the first, then the progress
    await wait_for(lambda: g.hub.stats()["sockets"] == 0)
    assert g.hub.stats()["runs"] == 1  # lingering: a page reloading keeps the stream
    await wait_for(lambda: g.hub.stats()["runs"] == 0)  # gone after linger_seconds (0.3 s)
    assert g.hub.stats()["streams"] == 0
    async with reading(g.url()) as reader:
        again = await reader.next()
        assert again["seq"] == 0  # a new stream counts from the start
        assert progress(again) == 7
        await wait_for(lambda: g.opened == ["r1", "r1"])


async def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.02)


async def test_events_through_another_coordinator_reach_both_gateways(
    coordinator: CoordinatorHarness, s: Setup, hub_key: Metadata, pg_dsn: str
) -> None:
    """Two coordinators on one database, a gateway on each: a commit through either
    reaches the sockets of both (the coordinators' NOTIFY crosses replicas)."""
    async with (
        running_coordinator(pg_dsn, clock=coordinator.clock) as other,
        gateway(f"127.0.0.1:{coordinator.port}", hub_key) as on_a,
        gateway(f"127.0.0.1:{other.port}", hub_key) as on_b,
        reading(on_a.url()) as reader_a,
        reading(on_b.url()) as reader_b,
    ):
        await reader_a.next()
        await reader_b.next()
        job = await claimed(other, s)  # through B
        await report(other, s, job, 30)
        for reader in (reader_a, reader_b):
            seen = await reader.until(lambda m: progress(m) == 30)
            assert seen["detail"]["run"]["status"] == "RUN_STATUS_RUNNING"
        await report(coordinator, s, job, 60)  # through A
        for reader in (reader_a, reader_b):
            await reader.until(lambda m: progress(m) == 60)
        assert (on_a.opened, on_b.opened) == (["r1"], ["r1"])


async def test_the_final_status_is_sent_then_the_socket_closes_normally(
    coordinator: CoordinatorHarness, s: Setup, g: Gateway
) -> None:
    c = coordinator
    jobs = [await claimed(c, s), await claimed(c, s)]
    async with reading(g.url()) as reader, reading(g.url()) as other:
        await reader.next()
        await other.next()
        for job in jobs:
            await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
        last = await reader.until(lambda m: m["final"])
        assert last["detail"]["run"]["status"] == "RUN_STATUS_COMPLETED"
        assert last["detail"]["run"]["counts"]["jobs_completed"] == 2
        assert await reader.closed() == (1000, "run finished")
        assert (await other.until(lambda m: m["final"]))["seq"] == last["seq"]
        assert (await other.closed())[0] == 1000
    # a socket opened later gets the final detail and 1000 at once, with no stream
    async with reading(g.url()) as late:
        message = await late.next()
        assert message["final"] is True
        assert message["detail"]["run"]["status"] == "RUN_STATUS_COMPLETED"
        assert (await late.closed())[0] == 1000
    assert g.opened == ["r1"]


async def test_a_cancelled_run_is_final(
    coordinator: CoordinatorHarness, s: Setup, g: Gateway
) -> None:
    async with reading(g.url()) as reader:
        await reader.next()
        await coordinator.workshop.CancelRun(
            ws.CancelRunRequest(run_id="r1"), metadata=coordinator.admin
        )
        last = await reader.until(lambda m: m["final"])
        assert last["detail"]["run"]["status"] == "RUN_STATUS_CANCELLED"
        assert (await reader.closed())[0] == 1000


async def test_the_stream_reopens_after_its_coordinator_restarts(pg_dsn: str) -> None:
    """The coordinator the hub reads from stops (its stream breaks) and starts again on the
    same port: the hub reopens the stream, the socket stays open, seq goes on."""
    async with running_coordinator(pg_dsn) as first:
        s = await setup(first)
        await create_run(first, s)
        port, clock, admin = first.port, first.clock, first.admin
        job = await claimed(first, s)
        stack = contextlib.AsyncExitStack()
        g = await stack.enter_async_context(gateway(f"127.0.0.1:{port}", admin))
        reader = await stack.enter_async_context(reading(g.url()))
        assert (await reader.next())["seq"] == 0
        await wait_for(lambda: bool(g.received))  # the stream is open when it stops
    async with stack:
        # the coordinator is down: reopening fails (at least once), with backoff
        await wait_for(lambda: g.hub.stats()["streams_opened"] >= 2)
        assert g.hub.stats()["sockets"] == 1
        # meanwhile progress is committed (by another coordinator, say): nobody hears it
        connection = await asyncpg.connect(pg_dsn)
        try:
            await connection.execute(PROGRESS, "r1", 0, 44)
        finally:
            await connection.close()
        assert g.hub.stats()["streams_opened"] >= 2
        heard = len(g.received)
        async with running_coordinator(pg_dsn, clock=clock, port=port) as again:
            # reopened: its first read is the fresh detail, the next message on the socket
            fresh = await reader.next()
            assert progress(fresh) == 44
            assert len(g.received) > heard
            await report(again, s, job, 55)
            moved = await reader.until(lambda m: progress(m) == 55)
            assert moved["seq"] == fresh["seq"] + 1
            assert reader.client.close_code is None  # it stayed open throughout
            await report(again, s, job, 56)
            after = await reader.until(lambda m: progress(m) == 56)
            assert after["seq"] == moved["seq"] + 1


async def test_close_flushes_the_pending_update_then_sends_1001(
    coordinator: CoordinatorHarness, s: Setup, hub_key: Metadata
) -> None:
    c = coordinator
    job = await claimed(c, s)
    # a long window keeps the second update pending in the hub when close() is called
    async with (
        gateway(f"127.0.0.1:{c.port}", hub_key, window_seconds=30.0) as g,
        contextlib.AsyncExitStack() as stack,
    ):
        readers = [await stack.enter_async_context(reading(g.url())) for _ in range(3)]
        for reader in readers:
            await reader.next()
        await wait_for(lambda: len(g.received) == 1)
        await report(c, s, job, 10)  # the leading edge: sent at once
        for reader in readers:
            await reader.until(lambda m: progress(m) == 10)
        await report(c, s, job, 20)  # inside the window: pending
        await wait_for(lambda: len(g.received) == 3)
        assert g.hub.stats()["updates"] == 1
        await g.hub.close()
        for reader in readers:
            assert progress(await reader.next()) == 20
            assert await reader.closed() == (1001, "gateway shutting down; reconnect")
        assert g.hub.stats()["sockets"] == 0


async def test_a_stream_refused_closes_its_sockets_with_1011(
    coordinator: CoordinatorHarness, s: Setup, hub_key: Metadata
) -> None:
    """A gateway key that may not watch runs: the socket is told, not left waiting."""
    c = coordinator
    narrow = bearer_metadata(await c.key(Grant(ScopeName.FOOTAGE_READ), name="narrow"))
    async with (
        gateway(f"127.0.0.1:{c.port}", narrow, client=hub_key) as g,
        reading(g.url()) as reader,
    ):
        assert (await reader.next())["seq"] == 0
        code, reason = await reader.closed()
        assert (code, reason) == (live_socket.CLOSE_UNAVAILABLE, UNAVAILABLE_REASON)


async def test_sockets_and_streams_that_end_change_nothing(
    coordinator: CoordinatorHarness, s: Setup, g: Gateway
) -> None:
    """A socket dropped mid-stream (no close frame) and the stream closed after it leave
    processing as it was: the job completes, the hub forgets the run."""
    c = coordinator
    job = await claimed(c, s)
    async with reading(g.url()) as reader:
        await reader.next()
        await report(c, s, job, 50)
        await reader.until(lambda m: progress(m) == 50)
        reader.client.transport.abort()
        await wait_for(lambda: g.hub.stats()["sockets"] == 0)
    await report(c, s, job, 80)
    await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
    assert await c.count("receipts") == 1
    await wait_for(lambda: g.hub.stats()["runs"] == 0)  # the stream went after the linger
    latest = await c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin)
    assert latest.detail.run.counts.jobs_completed == 1
