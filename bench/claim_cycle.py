"""Lease cycles over gRPC: 8 simulated processors against the coordinator, and procrastinate.

    .venv/bin/python -m bench.claim_cycle [--profile] [--check] [--session]
        [--progress-reports N]

Starts a throwaway Postgres cluster with the test harness (tmpfs when roomy, fsync and
synchronous_commit off), migrates a database and starts the coordinator as its own
process (`python -m services.coordinator`, system clock, scheduler and maintenance
off), read through `testbed/harness/processes.py`. Setup, not measured: gpu-box with 4
runtimes, 50 cameras, 1,000 one-hour recordings (copied in), a workflow sampling them
every 60 s, one workshop:run key per processor, and 20 full runs (5 per runtime) of
1,000 jobs x 60 slots: 20,000 queued jobs.

Measured:
- throughput: 8 processor processes (multiprocessing, spawn), 2 per runtime, each on
  its own loopback gRPC channel (`workshop.kit.channels.open_channel`), run the cycle
  the processor runs for short jobs (services/processor/leases.py), one job at a time
  with `--in-flight` places (default 3, the processor's): a Claim batched to its free
  places (max_jobs, a fresh request_id each) when it holds no job, then per job a
  Complete (all 60 slots EMPTY) carrying then_claim for the places it frees, until
  every job of their runtime is committed. A short job reports no progress: the
  processor reports only for a job still running after PROCESSOR_PROGRESS_AFTER_SECONDS
  (5 s), and a job that finishes within it (heartbeats are due only after 45 s without
  a renewal) sends its Complete alone. `--progress-reports N` runs the cycle of
  processors before that delay, N ReportProgress per job before its Complete (each
  renews the lease, so no Heartbeat is due; the figures before it were taken with 2). A
  cycle is one job: Cycles / wall time from the moment all processes are released.
  `--unbatched` runs the previous protocol instead (Claim of one job -> as many
  Heartbeats as `--progress-reports` -> Complete; recorded with 2), for comparison.
- with `--session`, the same throughput phase again on as many new runs (the database
  vacuumed first, not measured), each processor's calls made as messages on one
  JobService.Session stream of its own (`testbed.session_jobs.SessionJobs`) instead of
  unary RPCs: the batched Claim, then per job the Complete with then_claim (and the
  progress reports, with `--progress-reports`), one message each way per call. The
  default figures are the unary phase's, as without the flag; the session phase adds
  its own.
- latency: 100 more runs of 1,000 jobs (25 per runtime; 100,000 queued), then the same
  8 processes cycle `--latency-cycles` jobs each, claiming with a plain batched Claim
  (no then_claim, so that every batch is a measured Claim); p50/p99 of the Claim RPC
  as the processor sees it. Then the first of them alone cycles as many jobs on the same
  queue: the Claim's own latency at that depth, without the queueing for the 2 cores that
  8 busy processors cause (`claim_alone_p99_ms`).
- procrastinate, the peer a Python team would pick, on the same server in its own
  database (schema applied with its SchemaManager): 20,000 jobs of a task that only
  returns are deferred (batch_defer_async, setup), then `--procrastinate-processes`
  worker processes of `--procrastinate-concurrency` each (default 8 x 1: the closest
  match to 8 single-threaded processors) run with wait=False until the queue is empty.

Each phase also reports the CPU time used by the coordinator, Postgres (every backend
of the cluster, reaped ones included) and the clients, from /proc and getrusage, and
what the rest of the machine used meanwhile (/proc/stat): rates measured while other
processes load the machine are not its own, so it warns above 5 % and also prints the
ratio on CPU per cycle, which such load disturbs much less. `--profile` adds
pg_stat_statements (the cluster is restarted with it preloaded, track=all) for both
queues and a py-spy sample of the coordinator during the throughput phase (and, with
`--session`, both for the session phase; py-spy next to the interpreter, on PATH or in
`$PY_SPY`); both cost throughput. `--runs` scales the throughput phase and procrastinate's
queue for quick looks (default 20 runs: 20,000 jobs).

The last line is `RESULT claim_cycles_per_s=<x> procrastinate_jobs_per_s=<y> ratio=<x/y>
claim_p99_ms=<z> cpu_ratio=<c> grpc_floor_ms=<f> claim_alone_p99_ms=<a>
durable_floor_ratio=<d>`: the last is the durable floor's cycles/s (bench.grpc_floor with a
database: the cycle's calls, each with the one fenced statement it cannot do without, and
nothing else) over procrastinate's jobs/s, the best ratio the prescribed cycle can reach
in Python gRPC on this machine. Both floors make the cycle's calls per job: 1 by default
(the Complete's sizes), 1 + N with `--progress-reports N`. With `--session` the line goes on with
`session_cycles_per_s=<s> session_ratio=<s/y> session_cpu_ratio=<c'>
session_claim_p99_ms=<q>`: the session phase's cycles/s, its ratio to procrastinate's
jobs/s, procrastinate's CPU per job over the session phase's CPU per cycle, and the
latency phase run again with the Claims as messages on each processor's session (the
processor's own transport; then `--check` judges the session's ratio and p99).
Everything it starts is stopped on exit, also on error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import SynchronizedArray
from multiprocessing.synchronize import Event
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import asyncpg
from procrastinate import App, PsycopgConnector

from bench import grpc_floor
from bench.proc_stats import busy_cores_s, family_cpu_s, self_cpu_s
from bench.profiling import py_spy_binary, stack_counts
from bench.stats import median, percentile
from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.leases.results import result_digest
from testbed.coordinator_leases import empty_result
from testbed.coordinator_world import (
    CODE,
    build_world,
    copy_recordings,
    run_request,
    save_workflow,
    workflow_spec,
)
from testbed.harness.coordinator import CoordinatorHarness, coordinator_client
from testbed.harness.postgres import (
    TIMINGS,
    PostgresCluster,
    PostgresUnavailable,
    create_migrated_database,
    postgres_cluster,
    quote_ident,
)
from testbed.harness.processes import ServiceProcess
from testbed.session_jobs import SessionJobs
from tools.localstack.postgres import create_database
from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.v1 import (
    common_pb2,
    jobs_pb2,
    jobs_pb2_grpc,
)
from workshop.v1 import operator_pb2 as op

PROCESSORS = 8
RUNTIMES = 4
RUNS = 20
QUEUED_FOR_LATENCY = 100_000
LATENCY_CYCLES = 500  # per processor: 4,000 claims timed
CAMERAS = 50
RECORDINGS_PER_CAMERA = 20  # one-hour recordings from 02:00: 1,000 per run
FIRST_RECORDING_HOUR = 2
WINDOW_HOURS = (1, 23)
INTERVAL_SECONDS = 60
RECORDING_BYTES = 1_500_000_000  # an hour of camera footage, roughly
RECORDING_LENGTH = timedelta(hours=1)
JOBS_PER_RUN = CAMERAS * RECORDINGS_PER_CAMERA
SLOTS_PER_JOB = int(RECORDING_LENGTH.total_seconds()) // INTERVAL_SECONDS
# Progress reports per job (heartbeats with --unbatched): none for a short job, which
# ends within the processor's PROCESSOR_PROGRESS_AFTER_SECONDS; --progress-reports sets it.
PROGRESS_REPORTS = 0
IN_FLIGHT = 3  # the processor's default in_flight
WORKFLOW_ID = "bench-cycle"
DATABASE = "bench_claim_cycle"
PROCRASTINATE_DATABASE = "bench_procrastinate"
FLOOR_DATABASE = "bench_floor"
NOOP_TASK = "bench_noop"
DEFER_BATCH = 1_000
# A processor that finds nothing while its runtime still has unfinished jobs (the head
# run's last jobs are leased by the other processor) asks again after this pause.
EMPTY_BACKOFF_S = 0.005
READY_TIMEOUT_S = 120.0
PHASE_TIMEOUT_S = 600.0
RPC_TIMEOUT_S = 60.0
TARGET_RATIO = 1.0
TARGET_CLAIM_P99_MS = 25.0
PROFILE_TOP = 25
# The gRPC floor (bench.grpc_floor): per processor, cycles of the short-job cycle's calls.
FLOOR_CYCLES = 500
PYSPY_RATE = 200
OTHER_LOAD_WARNING = 0.05  # share of the machine used by processes we did not start
T = TypeVar("T")


def say(line: str = "") -> None:
    print(line, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _run(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run where SIGTERM cancels the work like Ctrl-C, so every `finally` runs on
    the loop (raising from a plain signal handler amid gRPC's callbacks can crash)."""

    async def body() -> T:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await make()

    try:
        return asyncio.run(body())
    except asyncio.CancelledError:
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


# What the child processes run -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProcessorConfig:
    index: int
    target: str
    secret: str
    runtime_id: str
    runtime_index: int
    expected_jobs: int  # stop once the runtime has this many commits in the phase (0: none)
    max_cycles: int  # stop after this many cycles (0: no limit)
    in_flight: int  # places: a Claim asks for as many jobs as are free (1: unbatched)
    fold: bool  # Complete claims the jobs for the places it frees (then_claim)
    batched: bool  # False: the previous protocol, Claim -> Heartbeats -> Complete
    session: bool = False  # the calls as messages on one JobService.Session stream
    renewals: int = PROGRESS_REPORTS  # progress reports per job (heartbeats: unbatched)


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    index: int
    dsn: str
    concurrency: int


@dataclasses.dataclass
class Report:
    """What one child process measured between its release and its end."""

    index: int
    cycles: int = 0
    empty_claims: int = 0
    claim_s: list[float] = dataclasses.field(default_factory=list)
    renew_s: list[float] = dataclasses.field(default_factory=list)  # progress or heartbeat
    complete_s: list[float] = dataclasses.field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0
    cpu_s: float = 0.0
    error: str = ""


def _child(
    run: Callable[[Any, Callable[[], None]], Coroutine[Any, Any, Report]],
    config: ProcessorConfig | WorkerConfig,
    ready: Queue[int],
    go: Event,
    reports: Queue[Report],
) -> None:
    """A child's body: build, say ready, wait for the release, measure, report."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us

    def released() -> None:
        ready.put(config.index)
        if not go.wait(READY_TIMEOUT_S):
            raise TimeoutError("never released")

    try:
        report = asyncio.run(run(config, released))  # child
    except BaseException as error:
        report = Report(config.index, error=f"{type(error).__name__}: {error}")
    reports.put(report)


async def _processor(
    config: ProcessorConfig, released: Callable[[], None], *, completed: SynchronizedArray[int]
) -> Report:
    channel = open_channel(config.target)
    try:
        await asyncio.wait_for(channel.channel_ready(), READY_TIMEOUT_S)
        # On a Session stream a call has no deadline of its own (a deadline is the stream's).
        rpc_timeout = None if config.session else RPC_TIMEOUT_S
        stub: jobs_pb2_grpc.JobServiceAsyncStub | SessionJobs = (
            SessionJobs(channel) if config.session else jobs_pb2_grpc.JobServiceStub(channel)
        )
        metadata = bearer_metadata(config.secret)
        # Every job has the same 60 slots, so its all-EMPTY result and digest are built
        # once per slot count: what a processor computes is not what is measured here.
        results: dict[int, tuple[jobs_pb2.JobResult, str]] = {}
        held: collections.deque[jobs_pb2.ClaimedJob] = collections.deque()
        report = Report(config.index)
        await asyncio.to_thread(released)
        report.started = time.monotonic()
        cpu = self_cpu_s()
        clock = time.perf_counter
        while not config.max_cycles or report.cycles < config.max_cycles:
            if not held:
                began = clock()
                # A fresh request id per claim, as the processor sends (idempotent Claim).
                reply = await stub.Claim(
                    _claim_request(config, config.in_flight),
                    metadata=metadata,
                    timeout=rpc_timeout,
                )
                claimed = clock()
                if not reply.HasField("job"):
                    report.empty_claims += 1
                    if (
                        config.expected_jobs
                        and completed[config.runtime_index] >= config.expected_jobs
                    ):
                        break
                    await asyncio.sleep(EMPTY_BACKOFF_S)
                    continue
                report.claim_s.append(claimed - began)
                held.extend([reply.job, *reply.more_jobs])
            job = held.popleft()
            for renewal in range(config.renewals):
                began = clock()
                if config.batched:
                    await stub.ReportProgress(
                        jobs_pb2.ReportProgressRequest(
                            lease=job.lease, percent=(renewal + 1) * 100 // (config.renewals + 1)
                        ),
                        metadata=metadata,
                        timeout=rpc_timeout,
                    )
                else:
                    await stub.Heartbeat(
                        jobs_pb2.HeartbeatRequest(lease=job.lease),
                        metadata=metadata,
                        timeout=rpc_timeout,
                    )
                report.renew_s.append(clock() - began)
            result, digest = _empty_result(results, job)
            request = jobs_pb2.CompleteRequest(
                lease=job.lease,
                code_sha256=CODE,
                result=result,
                result_sha256=digest,
                decoder="pyav",
            )
            if config.fold:  # the places free once this job is done
                request.then_claim.CopyFrom(_claim_request(config, config.in_flight - len(held)))
            began = clock()
            done = await stub.Complete(request, metadata=metadata, timeout=rpc_timeout)
            report.complete_s.append(clock() - began)
            if done.claimed.HasField("job"):
                held.extend([done.claimed.job, *done.claimed.more_jobs])
            report.cycles += 1
            with completed.get_lock():
                completed[config.runtime_index] += 1
        report.finished = time.monotonic()
        report.cpu_s = self_cpu_s() - cpu
        # Jobs claimed for places not used before the last cycle go back, as a processor
        # that stops hands them back: left leased, they would hold their run at the head
        # of the queue and the other processor of the runtime would find nothing to claim.
        for job in held:
            await stub.Release(
                jobs_pb2.ReleaseRequest(lease=job.lease), metadata=metadata, timeout=rpc_timeout
            )
        if isinstance(stub, SessionJobs):
            await stub.close()
        return report
    finally:
        await channel.close()


def _claim_request(config: ProcessorConfig, places: int) -> jobs_pb2.ClaimRequest:
    return jobs_pb2.ClaimRequest(
        runtime_id=config.runtime_id,
        code_sha256=CODE,
        request_id=uuid.uuid4().hex,
        max_jobs=places if config.batched else 0,
    )


def _empty_result(
    cache: dict[int, tuple[jobs_pb2.JobResult, str]], job: jobs_pb2.ClaimedJob
) -> tuple[jobs_pb2.JobResult, str]:
    count = len(job.input.slots)
    if any(slot.index != index for index, slot in enumerate(job.input.slots)):
        raise AssertionError(f"{job.input.job_id}: slot indices are not 0..{count - 1}")
    found = cache.get(count)
    if found is None:
        result = empty_result(job)
        found = cache[count] = (result, result_digest(result))
    return found


async def _noop() -> None:
    """The procrastinate task: nothing but returning."""


def _procrastinate_app(dsn: str) -> App:
    # It warns when the app is built in __main__ (a worker could miss the tasks); the
    # workers here build the same app and register the task themselves.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    app = App(connector=PsycopgConnector(conninfo=dsn))
    app.task(name=NOOP_TASK)(_noop)
    return app


async def _procrastinate_worker(config: WorkerConfig, released: Callable[[], None]) -> Report:
    app = _procrastinate_app(config.dsn)
    async with app.open_async():
        report = Report(config.index)
        await asyncio.to_thread(released)
        report.started = time.monotonic()
        cpu = self_cpu_s()
        await app.run_worker_async(
            name=f"bench-{config.index}",
            concurrency=config.concurrency,
            wait=False,
            install_signal_handlers=False,
        )
        report.finished = time.monotonic()
        report.cpu_s = self_cpu_s() - cpu
        return report


def _processor_child(
    config: ProcessorConfig,
    completed: SynchronizedArray[int],
    ready: Queue[int],
    go: Event,
    reports: Queue[Report],
) -> None:
    _child(functools.partial(_processor, completed=completed), config, ready, go, reports)


def _worker_child(
    config: WorkerConfig,
    ready: Queue[int],
    go: Event,
    reports: Queue[Report],
) -> None:
    _child(_procrastinate_worker, config, ready, go, reports)


# CPU time from /proc ----------------------------------------------------------------------


def _postgres_cpu_s(cluster: PostgresCluster) -> float:
    """CPU of the postmaster and its family, the backends it has reaped included."""
    pid_file = cluster.data_dir / "postmaster.pid"
    return family_cpu_s(int(pid_file.read_text().split("\n", 1)[0]))


@dataclasses.dataclass(frozen=True)
class CpuMark:
    coordinator: float
    postgres: float
    parent: float
    machine: float  # every process on the machine (/proc/stat), ours and others'


def _cpu_mark(cluster: PostgresCluster, coordinators: Sequence[ServiceProcess]) -> CpuMark:
    own = sum(family_cpu_s(coordinator.process.pid) for coordinator in coordinators)
    return CpuMark(own, _postgres_cpu_s(cluster), self_cpu_s(), busy_cores_s())


# Running a group of children --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    reports: list[Report]
    wall_s: float
    cpu: dict[str, float]  # seconds: coordinator, postgres, clients, bench

    @property
    def cycles(self) -> int:
        return sum(report.cycles for report in self.reports)

    @property
    def empty_claims(self) -> int:
        return sum(report.empty_claims for report in self.reports)

    def latencies(self, field: str) -> list[float]:
        values: list[float] = []
        for report in self.reports:
            values.extend(getattr(report, field))
        return values


def _run_children(
    ctx: SpawnContext,
    name: str,
    target: Callable[..., None],
    argument_sets: Sequence[tuple[Any, ...]],
    cluster: PostgresCluster,
    coordinators: Sequence[ServiceProcess],
    ready: Queue[int],
    go: Event,
    reports: Queue[Report],
    during: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
) -> Phase:
    """Starts the children, releases them together, and waits for their reports."""
    children: list[SpawnProcess] = []
    try:
        for arguments in argument_sets:
            child = ctx.Process(target=target, args=arguments, daemon=True)
            child.start()
            children.append(child)
        _wait_ready(ready, children)
        with during() if during is not None else contextlib.nullcontext():
            mark = _cpu_mark(cluster, coordinators)
            released = time.monotonic()
            go.set()
            collected = _collect(reports, children)
            end = _cpu_mark(cluster, coordinators)
        for child in children:  # they exit once their report is sent
            child.join(timeout=10)
        failed = [report for report in collected if report.error]
        if failed:
            raise RuntimeError(f"{name}: child {failed[0].index} failed: {failed[0].error}")
        wall = max(report.finished for report in collected) - released
        cpu = {
            "coordinator": end.coordinator - mark.coordinator,
            "postgres": end.postgres - mark.postgres,
            "clients": sum(report.cpu_s for report in collected),
            "bench": end.parent - mark.parent,
        }
        # Whatever else ran on the machine meanwhile (other people's tests, the kernel).
        cpu["other"] = max(0.0, end.machine - mark.machine - sum(cpu.values()))
        return Phase(name, sorted(collected, key=lambda r: r.index), wall, cpu)
    finally:
        go.clear()
        grpc_floor.stop(children)  # on an error or SIGTERM: at once


def _wait_ready(ready: Queue[int], children: Sequence[SpawnProcess]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    seen = 0
    while seen < len(children):
        with contextlib.suppress(queue.Empty):
            ready.get(timeout=0.5)
            seen += 1
            continue
        dead = [child for child in children if child.exitcode is not None]
        if dead:
            raise RuntimeError(f"a child exited ({dead[0].exitcode}) before it was ready")
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {seen} of {len(children)} children became ready")


def _collect(reports: Queue[Report], children: Sequence[SpawnProcess]) -> list[Report]:
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    collected: list[Report] = []
    while len(collected) < len(children):
        with contextlib.suppress(queue.Empty):
            collected.append(reports.get(timeout=0.5))
            continue
        died = [child for child in children if child.exitcode not in (None, 0)]
        if died:
            raise RuntimeError(f"a child died (exit {died[0].exitcode})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(collected)} of {len(children)} children finished")
    return collected


# Setup ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class World:
    runtimes: list[str]
    processor_secrets: list[str]


async def _set_up(c: CoordinatorHarness) -> World:
    """gpu-box with 4 runtimes, 50 cameras, 1,000 recordings, the workflow, 8 keys."""
    built = await build_world(c, recordings_per_camera=0)
    runtimes = [built.tracking_runtime]
    for index in range(1, RUNTIMES):
        reply = await c.operator.RegisterRuntime(
            op.RegisterRuntimeRequest(
                device_id="gpu-box",
                engine=f"workshop-processor-bench-{index}",
                code_sha256=CODE,
                capabilities=["workshop-v3"],
            ),
            metadata=c.admin,
        )
        runtimes.append(reply.runtime.runtime_id)
    cameras = [f"cam-{index:03d}" for index in range(CAMERAS)]
    for camera in cameras:
        await c.operator.PutCamera(op.PutCameraRequest(camera_id=camera), metadata=c.admin)
    now = c.clock.now()
    day = datetime(now.year, now.month, now.day, tzinfo=UTC) - timedelta(days=1)
    await copy_recordings(
        c,
        [
            (f"{camera}-h{hour:02d}", camera, start, start + RECORDING_LENGTH)
            for camera in cameras
            for hour in range(FIRST_RECORDING_HOUR, FIRST_RECORDING_HOUR + RECORDINGS_PER_CAMERA)
            for start in [day + timedelta(hours=hour)]
        ],
        byte_size=RECORDING_BYTES,
    )
    spec = workflow_spec(
        cameras=cameras,
        interval=INTERVAL_SECONDS,
        window=WINDOW_HOURS,
        date=(day.year, day.month, day.day),
    )
    await save_workflow(c, WORKFLOW_ID, spec)
    secrets = [
        await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name=f"processor-{index}")
        for index in range(PROCESSORS)
    ]
    return World(runtimes, secrets)


async def _create_runs(c: CoordinatorHarness, world: World, prefix: str, count: int) -> None:
    for index in range(count):
        request = run_request(
            f"{prefix}-{index:03d}",
            WORKFLOW_ID,
            world.runtimes[index % RUNTIMES],
            mode=common_pb2.RUN_MODE_FULL,
        )
        reply = await c.workshop.CreateRun(request, metadata=c.admin, timeout=RPC_TIMEOUT_S)
        if not reply.created:
            raise AssertionError(f"{request.run_id}: created=false on a new id")
    async with c.db.connection() as connection:
        jobs = await connection.fetchval(
            "SELECT count(*) FROM jobs WHERE run_id LIKE $1 AND state = 'queued'", f"{prefix}-%"
        )
        await connection.execute("VACUUM ANALYZE")
    if jobs != count * JOBS_PER_RUN:
        raise AssertionError(f"{prefix}: {jobs} queued jobs, expected {count * JOBS_PER_RUN}")


async def _check_committed(dsn: str, prefix: str, expected: int) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        jobs, receipts = await connection.fetchrow(
            "SELECT count(*) FILTER (WHERE j.state = 'completed'), count(r.run_id) "
            "FROM jobs j LEFT JOIN receipts r USING (run_id, job_index) WHERE j.run_id LIKE $1",
            f"{prefix}-%",
        )
    finally:
        await connection.close()
    if (jobs, receipts) != (expected, expected):
        raise AssertionError(f"{prefix}: {jobs} completed, {receipts} receipts; want {expected}")


# procrastinate ----------------------------------------------------------------------------


async def _procrastinate_prepare(cluster: PostgresCluster, jobs: int) -> float:
    """Its own database and schema, and `jobs` deferred jobs; returns the defer seconds."""
    admin = await asyncpg.connect(cluster.admin_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {quote_ident(PROCRASTINATE_DATABASE)}")
    finally:
        await admin.close()
    dsn = cluster.dsn(PROCRASTINATE_DATABASE)
    app = _procrastinate_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        task = app.tasks[NOOP_TASK]
        began = time.perf_counter()
        for start in range(0, jobs, DEFER_BATCH):
            await task.batch_defer_async(*({} for _ in range(min(DEFER_BATCH, jobs - start))))
        deferred_s = time.perf_counter() - began
    await _vacuum(dsn)
    return deferred_s


async def _procrastinate_done(dsn: str) -> dict[str, int]:
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(
            "SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY status"
        )
    finally:
        await connection.close()
    return {row[0]: row[1] for row in rows}


def procrastinate_side(
    ctx: SpawnContext,
    cluster: PostgresCluster,
    jobs: int,
    workers: int = PROCESSORS,
    concurrency: int = 1,
) -> Phase:
    """procrastinate's side as this benchmark runs it, for a benchmark that runs it beside
    its own in one run (`bench.grpc_floor --stream`): its database made afresh (one left by
    an earlier pass dropped), `jobs` jobs of the no-op task deferred (not measured), then
    `workers` worker processes of `concurrency` each until the queue is empty. The phase's
    cycles are the jobs that succeeded; its CPU is Postgres', the workers' and this
    process's."""

    async def drop() -> None:
        admin = await asyncpg.connect(cluster.admin_dsn)
        try:
            await admin.execute(
                f"DROP DATABASE IF EXISTS {quote_ident(PROCRASTINATE_DATABASE)} WITH (FORCE)"
            )
        finally:
            await admin.close()

    _run(drop)
    _run(lambda: _procrastinate_prepare(cluster, jobs))
    dsn = cluster.dsn(PROCRASTINATE_DATABASE)
    ready: Queue[int] = ctx.Queue()
    go = ctx.Event()
    reports: Queue[Report] = ctx.Queue()
    worked = _run_children(
        ctx,
        f"procrastinate ({workers} x concurrency {concurrency})",
        _worker_child,
        [(WorkerConfig(index, dsn, concurrency), ready, go, reports) for index in range(workers)],
        cluster,
        [],
        ready,
        go,
        reports,
    )
    statuses = _run(lambda: _procrastinate_done(dsn))
    done = statuses.get("succeeded", 0)
    if done != jobs:
        raise AssertionError(f"procrastinate: {statuses}, expected {jobs} done")
    return dataclasses.replace(worked, reports=[*worked.reports, Report(-1, cycles=done)])


def _psycopg_impl() -> str:
    import psycopg

    return str(psycopg.pq.__impl__)


# Profiling --------------------------------------------------------------------------------


def _enable_pg_stat_statements(cluster: PostgresCluster) -> None:
    with (cluster.data_dir / "workshop.conf").open("a", encoding="utf-8") as conf:
        conf.write(
            "shared_preload_libraries = 'pg_stat_statements'\n"
            "pg_stat_statements.track = all\n"
            "pg_stat_statements.max = 2000\n"
        )
    cluster.restart()


async def _statements_reset(dsn: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await connection.execute("SELECT pg_stat_statements_reset()")
    finally:
        await connection.close()


async def _statements_report(dsn: str, per: int, unit: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(
            "SELECT toplevel, calls, total_exec_time, shared_blks_dirtied, query "
            "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database "
            "WHERE datname = current_database()) ORDER BY total_exec_time DESC LIMIT 40"
        )
    finally:
        await connection.close()
    say(f"  {'level':<6} {'calls':>8} {'total ms':>9} {'ms/call':>8} {'us/' + unit:>9}  statement")
    for row in rows[:PROFILE_TOP]:
        text = " ".join(str(row["query"]).split())
        total = float(row["total_exec_time"])
        say(
            f"  {'top' if row['toplevel'] else 'nested':<6} {row['calls']:>8} {total:>9.0f} "
            f"{total / max(row['calls'], 1):>8.3f} {total * 1000 / per:>9.1f}  {text[:90]}"
        )


@contextlib.contextmanager
def _py_spy(pid: int, out: Path) -> Iterator[None]:
    """Samples `pid` with py-spy (collapsed stacks) while the block runs, if installed."""
    binary = py_spy_binary()
    if binary is None:
        say("  (py-spy not found: set PY_SPY or `pip install py-spy` for the profile)")
        yield
        return
    spy = subprocess.Popen(
        [
            binary,
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(PYSPY_RATE),
            "--format",
            "raw",
            "--nolineno",
            "--nonblocking",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)  # attach before the release
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()


def _py_spy_report(path: Path, wall_s: float) -> None:
    own, inclusive, total = stack_counts(path)
    if not total:
        return
    busy = total / (wall_s * PYSPY_RATE)
    say(
        f"py-spy of the coordinator: {total} busy samples at {PYSPY_RATE} Hz over "
        f"{wall_s:.1f} s (Python thread busy {busy:.0%} of the wall time)"
    )
    say(f"  inclusive (% of busy samples), top {PROFILE_TOP}, without frames on > 95 %:")
    shown = 0
    for name, count in inclusive.most_common():
        if count / total > 0.95:
            continue
        say(f"    {count / total:6.1%}  {name}")
        shown += 1
        if shown == PROFILE_TOP:
            break
    say(f"  own time (% of busy samples), top {PROFILE_TOP}:")
    for name, count in own.most_common(PROFILE_TOP):
        say(f"    {count / total:6.1%}  {name}")


# Report -----------------------------------------------------------------------------------


def _percentile_ms(values: Sequence[float], fraction: float) -> float:
    """bench.stats' nearest-rank percentile, in milliseconds."""
    return percentile(values, fraction) * 1000


def _print_phases(phases: Sequence[Phase], procrastinate: Phase, label: str) -> None:
    say()
    say(
        f"{'phase':<34} {'cycles':>7} {'wall s':>7} {'per s':>7} "
        f"{'claim p50/p99 ms':>17} {'renewal p50/p99':>18} {'complete p50/p99':>17} "
        f"{'empty':>6}"
    )
    for phase in phases:
        say(
            f"{phase.name:<34} {phase.cycles:>7,} {phase.wall_s:>7.2f} "
            f"{phase.cycles / phase.wall_s:>7.0f} {_pair(phase.latencies('claim_s')):>17} "
            f"{_pair(phase.latencies('renew_s')):>18} "
            f"{_pair(phase.latencies('complete_s')):>17} {phase.empty_claims:>6}"
        )
    say(
        f"{label:<34} {procrastinate.cycles:>7,} {procrastinate.wall_s:>7.2f} "
        f"{procrastinate.cycles / procrastinate.wall_s:>7.0f}"
    )
    say()
    cores = os.cpu_count() or 1
    say(f"CPU per cycle (per job for procrastinate), ms; busy = all CPU / ({cores} cores x wall)")
    say(
        f"{'phase':<34} {'coordinator':>11} {'postgres':>9} {'clients':>8} {'bench':>6} "
        f"{'total':>6} {'busy':>5} {'other':>6} {'other busy':>10} {'CPU-bound /s':>12}"
    )
    for phase in [*phases, procrastinate]:
        per = max(phase.cycles, 1)
        other = phase.cpu["other"]
        total = sum(phase.cpu.values()) - other
        say(
            f"{phase.name if phase is not procrastinate else label:<34} "
            f"{phase.cpu['coordinator'] * 1000 / per:>11.2f} "
            f"{phase.cpu['postgres'] * 1000 / per:>9.2f} "
            f"{phase.cpu['clients'] * 1000 / per:>8.2f} {phase.cpu['bench'] * 1000 / per:>6.2f} "
            f"{total * 1000 / per:>6.2f} {total / (cores * phase.wall_s):>5.0%} "
            f"{other * 1000 / per:>6.2f} {other / (cores * phase.wall_s):>10.0%} "
            f"{cores * per / total:>12.0f}"
        )
    say(
        "other: CPU of processes this benchmark did not start; more than a few % means the "
        "figures are not the machine's own."
    )
    say(
        f"CPU-bound /s: {cores} cores / total CPU per cycle, the rate if every core did this "
        "work alone (no idle, no other load)."
    )


def _cpu_per_unit(phase: Phase) -> float:
    """CPU seconds per cycle (per job) that the benchmark's own processes used."""
    return (sum(phase.cpu.values()) - phase.cpu["other"]) / max(phase.cycles, 1)


def _other_share(phase: Phase) -> float:
    return phase.cpu["other"] / ((os.cpu_count() or 1) * phase.wall_s)


def _pair(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{median(values) * 1000:.1f} / {_percentile_ms(values, 0.99):.1f}"


# Main -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
    runs: int
    latency_cycles: int
    workers: int
    concurrency: int
    profile: bool
    in_flight: int
    batched: bool
    coordinators: int = 1
    session: bool = False
    progress_reports: int = PROGRESS_REPORTS

    @property
    def floor_calls(self) -> int:
        """The cycle's calls per job, which both floors make: the renewals and a Complete."""
        return self.progress_reports + 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.claim_cycle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=RUNS,
        help=f"runs of {JOBS_PER_RUN:,} jobs for the throughput phase, and jobs / "
        f"{JOBS_PER_RUN:,} for procrastinate (default {RUNS}; a multiple of {RUNTIMES})",
    )
    parser.add_argument(
        "--latency-cycles",
        type=int,
        default=LATENCY_CYCLES,
        help=f"cycles per processor in the 100,000-queued phase (default {LATENCY_CYCLES})",
    )
    parser.add_argument(
        "--procrastinate-processes", type=int, default=PROCESSORS, help="worker processes"
    )
    parser.add_argument(
        "--procrastinate-concurrency", type=int, default=1, help="concurrency of each worker"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="pg_stat_statements for both queues and py-spy of the coordinator (slower)",
    )
    parser.add_argument(
        "--in-flight",
        type=int,
        default=IN_FLIGHT,
        help=f"places per simulated processor: jobs a Claim asks for (default {IN_FLIGHT})",
    )
    parser.add_argument(
        "--unbatched",
        action="store_true",
        help="the previous protocol: Claim of one job -> as many Heartbeats as "
        "--progress-reports -> Complete",
    )
    parser.add_argument(
        "--progress-reports",
        type=int,
        default=PROGRESS_REPORTS,
        help=f"ReportProgress calls per job before its Complete (default {PROGRESS_REPORTS}: "
        "a short job, finished within PROCESSOR_PROGRESS_AFTER_SECONDS; 2 = the cycle of "
        "processors before that delay)",
    )
    parser.add_argument(
        "--coordinators",
        type=int,
        default=1,
        help="coordinator replicas (processes) on the one database; processor i uses "
        "replica i mod N (default 1)",
    )
    parser.add_argument(
        "--session",
        action="store_true",
        help="also run the throughput phase over JobService.Session streams (one per "
        "processor) and report it beside the unary figures",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if args.runs < RUNTIMES or args.runs % RUNTIMES:
        parser.error(f"--runs must be a positive multiple of {RUNTIMES}")
    if args.latency_cycles < 1 or args.procrastinate_processes < 1 or args.coordinators < 1:
        parser.error(
            "--latency-cycles, --procrastinate-processes and --coordinators must be at least 1"
        )
    if args.in_flight < 1:
        parser.error("--in-flight must be at least 1")
    if args.procrastinate_concurrency < 1:
        parser.error("--procrastinate-concurrency must be at least 1")
    if args.progress_reports < 0:
        parser.error("--progress-reports must be at least 0")
    options = Options(
        runs=args.runs,
        latency_cycles=args.latency_cycles,
        workers=args.procrastinate_processes,
        concurrency=args.procrastinate_concurrency,
        profile=args.profile,
        in_flight=1 if args.unbatched else args.in_flight,
        batched=not args.unbatched,
        coordinators=args.coordinators,
        session=args.session,
        progress_reports=args.progress_reports,
    )
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with postgres_cluster() as cluster, tempfile.TemporaryDirectory(prefix="bench-") as tmp:
            say(
                f"postgres: {cluster.bin_dir} on {cluster.host}:{cluster.port}, data in "
                f"{cluster.data_dir} (initdb {TIMINGS.initdb_s:.2f} s, start "
                f"{TIMINGS.start_s:.2f} s)"
            )
            if options.profile:
                _enable_pg_stat_statements(cluster)
            ratio, claim_p99 = _bench(cluster, Path(tmp), options)
    except PostgresUnavailable as unavailable:
        say(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    missed = ratio < TARGET_RATIO or claim_p99 > TARGET_CLAIM_P99_MS
    return 1 if args.check and missed else 0


def _bench(cluster: PostgresCluster, tmp: Path, options: Options) -> tuple[float, float]:
    dsn = create_migrated_database(cluster, DATABASE)
    ctx = multiprocessing.get_context("spawn")
    ready: Queue[int] = ctx.Queue()
    go = ctx.Event()
    reports: Queue[Report] = ctx.Queue()
    env = {
        "COORDINATOR_DATABASE_URL": dsn,
        "COORDINATOR_HOST": "127.0.0.1",
        "COORDINATOR_PORT": "0",
        "COORDINATOR_DRAIN_SECONDS": "0",
        "COORDINATOR_GRACE_SECONDS": "1",
        "COORDINATOR_SCHEDULER_INTERVAL_SECONDS": "0",
        "COORDINATOR_MAINTENANCE_INTERVAL_SECONDS": "0",
    }
    coordinators: list[ServiceProcess] = []
    try:
        ports = []
        for replica in range(options.coordinators):
            coordinator = ServiceProcess(
                "services.coordinator", env, tmp / f"coordinator-{replica}.log"
            )
            coordinators.append(coordinator)
            ports.append(int(coordinator.wait_event("serving", timeout=READY_TIMEOUT_S)["port"]))
            say(f"coordinator: pid {coordinator.process.pid} on 127.0.0.1:{ports[-1]}")
        port = ports[0]
        began = time.perf_counter()
        world = _run(lambda: _prepare(dsn, port, "cycle", options.runs))
        say(
            f"setup: {RUNTIMES} runtimes, {JOBS_PER_RUN:,} recordings, {options.runs} runs x "
            f"{JOBS_PER_RUN:,} jobs x {SLOTS_PER_JOB} slots queued "
            f"({time.perf_counter() - began:.1f} s)"
        )
        renewal = "Heartbeat" if not options.batched else "ReportProgress"
        say(
            f"cycle: a Claim of {options.in_flight} place(s) when none is held, then per job "
            + (f"{options.progress_reports} {renewal} + " if options.progress_reports else "")
            + ("Complete with then_claim" if options.batched else "Complete")
        )
        phases: list[Phase] = []

        def processor_args(
            expected: int, max_cycles: int, fold: bool, session: bool = False
        ) -> list[tuple[Any, ...]]:
            completed: SynchronizedArray[int] = ctx.Array("q", RUNTIMES)
            return [
                (
                    ProcessorConfig(
                        index=index,
                        target=f"127.0.0.1:{ports[index % len(ports)]}",
                        secret=world.processor_secrets[index],
                        runtime_id=world.runtimes[index % RUNTIMES],
                        runtime_index=index % RUNTIMES,
                        expected_jobs=expected,
                        max_cycles=max_cycles,
                        in_flight=options.in_flight,
                        fold=fold and options.batched,
                        batched=options.batched,
                        session=session,
                        renewals=options.progress_reports,
                    ),
                    completed,
                    ready,
                    go,
                    reports,
                )
                for index in range(PROCESSORS)
            ]

        if options.profile:
            _run(lambda: _statements_reset(dsn))
        spy_out = tmp / "coordinator.pyspy"
        session_spy_out = tmp / "coordinator-session.pyspy"
        throughput = _run_children(
            ctx,
            f"throughput ({options.runs * JOBS_PER_RUN:,} queued)",
            _processor_child,
            processor_args(options.runs // RUNTIMES * JOBS_PER_RUN, 0, fold=True),
            cluster,
            coordinators,
            ready,
            go,
            reports,
            during=(lambda: _py_spy(coordinators[0].process.pid, spy_out))
            if options.profile
            else None,
        )
        phases.append(throughput)
        _run(lambda: _check_committed(dsn, "cycle", options.runs * JOBS_PER_RUN))
        say(f"throughput: {throughput.cycles:,} cycles in {throughput.wall_s:.2f} s")
        if options.profile:
            say()
            say(f"pg_stat_statements, workshop, throughput phase ({throughput.cycles:,} cycles):")
            _run(lambda: _statements_report(dsn, throughput.cycles, "cycle"))
            say()
            _py_spy_report(spy_out, throughput.wall_s)

        session_phase = session_latency = None
        if options.session:
            # As many jobs again, on a vacuumed database as the first phase had a fresh one.
            began = time.perf_counter()
            _run(lambda: _prepare_more(dsn, port, world, "session", options.runs))
            vacuum_s = _run(lambda: _vacuum(dsn))
            say(
                f"setup: {options.runs} more runs, {options.runs * JOBS_PER_RUN:,} jobs queued "
                f"for the session phase ({time.perf_counter() - began:.1f} s, vacuum "
                f"{vacuum_s:.1f} s)"
            )
            if options.profile:
                _run(lambda: _statements_reset(dsn))
            session_phase = _run_children(
                ctx,
                f"session ({options.runs * JOBS_PER_RUN:,} queued)",
                _processor_child,
                processor_args(options.runs // RUNTIMES * JOBS_PER_RUN, 0, fold=True, session=True),
                cluster,
                coordinators,
                ready,
                go,
                reports,
                during=(lambda: _py_spy(coordinators[0].process.pid, session_spy_out))
                if options.profile
                else None,
            )
            phases.append(session_phase)
            _run(lambda: _check_committed(dsn, "session", options.runs * JOBS_PER_RUN))
            say(f"session: {session_phase.cycles:,} cycles in {session_phase.wall_s:.2f} s")
            if options.profile:
                say()
                cycles = session_phase.cycles
                say(f"pg_stat_statements, workshop, session phase ({cycles:,} cycles):")
                _run(lambda: _statements_report(dsn, cycles, "cycle"))
                say()
                say("the session phase:")
                _py_spy_report(session_spy_out, session_phase.wall_s)

        latency_runs = QUEUED_FOR_LATENCY // JOBS_PER_RUN
        began = time.perf_counter()
        _run(lambda: _prepare_more(dsn, port, world, "queue", latency_runs))
        say(
            f"setup: {latency_runs} more runs, {latency_runs * JOBS_PER_RUN:,} jobs queued "
            f"({time.perf_counter() - began:.1f} s)"
        )
        latency = _run_children(
            ctx,
            f"latency ({latency_runs * JOBS_PER_RUN:,} queued)",
            _processor_child,
            processor_args(0, options.latency_cycles, fold=False),
            cluster,
            coordinators,
            ready,
            go,
            reports,
        )
        phases.append(latency)
        say(f"latency: {latency.cycles:,} cycles in {latency.wall_s:.2f} s")
        # The same queue with one processor: the Claim's own latency, which the loaded
        # phase's queueing for the 2 cores hides.
        alone = _run_children(
            ctx,
            f"alone ({latency_runs * JOBS_PER_RUN:,} queued)",
            _processor_child,
            processor_args(0, options.latency_cycles, fold=False)[:1],
            cluster,
            coordinators,
            ready,
            go,
            reports,
        )
        phases.append(alone)
        say(f"alone: {alone.cycles:,} cycles in {alone.wall_s:.2f} s")
        if options.session:
            # The processor's own transport: the same Claims as messages on its session.
            session_latency = _run_children(
                ctx,
                f"session latency ({latency_runs * JOBS_PER_RUN:,} queued)",
                _processor_child,
                processor_args(0, options.latency_cycles, fold=False, session=True),
                cluster,
                coordinators,
                ready,
                go,
                reports,
            )
            phases.append(session_latency)
            say(
                f"session latency: {session_latency.cycles:,} cycles "
                f"in {session_latency.wall_s:.2f} s"
            )
    finally:
        for coordinator in coordinators:
            code = coordinator.stop()
            if code not in (0, -signal.SIGTERM):
                say(f"coordinator exited {code}:\n{coordinator.log_tail()}")

    # Autovacuum of the coordinator's database (100,000 jobs churned) would otherwise run
    # during the phases below, on the cores they measure, and count as their Postgres CPU.
    vacuum_s = _run(lambda: _vacuum(dsn))
    say(f"vacuumed the coordinator's database before the peers ({vacuum_s:.1f} s, not measured)")
    deferred_s = _run(lambda: _procrastinate_prepare(cluster, options.runs * JOBS_PER_RUN))
    procrastinate_dsn = cluster.dsn(PROCRASTINATE_DATABASE)
    say(
        f"procrastinate: {options.runs * JOBS_PER_RUN:,} jobs deferred in {deferred_s:.1f} s "
        f"(psycopg implementation: {_psycopg_impl()})"
    )
    if options.profile:
        _run(lambda: _statements_reset(procrastinate_dsn))
    label = f"procrastinate ({options.workers} x concurrency {options.concurrency})"
    worked = _run_children(
        ctx,
        label,
        _worker_child,
        [
            (WorkerConfig(index, procrastinate_dsn, options.concurrency), ready, go, reports)
            for index in range(options.workers)
        ],
        cluster,
        [],
        ready,
        go,
        reports,
    )
    statuses = _run(lambda: _procrastinate_done(procrastinate_dsn))
    done = statuses.get("succeeded", 0)
    if done != options.runs * JOBS_PER_RUN:
        raise AssertionError(
            f"procrastinate: {statuses}, expected {options.runs * JOBS_PER_RUN} done"
        )
    worked = dataclasses.replace(worked, reports=[*worked.reports, Report(-1, cycles=done)])
    if options.profile:
        say()
        say(f"pg_stat_statements, procrastinate ({done:,} jobs):")
        _run(lambda: _statements_report(procrastinate_dsn, done, "job"))

    _print_phases(phases, worked, label)
    cycles_per_s = throughput.cycles / throughput.wall_s
    jobs_per_s = done / worked.wall_s
    ratio = cycles_per_s / jobs_per_s
    claim_p99 = _percentile_ms(latency.latencies("claim_s"), 0.99)
    claim_alone_p99 = _percentile_ms(alone.latencies("claim_s"), 0.99)
    say()
    # The same comparison on CPU per cycle, which other load on the machine disturbs less.
    cpu_ratio = _cpu_per_unit(worked) / _cpu_per_unit(throughput)
    say(f"ratio on CPU per cycle (procrastinate's per job / ours): {cpu_ratio:.2f}")
    # What the cycle's gRPC calls cost with nothing behind them: no design that makes
    # this many Python gRPC calls per job can spend less.
    floor = grpc_floor.measure(
        ctx, processes=PROCESSORS, cycles=FLOOR_CYCLES, calls=options.floor_calls
    )
    procrastinate_ms = _cpu_per_unit(worked) * 1000
    say(
        f"floor: {options.floor_calls} bare grpc.aio calls per cycle (no interceptor, no "
        f"database; bench.grpc_floor) cost {floor.total_ms:.2f} ms of CPU (server "
        f"{floor.server_ms:.2f}, clients {floor.clients_ms:.2f}) = "
        f"{floor.total_ms / procrastinate_ms:.0%} of procrastinate's whole job "
        f"({procrastinate_ms:.2f} ms); best CPU ratio any such protocol can reach: "
        f"{procrastinate_ms / floor.total_ms:.2f}"
    )
    durable = _durable_floor(ctx, cluster, options.floor_calls)
    durable_per_s = durable.cycles / durable.wall_s
    durable_ratio = durable_per_s / jobs_per_s
    say(
        f"durable floor: the same calls, each with the one fenced statement the cycle cannot "
        f"do without (bench.grpc_floor with a database): {durable.cycles:,} cycles in "
        f"{durable.wall_s:.2f} s = {durable_per_s:.0f} cycles/s, {durable_ratio:.2f} of "
        f"procrastinate's jobs/s; CPU {durable.total_ms:.2f} ms per cycle (server and "
        f"Postgres {durable.server_ms:.2f}, clients {durable.clients_ms:.2f}) against "
        f"procrastinate's {procrastinate_ms:.2f}"
    )
    loaded = [phase for phase in (*phases, worked) if _other_share(phase) > OTHER_LOAD_WARNING]
    if loaded:
        say(
            "WARNING: other processes used "
            + ", ".join(f"{_other_share(phase):.0%} ({phase.name})" for phase in loaded)
            + " of the machine: the rates below are not this machine's own"
        )
    say(
        f"targets: ratio >= {TARGET_RATIO:.1f}: {ratio:.2f} "
        f"{'met' if ratio >= TARGET_RATIO else 'MISSED'}; claim p99 <= "
        f"{TARGET_CLAIM_P99_MS:.0f} ms at {QUEUED_FOR_LATENCY:,} queued: {claim_p99:.1f} ms "
        f"{'met' if claim_p99 <= TARGET_CLAIM_P99_MS else 'MISSED'} (one processor alone: "
        f"{claim_alone_p99:.1f} ms)"
    )
    session_result = ""
    if session_phase is not None:
        session_per_s = session_phase.cycles / session_phase.wall_s
        session_ratio = session_per_s / jobs_per_s
        session_cpu_ratio = _cpu_per_unit(worked) / _cpu_per_unit(session_phase)
        say(
            f"session: {session_per_s:.0f} cycles/s over JobService.Session streams, "
            f"{session_ratio:.2f} of procrastinate's jobs/s (unary {ratio:.2f}); on CPU per "
            f"cycle {session_cpu_ratio:.2f} (unary {cpu_ratio:.2f})"
        )
        session_result = (
            f" session_cycles_per_s={session_per_s:.0f} session_ratio={session_ratio:.2f} "
            f"session_cpu_ratio={session_cpu_ratio:.2f}"
        )
    if session_latency is not None:
        session_claim_p99 = _percentile_ms(session_latency.latencies("claim_s"), 0.99)
        say(
            f"session claims: p99 {session_claim_p99:.1f} ms at {QUEUED_FOR_LATENCY:,} queued "
            f"with {PROCESSORS} processors cycling (unary {claim_p99:.1f}); target <= "
            f"{TARGET_CLAIM_P99_MS:.0f} ms "
            f"{'met' if session_claim_p99 <= TARGET_CLAIM_P99_MS else 'MISSED'}"
        )
        session_result += f" session_claim_p99_ms={session_claim_p99:.1f}"
    say(
        f"RESULT claim_cycles_per_s={cycles_per_s:.0f} procrastinate_jobs_per_s={jobs_per_s:.0f} "
        f"ratio={ratio:.2f} claim_p99_ms={claim_p99:.1f} cpu_ratio={cpu_ratio:.2f} "
        f"grpc_floor_ms={floor.total_ms:.2f} claim_alone_p99_ms={claim_alone_p99:.1f} "
        f"durable_floor_ratio={durable_ratio:.2f}{session_result}"
    )
    if session_phase is not None and session_latency is not None:
        # What `--check` judges: the processor's own transport when it was measured.
        return session_ratio, session_claim_p99
    return ratio, claim_p99


async def _vacuum(dsn: str) -> float:
    """VACUUM (ANALYZE) of the database `dsn`; the seconds it took."""
    began = time.perf_counter()
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("VACUUM (ANALYZE)")
    finally:
        await connection.close()
    return time.perf_counter() - began


def _durable_floor(ctx: SpawnContext, cluster: PostgresCluster, calls: int) -> grpc_floor.Floor:
    """The durable floor (bench.grpc_floor) in its own database of the same cluster, with
    as many client processes as processors; every cycle's job must have completed."""
    dsn = create_database(cluster, FLOOR_DATABASE)
    jobs = PROCESSORS * (FLOOR_CYCLES + 1)  # each client's first claim, then its cycles
    _run(lambda: grpc_floor.prepare_durable(dsn, jobs))
    floor = grpc_floor.measure(
        ctx,
        processes=PROCESSORS,
        cycles=FLOOR_CYCLES,
        calls=calls,
        dsn=dsn,
        database_cpu_s=lambda: _postgres_cpu_s(cluster),
    )
    completed = _run(lambda: grpc_floor.durable_completed(dsn))
    if completed != floor.cycles:
        raise AssertionError(f"durable floor: {completed} jobs completed, {floor.cycles} cycled")
    return floor


async def _prepare(dsn: str, port: int, prefix: str, runs: int) -> World:
    async with coordinator_client(dsn, port) as c:
        world = await _set_up(c)
        await _create_runs(c, world, prefix, runs)
        return world


async def _prepare_more(dsn: str, port: int, world: World, prefix: str, runs: int) -> None:
    async with coordinator_client(dsn, port) as c:
        await _create_runs(c, world, prefix, runs)


if __name__ == "__main__":
    sys.exit(main())
