"""The live channel's fan-out: 1,000 WebSocket watchers of one run on one gateway process.

    .venv/bin/python -m bench.live_fanout [--quick] [--watchers N] [--seconds S] [--deflate]
        [--uvloop] [--clients N] [--profile] [--check]

Starts a throwaway Postgres cluster (the test harness's), the coordinator as its own
process (`python -m services.coordinator`, system clock, no background loops) and the
gateway's live channel as its own process (this module with `--serve`: a `LiveHub`
behind uvicorn, configured as `services/gateway/web.py` runs it, with a route that reads
the run with GetRun and calls `hub.serve`, as the route author's will), so that its RSS
and CPU are its own (from /proc). Set-up, not measured: a full run of 20 jobs (cam-a and
cam-b, ten hour-long recordings each), all of them leased by one processor key.

Watchers: `--watchers` WebSocket connections (websockets' asyncio client, no
compression unless `--deflate`) from `--clients` client processes, each recording every
message's seq and arrival time (time.monotonic, one clock for every process on Linux);
one watcher per client process also parses each message's detail to learn which
events it reflects (every socket receives the same bytes for a seq).

Measured, once every watcher is connected and after `--warmup` seconds of the same
events (not timed: the gateway's heap settles; its first full collection after 1,000
connections comes then): this process commits `--rate` progress events a second for
`--seconds` through the coordinator's JobService (ReportProgress, one call after the
other, event k raising job k mod 20 to percent k div 20 + 1, each persisted and
announced). An event's latency at a socket is the arrival of the first message there
that reflects it, minus the moment its ReportProgress call was *sent* (the commit comes
up to that call's duration later, so the figure is an upper bound); p50 and p99 over
every (event, socket), split into the time to the first socket and an update's spread
over the sockets. Also: the gateway's RSS (VmRSS at the end, VmHWM the
peak), CPU per delivered message and garbage-collection pauses; the coordinator's,
Postgres' and the clients' CPU (the machine has 2 cores: the clients must not be the
bottleneck, so their CPU share and event-loop lag are printed, and they keep what they
record out of their collector's way), and what other processes used meanwhile.

`--quick`: 100 watchers for 5 s (1 s warm-up). Targets (2-core machine): p99 <= 250 ms
(the 120 ms window included), gateway RSS <= 300 MB. The last line is
`RESULT fanout_p99_ms=<x> gateway_rss_mb=<y> messages=<n>` (RSS: the peak). Everything it
starts is stopped on exit, also on error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import bisect
import contextlib
import dataclasses
import gc
import json
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from bench import proc_stats
from bench.stats import median, percentile
from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_world import CODE, build_world, run_request, save_workflow, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness, coordinator_client
from testbed.harness.postgres import (
    TIMINGS,
    PostgresUnavailable,
    create_migrated_database,
    postgres_cluster,
)
from tools.localstack.processes import ServiceProcess, running_service
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import workshop_pb2 as ws

DATABASE = "bench_live_fanout"
RUN_ID = "live"
JOBS = 20  # ten recordings on each of cam-a and cam-b
PATH = "/api/workshop/runs/{run_id}/live"
KEY_VARIABLE = "LIVE_FANOUT_KEY"  # the gateway's key reaches --serve here, not in argv
CONNECT_BATCH = 25  # connections a client opens at once
READY_TIMEOUT_S = 180.0
TAIL_S = 1.0  # after the last event: what is due arrives
LAG_TICK_S = 0.01  # the clients' event-loop lag probe
PROFILE_TOP = 30
TARGET_P99_MS = 250.0
TARGET_RSS_MB = 300.0
COORDINATOR_ENV = {
    "HOST": "127.0.0.1",
    "PORT": "0",
    "DRAIN_SECONDS": "0",
    "GRACE_SECONDS": "1",
    "SCHEDULER_INTERVAL_SECONDS": "0",
    "MAINTENANCE_INTERVAL_SECONDS": "0",
}


def say(line: str = "") -> None:
    print(line, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def covered_upto(progress: Sequence[int]) -> int:
    """The last event index a detail reflects, with event k raising job k % JOBS to percent
    k // JOBS + 1 and events committed in order: the next one is job j's at its percent."""
    return min(job + JOBS * percent for job, percent in enumerate(progress)) - 1


# The gateway process (--serve) ------------------------------------------------------------


def serve_gateway(target: str, deflate: bool, profile: bool, fast_loop: bool) -> None:
    """The gateway process: on asyncio's loop, as `python -m services.gateway` runs it, or
    with `fast_loop` on uvloop (`workshop.kit.server.run_event_loop`, what the coordinator
    and the preview service use)."""
    from workshop.kit.server import run_event_loop

    run = run_event_loop if fast_loop else asyncio.run
    main = _serve_gateway(target, os.environ[KEY_VARIABLE], deflate)
    if not profile:
        run(main)
        return
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        run(main)
    finally:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(PROFILE_TOP)


async def _serve_gateway(target: str, secret: str, deflate: bool) -> None:
    # Imported here: the parent process never loads the gateway's modules.
    import uvicorn
    from google.protobuf.json_format import MessageToDict
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route, WebSocketRoute
    from starlette.websockets import WebSocket

    from services.gateway.live import LiveHub
    from workshop.kit.channels import open_channel
    from workshop.kit.server import announce
    from workshop.v1 import workshop_pb2_grpc

    metadata = bearer_metadata(secret)
    channel = open_channel(target)
    stub = workshop_pb2_grpc.WorkshopServiceStub(channel)

    def open_watch(run_id: str) -> Any:
        return stub.WatchRun(ws.WatchRunRequest(run_id=run_id), metadata=metadata)

    def encode(message: Any) -> dict[str, Any]:
        return MessageToDict(message, preserving_proto_field_name=True)

    hub = LiveHub(open_watch, encode)

    async def live(websocket: WebSocket) -> None:
        run_id = websocket.path_params["run_id"]
        first = await stub.GetRun(ws.GetRunRequest(run_id=run_id), metadata=metadata)
        await websocket.accept()
        await hub.serve(websocket, run_id, first)

    pauses = _GcPauses()

    async def stats(request: Request) -> JSONResponse:
        found = {**hub.stats(), **pauses.figures()}
        if "restart" in request.query_params:  # the longest pauses from now on
            pauses.max_us = [0, 0, 0]
        return JSONResponse(found)

    app = Starlette(routes=[WebSocketRoute(PATH, live), Route("/stats", stats)])
    sock = socket.create_server(("127.0.0.1", 0), backlog=2048)
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        ws_per_message_deflate=deflate,
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task
            return
        await asyncio.sleep(0.01)
    # As workshop.kit.server.serve does for every service: start-up's heap out of the
    # collector's way.
    gc.collect()
    gc.freeze()
    gc.callbacks.append(pauses.callback)
    announce("live-fanout-gateway", event="serving", port=sock.getsockname()[1])
    await stop.wait()
    await hub.close()  # before uvicorn's own shutdown, which would send 1012
    server.should_exit = True
    await task
    await channel.close()


class _GcPauses:
    """How long the gateway's garbage collections took, by generation."""

    def __init__(self) -> None:
        self._began = 0.0
        self.total_us = [0, 0, 0]
        self.max_us = [0, 0, 0]
        self.count = [0, 0, 0]

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        took = int((time.perf_counter() - self._began) * 1e6)
        generation = info["generation"]
        self.total_us[generation] += took
        self.max_us[generation] = max(self.max_us[generation], took)
        self.count[generation] += 1

    def figures(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for generation in range(3):
            found[f"gc{generation}_count"] = self.count[generation]
            found[f"gc{generation}_total_us"] = self.total_us[generation]
            found[f"gc{generation}_max_us"] = self.max_us[generation]
        return found


# The client processes ---------------------------------------------------------------------


@dataclasses.dataclass
class ClientReport:
    index: int
    # per socket: seq and arrival of every message, in arrays: a list of tuples would be
    # walked by every full collection of the client, whose pauses would count as latency
    seqs: list[array.array[int]]
    arrivals: list[array.array[float]]
    covered: dict[int, int]  # seq -> last event index reflected (the probe's view)
    cpu_s: float = 0.0  # between the release and the stop
    wall_s: float = 0.0
    lag_p99_ms: float = 0.0  # event-loop lag of this client process
    lag_max_ms: float = 0.0
    closed_early: int = 0  # sockets the gateway closed during the measurement
    error: str = ""


def _client_child(
    index: int,
    url: str,
    count: int,
    deflate: bool,
    ready: Queue[int],
    go: Event,
    stop: Event,
    reports: Queue[ClientReport],
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    try:
        report = asyncio.run(_client(index, url, count, deflate, ready, go, stop))
    except BaseException as error:
        report = ClientReport(index, [], [], {}, error=f"{type(error).__name__}: {error}")
    reports.put(report)


async def _client(
    index: int, url: str, count: int, deflate: bool, ready: Queue[int], go: Event, stop: Event
) -> ClientReport:
    from websockets.asyncio.client import ClientConnection, connect

    report = ClientReport(
        index,
        [array.array("q") for _ in range(count)],
        [array.array("d") for _ in range(count)],
        {},
    )
    clients: list[ClientConnection] = []
    tasks: list[asyncio.Task[None]] = []
    measuring = [False]

    async def read(client: ClientConnection, slot: int) -> None:
        seqs, arrivals, probe = report.seqs[slot], report.arrivals[slot], slot == 0
        with contextlib.suppress(Exception):
            async for data in _frames(client):
                now = time.monotonic()
                seq = int(data[7 : data.index(b",", 7)])  # '{"seq":<n>,' comes first
                seqs.append(seq)
                arrivals.append(now)
                if probe:
                    jobs = json.loads(data)["detail"]["jobs"]
                    report.covered[seq] = covered_upto(
                        [int(job.get("progress_percent", 0)) for job in jobs]
                    )
        if measuring[0]:
            report.closed_early += 1

    async def open_one(slot: int) -> None:
        client = await connect(
            url,
            ping_interval=None,
            compression="deflate" if deflate else None,
            open_timeout=READY_TIMEOUT_S,
            max_size=None,
        )
        clients.append(client)
        tasks.append(asyncio.create_task(read(client, slot)))

    for start in range(0, count, CONNECT_BATCH):
        await asyncio.gather(
            *(open_one(slot) for slot in range(start, min(count, start + CONNECT_BATCH)))
        )
    gc.collect()
    gc.freeze()  # the connections' objects, out of the client's collections
    ready.put(index)
    await asyncio.to_thread(go.wait, READY_TIMEOUT_S)
    measuring[0] = True
    lags: list[float] = []
    lag = asyncio.create_task(_lag_probe(lags))
    cpu, began = proc_stats.self_cpu_s(), time.monotonic()
    await asyncio.to_thread(stop.wait)
    report.cpu_s, report.wall_s = proc_stats.self_cpu_s() - cpu, time.monotonic() - began
    measuring[0] = False
    lag.cancel()
    lags.sort()
    if lags:
        report.lag_p99_ms = percentile(lags, 0.99) * 1000
        report.lag_max_ms = lags[-1] * 1000
    for task in tasks:
        task.cancel()
    await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)
    return report


async def _frames(client: Any) -> Any:
    """The connection's messages as bytes (text frames undecoded: seq is read from bytes)."""
    while True:
        yield await client.recv(decode=False)


async def _lag_probe(lags: list[float]) -> None:
    while True:
        began = time.monotonic()
        await asyncio.sleep(LAG_TICK_S)
        lags.append(time.monotonic() - began - LAG_TICK_S)


# The driver -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    watchers: int
    clients: int
    seconds: float
    warmup: float
    rate: float
    deflate: bool
    profile: bool
    uvloop: bool


@dataclasses.dataclass
class Marks:
    """CPU seconds of the processes measured, at one moment."""

    gateway: float
    coordinator: float
    postgres: float
    driver: float  # this process: the ReportProgress calls
    machine: float

    @staticmethod
    def read(gateway: int, coordinator: int, postmaster: int) -> Marks:
        # process families: the postmaster's backends, exited ones included
        cpu = proc_stats.CpuMeter(
            {"gateway": gateway, "coordinator": coordinator, "postgres": postmaster}
        ).mark()
        return Marks(
            cpu["gateway"],
            cpu["coordinator"],
            cpu["postgres"],
            cpu["bench"],
            proc_stats.busy_cores_s(),
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.live_fanout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="100 watchers for 5 s")
    parser.add_argument("--watchers", type=int, default=0, help="default 1000 (quick: 100)")
    parser.add_argument("--seconds", type=float, default=0, help="default 30 (quick: 5)")
    parser.add_argument("--rate", type=float, default=50.0, help="progress events a second")
    parser.add_argument(
        "--warmup", type=float, default=-1, help="seconds of events first, not timed (5; quick 1)"
    )
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument(
        "--deflate", action="store_true", help="clients offer permessage-deflate (browsers do)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the gateway (slows it); its top functions are printed at the end",
    )
    parser.add_argument("--uvloop", action="store_true", help="the gateway on uvloop")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--serve", metavar="TARGET", help=argparse.SUPPRESS)  # the gateway
    args = parser.parse_args(argv)
    if args.serve:
        serve_gateway(args.serve, args.deflate, args.profile, args.uvloop)
        return 0
    config = Config(
        watchers=args.watchers or (100 if args.quick else 1000),
        clients=args.clients,
        seconds=args.seconds or (5.0 if args.quick else 30.0),
        warmup=args.warmup if args.warmup >= 0 else (1.0 if args.quick else 5.0),
        rate=args.rate,
        deflate=args.deflate,
        profile=args.profile,
        uvloop=args.uvloop,
    )
    if config.rate * (config.seconds + config.warmup) > JOBS * 100:
        parser.error(f"at most {JOBS * 100} events (100 persisted per job)")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with postgres_cluster() as cluster:
            say(
                f"postgres: {cluster.host}:{cluster.port} (initdb {TIMINGS.initdb_s:.2f} s, "
                f"start {TIMINGS.start_s:.2f} s)"
            )
            dsn = create_migrated_database(cluster, DATABASE)
            assert cluster.pid is not None, "the cluster is running"
            figures = asyncio.run(_bench(dsn, config, cluster.pid))
    except PostgresUnavailable as unavailable:
        say(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    say(
        f"RESULT fanout_p99_ms={figures['p99_ms']:.1f} gateway_rss_mb={figures['rss_mb']:.0f} "
        f"messages={figures['messages']:.0f}"
    )
    missed = figures["p99_ms"] > TARGET_P99_MS or figures["rss_mb"] > TARGET_RSS_MB
    return 1 if args.check and missed else 0


async def _bench(dsn: str, config: Config, postmaster: int) -> dict[str, float]:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    with (
        tempfile.TemporaryDirectory(prefix="bench-live-") as scratch,
        running_service(
            "services.coordinator",
            {f"COORDINATOR_{key}": value for key, value in COORDINATOR_ENV.items()}
            | {"COORDINATOR_DATABASE_URL": dsn},
            Path(scratch) / "coordinator.log",
        ) as (coordinator, serving),
    ):
        async with coordinator_client(dsn, int(serving["port"])) as c:
            began = time.perf_counter()
            processor, leases = await _world(c)
            took = time.perf_counter() - began
            say(f"setup: run {RUN_ID!r}, {len(leases)} jobs leased ({took:.1f} s)")
            key = await c.key(Grant(ScopeName.WORKSHOP), name="gateway")
            gateway = ServiceProcess(
                "bench.live_fanout",
                {KEY_VARIABLE: key},
                Path(scratch) / "gateway.log",
                args=[
                    f"--serve=127.0.0.1:{c.port}",
                    *(["--deflate"] if config.deflate else []),
                    *(["--profile"] if config.profile else []),
                    *(["--uvloop"] if config.uvloop else []),
                ],
            )
            try:
                port = int(gateway.wait_event("serving", timeout=READY_TIMEOUT_S)["port"])
                return await _measure(
                    c, config, processor, leases, port, (gateway.pid, coordinator.pid, postmaster)
                )
            finally:
                gateway.stop()
                if config.profile:
                    say("gateway profile (cProfile, by own time):")
                    say(gateway.log_tail(PROFILE_TOP + 12))


async def _world(c: CoordinatorHarness) -> tuple[Any, list[common_pb2.LeaseRef]]:
    world = await build_world(c, recordings_per_camera=JOBS // 2)
    await save_workflow(c, "yard", workflow_spec(cameras=("cam-a", "cam-b")))
    secret = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="processor")
    processor = bearer_metadata(secret)
    await c.workshop.CreateRun(
        run_request(RUN_ID, "yard", world.tracking_runtime, mode=common_pb2.RUN_MODE_FULL),
        metadata=c.admin,
    )
    leases: list[common_pb2.LeaseRef] = []
    for _ in range(JOBS):
        reply = await c.jobs.Claim(
            jobs_pb2.ClaimRequest(runtime_id=world.tracking_runtime, code_sha256=CODE),
            metadata=processor,
        )
        assert reply.HasField("job"), "every job of the run is claimable"
        leases.append(reply.job.lease)
    leases.sort(key=lambda lease: int(lease.job_id.removeprefix("j")))
    return processor, leases


async def _measure(
    c: CoordinatorHarness,
    config: Config,
    processor: Any,
    leases: list[common_pb2.LeaseRef],
    port: int,
    pids: tuple[int, int, int],
) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    ready: Queue[int] = context.Queue()
    reports: Queue[ClientReport] = context.Queue()
    go, stop = context.Event(), context.Event()
    url = f"ws://127.0.0.1:{port}{PATH.format(run_id=RUN_ID)}"
    shares = [config.watchers // config.clients] * config.clients
    shares[0] += config.watchers - sum(shares)
    children: list[SpawnProcess] = [
        context.Process(
            target=_client_child,
            args=(index, url, share, config.deflate, ready, go, stop, reports),
            daemon=True,
        )
        for index, share in enumerate(shares)
    ]
    began = time.perf_counter()
    for child in children:
        child.start()
    try:
        for _ in children:
            await asyncio.to_thread(ready.get, True, READY_TIMEOUT_S)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            connected = (await http.get("/stats")).json()
            say(
                f"setup: {connected['sockets']} watchers connected from {config.clients} "
                f"client processes ({time.perf_counter() - began:.1f} s); "
                f"WatchRun streams open: {connected['streams']}"
            )
            assert connected["sockets"] == config.watchers, connected
            await asyncio.sleep(1.0)  # quiet: the connections' first messages are out
            # Warm-up, not timed: the same events, so that the gateway's heap settles
            # (its first full collection after 1,000 connections comes here).
            warm = int(config.rate * config.warmup)
            await _commit_events(c, config, processor, leases, range(warm))
            before = (await http.get("/stats", params={"restart": "1"})).json()
            go.set()
            mark = Marks.read(*pids)
            events = range(warm, warm + int(config.rate * config.seconds))
            sent, rpc_s = await _commit_events(c, config, processor, leases, events)
            await asyncio.sleep(TAIL_S)
            after_mark = Marks.read(*pids)
            after = (await http.get("/stats")).json()
        rss_mb = proc_stats.status_kb(pids[0], "VmRSS") / 1024
        peak_mb = proc_stats.hwm_mb(pids[0])
        stop.set()
        found = [await asyncio.to_thread(reports.get, True, READY_TIMEOUT_S) for _ in children]
    finally:
        stop.set()
        go.set()
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
    errors = [report.error for report in found if report.error]
    if errors:
        raise RuntimeError(f"client processes failed: {errors}")
    return _figures(
        config, events, sent, rpc_s, found, (mark, after_mark), (before, after), rss_mb, peak_mb
    )


async def _commit_events(
    c: CoordinatorHarness,
    config: Config,
    processor: Any,
    leases: list[common_pb2.LeaseRef],
    events: range,
) -> tuple[list[float], list[float]]:
    """Commits `events` on schedule, one call after the other (so in order); returns when
    each call was sent and how long each took."""
    sent: list[float] = []
    rpc_s: list[float] = []
    start = time.monotonic()
    for offset, event in enumerate(events):
        delay = start + offset / config.rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        lease = leases[event % JOBS]
        request = jobs_pb2.ReportProgressRequest(lease=lease, percent=event // JOBS + 1)
        began = time.monotonic()
        reply = await c.jobs.ReportProgress(request, metadata=processor)
        rpc_s.append(time.monotonic() - began)
        assert reply.persisted, f"event {event} was not persisted"
        sent.append(began)
    return sent, rpc_s


def _figures(
    config: Config,
    events: range,
    sent: list[float],
    rpc_s: list[float],
    reports: list[ClientReport],
    marks: tuple[Marks, Marks],
    stats: tuple[dict[str, int], dict[str, int]],
    rss_mb: float,
    peak_mb: float,
) -> dict[str, float]:
    covered: dict[int, int] = {}
    for report in reports:
        covered.update(report.covered)
    known = sorted(covered)
    latencies: list[float] = []
    delivered = 0
    unreached = 0
    first_event_time = sent[0]
    last_event = events[-1]
    spans: dict[int, tuple[float, float]] = {}  # seq -> first and last arrival
    for report in reports:
        for seqs, arrivals in zip(report.seqs, report.arrivals, strict=True):
            done = events[0] - 1  # events up to this index have reached this socket
            for seq, arrived in zip(seqs, arrivals, strict=True):
                if arrived < first_event_time:
                    continue  # the message on connect, or of the warm-up
                delivered += 1
                first, last = spans.get(seq, (arrived, arrived))
                spans[seq] = (min(first, arrived), max(last, arrived))
                at = bisect.bisect_right(known, seq) - 1  # a seq no probe saw: the one before
                upto = covered[known[at]] if at >= 0 else -1
                for event in range(done + 1, min(upto, last_event) + 1):
                    latencies.append(arrived - sent[event - events[0]])
                done = max(done, upto)
            unreached += last_event - min(done, last_event)
    latencies.sort()
    # where the time goes: event -> the first socket (window, coordinator, hub), and one
    # update's spread over the sockets (the fan-out and the clients' own processing)
    to_first: list[float] = []
    done = events[0] - 1
    for seq in known:
        if seq not in spans:
            continue
        for event in range(done + 1, min(covered[seq], last_event) + 1):
            to_first.append(spans[seq][0] - sent[event - events[0]])
        done = max(done, covered[seq])
    to_first.sort()
    spread = sorted(last - first for first, last in spans.values())
    if not latencies:  # no RESULT without a measurement (never a nan in it)
        raise RuntimeError("no event reached a watcher: nothing to measure")
    p50 = median(latencies) * 1000
    p99 = percentile(latencies, 0.99) * 1000
    worst = latencies[-1] * 1000
    before, after = marks
    wall = config.seconds + TAIL_S
    gateway_cpu = after.gateway - before.gateway
    client_cpu = sum(report.cpu_s for report in reports)
    busy = after.machine - before.machine
    ours = (
        gateway_cpu
        + (after.coordinator - before.coordinator)
        + (after.postgres - before.postgres)
        + (after.driver - before.driver)
        + client_cpu
    )
    other = max(0.0, busy - ours)  # rates measured under others' load are not ours alone
    updates = stats[1]["updates"] - stats[0]["updates"]
    arrived = stats[1]["stream_messages"] - stats[0]["stream_messages"]
    sent_by_gateway = stats[1]["messages"] - stats[0]["messages"]
    rpc_s.sort()
    rows = [
        ("events committed", f"{len(sent)} ({len(sent) / config.seconds:.1f}/s)"),
        ("ReportProgress call p50 / p99", f"{_ms(rpc_s, 0.5)} / {_ms(rpc_s, 0.99)} ms"),
        ("WatchRun messages to the hub", f"{arrived} ({arrived / wall:.1f}/s)"),
        ("updates emitted by the hub (seq)", f"{updates} ({updates / wall:.1f}/s)"),
        ("messages sent by the gateway", f"{sent_by_gateway}"),
        ("messages received by watchers", f"{delivered}"),
        ("(event, socket) pairs timed", f"{len(latencies):,} ({unreached} never reached)"),
        ("commit -> arrival p50 / p99 / max", f"{p50:.1f} / {p99:.1f} / {worst:.1f} ms"),
        ("  commit -> first socket p50 / p99", f"{_ms(to_first, 0.5)} / {_ms(to_first, 0.99)} ms"),
        (
            "  an update's first -> last socket p50 / p99",
            f"{_ms(spread, 0.5)} / {_ms(spread, 0.99)} ms",
        ),
        ("gateway RSS now / peak", f"{rss_mb:.0f} / {peak_mb:.0f} MB"),
        ("gateway CPU", f"{gateway_cpu:.2f} s ({gateway_cpu / wall * 100:.0f} % of a core)"),
        ("gateway CPU per delivered message", f"{gateway_cpu / max(delivered, 1) * 1e6:.0f} us"),
        ("gateway CPU per update", f"{gateway_cpu / max(updates, 1) * 1000:.1f} ms"),
        ("gateway GC pauses (gen 0 / 1 / 2)", _gc(stats)),
        ("coordinator CPU", f"{after.coordinator - before.coordinator:.2f} s"),
        ("postgres CPU", f"{after.postgres - before.postgres:.2f} s"),
        (
            "client CPU (all processes)",
            f"{client_cpu:.2f} s ({client_cpu / wall / config.clients * 100:.0f} % of a core each)",
        ),
        (
            "client loop lag p99 / max",
            f"{max(r.lag_p99_ms for r in reports):.1f} / "
            f"{max(r.lag_max_ms for r in reports):.1f} ms",
        ),
        (
            "machine busy; other processes",
            f"{busy / wall:.2f} of {os.cpu_count()} cores; {other / wall:.2f} cores",
        ),
        (
            "sockets closed early, slow closes",
            f"{sum(r.closed_early for r in reports)}, {stats[1]['slow_closes']}",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    say(
        f"{config.watchers} watchers, {config.rate:g} events/s for {config.seconds:g} s"
        f"{', permessage-deflate' if config.deflate else ''}"
        f"{', gateway on uvloop' if config.uvloop else ''}:"
    )
    for name, value in rows:
        say(f"  {name:<{width}}  {value}")
    return {"p99_ms": p99, "rss_mb": peak_mb, "messages": float(delivered)}


def _gc(stats: tuple[dict[str, int], dict[str, int]]) -> str:
    """Collections, their total and the longest, per generation, during the measurement."""
    before, after = stats
    parts = []
    for generation in range(3):
        count = after[f"gc{generation}_count"] - before[f"gc{generation}_count"]
        total = after[f"gc{generation}_total_us"] - before[f"gc{generation}_total_us"]
        parts.append(
            f"{count}: {total / 1000:.0f} ms, max {after[f'gc{generation}_max_us'] / 1000:.1f}"
        )
    return " / ".join(parts)


def _ms(values: list[float], share: float) -> str:
    """A percentile in ms for the printed table ("-" when there are no values)."""
    return f"{percentile(values, share) * 1000:.1f}" if values else "-"


if __name__ == "__main__":
    sys.exit(main())
