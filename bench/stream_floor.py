"""The floor of the session stream (issue 34): one bidirectional gRPC stream per processor.

    .venv/bin/python -m bench.grpc_floor --stream [--repeat 2] [--jobs 4000] [--progress 0]
        [--batches 1,8,32] [--frames-per-job 120] [--frame-jobs 8]

What the design of issue 34 costs before any of the coordinator's own work, measured like
the unary floor (`bench.grpc_floor`): one server process (grpc.aio on uvloop, no
interceptor, no authentication, a pool of 10 asyncpg connections as the coordinator
holds) and `--processes` client processes (8, as many as the unary floor and
`bench.claim_cycle`'s processors), each holding ONE `stream_stream` call to it (raw
bytes, no protobuf) for the whole measurement. Every message that writes runs the one
fenced statement it needs (bench/grpc_floor.sql) on bare tables in a throwaway Postgres
cluster (`tools.localstack.postgres`: tmpfs when roomy, fsync and synchronous_commit
off, as every benchmark here runs it):

- **cycle** (`stream_floor_*`): the short job. After one claim, each cycle is one message
  "complete job X under token T and claim the next" (padded to the unary Complete's 900
  bytes) answered by one message "the next job and its token" (padded to an assignment
  of 60 slots, 1,700 bytes): one statement that ends the job under its token and claims
  the next queued one (`FOR UPDATE SKIP LOCKED`), the unary durable floor's own. With
  `--progress N` each job first sends N progress messages (each a fenced UPDATE that
  renews the lease, not answered: a refusal ends the stream). `--jobs` cycles in all.
- **bare cycle** (`stream_bare_*`): the same messages with nothing behind them (no
  database): what one message each way costs in Python gRPC.
- **frames** (`frame_floor_*_k<K>`): per job of `--frames-per-job` frames (120, as in
  `bench.processor_throughput`), messages of K frame records each (slot, object key,
  sha256, three boxes as JSON; the run and job are the lease's), not answered, each ONE
  statement: the fence (token, lease holds) renews the lease and counts the frames, and
  the K rows go into a frames table (one row per published frame) by INSERT ... SELECT
  FROM unnest(...); then one commit message: one statement that ends the job under its
  token when every frame it published is recorded, moves the job's frames into an items
  table (DELETE ... RETURNING into INSERT) and claims the next job, answered by the
  next assignment. The same statements whatever K and whatever the number of frames.
  Figures per published frame; server + Postgres is the floor of the control plane's
  CPU per frame (`control_plane_ms_per_frame`, coordinator + preview service +
  Postgres), the clients are the processors' own.
- **procrastinate**, the peer of `bench.claim_cycle` on the same cluster, through
  `bench.claim_cycle.procrastinate_side`: `--jobs` jobs of a task that only returns,
  8 worker processes of concurrency 1.
- the unary floor (`floor_ms_per_cycle`, `bench.grpc_floor` without a database), for
  reference.

Each side runs `--repeat` passes, in alternating order (forward, then backward, ...), each
on freshly prepared tables (preparation not measured); every figure is the median over
its side's passes. CPU from /proc (the server's process family, every Postgres backend,
reaped ones included) and getrusage (the clients); what other processes used meanwhile
(`other`, from /proc/stat) is printed per pass, since the rates (not the CPU per unit)
depend on it.

The last line is `RESULT floor_ms_per_cycle=<unary, bare> stream_bare_ms_per_cycle=<x>
stream_floor_ms_per_cycle=<x> stream_floor_cycles_per_s=<x> procrastinate_jobs_per_s=<y>
stream_floor_ratio=<x/y> stream_floor_cpu_ratio=<procrastinate's CPU per job / the stream
floor's per cycle> frame_floor_ms_per_frame_k<K>=<server + Postgres> ...
frame_floor_frames_per_s_k<K>=<x> ...`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
import os
import signal
import struct
import time
import uuid
from collections.abc import Callable, Sequence
from multiprocessing.context import SpawnContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

import asyncpg
import grpc
import uvloop

from bench import grpc_floor
from bench.proc_stats import busy_cores_s, family_cpu_s, self_cpu_s
from bench.results import result_line
from bench.stats import median
from tools.localstack.postgres import PostgresCluster, admin_execute, quote_ident, run_async

METHOD = "/bench.Session/Stream"
SQL = grpc_floor.SQL
READY_TIMEOUT_S = 60.0
RESULT_TIMEOUT_S = 600.0
POOL = grpc_floor.DURABLE_POOL  # the coordinator's pool size
DATABASE = "bench_stream_floor"

# A message: (operation, job id, argument, lease token) and the operation's payload; an
# answer: (status, next job id, its token). The argument is a progress report's percent,
# a record message's record count or a commit's frame count.
HEADER = struct.Struct("<BqI16s")
ANSWER = struct.Struct("<Bq16s")
CLAIM, PROGRESS, COMPLETE, RECORDS, COMMIT = range(5)
OK = 0
# A frame record: slot, sha256 of the object, lengths of the object key and of the boxes'
# JSON, then the key and the JSON (UTF-8).
RECORD = struct.Struct("<I32sHH")
# Sizes of the messages, as the unary floor pads them (protobuf's sizes in the product):
# a Complete of 60 empty slots, an assignment of 60 slots, a progress report.
COMPLETE_BYTES = 900
ASSIGNMENT_BYTES = 1700
PROGRESS_BYTES = 160
COMMIT_BYTES = 160
# Three boxes as the coordinator stores them (leases.boxes.box_dict's form).
BOXES_JSON = (
    '[{"class_name":"person","score":0.91,"x":0.1203,"y":0.2281,"w":0.0914,"h":0.3125,'
    '"track_id":"17"},{"class_name":"car","score":0.87,"x":0.5512,"y":0.4402,"w":0.2031,'
    '"h":0.1566,"track_id":"18"},{"class_name":"person","score":0.64,"x":0.8125,"y":0.2031,'
    '"w":0.0508,"h":0.2188,"track_id":"21"}]'
)

PROCESSES = 8
JOBS = 8000  # per side and pass: the cycle floor's cycles, procrastinate's jobs
BATCHES = (1, 8, 32)
FRAMES_PER_JOB = 120
FRAME_JOBS = 16  # jobs per client at K=1; (1 + log2 K) times as many at K frames a message
REPEAT = 2
TARGET_MS_PER_FRAME = 0.25
TARGET_RATIO = 1.0


# Messages (pure) --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Frame:
    slot: int
    object_key: str
    sha256: bytes
    boxes: str


def message(operation: int, job: int, token: bytes, argument: int = 0, size: int = 0) -> bytes:
    """A message's header, padded with zeros to `size` bytes."""
    return HEADER.pack(operation, job, argument, token).ljust(size, b"\0")


def answer(job: int, token: bytes, status: int = OK) -> bytes:
    """An answer: the next job and its token (0 and zeros: none), padded to an assignment."""
    return ANSWER.pack(status, job, token).ljust(ASSIGNMENT_BYTES, b"\0")


def pack_records(job: int, token: bytes, frames: Sequence[Frame]) -> bytes:
    """A record message: the header (the lease, the record count), then each record."""
    parts = [HEADER.pack(RECORDS, job, len(frames), token)]
    for frame in frames:
        key = frame.object_key.encode()
        boxes = frame.boxes.encode()
        parts += [RECORD.pack(frame.slot, frame.sha256, len(key), len(boxes)), key, boxes]
    return b"".join(parts)


def unpack_records(
    payload: bytes, count: int, offset: int = HEADER.size
) -> tuple[list[int], list[str], list[bytes], list[str]]:
    """The columns (slots, object keys, sha256s, boxes' JSON) of `count` records packed
    from `offset`: the arrays that the record statement unnests. ValueError when the
    payload is not exactly that many records."""
    slots: list[int] = []
    keys: list[str] = []
    shas: list[bytes] = []
    boxes: list[str] = []
    view = memoryview(payload)
    at = offset
    for _ in range(count):
        slot, sha, key_length, boxes_length = RECORD.unpack_from(payload, at)
        at += RECORD.size
        keys.append(str(view[at : at + key_length], "utf-8"))
        at += key_length
        boxes.append(str(view[at : at + boxes_length], "utf-8"))
        at += boxes_length
        slots.append(slot)
        shas.append(sha)
    if at != len(payload):
        raise ValueError(f"{len(payload) - at} bytes after {count} records")
    return slots, keys, shas, boxes


def batch_sizes(frames: int, per_message: int) -> list[int]:
    """How many records each message of a job of `frames` frames carries, at most
    `per_message` each: full messages, then the rest."""
    if frames < 0 or per_message < 1:
        raise ValueError(f"{frames} frames in messages of {per_message}")
    full, rest = divmod(frames, per_message)
    return [per_message] * full + ([rest] if rest else [])


def frame_jobs(base: int, per_message: int) -> int:
    """Jobs each client publishes at `per_message` frames a message: `base` at 1, (1 +
    log2 K) times as many at K, so that each pass is a few seconds at every K."""
    return base * (1 + math.ceil(math.log2(per_message)))


def job_frames(run: int, job: int, frames: int) -> list[Frame]:
    """The frames a processor publishes for one job: keys under the job, their sha256."""
    made = []
    for slot in range(frames):
        key = f"runs/{run:08d}/jobs/{job:012d}/{slot:05d}.jpg"
        made.append(Frame(slot, key, hashlib.sha256(key.encode()).digest(), BOXES_JSON))
    return made


# The server -------------------------------------------------------------------------------


class Refused(Exception):
    """The fence refused: the lease does not hold."""


def _database_handler(pool: asyncpg.Pool) -> Callable[[bytes], Any]:
    """Each message's one statement; the answer to send, or None (not answered)."""

    async def handle(request: bytes) -> bytes | None:
        operation, job, argument, token = HEADER.unpack_from(request)
        lease = uuid.UUID(bytes=token)
        if operation == RECORDS:
            slots, keys, shas, boxes = unpack_records(request, argument)
            status = await pool.execute(SQL["record_frames"], job, lease, slots, keys, shas, boxes)
            if status != f"INSERT 0 {argument}":
                raise Refused(status)
            return None
        if operation == PROGRESS:
            if await pool.fetchrow(SQL["progress"], job, lease, argument) is None:
                raise Refused("progress")
            return None
        if operation == COMPLETE:
            row = await pool.fetchrow(SQL["complete"], job, lease)
        elif operation == COMMIT:
            row = await pool.fetchrow(SQL["commit_frames"], job, lease, argument)
            if row is not None and row["saved"] != argument:
                raise Refused(f"commit saved {row['saved']} of {argument} frames")
        else:
            row = await pool.fetchrow(SQL["claim"])
            if row is None:
                return answer(0, bytes(16))
        if operation != CLAIM and (row is None or row["done"] != 1):
            raise Refused("complete")
        assert row is not None
        next_token = row["token"].bytes if row["token"] is not None else bytes(16)
        return answer(row["id"] or 0, next_token)

    return handle


async def _bare_handle(request: bytes) -> bytes | None:
    operation = request[0]
    if operation in (CLAIM, COMPLETE, COMMIT):
        return answer(1, bytes(16))
    return None


def _serve(ports: Queue[int], dsn: str | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us

    async def main() -> None:
        handle: Callable[[bytes], Any] = _bare_handle
        if dsn is not None:
            pool = await asyncpg.create_pool(dsn, min_size=POOL, max_size=POOL)
            handle = _database_handler(pool)

        async def session(requests: Any, context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
            """One processor's stream: its messages in order, each answered or not."""
            while True:
                request: object = await context.read()
                if not isinstance(request, bytes):  # grpc.aio.EOF: the client is done
                    return
                try:
                    reply = await handle(request)
                except Refused as refused:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refused))
                if reply is not None:
                    await context.write(reply)

        server = grpc.aio.server()
        handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.stream_stream_rpc_method_handler(
            session
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("bench.Session", {"Stream": handler}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ports.put(port)
        await server.wait_for_termination()

    uvloop.run(main())


# The clients ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Work:
    """What each client does: `jobs` jobs, each either the short-job cycle (`progress`
    reports, then complete + claim next) or `frames` frames in messages of `per_message`
    records, then a commit + claim next."""

    jobs: int
    progress: int = 0
    frames: int = 0
    per_message: int = 1


async def _read(call: grpc.aio.StreamStreamCall[bytes, bytes]) -> tuple[int, bytes]:
    reply = await call.read()
    if not isinstance(reply, bytes):
        raise RuntimeError("the stream ended")
    status, job, token = ANSWER.unpack_from(reply)
    if status != OK or job == 0:
        raise RuntimeError(f"answered status {status}, job {job}: nothing left to claim")
    return job, token


async def _client_work(target: str, work: Work, go: Event) -> float:
    """Opens the stream, claims, waits for the release, works; the CPU the work used."""
    async with grpc.aio.insecure_channel(target) as channel:
        await asyncio.wait_for(channel.channel_ready(), READY_TIMEOUT_S)
        call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(METHOD)()
        await call.write(message(CLAIM, 0, bytes(16), size=PROGRESS_BYTES))
        job, token = await _read(call)
        # The records of a job's messages, packed once: the floor sends one job's records
        # for every job (the same bytes on the wire; rows unique by job and slot), so that
        # the clients' packing does not take the 2 cores from the server and Postgres.
        frames = job_frames(1, 0, work.frames)
        bodies: list[tuple[int, bytes]] = []
        at = 0
        for size in batch_sizes(work.frames, work.per_message):
            packed = pack_records(0, bytes(16), frames[at : at + size])
            bodies.append((size, packed[HEADER.size :]))
            at += size
        await asyncio.to_thread(go.wait, READY_TIMEOUT_S)
        began = self_cpu_s()
        for _ in range(work.jobs):
            if work.frames:
                for size, body in bodies:
                    await call.write(HEADER.pack(RECORDS, job, size, token) + body)
                await call.write(message(COMMIT, job, token, work.frames, COMMIT_BYTES))
            else:
                for number in range(1, work.progress + 1):
                    percent = number * 100 // (work.progress + 1)
                    await call.write(message(PROGRESS, job, token, percent, PROGRESS_BYTES))
                await call.write(message(COMPLETE, job, token, 0, COMPLETE_BYTES))
            job, token = await _read(call)
        spent = self_cpu_s() - began
        await call.done_writing()
        return spent


def _client(target: str, work: Work, go: Event, results: Queue[float]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        results.put(asyncio.run(_client_work(target, work, go)))
    except BaseException:  # the parent sees a missing result
        results.put(-1.0)
        raise


# Measuring --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pass:
    """One side's pass: units (cycles, jobs or frames), wall seconds and CPU seconds."""

    units: int
    wall_s: float
    server_s: float
    postgres_s: float
    clients_s: float
    other_s: float | None = None  # CPU of processes not ours meanwhile; None: not read

    def ms(self, cpu_s: float) -> float:
        return cpu_s * 1000 / self.units

    @property
    def control_ms(self) -> float:
        """Server + Postgres per unit: the control plane's share."""
        return self.ms(self.server_s + self.postgres_s)

    @property
    def total_ms(self) -> float:
        return self.ms(self.server_s + self.postgres_s + self.clients_s)

    @property
    def per_s(self) -> float:
        return self.units / self.wall_s

    @property
    def other_cores(self) -> str:
        return "-" if self.other_s is None else f"{self.other_s / self.wall_s:.2f}"


def postgres_cpu_s(cluster: PostgresCluster) -> float:
    """CPU of the postmaster and its family, the backends it has reaped included."""
    pid_file = cluster.data_dir / "postmaster.pid"
    return family_cpu_s(int(pid_file.read_text().split("\n", 1)[0]))


def measure(
    ctx: SpawnContext,
    work: Work,
    *,
    processes: int = PROCESSES,
    dsn: str | None = None,
    cluster: PostgresCluster | None = None,
) -> Pass:
    """Runs the stream server and the clients (with `dsn`: each message's statement in
    that database, prepared by `prepare`); stops every process it started."""
    ports: Queue[int] = ctx.Queue()
    results: Queue[float] = ctx.Queue()
    go = ctx.Event()
    server = ctx.Process(target=_serve, args=(ports, dsn), daemon=True)
    clients = []
    server.start()
    try:
        target = f"127.0.0.1:{ports.get(timeout=READY_TIMEOUT_S)}"
        for _ in range(processes):
            client = ctx.Process(target=_client, args=(target, work, go, results), daemon=True)
            client.start()
            clients.append(client)
        time.sleep(1.0)  # streams open and claim before the release
        assert server.pid is not None

        def database() -> float:
            return postgres_cpu_s(cluster) if cluster is not None else 0.0

        server_before, postgres_before = family_cpu_s(server.pid), database()
        parent_before, machine_before = self_cpu_s(), busy_cores_s()
        released = time.monotonic()
        go.set()
        spent = [results.get(timeout=RESULT_TIMEOUT_S) for _ in clients]
        wall = time.monotonic() - released
        server_s = family_cpu_s(server.pid) - server_before
        postgres_s = database() - postgres_before
        parent_s = self_cpu_s() - parent_before
        machine_s = busy_cores_s() - machine_before
        if min(spent) < 0:
            raise RuntimeError("a stream client failed")
        units = processes * work.jobs * (work.frames or 1)
        other = max(0.0, machine_s - server_s - postgres_s - sum(spent) - parent_s)
        return Pass(units, wall, server_s, postgres_s, sum(spent), other)
    finally:
        grpc_floor.stop([*clients, server])


async def prepare(dsn: str, jobs: int) -> None:
    """The bare tables, empty but for `jobs` queued jobs (the statements' own, from
    bench/grpc_floor.sql)."""
    await grpc_floor.prepare_durable(dsn, jobs)
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(SQL["drop_frame_tables"])
        await connection.execute(SQL["create_frames"])
        await connection.execute(SQL["create_items"])
        await connection.execute("VACUUM ANALYZE floor_frames, floor_items")
    finally:
        await connection.close()


async def _count(dsn: str, name: str) -> int:
    connection = await asyncpg.connect(dsn)
    try:
        found: int = await connection.fetchval(SQL[name])
        return found
    finally:
        await connection.close()


# The run ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
    processes: int = PROCESSES
    jobs: int = JOBS
    progress: int = 0
    batches: tuple[int, ...] = BATCHES
    frames_per_job: int = FRAMES_PER_JOB
    frame_jobs: int = FRAME_JOBS
    repeat: int = REPEAT


def say(line: str = "") -> None:
    print(line, flush=True)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def _side_names(options: Options) -> list[str]:
    return ["unary", "bare", "procrastinate", "stream", *(f"k{k}" for k in options.batches)]


def _run_side(
    name: str, ctx: SpawnContext, cluster: PostgresCluster, dsn: str, options: Options
) -> Pass:
    from bench import claim_cycle  # its product imports only where procrastinate runs

    cycles = max(1, options.jobs // options.processes)
    if name == "unary":  # bench.grpc_floor's own measure: no reading of other load
        floor = grpc_floor.measure(ctx, processes=options.processes, cycles=cycles, calls=3)
        return Pass(floor.cycles, floor.wall_s, floor.server_cpu_s, 0.0, floor.clients_cpu_s)
    if name == "bare":
        return measure(ctx, Work(cycles, options.progress), processes=options.processes)
    if name == "procrastinate":
        phase = claim_cycle.procrastinate_side(
            ctx, cluster, options.jobs, workers=options.processes
        )
        cpu = phase.cpu
        return Pass(
            phase.cycles,
            phase.wall_s,
            cpu["coordinator"] + cpu["bench"],
            cpu["postgres"],
            cpu["clients"],
            cpu["other"],
        )
    if name == "stream":
        run_async(lambda: prepare(dsn, options.processes * (cycles + 1)))
        done = measure(
            ctx,
            Work(cycles, options.progress),
            processes=options.processes,
            dsn=dsn,
            cluster=cluster,
        )
        completed = run_async(lambda: _count(dsn, "completed"))
        if completed != done.units:
            raise AssertionError(f"stream floor: {completed} jobs completed, {done.units} cycled")
        return done
    per_message = int(name.removeprefix("k"))
    jobs = frame_jobs(options.frame_jobs, per_message)
    run_async(lambda: prepare(dsn, options.processes * (jobs + 1)))
    done = measure(
        ctx,
        Work(jobs, frames=options.frames_per_job, per_message=per_message),
        processes=options.processes,
        dsn=dsn,
        cluster=cluster,
    )
    saved = run_async(lambda: _count(dsn, "items_saved"))
    if saved != done.units:
        raise AssertionError(f"frame floor K={per_message}: {saved} items, {done.units} frames")
    return done


def _print_pass(name: str, number: int, done: Pass) -> None:
    unit = "frame" if name.startswith("k") else "cycle" if name != "procrastinate" else "job"
    say(
        f"  pass {number} {name:<13} {done.units:>7,} {unit}s in {done.wall_s:6.2f} s = "
        f"{done.per_s:7.0f}/s; CPU ms per {unit}: server {done.ms(done.server_s):.3f} "
        f"postgres {done.ms(done.postgres_s):.3f} clients {done.ms(done.clients_s):.3f} "
        f"total {done.total_ms:.3f}; other {done.other_cores} cores"
    )


def run(cluster: PostgresCluster, ctx: SpawnContext, options: Options) -> dict[str, list[Pass]]:
    """Every side's passes, alternating the order pass by pass."""
    run_async(lambda: admin_execute(cluster.admin_dsn, f"CREATE DATABASE {quote_ident(DATABASE)}"))
    dsn = cluster.dsn(DATABASE)
    names = _side_names(options)
    passes: dict[str, list[Pass]] = {name: [] for name in names}
    for number in range(1, options.repeat + 1):
        say(f"pass {number} ({_load()}):")
        for name in names if number % 2 else reversed(names):
            done = _run_side(name, ctx, cluster, dsn, options)
            passes[name].append(done)
            _print_pass(name, number, done)
    return passes


def report(passes: dict[str, list[Pass]], options: Options) -> str:
    """The summary (medians over each side's passes) and the RESULT line."""

    def med(name: str, figure: Callable[[Pass], float]) -> float:
        return median(figure(done) for done in passes[name])

    unary = med("unary", lambda p: p.total_ms)
    bare = med("bare", lambda p: p.total_ms)
    stream_ms = med("stream", lambda p: p.total_ms)
    stream_per_s = med("stream", lambda p: p.per_s)
    peer_ms = med("procrastinate", lambda p: p.total_ms)
    peer_per_s = med("procrastinate", lambda p: p.per_s)
    ratio = stream_per_s / peer_per_s
    cpu_ratio = peer_ms / stream_ms
    say()
    say(f"medians over {options.repeat} passes a side:")
    say(f"  unary floor, 3 bare calls a cycle (no database): {unary:.2f} ms of CPU per cycle")
    say(f"  stream, 1 bare message each way (no database): {bare:.2f} ms of CPU per cycle")
    say(
        f"  stream floor, short-job cycle ({options.progress} progress messages, complete + "
        f"claim next -> assignment, fenced statements): {stream_per_s:.0f} cycles/s, "
        f"{stream_ms:.2f} ms of CPU per cycle (server "
        f"{med('stream', lambda p: p.ms(p.server_s)):.2f}, Postgres "
        f"{med('stream', lambda p: p.ms(p.postgres_s)):.2f}, clients "
        f"{med('stream', lambda p: p.ms(p.clients_s)):.2f})"
    )
    say(
        f"  procrastinate ({options.processes} workers x 1): {peer_per_s:.0f} jobs/s, "
        f"{peer_ms:.2f} ms of CPU per job"
    )
    say(
        f"  ratio (stream floor cycles/s / procrastinate jobs/s): {ratio:.2f}; on CPU "
        f"(procrastinate's per job / the floor's per cycle): {cpu_ratio:.2f}; target >= "
        f"{TARGET_RATIO:.1f}: {'leaves room' if ratio >= TARGET_RATIO else 'MISSED'}"
    )
    fields = {
        "floor_ms_per_cycle": f"{unary:.2f}",
        "stream_bare_ms_per_cycle": f"{bare:.2f}",
        "stream_floor_ms_per_cycle": f"{stream_ms:.2f}",
        "stream_floor_cycles_per_s": f"{stream_per_s:.0f}",
        "procrastinate_jobs_per_s": f"{peer_per_s:.0f}",
        "stream_floor_ratio": f"{ratio:.2f}",
        "stream_floor_cpu_ratio": f"{cpu_ratio:.2f}",
    }
    for k in options.batches:
        name = f"k{k}"
        control = med(name, lambda p: p.control_ms)
        say(
            f"  frames, {k} a message ({options.frames_per_job} a job): "
            f"{med(name, lambda p: p.per_s):.0f} frames/s; CPU ms per frame: server "
            f"{med(name, lambda p: p.ms(p.server_s)):.3f} + Postgres "
            f"{med(name, lambda p: p.ms(p.postgres_s)):.3f} = {control:.3f} (target <= "
            f"{TARGET_MS_PER_FRAME}: "
            f"{'leaves room' if control <= TARGET_MS_PER_FRAME else 'MISSED'}); clients "
            f"{med(name, lambda p: p.ms(p.clients_s)):.3f}"
        )
        fields[f"frame_floor_ms_per_frame_k{k}"] = f"{control:.3f}"
    for k in options.batches:
        fields[f"frame_floor_frames_per_s_k{k}"] = f"{med(f'k{k}', lambda p: p.per_s):.0f}"
    return result_line(fields)


def main(ctx: SpawnContext, options: Options) -> int:
    from tools.localstack.postgres import PostgresUnavailable, postgres_cluster

    say(f"{_load()} before; {os.cpu_count()} cores")
    try:
        with postgres_cluster() as cluster:
            say(f"postgres: {cluster.bin_dir} on {cluster.host}:{cluster.port}")
            passes = run(cluster, ctx, options)
    except PostgresUnavailable as unavailable:
        say(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    line = report(passes, options)
    say(f"{_load()} after")
    say(line)
    return 0
