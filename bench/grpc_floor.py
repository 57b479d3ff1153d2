"""The CPU floor of N Python gRPC calls per job: bare grpc.aio unary calls, no database.

    .venv/bin/python -m bench.grpc_floor [--processes 8] [--cycles 1000] [--calls 3]

One echo server process (grpc.aio on uvloop, as the services run, with no interceptor,
no authentication and no database) and `--processes` client processes on their own
loopback channels, each making `--calls` unary calls per cycle, one after another, with
message sizes of the processor's short-job cycle (two progress reports and a Complete
that claims the next job). It measures the CPU that the server and the clients use per
cycle, from /proc and getrusage: what any design that makes that many Python gRPC calls
per job spends before it does any work. `bench.claim_cycle` runs it beside procrastinate
in the same run.

The last line is `RESULT floor_ms_per_cycle=<x> server_ms=<y> clients_ms=<z>`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import multiprocessing
import resource
import signal
import struct
import time
from collections.abc import Sequence
from multiprocessing.context import SpawnContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

import grpc
import uvloop

from bench.proc_stats import proc_times

METHOD = "/bench.Echo/Call"
# (request bytes, answer bytes) of the processor's short-job cycle over gRPC: two
# ReportProgress calls and a Complete of 60 empty slots answering a claimed job.
CYCLE_SIZES = ((160, 60), (160, 60), (900, 1700))
READY_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class Floor:
    cycles: int
    calls_per_cycle: int
    wall_s: float
    server_cpu_s: float
    clients_cpu_s: float

    @property
    def server_ms(self) -> float:
        return self.server_cpu_s * 1000 / self.cycles

    @property
    def clients_ms(self) -> float:
        return self.clients_cpu_s * 1000 / self.cycles

    @property
    def total_ms(self) -> float:
        return self.server_ms + self.clients_ms


def _answer(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    (size,) = struct.unpack_from("<I", request)
    return bytes(size)


def _serve(ports: Queue[int]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us

    async def main() -> None:
        server = grpc.aio.server()
        handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(_answer)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("bench.Echo", {"Call": handler}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ports.put(port)
        await server.wait_for_termination()

    uvloop.run(main())


def _client(
    index: int, target: str, cycles: int, calls: int, go: Event, results: Queue[float]
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main() -> float:
        async with grpc.aio.insecure_channel(target) as channel:
            await asyncio.wait_for(channel.channel_ready(), READY_TIMEOUT_S)
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(METHOD)
            sizes = [CYCLE_SIZES[i % len(CYCLE_SIZES)] for i in range(calls)]
            requests = [struct.pack("<I", answer) + bytes(sent - 4) for sent, answer in sizes]
            await asyncio.to_thread(go.wait, READY_TIMEOUT_S)
            began = _self_cpu_s()
            for _ in range(cycles):
                for request in requests:
                    await call(request)
            return _self_cpu_s() - began

    try:
        results.put(asyncio.run(main()))
    except BaseException:  # the parent sees a missing result
        results.put(-1.0)
        raise


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(ctx: SpawnContext, *, processes: int = 8, cycles: int = 1000, calls: int = 3) -> Floor:
    """Runs the echo server and the clients; stops every process it started."""
    ports: Queue[int] = ctx.Queue()
    results: Queue[float] = ctx.Queue()
    go = ctx.Event()
    server = ctx.Process(target=_serve, args=(ports,), daemon=True)
    clients = []
    server.start()
    try:
        target = f"127.0.0.1:{ports.get(timeout=READY_TIMEOUT_S)}"
        for index in range(processes):
            client = ctx.Process(
                target=_client, args=(index, target, cycles, calls, go, results), daemon=True
            )
            client.start()
            clients.append(client)
        time.sleep(1.0)  # channels connect before the release
        assert server.pid is not None
        server_before = _process_cpu_s(server.pid)
        released = time.monotonic()
        go.set()
        spent = [results.get(timeout=600) for _ in clients]
        wall = time.monotonic() - released
        server_cpu = _process_cpu_s(server.pid) - server_before
        if min(spent) < 0:
            raise RuntimeError("an echo client failed")
        return Floor(processes * cycles, calls, wall, server_cpu, sum(spent))
    finally:
        for child in [*clients, server]:
            if child.is_alive():
                child.terminate()
                child.join(timeout=5)
            if child.is_alive():
                child.kill()
                child.join()


def _process_cpu_s(pid: int) -> float:
    times = proc_times(pid)
    return times[0] if times else 0.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.grpc_floor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--processes", type=int, default=8, help="client processes")
    parser.add_argument("--cycles", type=int, default=1000, help="cycles per client")
    parser.add_argument("--calls", type=int, default=3, help="unary calls per cycle")
    args = parser.parse_args(argv)
    if min(args.processes, args.cycles, args.calls) < 1:
        parser.error("--processes, --cycles and --calls must be at least 1")
    floor = measure(
        multiprocessing.get_context("spawn"),
        processes=args.processes,
        cycles=args.cycles,
        calls=args.calls,
    )
    print(
        f"{floor.cycles:,} cycles of {floor.calls_per_cycle} bare gRPC calls in "
        f"{floor.wall_s:.2f} s: {floor.total_ms:.2f} ms of CPU per cycle (server "
        f"{floor.server_ms:.2f}, clients {floor.clients_ms:.2f})"
    )
    print(
        f"RESULT floor_ms_per_cycle={floor.total_ms:.2f} server_ms={floor.server_ms:.2f} "
        f"clients_ms={floor.clients_ms:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
