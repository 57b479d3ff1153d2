"""CreateRun at the size limit: a full run over 10,000 recordings of 60 slots each.

    .venv/bin/python -m bench.run_create [--samples 5] [--profile] [--check]

Starts a throwaway Postgres cluster (the test harness's: tmpfs when roomy, fsync and
synchronous_commit off), migrates a database, starts the coordinator in process on real
gRPC (loopback) with the harness's frozen clock, and registers a device, runtimes, 500
cameras, a model and a bucket. It then copies in 10,000 one-hour recordings (20 per
camera, 02:00-22:00 on the input day; setup, not measured) and saves a workflow that
samples them every 60 s over 01:00-23:00, so each recording is one job of 60 slots.

Measured, with time.perf_counter() around the RPC as a client sees it:
- creation: `--samples` CreateRun calls in full mode with new run ids; each admits
  10,000 jobs (600,000 slots), and each finds the previous ones' jobs unfinished;
- retry: `--samples` CreateRun calls repeating the first run's id and body (created=false).

Then, unmeasured, one more creation in process (Runs.create_run plus the
get_run the RPC answers with) on a one-connection pool whose statements are timed by
asyncpg's query logger: the split between SQL round trips and Python. `--profile` adds
EXPLAIN ANALYZE of the big statements (in a rolled-back transaction) and cProfile over
one more in-process creation.

The last line is `RESULT run_create_10k_s=<median> run_create_retry_ms=<median>`.
Everything it starts is stopped on exit, also on error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import io
import pstats
import signal
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from types import FrameType
from typing import Any

from bench.stats import median
from services.coordinator.identity.auth import Grant, Principal, ScopeName
from services.coordinator.platform import queries
from services.coordinator.platform.db import Database
from services.coordinator.runs.admission import run_request as api_run_request
from services.coordinator.runs.runs import Runs
from testbed.coordinator_world import (
    DAY,
    build_world,
    copy_recordings,
    run_request,
    save_workflow,
    workflow_spec,
)
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from testbed.harness.postgres import (
    TIMINGS,
    PostgresUnavailable,
    create_migrated_database,
    postgres_cluster,
    quote_ident,
)
from workshop.v1 import common_pb2
from workshop.v1 import operator_pb2 as op

CAMERAS = 500
RECORDINGS_PER_CAMERA = 20
FIRST_RECORDING_HOUR = 2  # recordings start on the hour: 02:00 ... 21:00
WINDOW_HOURS = (1, 23)  # the workflow's window; the slot grid starts at 01:00
INTERVAL_SECONDS = 60
RECORDING_BYTES = 1_500_000_000  # an hour of camera footage, roughly
RECORDING_LENGTH = timedelta(hours=1)
RECORDINGS = CAMERAS * RECORDINGS_PER_CAMERA
SLOTS_PER_RECORDING = int(RECORDING_LENGTH.total_seconds()) // INTERVAL_SECONDS
WORKFLOW_ID = "bench-10k"
DATABASE = "bench_run_create"
# Room for every run this benchmark creates; the capacity check itself still runs.
JOB_CAPACITY = 10_000_000
RPC_TIMEOUT_S = 120.0
TARGET_CREATE_S = 1.0
TARGET_RETRY_MS = 30.0
PROFILE_TOP = 15
SHOWN_STATEMENT_S = 0.0005
PROFILE_FRAMEWORK = ("/asyncio/", "selectors.py", "bench/run_create.py")
BENCH_PRINCIPAL = Principal(kind="key", key_id="bench", grants=(Grant(ScopeName.ADMIN),))


@dataclasses.dataclass(frozen=True)
class Figures:
    create_s: list[float]
    retry_s: list[float]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run_create",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--samples", type=int, default=5, help="creations and retries timed")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also EXPLAIN ANALYZE the big statements and cProfile one in-process creation",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a median misses its target"
    )
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    # Outside the event loop (initdb, start, migrations, stop) SIGTERM raises SystemExit,
    # so the cluster's cleanup runs.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with postgres_cluster() as cluster:
            say(
                f"postgres: {cluster.bin_dir} on {cluster.host}:{cluster.port}, "
                f"data in {cluster.data_dir} (initdb {TIMINGS.initdb_s:.2f} s, "
                f"start {TIMINGS.start_s:.2f} s)"
            )
            dsn = create_migrated_database(cluster, DATABASE)
            try:
                figures = asyncio.run(_bench(dsn, args.samples, profile=args.profile))
            except asyncio.CancelledError:  # SIGTERM while the loop ran
                raise SystemExit(128 + signal.SIGTERM) from None
            finally:
                signal.signal(signal.SIGTERM, _exit_on_sigterm)
    except PostgresUnavailable as unavailable:
        say(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    create_s = median(figures.create_s)
    retry_ms = median(figures.retry_s) * 1000
    missed = create_s > TARGET_CREATE_S or retry_ms > TARGET_RETRY_MS
    say(f"RESULT run_create_10k_s={create_s:.3f} run_create_retry_ms={retry_ms:.1f}")
    return 1 if args.check and missed else 0


def say(line: str = "") -> None:
    print(line, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


async def _bench(dsn: str, samples: int, *, profile: bool) -> Figures:
    # Inside the loop, SIGTERM cancels the benchmark like Ctrl-C does, so every `finally`
    # runs on the loop (an exception raised from a plain signal handler in the middle of
    # gRPC's callbacks can crash the interpreter). asyncio.run restores SIG_DFL at the end.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    async with running_coordinator(dsn, job_capacity=JOB_CAPACITY) as c:
        began = time.perf_counter()
        runtime_id = await _set_up(c)
        say(
            f"setup: {RECORDINGS:,} recordings x {SLOTS_PER_RECORDING} slots on {CAMERAS} "
            f"cameras, workflow {WORKFLOW_ID!r} ({time.perf_counter() - began:.1f} s)"
        )
        figures = await _measure(c, runtime_id, samples)
        _print_table(figures)
        await _phases(dsn, c, runtime_id, samples, profile=profile)
        return figures


async def _set_up(c: CoordinatorHarness) -> str:
    """The world, 500 more cameras, 10,000 recordings (copied in) and the workflow."""
    world = await build_world(c, recordings_per_camera=0)
    cameras = [f"cam-{index:03d}" for index in range(CAMERAS)]
    for camera in cameras:
        await c.operator.PutCamera(op.PutCameraRequest(camera_id=camera), metadata=c.admin)
    await copy_recordings(
        c,
        [
            (f"{camera}-h{hour:02d}", camera, start, start + RECORDING_LENGTH)
            for camera in cameras
            for hour in range(FIRST_RECORDING_HOUR, FIRST_RECORDING_HOUR + RECORDINGS_PER_CAMERA)
            for start in [DAY + timedelta(hours=hour)]
        ],
        byte_size=RECORDING_BYTES,
    )
    async with c.db.connection() as connection:
        await connection.execute("VACUUM ANALYZE")
    spec = workflow_spec(cameras=cameras, interval=INTERVAL_SECONDS, window=WINDOW_HOURS)
    await save_workflow(c, WORKFLOW_ID, spec)
    return world.tracking_runtime


async def _measure(c: CoordinatorHarness, runtime_id: str, samples: int) -> Figures:
    create_s: list[float] = []
    for index in range(samples):
        request = _full_request(f"bench-create-{index}", runtime_id)
        began = time.perf_counter()
        response = await c.workshop.CreateRun(request, metadata=c.admin, timeout=RPC_TIMEOUT_S)
        create_s.append(time.perf_counter() - began)
        if not response.created:
            raise AssertionError(f"{request.run_id}: created=false on a new id")
        await _check_jobs(c, request.run_id)
    first = _full_request("bench-create-0", runtime_id)
    retry_s: list[float] = []
    for _ in range(samples):
        began = time.perf_counter()
        response = await c.workshop.CreateRun(first, metadata=c.admin, timeout=RPC_TIMEOUT_S)
        retry_s.append(time.perf_counter() - began)
        if response.created:
            raise AssertionError("a retry with the same id and body created a run")
    return Figures(create_s=create_s, retry_s=retry_s)


def _full_request(run_id: str, runtime_id: str) -> Any:
    return run_request(run_id, WORKFLOW_ID, runtime_id, mode=common_pb2.RUN_MODE_FULL)


async def _check_jobs(c: CoordinatorHarness, run_id: str) -> None:
    async with c.db.connection() as connection:
        jobs, slots = await connection.fetchrow(
            "SELECT count(*), coalesce(sum(slot_count), 0) FROM jobs WHERE run_id = $1", run_id
        )
    expected = (RECORDINGS, RECORDINGS * SLOTS_PER_RECORDING)
    if (jobs, slots) != expected:
        raise AssertionError(f"{run_id}: {jobs} jobs, {slots} slots; expected {expected}")


def _print_table(figures: Figures) -> None:
    say()
    say(f"CreateRun through gRPC, full mode, {RECORDINGS:,} jobs x {SLOTS_PER_RECORDING} slots")
    say(f"{'':>8} {'create (s)':>12} {'retry (ms)':>12}")
    for index, (create, retry) in enumerate(
        zip(figures.create_s, figures.retry_s, strict=True), start=1
    ):
        say(f"{f'#{index}':>8} {create:>12.3f} {retry * 1000:>12.1f}")
    for label, pick in (("median", median), ("min", min), ("max", max)):
        say(f"{label:>8} {pick(figures.create_s):>12.3f} {pick(figures.retry_s) * 1000:>12.1f}")
    create = median(figures.create_s)
    retry = median(figures.retry_s) * 1000
    say(
        f"targets: creation <= {TARGET_CREATE_S:.1f} s {_verdict(create <= TARGET_CREATE_S)}; "
        f"retry <= {TARGET_RETRY_MS:.0f} ms {_verdict(retry <= TARGET_RETRY_MS)}"
    )


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


# Where one creation's time goes ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Timed:
    name: str
    elapsed_s: float
    args: tuple[Any, ...]


class StatementClock:
    """asyncpg query logger: each statement's client-side time, named as in its .sql files."""

    def __init__(self) -> None:
        self.names = {
            text: f"{path.stem}.{name}"
            for path in queries.sql_files()
            for name, text in queries.load(path.stem).items()
        }
        self.timed: list[Timed] = []

    def __call__(self, record: Any) -> None:
        text = str(record.query).strip()
        name = self.names.get(text) or _driver_statement(text)
        self.timed.append(Timed(name, float(record.elapsed), tuple(record.args or ())))


def _driver_statement(text: str) -> str:
    """A name for the statements asyncpg itself sends."""
    if text.startswith("SELECT pg_advisory_unlock_all()"):
        return "(asyncpg: pool reset on release)"
    if text in ("BEGIN;", "COMMIT;", "ROLLBACK;"):
        return text.rstrip(";")
    return "(other) " + " ".join(text.split())[:40]


async def _phases(
    dsn: str, c: CoordinatorHarness, runtime_id: str, samples: int, *, profile: bool
) -> None:
    async with Database.open(dsn, size=1) as db:  # one connection: every statement is timed
        api = Runs(db, c.clock, capacity=JOB_CAPACITY)
        # Warm the connection (type introspection, prepared statements) with a 1-job test run.
        warm = dataclasses.replace(
            _api_request("bench-warm", runtime_id), mode="test", image_limit=1
        )
        await api.create_run(BENCH_PRINCIPAL, warm)
        await api.get_run(BENCH_PRINCIPAL, warm.run_id, 0)
        clock = StatementClock()
        async with db.connection() as connection:
            connection.add_query_logger(clock)
        request = _api_request("bench-phases", runtime_id)
        say()
        await _split(
            f"one more creation, in process on a warm connection, {samples * RECORDINGS:,} "
            "unfinished jobs before it",
            api,
            request,
            clock,
            created=True,
        )
        creation = list(clock.timed)
        say()
        await _split("one retry of it, in process", api, request, clock, created=False)
        if profile:
            await _explain(db, creation)
            await _profile(api, runtime_id)


async def _split(
    title: str, api: Runs, request: Any, clock: StatementClock, *, created: bool
) -> None:
    """Times create_run plus the get_run the RPC answers with; prints where the time went."""
    clock.timed.clear()
    began = time.perf_counter()
    _, was_created = await api.create_run(BENCH_PRINCIPAL, request)
    create_s = time.perf_counter() - began
    await api.get_run(BENCH_PRINCIPAL, request.run_id, 0)
    total_s = time.perf_counter() - began
    await asyncio.sleep(0.05)  # the logger is called soon after each statement
    if was_created != created:
        raise AssertionError(f"{request.run_id}: created={was_created}, expected {created}")
    say(
        f"{title}: {total_s * 1000:.1f} ms (create_run {create_s * 1000:.1f} ms, "
        f"get_run {(total_s - create_s) * 1000:.1f} ms)"
    )
    by_name: dict[str, list[float]] = {}
    for timed in clock.timed:
        by_name.setdefault(timed.name, []).append(timed.elapsed_s)
    sql_s = sum(timed.elapsed_s for timed in clock.timed)
    shown = 0.0
    for name, times in sorted(by_name.items(), key=lambda item: -sum(item[1])):
        if sum(times) < SHOWN_STATEMENT_S:
            continue
        shown += sum(times)
        calls = f" (x{len(times)})" if len(times) > 1 else ""
        say(f"  {sum(times) * 1000:8.1f} ms  {name}{calls}")
    hidden = len(clock.timed) - sum(
        len(times) for times in by_name.values() if sum(times) >= SHOWN_STATEMENT_S
    )
    if hidden:
        say(f"  {(sql_s - shown) * 1000:8.1f} ms  {hidden} statements under 0.5 ms each")
    say(
        f"  {sql_s * 1000:8.1f} ms  SQL in all, {len(clock.timed)} statements "
        "(client side: argument encoding, round trip, server, result decoding)"
    )
    say(f"  {(total_s - sql_s) * 1000:8.1f} ms  Python outside the statements")


def _api_request(run_id: str, runtime_id: str) -> Any:
    return api_run_request(
        run_id=run_id,
        workflow_id=WORKFLOW_ID,
        runtime_id=runtime_id,
        revision=1,
        mode="full",
        image_limit=None,
    )


class _Rollback(Exception):
    pass


async def _explain(db: Database, creation: Sequence[Timed]) -> None:
    """EXPLAIN ANALYZE the phase run's big statements again, under a copy of its run row.

    The inserts get the arguments the phase run sent, its run id and seq swapped for the
    copy's; the transaction is rolled back.
    """
    timed = {entry.name: entry for entry in creation}
    names = [
        "runs.unfinished_job_count",
        "resources.recording_list_for_input",
        "runs.snapshot_recordings_insert",
        "runs.jobs_insert",
    ]
    texts = {name: text for text, name in StatementClock().names.items()}
    original = "bench-phases"
    copy_id = "bench-explain"
    say()
    say("EXPLAIN (ANALYZE, BUFFERS) of the big statements, rolled back:")
    try:
        async with db.transaction() as connection:
            original_seq = await connection.fetchval(
                "SELECT seq FROM runs WHERE run_id = $1", original
            )
            columns = ", ".join(
                quote_ident(row["attname"])
                for row in await connection.fetch(
                    "SELECT attname FROM pg_attribute WHERE attrelid = 'runs'::regclass "
                    "AND attnum > 0 AND NOT attisdropped AND attidentity = '' "
                    "AND attgenerated = '' AND attname <> 'run_id' ORDER BY attnum"
                )
            )
            seq = await connection.fetchval(
                f"INSERT INTO runs (run_id, {columns}) SELECT $1, {columns} FROM runs "
                "WHERE run_id = $2 RETURNING seq",
                copy_id,
                original,
            )
            swap = {original: copy_id, original_seq: seq}
            for name in names:
                args = [
                    swap.get(value, value) if isinstance(value, str | int) else value
                    for value in timed[name].args
                ]
                plan = await connection.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {texts[name]}", *args)
                say(f"-- {name}")
                for row in plan:
                    line = str(row[0])
                    say(f"   {line if len(line) <= 140 else line[:137] + '...'}")
            raise _Rollback
    except _Rollback:
        pass


async def _profile(api: Runs, runtime_id: str) -> None:
    run_id = "bench-profile"
    request = _api_request(run_id, runtime_id)
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        await api.create_run(BENCH_PRINCIPAL, request)
        await api.get_run(BENCH_PRINCIPAL, run_id, 0)
    finally:
        profiler.disable()
    # By cumulative time, the event loop and this file would fill the list: leave them out.
    for sort, leave_out in (("cumulative", PROFILE_FRAMEWORK), ("tottime", ())):
        stats = pstats.Stats(profiler)
        table: Any = stats.stats  # type: ignore[attr-defined]
        for function in list(table):
            if any(part in function[0] for part in leave_out) or "_contextvars" in function[2]:
                del table[function]
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]
        stats.strip_dirs().sort_stats(sort).print_stats(PROFILE_TOP)
        say()
        say(f"cProfile of one in-process creation (+ get_run), top {PROFILE_TOP} by {sort}:")
        lines = out.getvalue().strip().splitlines()
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
        for line in lines[start:]:
            say(f"  {line}")


if __name__ == "__main__":
    sys.exit(main())
