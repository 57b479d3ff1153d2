"""Processor throughput through the whole path, against a plain in-process loop.

    .venv/bin/python -m bench.processor_throughput [--recordings 10] [--seconds 60]
        [--codec h264|vp9] [--interval 0.5] [--in-flight 3] [--repeat 1] [--warm-passes 1]
        [--drop-frames]
        [--set NAME=VALUE ...] [--model demo|yolo] [--profile] [--profile-control] [--check]

Recordings: `--recordings` synthetic scenes (`tools.demo.scenes`, seeds 1..N) of
`--seconds` at 10 fps, 640x360, encoded once into a cache directory (`--cache-dir`,
default `~/.cache/workshop-bench/processor_throughput`, one folder per codec, size,
length, PyAV version and scenes source) and reused. H.264 by default, since that is
what cameras and recorders write; `--codec vp9` runs the same through DALI's CPU decoder.

Started for the run, every part on loopback and stopped on exit (also on error, Ctrl-C
or SIGTERM; on error the services' logs are kept and their folder named): a throwaway
Postgres cluster with a migrated database, SeaweedFS (`weed mini`) holding the
recordings and the previews, the bundled Triton with the demo detector published as
version 1 (max batch 8, two instances of one onnxruntime thread each) and loaded, and
three service processes as they are deployed: the coordinator (`python -m
services.coordinator`, scheduler and maintenance loops off), the preview service and the
processor (`python -m services.processor`, PROCESSOR_IN_FLIGHT = `--in-flight`; `--set
NAME=VALUE` adds PROCESSOR_NAME=VALUE, e.g. TRITON_SHARED_MEMORY=off).

Measured, after a warm-up test run of two frames and `--warm-passes` (1) unmeasured full
passes of the baseline and the processor, `--repeat` passes of each side, alternated so
that a host whose speed drifts weighs on both alike: baseline, plain, processor, then
processor, baseline, plain, and so on. (Without the warm full pass, the first measured
processor pass read 0.02-0.04 ms a frame more control plane than the passes after it, most
of it Postgres, in each of the seven runs of 2026-12-06 08:06-08:35 UTC: each pooled
backend's first plans of the full run's statements and its caches, one-off costs that a
processor running for hours does not pay per frame. The warm-up pass's control-plane
figure is printed, not counted.)
- **baseline**: one plain loop in this process doing the work the processor does for a
  full run: it decodes the frames the run samples with PyAV (its default threading,
  forward decoding, rgb24 at the model's size), runs the same ONNX file with onnxruntime
  (default session options, warmed up) in batches of 8, then JPEG-encodes every frame
  with the processor's encoder and puts it to the same SeaweedFS (the minio SDK's
  put_object, one at a time); with `--drop-frames` it stores nothing, like the processor;
  with `--model yolo` (a YOLOv8-shaped model of 640x640 input,
  `testbed.yolo_models.colour_blob_yolov8`, served as publishing serves it: letterbox
  input, decoding in the graph) it letterboxes each frame into 640x640 (PyAV's scale into a
  gray canvas, as the processor's PyAV decoder), runs the model's own raw graph (float
  NCHW /255) with onnxruntime, and decodes the raw head in numpy (best class, confidence
  threshold, class-wise NMS, top K: `bench.yolo_decode.numpy_decode`);
- **plain**: the same loop without the JPEG and the put (the baseline before it stored
  frames), printed as its own line for comparison;
- **processor**: a full run over all recordings, one frame every `--interval` seconds
  (default 0.5: 2 fps, the rate it targets; any whole number of milliseconds from 0.1), from
  CreateRun until every job finished: claim, download, checksum, decode, Triton,
  routing, then a preview of every frame (every frame shows objects of the rule's
  classes; in a full run the preview's object is also the frame's upload), complete. A
  test run would stop at 100 images. With `--drop-frames` the rule sends every frame to
  Do nothing instead: no previews or uploads, the processor's own path. The idle
  processor's Claim waits at the coordinator (a long poll), so the first claim follows
  CreateRun at once; the delay and the rate from the first claim are printed too.

Each pass reports frames/s, the cores that other processes of the machine kept busy
meanwhile (from /proc/stat), CPU ms per frame of every part (from /proc, each service's
process family, children that exited during the pass included; this process by
getrusage) and the rate the machine's cores would give at that CPU per frame
("CPU-bound"), which other work disturbs much less than wall time. `--profile` runs the
processor under cProfile (its event-loop thread) and prints the top functions; the
processor's per-thread CPU is always printed.
`--profile-control` shows where the control plane's CPU goes in the first processor pass
(`bench/profiling.py`): the coordinator's and the preview service's CPU a second with the
stack up and no work (5 s before the pass), Postgres' CPU by process (`bench.pg_backends`:
each client backend by the process it serves, the background processes, autovacuum's
visits), pg_stat_statements (the cluster restarted with
it preloaded, nested statements tracked), the coordinator's CPU by call kind
(`bench.cpu_steps`, under which the coordinator then runs), the calls each service
answered per frame (from their /metrics), their user and system CPU and CPU per thread,
and py-spy samples of both (py-spy next to the interpreter, on PATH or in `$PY_SPY`;
`$PY_SPY_RATE`, `$PY_SPY_NATIVE`, `$PY_SPY_GIL` as `bench/profiling.py` says); the
profilers cost a little, so take the per-frame figures of record from a run without it.
The pass measures CreateRun and the processor's work; the run is read back (GetRun) and
checked after the pass, outside its figures. The pass waits for the run's end by polling
its jobs in Postgres every 0.25 s on a connection of its own; that backend's CPU (0.015-0.04
ms a frame, more the longer a pass takes) is this benchmark's load, not the system's, so
it counts in the `bench` column, not in `postgres` (each pass's line prints it).

Memory: the processor's peak resident set is the kernel's high-water mark (`VmHWM` in
/proc/<pid>/status) of the processor process, plus those of any children it has (none
today). Triton is a separate server: its peak is reported on its own, sampled every
0.5 s as the summed `VmRSS` of tritonserver and its python-backend stubs.

The last line is `RESULT processor_fps=<x> baseline_fps=<y> ratio=<x/y> peak_rss_mb=<z>
control_plane_ms_per_frame=<c> cpu_bound_ratio=<r> plain_fps=<p>`, each figure the median
over its side's passes (`bench.stats.median`: with two passes their mean, never the slower
or the faster alone); `control_plane_ms_per_frame` is the CPU of the coordinator, the
preview service and Postgres (their process families, exited backends included, the
benchmark's own poll left out) per frame of a processor pass. Targets:
ratio >= 1.0 and CPU-bound ratio >= 0.9 against the storing baseline, peak RSS <= 1,500
MB, control plane <= 0.25 ms per frame. `--check` exits 1 when one is missed. Results and
analysis: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import os
import pstats
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import asyncpg
import av
import numpy as np
import onnxruntime as ort
import tritonclient.grpc as triton_client
from minio import Minio

from bench import profiling
from bench.footage import (
    DEFAULT_CACHE,
    FPS,
    HEIGHT,
    START,
    WIDTH,
    Recording,
    cached_recordings,
    sampled_frames,
    whole_ms,
)
from bench.pg_backends import BackendCpu
from bench.proc_stats import (
    CpuMeter,
    MemoryWatch,
    busy_cores_s,
    delta,
    hwm_mb,
    thread_cpu,
    user_system_s,
)
from bench.results import result_line
from bench.services import separate_services
from bench.stats import median
from bench.yolo_decode import numpy_decode
from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.workflows.validation import MIN_INTERVAL_SECONDS
from services.processor.images import JPEG, encode_jpeg
from testbed.coordinator_world import save_workflow, stamp, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.postgres import (
    PostgresCluster,
    PostgresUnavailable,
    create_migrated_database,
    postgres_cluster,
)
from testbed.yolo_models import colour_blob_yolov8
from tools.localstack.processes import ServiceProcess
from tools.localstack.s3 import S3LaunchError, S3Server, running_s3_server
from tools.localstack.triton import TritonServer, TritonStartError, running_triton
from tools.model_repository.detector import CLASSES, build_detector, weights_sha256
from tools.model_repository.families import Postprocess, inspect, served_graph
from tools.model_repository.repository import publish_version
from workshop.kit.letterbox import PAD_VALUE, letterbox
from workshop.kit.processor_manifest import registration
from workshop.v1 import common_pb2, run_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import workshop_pb2 as ws

DATABASE = "bench_processor"
RECORDINGS_BUCKET = "recordings"
PREVIEW_BUCKET = "previews"
DEVICE = "bench-box"
MODEL = "detector"
MAX_BATCH = 8
YOLO_SIZE = 640  # --model yolo: a YOLOv8-shaped model of 640x640 letterboxed input
MODEL_INSTANCES, MODEL_THREADS = 2, 1  # measured best on 2 cores (docs/benchmarks.md)
TARGET_RATIO = 1.0
TARGET_CPU_RATIO = 0.9
TARGET_CONTROL_MS = 0.25  # issue 34: at most one core of control plane per GPU at full rate
CONTROL_PLANE = ("coordinator", "preview", "postgres")
TARGET_RSS_MB = 1500
READY_TIMEOUT_S = 60.0
STALL_S = 90.0
UNFINISHED_SQL = """
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE state IN ('queued', 'leased')) AS unfinished,
       count(*) FILTER (WHERE state <> 'queued') AS started,
       coalesce(sum(progress), 0) AS progress
FROM jobs WHERE run_id = $1
"""
# The poll for the run's end is this benchmark's own load on Postgres (at 0.25 s about
# 0.015 ms of Postgres CPU a frame, bench.pg_backends): it runs on its own connection,
# whose backend's CPU PassMeter counts as this benchmark's, not as the control plane's.
POLL_S = 0.25
POLL_BACKEND = "postgres: the benchmark's poll"
CORES = os.cpu_count() or 1
SIDES = ("processor", "baseline", "plain")


@dataclasses.dataclass(frozen=True)
class Figures:
    name: str
    frames: int
    wall_s: float
    cpu_s: dict[str, float] = dataclasses.field(default_factory=dict)
    others_cores: float = 0.0  # cores busy with processes this benchmark did not start

    @property
    def fps(self) -> float:
        return self.frames / self.wall_s

    @property
    def cpu_bound_fps(self) -> float:
        """The rate all cores would give at this pass's CPU seconds per frame."""
        return CORES * self.frames / sum(self.cpu_s.values())

    @property
    def control_plane_ms_per_frame(self) -> float:
        """CPU ms of the coordinator, the preview service and Postgres per frame."""
        return sum(self.cpu_s.get(name, 0.0) for name in CONTROL_PLANE) * 1000 / self.frames


@dataclasses.dataclass(frozen=True)
class Outcome:
    """Medians over each side's passes."""

    processor_fps: float
    baseline_fps: float  # decode, infer, JPEG, put to S3
    plain_fps: float  # decode and infer only (the loop before the baseline stored frames)
    control_ms: float  # control plane CPU per frame of the processor passes
    peak_rss_mb: float
    cpu_ratio: float


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.processor_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--recordings", type=int, default=10, help="recordings (jobs)")
    parser.add_argument("--seconds", type=int, default=60, help="length of each recording")
    parser.add_argument("--codec", choices=("h264", "vp9"), default="h264")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.5,
        help="sampling interval, seconds (a whole number of ms, from 0.1; 0.5 = 2 fps)",
    )
    parser.add_argument("--in-flight", type=int, default=3, help="PROCESSOR_IN_FLIGHT")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra processor setting, e.g. TRITON_SHARED_MEMORY=off (PROCESSOR_ is added)",
    )
    parser.add_argument(
        "--drop-frames",
        action="store_true",
        help="route every frame to Do nothing: no previews or uploads (the processor's core)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="passes of each side, alternated")
    parser.add_argument(
        "--warm-passes",
        type=int,
        default=1,
        help="unmeasured full passes of each side before them (0: the warm-up test run only)",
    )
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument(
        "--profile", action="store_true", help="run the processor under cProfile; print it"
    )
    parser.add_argument(
        "--profile-control",
        action="store_true",
        help="pg_stat_statements and py-spy of the coordinator and preview service (1st pass)",
    )
    parser.add_argument(
        "--model",
        choices=("demo", "yolo"),
        default="demo",
        help="the demo detector (640x360 uint8 frames), or a YOLOv8-shaped model of 640x640 "
        "letterboxed input served with its decoding (testbed.yolo_models.colour_blob_yolov8)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if args.recordings < 1 or args.seconds < 2:
        parser.error("need --recordings >= 1 and --seconds >= 2")
    if not MIN_INTERVAL_SECONDS <= args.interval < args.seconds or not whole_ms(args.interval):
        parser.error(
            f"need {MIN_INTERVAL_SECONDS} <= --interval < --seconds, a whole number of milliseconds"
        )
    if args.repeat < 1:
        parser.error("need --repeat >= 1")
    if args.warm_passes < 0:
        parser.error("need --warm-passes >= 0")
    extra = dict(item.split("=", 1) for item in args.set if "=" in item)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    recordings = cached_recordings(args.cache_dir, args.recordings, args.seconds, args.codec)
    try:
        with (
            postgres_cluster() as cluster,
            _scratch() as scratch,
        ):
            (scratch / "s3").mkdir()
            (scratch / "triton").mkdir()
            with (
                running_s3_server(scratch / "s3") as s3,
                running_triton(scratch / "triton") as triton,
            ):
                if args.profile_control:
                    profiling.enable_pg_stat_statements(cluster)
                dsn = create_migrated_database(cluster, DATABASE)
                for bucket in (RECORDINGS_BUCKET, PREVIEW_BUCKET):
                    s3.client().make_bucket(bucket)
                detector = _detector(args.model)
                publish_version(
                    triton.model_repository,
                    MODEL,
                    1,
                    detector.served,
                    classes=CLASSES,
                    max_batch_size=MAX_BATCH if detector.batched else 0,
                    instances=MODEL_INSTANCES,
                    threads=MODEL_THREADS,
                    # a YOLO version joins the requests that queue up, as publishing writes it
                    max_queue_delay_microseconds=0 if detector.post else None,
                )
                say(
                    f"postgres {cluster.host}:{cluster.port}; seaweedfs {s3.endpoint}; "
                    f"triton {triton.grpc_url} (pid {triton.pid})"
                )
                outcome = asyncio.run(
                    _bench(dsn, cluster, s3, triton, scratch, recordings, detector, args, extra)
                )
    except PostgresUnavailable as unavailable:
        say(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    except (S3LaunchError, TritonStartError) as problem:
        say(f"cannot start a dependency: {problem}")
        return 2
    rss, control = outcome.peak_rss_mb, outcome.control_ms
    ratio = outcome.processor_fps / outcome.baseline_fps
    say(
        result_line(
            {
                "processor_fps": f"{outcome.processor_fps:.1f}",
                "baseline_fps": f"{outcome.baseline_fps:.1f}",
                "ratio": f"{ratio:.2f}",
                "peak_rss_mb": f"{rss:.0f}",
                "control_plane_ms_per_frame": f"{control:.2f}",
                "cpu_bound_ratio": f"{outcome.cpu_ratio:.2f}",
                "plain_fps": f"{outcome.plain_fps:.1f}",
            }
        )
    )
    missed = (
        ratio < TARGET_RATIO
        or rss > TARGET_RSS_MB
        or outcome.cpu_ratio < TARGET_CPU_RATIO
        or control > TARGET_CONTROL_MS
    )
    return 1 if args.check and missed else 0


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    """A work directory, removed afterwards; kept with the services' logs on failure."""
    folder = Path(tempfile.mkdtemp(prefix="bench-processor-"))
    try:
        yield folder
    except BaseException:
        say(f"logs kept in {folder} (coordinator.log, preview.log, processor.log)")
        raise
    shutil.rmtree(folder, ignore_errors=True)


def say(line: str = "") -> None:
    print(line, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


# The benchmark ----------------------------------------------------------------------------


async def _bench(
    dsn: str,
    cluster: PostgresCluster,
    s3: S3Server,
    triton: TritonServer,
    scratch: Path,
    recordings: list[Recording],
    detector: Detector,
    args: argparse.Namespace,
    extra: dict[str, str],
) -> Outcome:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    wanted = await asyncio.to_thread(sampled_frames, recordings, args.seconds, args.interval)
    frames = sum(len(indices) for indices in wanted)
    _load_model(triton)
    session = _session(detector)
    steps = scratch / "cpu-steps.txt" if args.profile_control else None
    async with (
        _services(dsn, s3, scratch, steps) as (c, pids),
        _poll_connection(dsn) as poll,
    ):
        runtime_id, key = await _world(c, s3, recordings, detector, args)
        env = _processor_env(c, s3, triton, pids["preview_port"], runtime_id, key, args, extra)
        profile = scratch / "processor.prof" if args.profile else None
        with _processor_process(env, scratch / "processor.log", profile) as processor:
            meter = PassMeter(
                {
                    "processor": processor.pid,
                    "triton": triton.pid,
                    "coordinator": pids["coordinator"],
                    "preview": pids["preview"],
                    "seaweedfs": s3.pid,
                    "postgres": cluster.pid,
                    POLL_BACKEND: poll.get_server_pid(),
                }
            )
            with MemoryWatch(processor.pid, triton.pid) as memory:
                await _warm_up(c, poll, runtime_id, processor)
                phases = []
                threads: dict[str, float] = {}
                store = None if args.drop_frames else s3.client()
                for warm in range(1, args.warm_passes + 1):
                    # Unmeasured full passes of both sides first: the first full run on the
                    # coordinator's fresh connections pays one-off costs (each backend's
                    # first plans of the commit's and the records' statements, its caches),
                    # which a processor running for hours never pays again.
                    await meter.measure(
                        "warm-up baseline",
                        lambda: _baseline(recordings, wanted, session, store, detector),
                    )
                    warm_run = f"warm-up-{warm}"
                    figures = await meter.measure(
                        "warm-up processor",
                        lambda warm_run=warm_run: _processor_run(
                            c, poll, runtime_id, processor, frames, warm_run
                        ),
                    )
                    await _check_run(c, warm_run, recordings, frames, args.drop_frames)
                    say(
                        f"warm-up processor pass, not counted: control plane "
                        f"{figures.control_plane_ms_per_frame:.3f} CPU ms per frame"
                    )

                async def baselines() -> None:
                    phases.append(
                        await meter.measure(
                            "baseline",
                            lambda: _baseline(recordings, wanted, session, store, detector),
                        )
                    )
                    phases.append(
                        await meter.measure(
                            "plain", lambda: _baseline(recordings, wanted, session, None, detector)
                        )
                    )

                async def processor_pass(attempt: int) -> None:
                    threads_before = thread_cpu(processor.pid)
                    profiled = args.profile_control and attempt == 1
                    profiler = (
                        _ControlProfile(dsn, pids, cluster.pid or 0, scratch) if profiled else None
                    )
                    if profiler is not None:
                        await profiler.idle()  # before py-spy attaches
                    with profiler or contextlib.nullcontext():
                        if profiler is not None:
                            await profiler.start()
                        phases.append(
                            await meter.measure(
                                "processor",
                                lambda attempt=attempt: _processor_run(
                                    c, poll, runtime_id, processor, frames, f"measured-{attempt}"
                                ),
                            )
                        )
                    if profiler is not None:
                        await profiler.report(frames)
                    await _check_run(c, f"measured-{attempt}", recordings, frames, args.drop_frames)
                    for name, seconds in delta(thread_cpu(processor.pid), threads_before).items():
                        threads[name] = threads.get(name, 0.0) + seconds

                # Equal passes, alternated: baseline first in odd attempts, the processor
                # first in even ones, so neither side always runs on the fresher machine.
                for attempt in range(1, args.repeat + 1):
                    if attempt % 2:
                        await baselines()
                        await processor_pass(attempt)
                    else:
                        await processor_pass(attempt)
                        await baselines()
            _check_alive(processor)
            peak = memory.processor_peak_mb()
            service_mb = {name: hwm_mb(pids[name]) for name in ("coordinator", "preview")}
    _print_table(phases, args, frames)
    busiest = sorted(threads.items(), key=lambda item: -item[1])[:5]
    say(
        "processor threads, CPU ms per frame: "
        + ", ".join(
            f"{name} {seconds * 1000 / (frames * args.repeat):.2f}" for name, seconds in busiest
        )
        + " ('main' runs the event loop; Python's worker threads all show as 'python';"
        " threads that ended before the end of a pass are not counted)"
    )
    if profile is not None:
        _print_profile(profile)
    say(
        f"peak RSS: processor {peak:.0f} MB (VmHWM of the process and its children, "
        f"{args.in_flight} recordings in flight); triton {memory.triton_peak_mb:.0f} MB "
        "(server + python stubs, sampled); "
        f"coordinator {service_mb['coordinator']:.0f} MB; preview {service_mb['preview']:.0f} MB"
    )
    fps = {name: _median(phases, name, lambda p: p.fps) for name in SIDES}
    cpu_bound = {name: _median(phases, name, lambda p: p.cpu_bound_fps) for name in SIDES}
    ratio = fps["processor"] / fps["baseline"]
    cpu_ratio = cpu_bound["processor"] / cpu_bound["baseline"]
    control = _median(phases, "processor", lambda p: p.control_plane_ms_per_frame)
    say(
        f"CPU-bound ratio {cpu_ratio:.2f} (target >= {TARGET_CPU_RATIO}: "
        f"{'met' if cpu_ratio >= TARGET_CPU_RATIO else 'MISSED'}; median CPU-bound frames/s: "
        f"processor {cpu_bound['processor']:.1f}, baseline {cpu_bound['baseline']:.1f}, "
        f"plain {cpu_bound['plain']:.1f})"
    )
    say(
        f"ratio processor / baseline {ratio:.2f} (target >= {TARGET_RATIO}: "
        f"{'met' if ratio >= TARGET_RATIO else 'MISSED'}); processor / plain (no storage) "
        f"{fps['processor'] / fps['plain']:.2f}; peak RSS {peak:.0f} MB "
        f"(target <= {TARGET_RSS_MB}: {'met' if peak <= TARGET_RSS_MB else 'MISSED'})"
    )
    say(
        f"control plane (coordinator + preview + postgres) {control:.2f} CPU ms per published "
        f"frame (target <= {TARGET_CONTROL_MS}: "
        f"{'met' if control <= TARGET_CONTROL_MS else 'MISSED'})"
    )
    return Outcome(fps["processor"], fps["baseline"], fps["plain"], control, peak, cpu_ratio)


IDLE_WINDOW_S = 5.0


class _ControlProfile:
    """--profile-control around one processor pass: pg_stat_statements, py-spy and the CPU
    per thread of the coordinator and the preview service."""

    def __init__(self, dsn: str, pids: dict[str, int], postmaster: int, scratch: Path) -> None:
        self.dsn = dsn
        self.pids = {name: pids[name] for name in ("coordinator", "preview")}
        self.backends = BackendCpu(dsn, postmaster, {**self.pids, "benchmark": os.getpid()})
        self.metrics_ports = {name: pids.get(f"{name}_metrics_port") for name in self.pids}
        self.spy = profiling.PySpy(self.pids, scratch)
        self.steps = scratch / "cpu-steps.txt"
        self.threads: dict[str, dict[str, float]] = {}
        self.calls: dict[str, Counter[str]] = {}
        self.user_system: dict[str, tuple[float, float]] = {}

    async def start(self) -> None:
        os.kill(self.pids["coordinator"], signal.SIGUSR1)  # bench.cpu_steps: from zero
        await profiling.statements_reset(self.dsn)
        self.calls = {
            name: await profiling.rpc_counts(port) for name, port in self.metrics_ports.items()
        }
        self.threads = {name: thread_cpu(pid) for name, pid in self.pids.items()}
        self.user_system = {name: user_system_s(pid) for name, pid in self.pids.items()}
        await self.backends.start()

    async def idle(self) -> None:
        """The services' CPU a second with the stack up and no work (the processor connected,
        nothing queued): a fixed cost that a short pass would put on its frames."""
        before = {name: user_system_s(pid) for name, pid in self.pids.items()}
        await asyncio.sleep(IDLE_WINDOW_S)
        for name, pid in self.pids.items():
            user, system = (a - b for a, b in zip(user_system_s(pid), before[name], strict=True))
            say(
                f"{name} idle: {(user + system) * 1000 / IDLE_WINDOW_S:.2f} CPU ms a second "
                f"(user {user * 1000:.0f} ms, system {system * 1000:.0f} ms "
                f"in {IDLE_WINDOW_S:.0f} s)"
            )

    def __enter__(self) -> _ControlProfile:
        self.spy.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.threads = {
            name: delta(thread_cpu(pid), self.threads.get(name, {}))
            for name, pid in self.pids.items()
        }
        for name, pid in self.pids.items():
            (user, system), (user_0, system_0) = user_system_s(pid), self.user_system[name]
            self.user_system[name] = (user - user_0, system - system_0)
        self.backends.stop()
        self.steps.unlink(missing_ok=True)
        os.kill(self.pids["coordinator"], signal.SIGUSR2)  # bench.cpu_steps: written out
        self.spy.__exit__(*exc)

    async def report(self, frames: int) -> None:
        say()
        say(f"control-plane profile of the first processor pass ({frames} frames):")
        for name, (user, system) in self.user_system.items():
            say(
                f"{name} CPU ms per frame: user {user * 1000 / frames:.3f}, "
                f"system {system * 1000 / frames:.3f} (the kernel's share: sockets, wake-ups)"
            )
        for name, threads in self.threads.items():
            busiest = sorted(threads.items(), key=lambda item: -item[1])[:5]
            say(
                f"{name} threads, CPU ms per frame: "
                + ", ".join(
                    f"{thread} {seconds * 1000 / frames:.3f}" for thread, seconds in busiest
                )
            )
        for name, port in self.metrics_ports.items():
            after = await profiling.rpc_counts(port)
            profiling.rpc_report(name, self.calls.get(name, Counter()), after, frames, "frame")
        await self.backends.name_newcomers()
        self.backends.report(frames, "frame", say)
        await profiling.statements_report(self.dsn, frames, "frame")
        await self._steps_report(frames)
        self.spy.report(frames, "frame")
        say()

    async def _steps_report(self, frames: int) -> None:
        for _ in range(50):
            if self.steps.exists():
                break
            await asyncio.sleep(0.1)
        else:
            say("(no CPU by call kind: the coordinator wrote no bench.cpu_steps totals)")
            return
        user, system = self.user_system["coordinator"]
        say(
            "coordinator CPU by call kind (bench.cpu_steps: the event-loop thread's CPU of "
            "each kind's steps; a statement counts again inside its handler), us per frame; "
            f"the whole process {(user + system) * 1e6 / frames:.1f}:"
        )
        for line in self.steps.read_text(encoding="utf-8").splitlines():
            ms, calls, kind = line.split(" ", 2)
            say(f"  {float(ms) * 1000 / frames:8.1f}  {int(calls):>5} calls  {kind}")


def _load_model(triton: TritonServer) -> None:
    """Loaded before the processor starts, so no measured part waits for the stubs."""
    client = triton_client.InferenceServerClient(triton.grpc_url)
    try:
        client.load_model(MODEL)
    finally:
        client.close()


@contextlib.asynccontextmanager
async def _services(
    dsn: str, s3: S3Server, scratch: Path, cpu_steps: Path | None
) -> AsyncIterator[tuple[CoordinatorHarness, dict[str, int]]]:
    """The coordinator and the preview service as their own processes (the coordinator
    under `bench.cpu_steps` when `cpu_steps` names its output)."""
    async with separate_services(
        dsn, s3, scratch, bucket=PREVIEW_BUCKET, cpu_steps=cpu_steps
    ) as services:
        yield (
            services.coordinator,
            {
                "coordinator": services.coordinator_process.pid,
                "preview": services.preview_process.pid,
                "preview_port": services.preview_port,
                **{
                    f"{name}_metrics_port": port
                    for name, port in services.metrics_ports.items()
                    if port is not None
                },
            },
        )


async def _world(
    c: CoordinatorHarness,
    s3: S3Server,
    recordings: list[Recording],
    detector: Detector,
    args: argparse.Namespace,
) -> tuple[str, str]:
    """Device, runtime of this checkout, cameras with their recordings in S3, the model,
    the bucket and the workflow; returns the runtime id and a processor key."""
    md = c.admin
    await c.operator.RegisterDevice(op.RegisterDeviceRequest(device_id=DEVICE), metadata=md)
    runtime = await c.operator.RegisterRuntime(registration(DEVICE), metadata=md)
    client = s3.client()
    for recording in recordings:
        key = f"recordings/{recording.path.name}"
        await asyncio.to_thread(client.fput_object, RECORDINGS_BUCKET, key, str(recording.path))
        await c.operator.PutCamera(op.PutCameraRequest(camera_id=recording.camera), metadata=md)
        await c.operator.PutRecording(
            op.PutRecordingRequest(
                recording_id=f"{recording.camera}-0",
                camera_id=recording.camera,
                start=stamp(START),
                end=stamp(START + timedelta(seconds=args.seconds)),
                fps=FPS,
                object_key=key,
                sha256=recording.sha256,
                byte_size=recording.byte_size,
            ),
            metadata=md,
        )
    await c.operator.PublishModelVersion(
        op.PublishModelVersionRequest(
            name=MODEL,
            version=1,
            weights_sha256=weights_sha256(detector.served),
            classes=list(CLASSES),
            input_shape=[detector.height, detector.width, 3],
            family=detector.family,
            confidence_threshold=detector.post.confidence if detector.post else 0.0,
            iou_threshold=detector.post.iou if detector.post else 0.0,
            max_detections=detector.post.max_detections if detector.post else 0,
        ),
        metadata=md,
    )
    await c.operator.CreateBucket(op.CreateBucketRequest(bucket_id="yard"), metadata=md)
    spec = workflow_spec(
        cameras=[recording.camera for recording in recordings],
        interval=args.interval,
        window=(8, 9),
        classes=CLASSES,
    )
    if args.drop_frames:
        # Every frame shows all classes, so MATCH -> Do nothing drops every frame; the
        # output stays reachable (NO_MATCH), as the workflow contract requires.
        for edge in spec.graph.edges:
            if edge.from_step_id == "rule":
                edge.to_step_id = "drop" if edge.to_step_id == "save" else "save"
    await save_workflow(c, "bench", spec)
    key_secret = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id=DEVICE), name="processor")
    return runtime.runtime.runtime_id, key_secret


@contextlib.contextmanager
def _processor_process(
    env: dict[str, str], log_path: Path, profile: Path | None
) -> Iterator[ServiceProcess]:
    """`python -m services.processor`, or under cProfile (its event-loop thread) with
    --profile; the profile is written when it stops."""
    if profile is None:
        process = ServiceProcess("services.processor", env, log_path)
    else:
        args = ["-o", str(profile), "-m", "services.processor"]
        process = ServiceProcess("cProfile", env, log_path, args=args)
    try:
        process.wait_event("serving", timeout=READY_TIMEOUT_S)
        yield process
    finally:
        process.stop()


def _print_profile(path: Path, lines: int = 30) -> None:
    say()
    say(f"processor profile, event-loop thread (cProfile, top {lines} by own time):")
    out = io.StringIO()
    pstats.Stats(str(path), stream=out).sort_stats("tottime").print_stats(lines)
    say(out.getvalue().split("\n\n", 1)[-1].rstrip())


def _processor_env(
    c: CoordinatorHarness,
    s3: S3Server,
    triton: TritonServer,
    preview_port: int,
    runtime_id: str,
    key: str,
    args: argparse.Namespace,
    extra: dict[str, str],
) -> dict[str, str]:
    values = {
        "HOST": "127.0.0.1",
        "PORT": "0",
        "DRAIN_SECONDS": "0",
        "GRACE_SECONDS": "1",
        "LOG_LEVEL": "WARNING",
        "DEVICE_ID": DEVICE,
        "KEY": key,
        "COORDINATOR_TARGET": f"127.0.0.1:{c.port}",
        "PREVIEW_TARGET": f"127.0.0.1:{preview_port}",
        "TRITON_TARGET": triton.grpc_url,
        "MODEL_REPOSITORY": str(triton.model_repository),
        "RUNTIME_ID": runtime_id,
        "S3_ENDPOINT": s3.endpoint,
        "S3_ACCESS_KEY": s3.access_key,
        "S3_SECRET_KEY": s3.secret_key,
        "RECORDINGS_BUCKET": RECORDINGS_BUCKET,
        "IN_FLIGHT": str(args.in_flight),
        **extra,
    }
    return {f"PROCESSOR_{name}": value for name, value in values.items()}


@contextlib.asynccontextmanager
async def _poll_connection(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """The connection of the run's poll (`_finished`): one backend, whose CPU the
    benchmark tells apart from the system's."""
    connection = await asyncpg.connect(
        dsn, server_settings={"application_name": "bench.processor_throughput poll"}
    )
    try:
        yield connection
    finally:
        await connection.close()


async def _warm_up(
    c: CoordinatorHarness, poll: asyncpg.Connection, runtime_id: str, processor: ServiceProcess
) -> None:
    """A two-frame test run: channels, decoders and the model path are warm afterwards."""
    request = ws.CreateRunRequest(
        run_id="warm-up",
        workflow_id="bench",
        runtime_id=runtime_id,
        revision=1,
        mode=common_pb2.RUN_MODE_TEST,
        image_limit=2,
    )
    await c.workshop.CreateRun(request, metadata=c.admin)
    await _finished(poll, "warm-up", processor)
    detail = await _run_detail(c, "warm-up")
    if detail.run.status != common_pb2.RUN_STATUS_COMPLETED:
        raise AssertionError(f"the warm-up run did not complete: {detail}")


async def _processor_run(
    c: CoordinatorHarness,
    poll: asyncpg.Connection,
    runtime_id: str,
    processor: ServiceProcess,
    frames: int,
    run_id: str,
) -> int:
    """The measured part of a pass: CreateRun, then the processor's work until every job
    has finished (polled in the database). The run is read back and checked afterwards
    (`_check_run`), outside the measured window: that GetRun is this benchmark's, not
    the processor's."""
    request = ws.CreateRunRequest(
        run_id=run_id,
        workflow_id="bench",
        runtime_id=runtime_id,
        revision=1,
        mode=common_pb2.RUN_MODE_FULL,
    )
    created = time.perf_counter()
    await c.workshop.CreateRun(request, metadata=c.admin)
    claimed = await _finished(poll, run_id, processor)
    finished = time.perf_counter()
    say(
        f"processor run: first claim {claimed - created:.2f} s after CreateRun, from there "
        f"{frames / (finished - claimed):.1f} frames/s"
    )
    return frames


async def _check_run(
    c: CoordinatorHarness, run_id: str, recordings: list[Recording], frames: int, drop_frames: bool
) -> None:
    detail = await _run_detail(c, run_id)
    run = detail.run
    decoders: dict[str, int] = {}
    for job in detail.jobs:
        decoders[job.decoder] = decoders.get(job.decoder, 0) + 1
    say(
        f"processor run: {run.counts.jobs_completed}/{len(recordings)} jobs completed, "
        f"{run.counts.slots_frame} frames, {run.counts.slots_dropped} dropped, "
        f"{run.counts.items_saved} items saved; decoders "
        + ", ".join(f"{name or '?'} x{count}" for name, count in sorted(decoders.items()))
    )
    if (
        run.status != common_pb2.RUN_STATUS_COMPLETED
        or (run.counts.slots_dropped if drop_frames else run.counts.slots_frame) != frames
        or run.counts.items_saved != (0 if drop_frames else frames)
    ):
        failed = [job.failure_message for job in detail.jobs if job.failure_message]
        raise AssertionError(f"the run did not label all {frames} frames: {run} {failed[:3]}")


async def _finished(poll: asyncpg.Connection, run_id: str, processor: ServiceProcess) -> float:
    """Waits for the run's jobs to finish; fails early when nothing moves for STALL_S.
    Returns when its first job was seen claimed (perf_counter).

    Polled in the database (one cheap query), not with GetRun: its detail of recent
    images would cost the coordinator and this process CPU while the processor works."""
    last, moved, claimed = None, time.monotonic(), 0.0
    while True:
        row = await poll.fetchrow(UNFINISHED_SQL, run_id)
        if row["started"] and not claimed:
            claimed = time.perf_counter()
        if row["jobs"] and not row["unfinished"]:
            return claimed
        progress = (row["unfinished"], row["progress"])
        if progress != last:
            last, moved = progress, time.monotonic()
        elif time.monotonic() - moved > STALL_S:
            raise TimeoutError(
                f"run {run_id} made no progress for {STALL_S:.0f} s; processor log:\n"
                f"{processor.log_tail()}"
            )
        await asyncio.sleep(POLL_S)


async def _run_detail(c: CoordinatorHarness, run_id: str) -> run_pb2.RunDetail:
    reply: ws.GetRunResponse = await c.workshop.GetRun(
        ws.GetRunRequest(run_id=run_id), metadata=c.admin
    )
    return reply.detail


def _check_alive(processor: ServiceProcess) -> None:
    if processor.process.poll() is not None:
        raise RuntimeError(f"the processor exited early:\n{processor.log_tail()}")


# Baseline ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Detector:
    """The model under test: what Triton serves (its SHA-256 the run pins) and what the
    baseline runs in process (a YOLO model's raw graph, decoded in numpy)."""

    served: bytes
    raw: bytes
    height: int
    width: int
    batched: bool
    family: str = ""
    post: Postprocess | None = None  # a YOLO model's decoding

    def frame(self, frame: Any) -> Any:
        """A decoded PyAV frame as the processor places it in the model's input."""
        if self.post is None:
            return frame.to_ndarray(format="rgb24", width=self.width, height=self.height)
        place = letterbox(frame.height, frame.width, self.height, self.width)
        picture = frame.to_ndarray(format="rgb24", width=place.width, height=place.height)
        canvas = np.full((self.height, self.width, 3), PAD_VALUE, np.uint8)
        canvas[place.top : place.top + place.height, place.left : place.left + place.width] = (
            picture
        )
        return canvas


def _detector(kind: str) -> Detector:
    if kind == "demo":
        weights = build_detector(HEIGHT, WIDTH)
        return Detector(weights, weights, HEIGHT, WIDTH, True)
    raw = colour_blob_yolov8(YOLO_SIZE, CLASSES)
    inspection = inspect(raw)
    post = Postprocess()
    return Detector(
        served_graph(raw, inspection, CLASSES, post),
        raw,
        inspection.height,
        inspection.width,
        inspection.batch is None,
        inspection.family,
        post,
    )


def _session(detector: Detector) -> ort.InferenceSession:
    """The peer's session, warmed by one batch (the processor's model is warm too)."""
    session = ort.InferenceSession(detector.raw, providers=["CPUExecutionProvider"])
    blank = np.zeros((detector.height, detector.width, 3), dtype=np.uint8)
    _infer(session, [blank] * MAX_BATCH, detector)
    return session


async def _baseline(
    recordings: list[Recording],
    wanted: list[list[int]],
    session: ort.InferenceSession,
    store: Minio | None,
    detector: Detector,
) -> int:
    return await asyncio.to_thread(_baseline_loop, recordings, wanted, session, store, detector)


def _baseline_loop(
    recordings: list[Recording],
    wanted: list[list[int]],
    session: ort.InferenceSession,
    store: Minio | None,
    detector: Detector,
) -> int:
    """PyAV decode of the sampled frames and onnxruntime in process: the named peer. With
    `store`, each frame is then JPEG-encoded as the processor encodes it and put to the
    same S3, as a full run stores each frame that reaches an output. A YOLO model's frames
    are letterboxed, its raw head decoded in numpy (best class, threshold, class-wise NMS,
    top K: bench.yolo_decode's `numpy_decode`)."""
    found = 0
    for recording, indices in zip(recordings, wanted, strict=True):
        data = recording.path.read_bytes()  # the processor downloads; this reads memory
        prefix = f"baseline/{recording.path.stem}/"
        batch: list[Any] = []
        stored = 0
        for frame in _decoded(data, indices, detector):
            batch.append(frame)
            if len(batch) == MAX_BATCH:
                found += _infer(session, batch, detector)
                stored = _store(store, prefix, stored, batch)
                batch = []
        if batch:
            found += _infer(session, batch, detector)
            _store(store, prefix, stored, batch)
    if found == 0:
        raise AssertionError("the baseline found no objects: it did not run the detector")
    return sum(len(indices) for indices in wanted)


def _store(store: Minio | None, prefix: str, stored: int, frames: list[Any]) -> int:
    """Each frame as JPEG (the processor's encoder) put to S3; the count stored so far."""
    if store is None:
        return stored
    for frame in frames:
        image = encode_jpeg(frame)
        key = f"{prefix}{stored}.jpg"
        store.put_object(PREVIEW_BUCKET, key, io.BytesIO(image), len(image), content_type=JPEG)
        stored += 1
    return stored


def _decoded(data: bytes, indices: list[int], detector: Detector) -> Iterator[Any]:
    """rgb24 frames placed in the model's input, forward decoding, in index order."""
    remaining = set(indices)
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]  # PyAV's default threading: a plain loop
        for index, frame in enumerate(container.decode(stream)):
            if index in remaining:
                remaining.discard(index)
                yield detector.frame(frame)
                if not remaining:
                    return


def _infer(session: ort.InferenceSession, batch: list[Any], detector: Detector) -> int:
    if detector.post is None:
        counts = session.run(["num_dets"], {"images": np.stack(batch)})[0]
        return int(counts.sum())
    name = session.get_inputs()[0].name
    post, found = detector.post, 0
    frames = np.stack(batch).transpose(0, 3, 1, 2).astype(np.float32) / 255.0
    groups = [frames] if detector.batched else [f[np.newaxis] for f in frames]
    for group in groups:
        heads = session.run(None, {name: group})[0]
        for head in heads:
            found += len(numpy_decode(head, post.confidence, post.iou, post.max_detections))
    return found


def _median(phases: list[Figures], name: str, figure: Callable[[Figures], float]) -> float:
    """The median of one figure over the passes of one side (bench.stats' rule)."""
    return median(figure(phase) for phase in phases if phase.name == name)


class PassMeter(CpuMeter):
    """The CPU of every process family and this process (bench.proc_stats.CpuMeter), and
    the cores other work kept busy, around one pass; the backend of the run's poll
    (root `POLL_BACKEND`) is counted as this process's, not Postgres'."""

    async def measure(self, name: str, run: Any) -> Figures:
        before, busy = self.mark(), busy_cores_s()
        began = time.perf_counter()
        frames = await run()
        wall = time.perf_counter() - began
        after, busy = self.mark(), busy_cores_s() - busy
        cpu = {k: after[k] - before[k] for k in before}
        # The run's poll is this benchmark's load, not the system's: its backend's CPU
        # counts as the benchmark's, not as Postgres'.
        poll = cpu.pop(POLL_BACKEND, 0.0)
        cpu["postgres"] -= poll
        cpu["bench"] += poll
        others = max(0.0, busy - sum(cpu.values())) / wall
        say(
            f"{name}: {frames} frames in {wall:.2f} s ({others:.2f} cores busy elsewhere; "
            f"the run's poll {poll * 1000 / frames:.3f} ms of Postgres CPU a frame, "
            "counted as this benchmark's)"
        )
        return Figures(name, frames, wall, cpu, others)


def _print_table(phases: list[Figures], args: argparse.Namespace, frames: int) -> None:
    say()
    say(
        f"{args.recordings} recordings x {args.seconds} s, {args.codec} {WIDTH}x{HEIGHT} "
        f"{FPS} fps, one frame every {args.interval:g} s: {frames} frames per pass"
    )
    names = list(phases[0].cpu_s)
    say(
        f"{'':>10} {'frames/s':>9} {'wall s':>7} {'others':>7} {'CPU-bound':>9}   "
        "CPU ms per frame: " + " ".join(f"{name:>11}" for name in names) + f" {'total':>7}"
    )
    for phase in phases:
        per_frame = {k: v * 1000 / phase.frames for k, v in phase.cpu_s.items()}
        say(
            f"{phase.name:>10} {phase.fps:>9.1f} {phase.wall_s:>7.2f} {phase.others_cores:>7.2f}"
            f" {phase.cpu_bound_fps:>9.1f}                     "
            + " ".join(f"{per_frame[name]:>11.2f}" for name in names)
            + f" {sum(per_frame.values()):>7.2f}"
        )
    say(
        "others: cores busy with processes this benchmark did not start (other work on the "
        f"machine); CPU-bound: frames/s that {CORES} cores would give at that CPU per frame, "
        "which other work disturbs much less than wall time; the result takes the median "
        "of each figure over its side's passes"
    )


if __name__ == "__main__":
    sys.exit(main())
