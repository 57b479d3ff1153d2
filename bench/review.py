"""Review at scale: GetReview pages, DecideSighting, GetSummary, and the dataset export.

    .venv/bin/python -m bench.review [--samples 100] [--quick] [--export-items N]

Starts a throwaway Postgres cluster (the test harness's), migrates a database and
starts the coordinator as its own process (`python -m services.coordinator`, no
background loops), as a deployment runs it, with this process as its client over
loopback gRPC. Set-up (not measured, timed and printed):

- a full run over 10 cameras with one 10,000-slot job each (CreateRun), whose jobs'
  items are then inserted straight into `bucket_items` (what a Complete inserts, but not
  grouped: the table's trigger counts them, as in a commit): 100,000 items, one box
  each, in 2,000 sightings: camera 0 holds 20 sightings of 500 items, the others 220 of
  about 45. The timelines are then grouped with the commit path's code
  (`reviews.group_backlog`, which runs `group_items` and writes the items' box
  sightings and the sightings, as a commit does), timed: that is what grouping a
  10,000-frame Complete costs;
- 90 more full runs of 5 workflows over the same cameras, 1,000 items per job inserted
  the same way with one commit time per job spread over 90 days, so 1,000,000 items
  in 20 buckets feed the summary.

Measured, with time.perf_counter() around each RPC as a client sees it, `--samples`
times each: GetReview's first page and a deep page (page size 1,000, the page after
item 90,000), DecideSighting on a 500-item sighting (alternating CONFIRM and NONE, so
every call changes 500 items), and GetSummary (30 days, Europe/Berlin). Then the
dataset export: `python -m bench.export --items N` in a subprocess (its own Postgres,
S3 and preview service; see that module), whose RESULT line gives items/s and memory.

`--quick` shrinks everything tenfold. Targets (2-core machine): page p99 <= 50 ms,
decide p99 <= 50 ms, summary p99 <= 100 ms, export >= 500 items/s. The last line is
`RESULT review_page_p99_ms=<x> review_deep_page_p99_ms=<x> decide_p99_ms=<y>
summary_p99_ms=<z> export_items_per_s=<w>` (p50 the median, p99 the nearest rank:
`bench.stats`); `--no-export` leaves the export's figure out, and a failed export exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from types import FrameType

from bench.proc_stats import CpuMeter, delta
from bench.results import ResultError, last_result, parse_result, result_line
from bench.stats import median, percentile
from services.coordinator.review import reviews
from services.coordinator.servicers.views import scope_of_run
from testbed.coordinator_world import DAY, build_world, copy_recordings, run_request, save_workflow
from testbed.harness.coordinator import CoordinatorHarness, coordinator_client
from testbed.harness.postgres import (
    TIMINGS,
    PostgresUnavailable,
    create_migrated_database,
    postgres_cluster,
)
from testbed.review_world import watch_spec
from tools.localstack.processes import running_service
from workshop.v1 import common_pb2, workflow_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import workshop_pb2 as ws

CAMERAS = [f"cam-{index:02d}" for index in range(10)]
BUCKETS = [f"b{index:02d}" for index in range(20)]
WORKFLOWS = [f"w{index}" for index in range(5)]
DATABASE = "bench_review"
RPC_TIMEOUT_S = 60.0
COORDINATOR_ENV = {
    "HOST": "127.0.0.1",
    "PORT": "0",
    "DRAIN_SECONDS": "0",
    "GRACE_SECONDS": "1",
    "SCHEDULER_INTERVAL_SECONDS": "0",
    "MAINTENANCE_INTERVAL_SECONDS": "0",
    "JOB_CAPACITY": "10000000",
}
TARGETS = {"page": 50.0, "deep": 50.0, "decide": 50.0, "summary": 100.0, "export": 500.0}


@dataclasses.dataclass(frozen=True)
class Scale:
    slots_per_job: int  # review run: items per camera
    long_sightings: int  # on camera 0, of `long_length` items each
    long_length: int
    sightings_per_camera: int  # on the other cameras
    extra_runs: int  # summary runs, 10 jobs each
    extra_items_per_job: int
    export_items: int


FULL = Scale(10_000, 20, 500, 220, 90, 1_000, 100_000)
QUICK = Scale(1_000, 2, 500, 22, 9, 1_000, 2_000)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.review",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--samples", type=int, default=100, help="calls timed per figure")
    parser.add_argument("--quick", action="store_true", help="a tenth of the data")
    parser.add_argument("--export-items", type=int, default=0, help="0: the scale's default")
    parser.add_argument("--no-export", action="store_true", help="skip the export figure")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with postgres_cluster() as cluster:
            say(
                f"postgres: {cluster.host}:{cluster.port} (initdb {TIMINGS.initdb_s:.2f} s, "
                f"start {TIMINGS.start_s:.2f} s)"
            )
            dsn = create_migrated_database(cluster, DATABASE)
            postgres = cluster.pid
            assert postgres is not None, "the cluster is running"
            figures = asyncio.run(_bench(dsn, scale, args.samples, postgres))
    except PostgresUnavailable as unavailable:
        say(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    fields = {
        "review_page_p99_ms": f"{figures['page']:.1f}",
        "review_deep_page_p99_ms": f"{figures['deep']:.1f}",
        "decide_p99_ms": f"{figures['decide']:.1f}",
        "summary_p99_ms": f"{figures['summary']:.1f}",
    }
    if not args.no_export:  # without the export its figure is left out, not printed as nan
        export = _export(args.export_items or scale.export_items)
        if export is None:
            return 1
        figures["export"] = export
        fields["export_items_per_s"] = f"{export:.0f}"
    say(result_line(fields))
    missed = [
        name
        for name, target in TARGETS.items()
        if name in figures
        and (figures[name] < target if name == "export" else figures[name] > target)
    ]
    return 1 if args.check and missed else 0


def say(line: str = "") -> None:
    print(line, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


async def _bench(dsn: str, scale: Scale, samples: int, postgres: int) -> dict[str, float]:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    # The coordinator as its own process, as it runs in a deployment: this process's
    # client, set-up and heap are not the coordinator's.
    with (
        tempfile.TemporaryDirectory(prefix="bench-review-") as scratch,
        running_service(
            "services.coordinator",
            {f"COORDINATOR_{key}": value for key, value in COORDINATOR_ENV.items()}
            | {"COORDINATOR_DATABASE_URL": dsn},
            Path(scratch) / "coordinator.log",
        ) as (coordinator, serving),
    ):
        async with coordinator_client(dsn, int(serving["port"])) as c:
            # the postmaster's family: its backends, also those that exit between marks
            pids = CpuMeter({"coordinator": coordinator.pid, "postgres": postgres})
            return await _bench_with(c, scale, samples, pids)


async def _bench_with(
    c: CoordinatorHarness, scale: Scale, samples: int, pids: CpuMeter
) -> dict[str, float]:
    began = time.perf_counter()
    runtime = await _world(c, scale)
    say(f"setup: world ({time.perf_counter() - began:.1f} s)")
    began = time.perf_counter()
    await _review_run(c, runtime, scale)
    items = scale.slots_per_job * len(CAMERAS)
    say(f"setup: review run, {items:,} items inserted ({time.perf_counter() - began:.1f} s)")
    began = time.perf_counter()
    await _group(c)
    grouped_s = time.perf_counter() - began
    async with c.db.connection() as connection:
        boxes = await connection.fetchval(
            "SELECT coalesce(sum(cardinality(box_sightings)), 0) FROM bucket_items "
            "WHERE box_sightings IS NOT NULL"
        )
    say(
        f"grouping: {boxes:,} boxes in {grouped_s * 1000:.0f} ms, "
        f"{grouped_s / boxes * 1e6:.1f} us a box (what a commit's transaction adds)"
    )
    began = time.perf_counter()
    extra = await _summary_runs(c, runtime, scale)
    took = time.perf_counter() - began
    say(f"setup: {extra:,} more items in {scale.extra_runs} runs ({took:.1f} s)")
    async with c.db.connection() as connection:
        await connection.execute("VACUUM ANALYZE")
        total = await connection.fetchval("SELECT count(*) FROM bucket_items")
        sightings = await connection.fetchval(
            "SELECT count(*) FROM sightings WHERE run_id = 'review'"
        )
    say(f"data: {total:,} items; review run: {items:,} items in {sightings:,} sightings")
    return await _measure(c, scale, samples, pids)


async def _world(c: CoordinatorHarness, scale: Scale) -> str:
    world = await build_world(c, recordings_per_camera=0)
    for camera in CAMERAS:
        await c.operator.PutCamera(op.PutCameraRequest(camera_id=camera), metadata=c.admin)
    for bucket in BUCKETS:
        await c.operator.CreateBucket(
            op.CreateBucketRequest(bucket_id=bucket, name=f"bucket {bucket}"), metadata=c.admin
        )
    length = timedelta(seconds=max(scale.slots_per_job, scale.extra_items_per_job) + 60)
    await copy_recordings(
        c,
        [
            (f"{camera}-r", camera, DAY + timedelta(hours=8), DAY + timedelta(hours=8) + length)
            for camera in CAMERAS
        ],
    )
    await save_workflow(c, "review", _spec(scale.slots_per_job, "b00"))
    for index, workflow in enumerate(WORKFLOWS):
        await save_workflow(c, workflow, _spec(scale.extra_items_per_job, BUCKETS[index]))
    return world.tracking_runtime


def _spec(slots: int, bucket: str) -> workflow_pb2.WorkflowSpec:
    """`watch` over every camera, one slot a second for `slots` seconds from 08:00."""
    spec = watch_spec(CAMERAS)
    end = 8 * 3600 + slots
    window = spec.graph.steps[0].input.window_end
    window.hours, window.minutes, window.seconds = end // 3600, end % 3600 // 60, end % 60
    for step in spec.graph.steps:
        if step.HasField("output"):
            step.output.bucket_id = bucket
    return spec


async def _create(c: CoordinatorHarness, run_id: str, workflow: str, runtime: str) -> None:
    await c.workshop.CreateRun(
        run_request(run_id, workflow, runtime, mode=common_pb2.RUN_MODE_FULL),
        metadata=c.admin,
        timeout=RPC_TIMEOUT_S,
    )


# Boxes travel as JSON text: asyncpg would read a list of lists as a 2-D array.
INSERT_ITEMS = """
INSERT INTO bucket_items (item_id, bucket_id, run_id, job_index, slot_index, step_id, camera_id,
                          recording_id, recording_generation, frame_time, boxes, object_key,
                          sha256, saved_at)
SELECT 'it_' || md5($1 || '/' || j.job_index || '/' || s), $2, $1, j.job_index, s, 'save',
       j.camera_id, j.recording_id, j.recording_generation,
       j.first_slot_at + s * interval '1 second', b.boxes,
       'uploads/' || $1 || '/' || j.job_index || '/' || s || '.jpg', repeat('ab', 32), $3
FROM jobs j
CROSS JOIN generate_series(0, j.slot_count - 1) AS s
CROSS JOIN LATERAL (SELECT (($4::text[])[s + 1])::jsonb AS boxes) b
WHERE j.run_id = $1 AND j.job_index = $5
"""


async def _review_run(c: CoordinatorHarness, runtime: str, scale: Scale) -> None:
    await _create(c, "review", "review", runtime)
    async with c.db.connection() as connection:
        jobs = await connection.fetch(
            "SELECT job_index, camera_id FROM jobs WHERE run_id = 'review' ORDER BY job_index"
        )
        for job in jobs:
            if job["camera_id"] == CAMERAS[0]:
                lengths = [scale.long_length] * scale.long_sightings
            else:
                per = scale.slots_per_job // scale.sightings_per_camera
                lengths = [per] * scale.sightings_per_camera
            await connection.execute(
                INSERT_ITEMS,
                "review",
                "b00",
                c.clock.now(),
                _boxes(lengths, scale.slots_per_job),
                job["job_index"],
            )


def _boxes(lengths: list[int], slots: int) -> list[str]:  # JSON text each: see INSERT_ITEMS
    """One box a frame: each sighting an object drifting slowly, the next one far away."""
    boxes: list[str] = []
    for number, length in enumerate(lengths):
        x = 0.1 if number % 2 == 0 else 0.7
        for step in range(length):
            box = {
                "class_name": "person",
                "score": 0.9,
                "x": x + 0.0001 * step,
                "y": 0.3,
                "w": 0.05,
                "h": 0.1,
            }
            boxes.append(json.dumps([box]))
    while len(boxes) < slots:
        boxes.append("[]")
    return boxes[:slots]


async def _group(c: CoordinatorHarness) -> None:
    """Groups every ungrouped timeline with the code a commit and the maintenance pass use
    (`reviews.group_backlog`: each timeline under its lock, in its own transaction)."""
    while await reviews.group_backlog(c.db):
        pass


async def _summary_runs(c: CoordinatorHarness, runtime: str, scale: Scale) -> int:
    rng = random.Random(7)
    inserted = 0
    for number in range(scale.extra_runs):
        run_id = f"extra-{number:03d}"
        workflow = WORKFLOWS[number % len(WORKFLOWS)]
        await _create(c, run_id, workflow, runtime)
        async with c.db.connection() as connection:
            jobs = await connection.fetch(
                "SELECT job_index FROM jobs WHERE run_id = $1 ORDER BY job_index", run_id
            )
            for job in jobs:
                saved_at = c.clock.now() - timedelta(minutes=rng.randrange(0, 90 * 24 * 60))
                boxes = [
                    json.dumps(
                        [
                            {
                                "class_name": rng.choice(("person", "vehicle")),
                                "x": 0.5,
                                "y": 0.5,
                                "w": 0.1,
                                "h": 0.1,
                            }
                        ]
                    )
                    for _ in range(scale.extra_items_per_job)
                ]
                bucket = BUCKETS[(number + job["job_index"]) % len(BUCKETS)]
                await connection.execute(
                    INSERT_ITEMS, run_id, bucket, saved_at, boxes, job["job_index"]
                )
                inserted += scale.extra_items_per_job
    return inserted


async def _measure(
    c: CoordinatorHarness, scale: Scale, samples: int, pids: CpuMeter
) -> dict[str, float]:
    async with c.db.connection() as connection:
        deep = await connection.fetchrow(
            "SELECT frame_time, item_id FROM bucket_items WHERE run_id = 'review' "
            "ORDER BY frame_time, item_id OFFSET $1 LIMIT 1",
            scale.slots_per_job * len(CAMERAS) * 9 // 10,
        )
        long_sighting = await connection.fetchval(
            "SELECT sighting_id FROM sightings WHERE run_id = 'review' "
            "AND item_count >= $1 ORDER BY 1 LIMIT 1",
            scale.long_length,
        )
    deep_token = f"{scope_of_run('review')}|{deep['frame_time'].isoformat()}|{deep['item_id']}"
    first = ws.GetReviewRequest(run_id="review", page_size=1000)
    deeper = ws.GetReviewRequest(run_id="review", page_size=1000, page_token=deep_token)
    decisions = [ws.REVIEW_DECISION_CONFIRM, ws.REVIEW_DECISION_NONE]
    calls: dict[str, Callable[[int], Awaitable[object]]] = {
        "page": lambda _: c.workshop.GetReview(first, metadata=c.admin, timeout=RPC_TIMEOUT_S),
        "deep": lambda _: c.workshop.GetReview(deeper, metadata=c.admin, timeout=RPC_TIMEOUT_S),
        "decide": lambda n: c.workshop.DecideSighting(
            ws.DecideSightingRequest(
                run_id="review", sighting_id=long_sighting, decision=decisions[n % 2]
            ),
            metadata=c.admin,
            timeout=RPC_TIMEOUT_S,
        ),
        "summary": lambda _: c.workshop.GetSummary(
            ws.GetSummaryRequest(time_zone="Europe/Berlin"), metadata=c.admin, timeout=RPC_TIMEOUT_S
        ),
    }
    page = await c.workshop.GetReview(first, metadata=c.admin)
    decided = await calls["decide"](0)
    say(
        f"first page: {len(page.items)} items, {len(page.sightings)} sightings, "
        f"{page.ByteSize() / 1e6:.2f} MB; decision: {decided.items_updated} items"  # type: ignore[attr-defined]
    )
    figures: dict[str, float] = {}
    say(
        f"{'call':<10}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}"
        f"{'coord CPU ms':>14}{'pg CPU ms':>11}{'bench CPU ms':>14}"
    )
    for name, call in calls.items():
        timings: list[float] = []
        cpu_before = pids.mark()
        for n in range(samples):
            began = time.perf_counter()
            await call(n + 1)
            timings.append((time.perf_counter() - began) * 1000)
        p99 = percentile(timings, 0.99)
        figures[name] = p99
        used = {part: ms / samples * 1000 for part, ms in delta(pids.mark(), cpu_before).items()}
        say(
            f"{name:<10}{median(timings):>10.1f}{p99:>10.1f}{max(timings):>10.1f}"
            f"{used['coordinator']:>14.1f}{used['postgres']:>11.1f}{used['bench']:>14.1f}"
        )
    return figures


def _export(items: int) -> float | None:
    """items/s of `bench.export` run in a subprocess, read from its RESULT line; None when
    it failed (said, with its error output)."""
    command = [sys.executable, "-m", "bench.export", "--items", str(items)]
    say(f"export: {' '.join(command[1:])}")
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
    for line in done.stdout.splitlines():
        say(f"  {line}")
    try:
        rate = parse_result(last_result(done.stdout)).get("export_items_per_s")
    except ResultError:
        rate = None
    if done.returncode != 0 or rate is None:
        say(f"export failed (exit {done.returncode}): {done.stderr[-2000:]}")
        return None
    return float(rate)


if __name__ == "__main__":
    raise SystemExit(main())
