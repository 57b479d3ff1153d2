"""Run detail over HTTP through the gateway, against the same GetRun over gRPC.

    .venv/bin/python -m bench.http_read [--seconds 20] [--connections 64] [--quick]

Starts a throwaway Postgres cluster (the test harness's), the coordinator and the
gateway each as its own process (`python -m services.coordinator`, `python -m
services.gateway`), as a deployment runs them. The world is testbed/coordinator_world.py's
with a test run of workflow `night` (4 jobs). Then, for `--seconds` each, in this order:

- grpc: `--connections` concurrent callers of WorkshopService.GetRun on one channel to
  the coordinator, with an Agent key of scope `workshop` (what the gateway itself does
  for each request);
- http: `--connections` concurrent HTTP/1.1 keep-alive connections (a minimal client on
  asyncio streams) each looping `GET /v1/workshop/runs/{id}` with the same key through
  the gateway, which calls GetRun and writes the detail as JSON.

Printed per mode: calls/s, p50/p99 latency, and CPU seconds per 1,000 calls of the
client (this process), the gateway, the coordinator and Postgres, so the ratio can be
read against where the time goes on a 2-core machine shared by all of them. The last
line is `RESULT http_per_s=<x> grpc_per_s=<y> ratio=<x/y> http_p99_ms=<z>` (target
ratio >= 0.5).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from bench import proc_stats
from bench.stats import median, percentile
from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_world import build_world, run_request, save_workflow, workflow_spec
from testbed.harness.coordinator import coordinator_client
from testbed.harness.postgres import PostgresUnavailable, create_migrated_database, postgres_cluster
from testbed.harness.processes import ServiceProcess, running_service
from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.v1 import workshop_pb2 as ws
from workshop.v1 import workshop_pb2_grpc

RUN_ID = "bench-read"
PROCESSES = ("client", "gateway", "coordinator", "postgres")
SERVICE_ENV = {"HOST": "127.0.0.1", "PORT": "0", "DRAIN_SECONDS": "0", "GRACE_SECONDS": "1"}
COORDINATOR_ENV = {"SCHEDULER_INTERVAL_SECONDS": "0", "MAINTENANCE_INTERVAL_SECONDS": "0"}


def say(line: str = "") -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_read", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured time per mode")
    parser.add_argument("--connections", type=int, default=64, help="concurrent callers")
    parser.add_argument("--quick", action="store_true", help="3 s per mode")
    args = parser.parse_args(argv)
    seconds = 3.0 if args.quick else args.seconds
    try:
        with postgres_cluster() as cluster:
            dsn = create_migrated_database(cluster, "bench_http_read")
            assert cluster.pid is not None
            figures = asyncio.run(_bench(dsn, cluster.pid, seconds, args.connections))
    except PostgresUnavailable as unavailable:
        say(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    http, grpc_ = figures["http"], figures["grpc"]
    say(
        f"RESULT http_per_s={http.rate:.0f} grpc_per_s={grpc_.rate:.0f} "
        f"ratio={http.rate / grpc_.rate:.2f} http_p99_ms={http.p99_ms:.1f}"
    )
    return 0


class Figure:
    def __init__(self, latencies: list[float], elapsed: float, cpu: dict[str, float]) -> None:
        self.rate = len(latencies) / elapsed
        self.p50_ms = median(latencies) * 1000
        self.p99_ms = percentile(latencies, 0.99) * 1000
        self.calls = len(latencies)
        self.cpu = cpu


async def _bench(dsn: str, postgres: int, seconds: float, connections: int) -> dict[str, Figure]:
    with tempfile.TemporaryDirectory(prefix="bench-http-read-") as scratch:
        env = {f"COORDINATOR_{k}": v for k, v in {**SERVICE_ENV, **COORDINATOR_ENV}.items()}
        with running_service(
            "services.coordinator",
            env | {"COORDINATOR_DATABASE_URL": dsn},
            Path(scratch) / "coordinator.log",
        ) as (coordinator, serving):
            port = int(serving["port"])
            async with coordinator_client(dsn, port) as c:
                world = await build_world(c)
                await save_workflow(c, "night", workflow_spec(cameras=("cam-a", "cam-b")))
                await c.workshop.CreateRun(
                    run_request(RUN_ID, "night", world.tracking_runtime), metadata=c.admin
                )
                agent = await c.key(Grant(ScopeName.WORKSHOP), name="bench")
                gateway_key = await c.key(Grant(ScopeName.GATEWAY), name="gateway")
            gateway = ServiceProcess(
                "services.gateway",
                {f"GATEWAY_{k}": v for k, v in SERVICE_ENV.items()}
                | {
                    "GATEWAY_HTTP_HOST": "127.0.0.1",
                    "GATEWAY_HTTP_PORT": "0",
                    "GATEWAY_COORDINATOR_TARGET": f"127.0.0.1:{port}",
                    "GATEWAY_PREVIEW_TARGET": "127.0.0.1:9",
                    "GATEWAY_KEY": gateway_key,
                    "GATEWAY_LOG_LEVEL": "WARNING",
                },
                Path(scratch) / "gateway.log",
            )
            try:
                http_port = int(gateway.wait_event("http")["port"])
                gateway.wait_event("serving")
                pids = {
                    "client": os.getpid(),
                    "gateway": gateway.pid,
                    "coordinator": coordinator.pid,
                    "postgres": postgres,
                }
                figures = {
                    "grpc": await _grpc(port, agent, seconds, connections, pids),
                    "http": await _http(http_port, agent, seconds, connections, pids),
                }
            finally:
                gateway.stop()
    _table(figures, connections)
    return figures


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds of each process family (Postgres's backends, exited ones included) and
    of this process, the client (alone: the services are its children)."""
    services = {name: pid for name, pid in pids.items() if name != "client"}
    return proc_stats.CpuMeter(services, this_process="client").mark()


async def _measure(
    call: Callable[[], Awaitable[None]], seconds: float, connections: int, pids: dict[str, int]
) -> Figure:
    for _ in range(20):  # warm up: connections, caches
        await call()
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - began)

    before = _cpu(pids)
    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    elapsed = time.perf_counter() - began
    after = _cpu(pids)
    cpu = {name: after[name] - before[name] for name in pids}
    return Figure(latencies, elapsed, cpu)


async def _grpc(
    port: int, key: str, seconds: float, connections: int, pids: dict[str, int]
) -> Figure:
    async with open_channel(f"127.0.0.1:{port}", max_attempts=1) as channel:
        stub = workshop_pb2_grpc.WorkshopServiceStub(channel)
        metadata = bearer_metadata(key)
        request = ws.GetRunRequest(run_id=RUN_ID)

        async def call() -> None:
            await stub.GetRun(request, metadata=metadata)

        try:
            return await _measure(call, seconds, connections, pids)
        except grpc.aio.AioRpcError as error:
            say(f"GetRun failed: {error.code().name} {error.details()}")
            raise


async def _http(
    port: int, key: str, seconds: float, connections: int, pids: dict[str, int]
) -> Figure:
    """Each caller holds one keep-alive HTTP/1.1 connection of its own (asyncio streams,
    like wrk: httpx itself cost about 4.7 ms of client CPU a call, more than the gateway)."""
    request = (
        f"GET /v1/workshop/runs/{RUN_ID} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {key}\r\n\r\n"
    ).encode()
    pool: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(await asyncio.open_connection("127.0.0.1", port))

    async def call() -> None:
        reader, writer = await pool.get()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = head[9:12]
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        body = await reader.readexactly(length)
        pool.put_nowait((reader, writer))
        if status != b"200":
            raise RuntimeError(f"GET run: {status!r} {body[:200]!r}")

    try:
        return await _measure(call, seconds, connections, pids)
    finally:
        while not pool.empty():
            _, writer = pool.get_nowait()
            writer.close()


def _table(figures: dict[str, Figure], connections: int) -> None:
    say(f"run detail, {connections} concurrent callers")
    say(
        f"{'mode':6} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        + " ".join(f"{name + ' cpu ms/call':>22}" for name in PROCESSES)
    )
    for mode in ("grpc", "http"):
        f = figures[mode]
        cpu = " ".join(f"{f.cpu[name] / f.calls * 1000:>22.3f}" for name in PROCESSES)
        say(f"{mode:6} {f.rate:>9.0f} {f.p50_ms:>8.1f} {f.p99_ms:>8.1f} {cpu}")


if __name__ == "__main__":
    sys.exit(main())
