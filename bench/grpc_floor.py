"""The CPU floor of N Python gRPC calls per job: bare grpc.aio unary calls, no database.

    .venv/bin/python -m bench.grpc_floor [--processes 8] [--cycles 1000] [--calls 3]

One echo server process (grpc.aio on uvloop, as the services run, with no interceptor,
no authentication and no database) and `--processes` client processes on their own
loopback channels, each making `--calls` unary calls per cycle, one after another, with
message sizes of the processor's short-job cycle (`--calls` - 1 progress reports, then
the Complete that claims the next job: a short job sends only the Complete,
`bench.claim_cycle --progress-reports N` the older cycles). It measures the CPU that the
server and the clients use per cycle, from /proc and getrusage: what any design that makes
that many Python gRPC calls per job spends before it does any work. `bench.claim_cycle`
runs it beside procrastinate in the same run.

With a database (`measure(..., dsn=...)`, which `bench.claim_cycle` uses beside
procrastinate on its own Postgres) it is the **durable floor** instead: each call also
runs the one Postgres statement that call of the cycle cannot do without, on a bare
table of jobs (`prepare_durable`), and the clients carry the lease from answer to call:
a progress report is an `UPDATE` fenced by the lease's token that renews it; the
Complete is one statement that ends the job under its token and claims the next queued
one (`FOR UPDATE SKIP LOCKED`). No authentication, receipts, events, snapshots, policy
or metrics: what the prescribed cycle costs before any of the coordinator's own work.

The last line is `RESULT floor_ms_per_cycle=<x> server_ms=<y> clients_ms=<z>`.

    .venv/bin/python -m bench.grpc_floor --stream [--repeat 2] [--jobs 8000] [--progress 0]

`--stream` measures the floor of issue 34's session stream instead (bench/stream_floor.py,
whose docstring says what and how): each client process holds one bidirectional stream,
a short job is one message each way, published frames go K to a message, every message
with the one fenced statement it needs, in a throwaway Postgres cluster with
procrastinate beside it (`bench.claim_cycle.procrastinate_side`), passes alternated. Its
last line starts with this mode's `floor_ms_per_cycle` (3 calls, `--jobs` / `--processes`
cycles a client; `--cycles` and `--calls` do not apply) and goes on with the stream's
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import multiprocessing
import signal
import struct
import time
import uuid
from collections.abc import Callable, Sequence
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from types import FrameType
from typing import Any

import asyncpg
import grpc
import uvloop

from bench.proc_stats import family_cpu_s, self_cpu_s
from services.coordinator.platform.queries import parse_queries

METHOD = "/bench.Echo/Call"
# (request bytes, answer bytes) of the calls of the processor's short-job cycle over gRPC:
# a ReportProgress (a job that outlives PROCESSOR_PROGRESS_AFTER_SECONDS sends some) and
# the Complete of 60 empty slots answering a claimed job, always the cycle's last call.
PROGRESS_SIZES = (160, 60)
COMPLETE_SIZES = (900, 1700)


def cycle_sizes(calls: int) -> list[tuple[int, int]]:
    """A cycle of `calls` calls: progress reports, then the Complete."""
    return [PROGRESS_SIZES] * (calls - 1) + [COMPLETE_SIZES]


READY_TIMEOUT_S = 60.0

# The durable floor: a request is (answer size, operation, job id, lease token, percent),
# an answer (job id, lease token) of the job the client holds next (id 0: none left).
DURABLE_REQUEST = struct.Struct("<IBq16sI")
DURABLE_ANSWER = struct.Struct("<q16s")
CLAIM, PROGRESS, COMPLETE = range(3)
DURABLE_POOL = 10  # the coordinator's pool size
SQL = parse_queries(
    Path(__file__).with_name("grpc_floor.sql").read_text(encoding="utf-8"), source="grpc_floor.sql"
)


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


def _durable_handler(pool: asyncpg.Pool) -> Callable[..., Any]:
    """The durable floor's one method: each call's one statement, fenced by the token."""

    async def answer(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        size, operation, job, token, percent = DURABLE_REQUEST.unpack_from(request)
        lease = uuid.UUID(bytes=token)
        if operation == PROGRESS:
            row = await pool.fetchrow(SQL["progress"], job, lease, percent)
        elif operation == COMPLETE:
            row = await pool.fetchrow(SQL["complete"], job, lease)
            if row is not None and row["done"] != 1:
                row = None
        else:
            row = await pool.fetchrow(SQL["claim"])
            if row is None:  # nothing queued: id 0
                return DURABLE_ANSWER.pack(0, bytes(16)).ljust(size, b"\0")
        if row is None:  # the fence refused: the lease does not hold
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "lease lost")
        next_id = row["id"] or 0
        next_token = row["token"].bytes if row["token"] is not None else bytes(16)
        return DURABLE_ANSWER.pack(next_id, next_token).ljust(size, b"\0")

    return answer


def _serve(ports: Queue[int], dsn: str | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us

    async def main() -> None:
        server = grpc.aio.server()
        method: Callable[..., Any] = _answer
        if dsn is not None:
            pool = await asyncpg.create_pool(dsn, min_size=DURABLE_POOL, max_size=DURABLE_POOL)
            method = _durable_handler(pool)
        handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(method)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("bench.Echo", {"Call": handler}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ports.put(port)
        await server.wait_for_termination()

    uvloop.run(main())


def _client(
    index: int,
    target: str,
    cycles: int,
    calls: int,
    durable: bool,
    go: Event,
    results: Queue[float],
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main() -> float:
        async with grpc.aio.insecure_channel(target) as channel:
            await asyncio.wait_for(channel.channel_ready(), READY_TIMEOUT_S)
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(METHOD)
            sizes = cycle_sizes(calls)
            if durable:
                return await _durable_cycles(call, sizes, cycles, go)
            requests = [struct.pack("<I", answer) + bytes(sent - 4) for sent, answer in sizes]
            await asyncio.to_thread(go.wait, READY_TIMEOUT_S)
            began = self_cpu_s()
            for _ in range(cycles):
                for request in requests:
                    await call(request)
            return self_cpu_s() - began

    try:
        results.put(asyncio.run(main()))
    except BaseException:  # the parent sees a missing result
        results.put(-1.0)
        raise


async def _durable_cycles(
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes],
    sizes: list[tuple[int, int]],
    cycles: int,
    go: Event,
) -> float:
    """A claim, then `cycles` jobs of progress reports and a Complete that claims the next,
    carrying each answer's lease into the next call; the CPU the cycles used."""

    def request(size: tuple[int, int], operation: int, held: bytes, percent: int = 0) -> bytes:
        sent, answer = size
        job, token = DURABLE_ANSWER.unpack_from(held)
        return DURABLE_REQUEST.pack(answer, operation, job, token, percent).ljust(sent, b"\0")

    *reports, complete = sizes
    held = await call(request(COMPLETE_SIZES, CLAIM, DURABLE_ANSWER.pack(0, bytes(16))))
    await asyncio.to_thread(go.wait, READY_TIMEOUT_S)
    began = self_cpu_s()
    for _ in range(cycles):
        for number, size in enumerate(reports, start=1):
            held = await call(request(size, PROGRESS, held, number * 100 // len(sizes)))
        held = await call(request(complete, COMPLETE, held))
    return self_cpu_s() - began


async def prepare_durable(dsn: str, jobs: int) -> None:
    """The durable floor's table with `jobs` queued jobs, in the database `dsn`."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(SQL["drop_table"])
        await connection.execute(SQL["create_table"])
        await connection.execute(SQL["create_index"])
        await connection.execute(SQL["queue"], jobs)
        await connection.execute("VACUUM ANALYZE floor_jobs")
    finally:
        await connection.close()


async def durable_completed(dsn: str) -> int:
    """How many of the durable floor's jobs completed."""
    connection = await asyncpg.connect(dsn)
    try:
        done: int = await connection.fetchval(SQL["completed"])
        return done
    finally:
        await connection.close()


def measure(
    ctx: SpawnContext,
    *,
    processes: int = 8,
    cycles: int = 1000,
    calls: int = 3,
    dsn: str | None = None,
    database_cpu_s: Callable[[], float] | None = None,
) -> Floor:
    """Runs the echo server and the clients; stops every process it started. With `dsn`
    (a database `prepare_durable` made, with at least processes x (cycles + 1) jobs) the
    durable floor, whose database CPU `database_cpu_s` reads (counted with the server's)."""
    ports: Queue[int] = ctx.Queue()
    results: Queue[float] = ctx.Queue()
    go = ctx.Event()
    server = ctx.Process(target=_serve, args=(ports, dsn), daemon=True)
    clients = []
    server.start()
    try:
        target = f"127.0.0.1:{ports.get(timeout=READY_TIMEOUT_S)}"
        for index in range(processes):
            client = ctx.Process(
                target=_client,
                args=(index, target, cycles, calls, dsn is not None, go, results),
                daemon=True,
            )
            client.start()
            clients.append(client)
        time.sleep(1.0)  # channels connect before the release
        assert server.pid is not None
        database = database_cpu_s or (lambda: 0.0)
        server_before = family_cpu_s(server.pid) + database()
        released = time.monotonic()
        go.set()
        spent = [results.get(timeout=600) for _ in clients]
        wall = time.monotonic() - released
        server_cpu = family_cpu_s(server.pid) + database() - server_before
        if min(spent) < 0:
            raise RuntimeError("an echo client failed")
        return Floor(processes * cycles, calls, wall, server_cpu, sum(spent))
    finally:
        stop([*clients, server])


def stop(children: Sequence[BaseProcess]) -> None:
    """Ends the benchmark's child processes still running: SIGTERM, then SIGKILL after 5 s."""
    for child in children:
        if child.is_alive():
            child.terminate()
            child.join(timeout=5)
        if child.is_alive():
            child.kill()
            child.join()


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # every `finally` runs: the cluster and children stop


def main(argv: Sequence[str] | None = None) -> int:
    from bench import stream_floor  # it imports this module

    parser = argparse.ArgumentParser(
        prog="python -m bench.grpc_floor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--processes", type=int, default=8, help="client processes")
    parser.add_argument("--cycles", type=int, default=1000, help="cycles per client")
    parser.add_argument("--calls", type=int, default=3, help="unary calls per cycle")
    stream = parser.add_argument_group(
        "the session stream's floor (bench/stream_floor.py), with a Postgres cluster and "
        "procrastinate beside it"
    )
    stream.add_argument(
        "--stream", action="store_true", help="one bidirectional stream per client process"
    )
    stream.add_argument(
        "--jobs",
        type=int,
        default=stream_floor.JOBS,
        help=f"short-job cycles, and procrastinate's jobs, per pass (default {stream_floor.JOBS})",
    )
    stream.add_argument(
        "--progress", type=int, default=0, help="progress messages per short job (default 0)"
    )
    stream.add_argument(
        "--batches",
        default=",".join(map(str, stream_floor.BATCHES)),
        help="frame records per message, one frame floor each (default "
        f"{','.join(map(str, stream_floor.BATCHES))})",
    )
    stream.add_argument(
        "--frames-per-job",
        type=int,
        default=stream_floor.FRAMES_PER_JOB,
        help=f"frames published per job (default {stream_floor.FRAMES_PER_JOB})",
    )
    stream.add_argument(
        "--frame-jobs",
        type=int,
        default=stream_floor.FRAME_JOBS,
        help="jobs per client at 1 frame a message, (1 + log2 K) times as many at K "
        f"(default {stream_floor.FRAME_JOBS})",
    )
    stream.add_argument(
        "--repeat",
        type=int,
        default=stream_floor.REPEAT,
        help=f"passes of each side, in alternating order (default {stream_floor.REPEAT})",
    )
    args = parser.parse_args(argv)
    if min(args.processes, args.cycles, args.calls) < 1:
        parser.error("--processes, --cycles and --calls must be at least 1")
    if args.stream:
        try:
            batches = tuple(int(k) for k in args.batches.split(","))
        except ValueError:
            parser.error("--batches takes whole numbers separated by commas")
        if min(args.jobs, args.frames_per_job, args.frame_jobs, args.repeat, *batches) < 1:
            parser.error("--jobs, --frames-per-job, --frame-jobs, --repeat and --batches >= 1")
        if args.progress < 0:
            parser.error("--progress must be at least 0")
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return stream_floor.main(
            multiprocessing.get_context("spawn"),
            stream_floor.Options(
                processes=args.processes,
                jobs=args.jobs,
                progress=args.progress,
                batches=batches,
                frames_per_job=args.frames_per_job,
                frame_jobs=args.frame_jobs,
                repeat=args.repeat,
            ),
        )
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
