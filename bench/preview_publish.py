"""Preview publishing through the fenced path, against plain puts to the same S3 server.

    .venv/bin/python -m bench.preview_publish [--previews 2000] [--publishers 8]
                                              [--size 61440] [--processes] [--check]

Starts a throwaway Postgres cluster (the test harness's: tmpfs when roomy, fsync and
synchronous_commit off) with a migrated database, SeaweedFS (`weed mini`, the test
harness's `running_s3_server`, data in a temporary directory), the coordinator and
the preview service (its own `service` key, S3 timeouts of 5 s, cleanup loop off):

- by default both in this process on real gRPC (loopback), the coordinator on the
  harness's frozen clock (`running_coordinator`, `running_preview`), sharing one event
  loop (uvloop when installed, as the services' own processes run:
  `workshop.kit.server.run_event_loop`) and one GIL with the clients and the S3 SDK's
  threads;
- with `--processes`, each as its own process (`python -m services.coordinator`,
  `python -m services.preview`, system clock), as they are deployed.

Setup, not measured: gpu-box with its runtimes, cameras cam-a and cam-b with four
one-hour recordings each (08:00-12:00), a workflow sampling both every 4 s, and one
full run of 8 jobs x 900 slots, every job claimed by one workshop:run key. The image
is a real JPEG (PyAV) grown to `--size` bytes with comment segments.

Measured (wall time from the first call to the last answer), each after a warm-up of
10 per caller:
- direct put: `--previews` objects of the image put with the minio SDK's `put_object`
  from `--publishers` threads sharing one client; keys under `bench-direct/`;
- PublishPreview: `--publishers` tasks, one per job, each publishing its share of
  `--previews` in slot order (lease check kept 10 s, put, record: the service
  batches the records of concurrent publishes into one RecordPreviews call);
- grants: the processor's own path (`services.processor.direct_writes`), one writer for
  all `--publishers` tasks as one processor has: GrantPreviewWrites for the next 128
  slots, a POST of each image straight to SeaweedFS with its grant, records batched
  (256, or 1 s) into RecordWrittenPreviews, which the coordinator runs as one fenced
  statement; the phase ends when every record is answered;
- fences only: the coordinator's RecordPreview per preview as the service makes it
  (its credential, the processor's on behalf), one call per preview, with no bytes:
  what the coordinator costs without group commit.

Each phase also reports per-call latency (p50/p99) and the CPU seconds used by this
process, the services' processes (with --processes), SeaweedFS and Postgres.

The last line is `RESULT preview_per_s=<x> direct_put_per_s=<y> ratio=<x/y>`, where
preview_per_s is the grants phase (the fenced path processors take); the target is a
ratio of at least 0.8. Everything it starts is stopped on exit, also on
error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import urllib3
from minio import Minio

from bench.proc_stats import CpuMeter
from bench.services import separate_services
from bench.stats import median, percentile
from services.coordinator.identity.auth import Grant, ScopeName
from services.processor.direct_writes import DirectPreviews
from testbed.coordinator_world import CODE, build_world, run_request, save_workflow, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from testbed.harness.postgres import (
    TIMINGS,
    PostgresCluster,
    PostgresUnavailable,
    create_migrated_database,
    postgres_cluster,
)
from testbed.harness.preview import jpeg_bytes, publish_request, running_preview
from testbed.harness.s3 import REGION, S3Bucket, S3HarnessError, S3Server, running_s3_server
from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.kit.hashing import sha256_hex
from workshop.kit.object_keys import object_key
from workshop.kit.server import run_event_loop
from workshop.v1 import (
    common_pb2,
    jobs_pb2,
    preview_pb2_grpc,
)
from workshop.v1 import publication_pb2 as pub

DATABASE = "bench_preview_publish"
BUCKET = "bench-preview"
WORKFLOW_ID = "bench-preview"
CAMERAS = ("cam-a", "cam-b")
RECORDINGS_PER_CAMERA = 4  # one hour each from 08:00
INTERVAL_SECONDS = 4  # 900 slots per one-hour job: warm-ups, PublishPreview, grants, fences only
JOBS = len(CAMERAS) * RECORDINGS_PER_CAMERA
SLOTS_PER_JOB = 3600 // INTERVAL_SECONDS
WARM_UP = 10  # per caller
S3_TIMEOUT_SECONDS = 5.0
TARGET_RATIO = 0.8

Metadata = tuple[tuple[str, str], ...]
Result = tuple[int, list[float]]  # calls, latencies


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    count: int
    wall_s: float
    latencies_s: list[float]
    cpu_s: dict[str, float]

    @property
    def rate(self) -> float:
        return self.count / self.wall_s


@dataclasses.dataclass
class Services:
    """Where the coordinator and the preview service run, as the phases reach them."""

    coordinator: CoordinatorHarness
    preview: preview_pb2_grpc.PreviewServiceAsyncStub
    pids: dict[str, int]  # service processes to account CPU to (--processes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.preview_publish",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--previews", type=int, default=2000, help="objects per phase")
    parser.add_argument("--publishers", type=int, default=8, help="concurrent callers")
    parser.add_argument("--size", type=int, default=60 * 1024, help="image bytes")
    parser.add_argument(
        "--processes", action="store_true", help="run the services as their own processes"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the ratio misses")
    args = parser.parse_args(argv)
    if not 1 <= args.publishers <= JOBS:
        parser.error(f"--publishers must be 1..{JOBS} (one job each)")
    if 3 * -(-args.previews // args.publishers) + 2 * WARM_UP > SLOTS_PER_JOB:
        most = (SLOTS_PER_JOB - 2 * WARM_UP) // 3 * args.publishers
        parser.error(f"at most {most} previews with {args.publishers} publishers")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with (
            postgres_cluster() as cluster,
            tempfile.TemporaryDirectory(prefix="bench-preview-") as scratch,
            running_s3_server(Path(scratch)) as s3,
        ):
            say(
                f"postgres: {cluster.bin_dir} on {cluster.host}:{cluster.port} "
                f"(initdb {TIMINGS.initdb_s:.2f} s, start {TIMINGS.start_s:.2f} s); "
                f"seaweedfs: {s3.weed} on {s3.endpoint}"
            )
            dsn = create_migrated_database(cluster, DATABASE)
            s3.client().make_bucket(BUCKET)
            try:
                fenced, direct = run_event_loop(_bench(dsn, cluster, s3, Path(scratch), args))
            except asyncio.CancelledError:  # SIGTERM while the loop ran
                raise SystemExit(128 + signal.SIGTERM) from None
    except PostgresUnavailable as unavailable:
        say(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    except S3HarnessError as problem:
        say(f"cannot start SeaweedFS: {problem}")
        return 2
    ratio = fenced.rate / direct.rate
    say(
        f"RESULT preview_per_s={fenced.rate:.1f} direct_put_per_s={direct.rate:.1f} "
        f"ratio={ratio:.2f}"
    )
    return 1 if args.check and ratio < TARGET_RATIO else 0


def say(line: str = "") -> None:
    print(line, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


async def _bench(
    dsn: str, cluster: PostgresCluster, s3: S3Server, scratch: Path, args: argparse.Namespace
) -> tuple[Phase, Phase]:
    # Inside the loop SIGTERM cancels the benchmark like Ctrl-C, so every `finally` runs.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    image = jpeg_bytes(320, 240, size=args.size)
    counts = _shares(args.previews, args.publishers)
    start = _separate_services if args.processes else _in_process_services
    async with start(dsn, s3, scratch) as services:
        c = services.coordinator
        began = time.perf_counter()
        processor, jobs = await _set_up(c, args.publishers)
        say(
            f"setup: full run of {JOBS} jobs x {SLOTS_PER_JOB} slots, {args.publishers} "
            f"claimed ({time.perf_counter() - began:.1f} s); image {len(image):,} bytes (JPEG); "
            f"services {'as their own processes' if args.processes else 'in this process'}"
        )
        cpu = PhaseMeter({**services.pids, "seaweedfs": s3.pid, "postgres": cluster.pid})
        warm = [WARM_UP] * args.publishers
        await _direct(s3, image, warm, "warm")
        direct = await cpu.measure("direct put", lambda: _direct(s3, image, counts, "measured"))
        await _fenced(services.preview, processor, jobs, image, warm, 0)
        fenced = await cpu.measure(
            "PublishPreview",
            lambda: _fenced(services.preview, processor, jobs, image, counts, WARM_UP),
        )
        await _check(c, s3, args.previews + WARM_UP * args.publishers)
        first = WARM_UP + max(counts)
        await _granted(services.preview, processor, jobs, image, warm, first)
        granted = await cpu.measure(
            "grants",
            lambda: _granted(services.preview, processor, jobs, image, counts, first + WARM_UP),
        )
        await _check(c, s3, 2 * (args.previews + WARM_UP * args.publishers))
        fences = await cpu.measure(
            "fences only",
            lambda: _fences_only(c, processor, jobs, image, counts, first + WARM_UP + max(counts)),
        )
    _print_table([direct, fenced, granted, fences], args.publishers, args.size)
    return granted, direct


@contextlib.asynccontextmanager
async def _in_process_services(dsn: str, s3: S3Server, scratch: Path) -> AsyncIterator[Services]:
    async with (
        running_coordinator(dsn) as c,
        running_preview(c, S3Bucket(s3, BUCKET), s3_timeout_seconds=S3_TIMEOUT_SECONDS) as p,
    ):
        yield Services(c, p.stub, {})


@contextlib.asynccontextmanager
async def _separate_services(dsn: str, s3: S3Server, scratch: Path) -> AsyncIterator[Services]:
    settings = {"S3_TIMEOUT_SECONDS": str(S3_TIMEOUT_SECONDS)}
    async with separate_services(
        dsn, s3, scratch, bucket=BUCKET, preview_settings=settings
    ) as services:
        channel = open_channel(f"127.0.0.1:{services.preview_port}", max_attempts=1)
        try:
            yield Services(
                services.coordinator,
                preview_pb2_grpc.PreviewServiceStub(channel),
                {
                    "coordinator": services.coordinator_process.process.pid,
                    "preview": services.preview_process.process.pid,
                },
            )
        finally:
            await channel.close()


async def _set_up(
    c: CoordinatorHarness, publishers: int
) -> tuple[Metadata, list[jobs_pb2.ClaimedJob]]:
    world = await build_world(c, recordings_per_camera=RECORDINGS_PER_CAMERA)
    await save_workflow(c, WORKFLOW_ID, workflow_spec(cameras=CAMERAS, interval=INTERVAL_SECONDS))
    await c.workshop.CreateRun(
        run_request("bench", WORKFLOW_ID, world.tracking_runtime, mode=common_pb2.RUN_MODE_FULL),
        metadata=c.admin,
    )
    processor = bearer_metadata(
        await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="processor")
    )
    jobs = []
    for _ in range(publishers):
        reply = await c.jobs.Claim(
            jobs_pb2.ClaimRequest(runtime_id=world.tracking_runtime, code_sha256=CODE),
            metadata=processor,
        )
        if not reply.HasField("job") or len(reply.job.input.slots) != SLOTS_PER_JOB:
            raise AssertionError(f"claim returned {reply}")
        jobs.append(reply.job)
    return processor, jobs


def _shares(total: int, callers: int) -> list[int]:
    base, extra = divmod(total, callers)
    return [base + (1 if index < extra else 0) for index in range(callers)]


async def _each_job(
    jobs: list[jobs_pb2.ClaimedJob],
    counts: list[int],
    first_slot: int,
    publish: Callable[[jobs_pb2.ClaimedJob, int], Awaitable[object]],
) -> Result:
    """One task per job, publishing its slots in order; every call's latency."""
    latencies: list[float] = []

    async def publisher(job: jobs_pb2.ClaimedJob, count: int) -> None:
        for slot in range(first_slot, first_slot + count):
            began = time.perf_counter()
            await publish(job, slot)
            latencies.append(time.perf_counter() - began)

    await asyncio.gather(*(publisher(job, n) for job, n in zip(jobs, counts, strict=True)))
    return len(latencies), latencies


async def _fenced(
    stub: preview_pb2_grpc.PreviewServiceAsyncStub,
    processor: Metadata,
    jobs: list[jobs_pb2.ClaimedJob],
    image: bytes,
    counts: list[int],
    first_slot: int,
) -> Result:
    async def publish(job: jobs_pb2.ClaimedJob, slot: int) -> None:
        await stub.PublishPreview(publish_request(job, slot, image), metadata=processor)

    return await _each_job(jobs, counts, first_slot, publish)


async def _granted(
    stub: preview_pb2_grpc.PreviewServiceAsyncStub,
    processor: Metadata,
    jobs: list[jobs_pb2.ClaimedJob],
    image: bytes,
    counts: list[int],
    first_slot: int,
) -> Result:
    """The processor's own path (services.processor.direct_writes): grants for the next
    slots, a POST of each image straight to SeaweedFS, records batched into
    RecordWrittenPreviews; done when every record is answered. Latency: per image, to
    its record queued."""

    async def call(method: Any, request: Any) -> Any:
        return await method(request, metadata=processor)

    def refusal(refused: pub.Refusal) -> Exception:
        return AssertionError(f"a record was refused: {refused.reason} {refused.message}")

    writer = DirectPreviews(stub, call, refusal, CODE)
    digest = sha256_hex(image)

    async def publish(job: jobs_pb2.ClaimedJob, slot: int) -> None:
        await writer.publish(
            job, slot, job.input.slots[slot].start, image, "image/jpeg", [], digest
        )

    try:
        result = await _each_job(jobs, counts, first_slot, publish)
        for job in jobs:
            await writer.settle(job.lease)
    finally:
        writer.close()
    return result


async def _fences_only(
    c: CoordinatorHarness,
    processor: Metadata,
    jobs: list[jobs_pb2.ClaimedJob],
    image: bytes,
    counts: list[int],
    first_slot: int,
) -> Result:
    """The coordinator's fenced record per preview as the service makes it, no bytes."""
    service = bearer_metadata(await c.key(Grant(ScopeName.SERVICE), name="bench-fences"))
    on_behalf = ("workshop-on-behalf-of", processor[0][1])
    metadata = (*service, on_behalf)
    digest = sha256_hex(image)

    async def publish(job: jobs_pb2.ClaimedJob, slot: int) -> None:
        lease = job.lease
        await c.publication.RecordPreview(
            pub.RecordPreviewRequest(
                lease=lease,
                code_sha256=CODE,
                slot_index=slot,
                object_key=object_key(
                    "preview",
                    lease.run_id,
                    lease.job_id,
                    lease.generation,
                    slot,
                    test=False,
                    content_type="image/jpeg",
                ),
                frame_time=job.input.slots[slot].start,
                byte_size=len(image),
                sha256=digest,
                content_type="image/jpeg",
            ),
            metadata=metadata,
        )

    return await _each_job(jobs, counts, first_slot, publish)


def _client(s3: S3Server, connections: int) -> tuple[Minio, urllib3.PoolManager]:
    """A minio client like the service's: short timeouts, one retry, a connection per thread."""
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=S3_TIMEOUT_SECONDS, read=S3_TIMEOUT_SECONDS),
        maxsize=connections,
        retries=urllib3.Retry(total=1, backoff_factor=0.2),
    )
    client = Minio(
        s3.endpoint,
        access_key=s3.access_key,
        secret_key=s3.secret_key,
        secure=False,
        region=REGION,
        http_client=http,
    )
    return client, http


async def _direct(s3: S3Server, image: bytes, counts: list[int], phase: str) -> Result:
    """Plain put_object from one thread per caller, on one shared client."""
    client, http = _client(s3, len(counts))

    def putter(index: int, count: int) -> list[float]:
        latencies = []
        for n in range(count):
            began = time.perf_counter()
            client.put_object(
                BUCKET,
                f"bench-direct/{phase}/{index}/{n}.jpg",
                io.BytesIO(image),
                length=len(image),
                content_type="image/jpeg",
            )
            latencies.append(time.perf_counter() - began)
        return latencies

    def run_all() -> list[float]:
        with ThreadPoolExecutor(len(counts), thread_name_prefix="direct") as pool:
            results = pool.map(putter, range(len(counts)), counts)
            return [latency for latencies in results for latency in latencies]

    try:
        latencies = await asyncio.to_thread(run_all)
    finally:
        http.clear()
    return len(latencies), latencies


async def _check(c: CoordinatorHarness, s3: S3Server, expected: int) -> None:
    """Every preview published by the coordinator, and its bytes in the bucket."""
    async with c.db.connection() as connection:
        published = await connection.fetchval(
            "SELECT count(*) FROM staged_objects "
            "WHERE kind = 'preview' AND published_at IS NOT NULL"
        )

    def stored() -> int:
        return sum(1 for _ in s3.client().list_objects(BUCKET, prefix="previews/", recursive=True))

    in_bucket = await asyncio.to_thread(stored)
    if published != expected or in_bucket != expected:
        raise AssertionError(f"{published} published, {in_bucket} stored; expected {expected}")


# CPU time -----------------------------------------------------------------------------------


class PhaseMeter(CpuMeter):
    """CPU seconds of this process and of each named process family
    (bench.proc_stats.CpuMeter: Postgres's backends that exit during a phase included)."""

    async def measure(self, name: str, run: Callable[[], Awaitable[Result]]) -> Phase:
        before = self.mark()
        began = time.perf_counter()
        count, latencies = await run()
        wall = time.perf_counter() - began
        after = self.mark()
        return Phase(name, count, wall, latencies, {k: after[k] - before[k] for k in before})


def _print_table(phases: list[Phase], publishers: int, size: int) -> None:
    say()
    say(f"{phases[0].count:,} objects of {size:,} bytes each, {publishers} concurrent callers")
    cpu_names = list(phases[0].cpu_s)
    say(
        f"{'':>16} {'objects/s':>10} {'wall s':>7} {'p50 ms':>7} {'p99 ms':>7}   CPU s: "
        + " ".join(f"{name:>11}" for name in cpu_names)
    )
    for phase in phases:
        p50 = median(phase.latencies_s) * 1000
        p99 = percentile(phase.latencies_s, 0.99) * 1000
        say(
            f"{phase.name:>16} {phase.rate:>10.1f} {phase.wall_s:>7.2f} {p50:>7.1f} {p99:>7.1f}"
            "          " + " ".join(f"{phase.cpu_s[name]:>11.2f}" for name in cpu_names)
        )
    direct, relayed, granted = phases[0], phases[1], phases[2]
    ratio = granted.rate / direct.rate
    verdict = "met" if ratio >= TARGET_RATIO else "MISSED"
    say(f"ratio grants / direct put {ratio:.2f} (target >= {TARGET_RATIO:.2f}: {verdict})")
    say(f"ratio PublishPreview (bytes relayed) / direct put {relayed.rate / direct.rate:.2f}")


if __name__ == "__main__":
    sys.exit(main())
