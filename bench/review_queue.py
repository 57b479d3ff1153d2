"""A bucket's review queue and bulk decisions at scale: GetReviewQueue's next sighting,
BulkDecideSightings over 10,000 items and its undo.

    .venv/bin/python -m bench.review_queue [--samples 100] [--quick] [--bulk-items 10000]

Starts a throwaway Postgres cluster and the coordinator as its own process, as
`bench.review` does, and builds its data the same way (`bench.review`'s world and review
run: 100,000 items of one run in bucket b00, 2,000 sightings), plus 90 more full runs of 5
workflows over the same 10 cameras, 1,000 items a job, so 1,000,000 items in 20 buckets;
their boxes (one a frame: objects of a random class and score seen for 1 to 10 frames) are
grouped into sightings with the commit path's code (`reviews.group_backlog`), so every
bucket holds sightings across 45 runs. Not measured: the set-up, timed and printed.

Measured, with time.perf_counter() around each RPC as a client sees it, `--samples` times
each, in bucket b05 (50,000 items of 45 runs): the queue's next sighting (page size 1)
first in each order (oldest, lowest score, by camera), deep (a page token after 90% of
the bucket's sightings), and filtered (class and camera, deep); then a bulk decision on
the first sightings of b05 by first frame time that hold `--bulk-items` items (a time
range): its preview (dry run), its apply (CONFIRM with the preview's revision) and its
undo, `--bulk-rounds` times each (apply and undo alternate, so every apply changes them
all); then the next pending sighting again once the range was decided (the queue skips
it by index).

`--quick` a tenth of the data and 1,000 bulk items. Targets (2-core machine): queue next
p99 <= 50 ms, bulk apply <= 2 s at 10,000 items. The last line is `RESULT
queue_next_p99_ms=<worst p99 of the queue calls> queue_deep_p99_ms=<x>
queue_score_p99_ms=<x> queue_filtered_p99_ms=<x> bulk_preview_ms=<x> bulk_apply_ms=<x>
bulk_undo_ms=<x> bulk_items=<n>` (the bulk figures the worst of the rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from types import FrameType

from bench.proc_stats import CpuMeter, delta
from bench.results import result_line
from bench.review import (
    BUCKETS,
    COORDINATOR_ENV,
    FULL,
    INSERT_ITEMS,
    QUICK,
    RPC_TIMEOUT_S,
    WORKFLOWS,
    Scale,
    _create,
    _group,
    _review_run,
    _world,
    say,
)
from bench.stats import median, percentile
from services.coordinator.review.queue import QueueKey, SightingFilter
from services.coordinator.servicers.views import queue_token
from testbed.harness.coordinator import CoordinatorHarness, coordinator_client
from testbed.harness.postgres import (
    TIMINGS,
    PostgresUnavailable,
    create_migrated_database,
    postgres_cluster,
)
from tools.localstack.processes import running_service
from workshop.v1 import workshop_pb2 as ws

DATABASE = "bench_review_queue"
BUCKET = "b05"
TARGETS = {"queue_next": 50.0, "bulk_apply": 2000.0}
ORDER_NAMES = {
    ws.QUEUE_ORDER_OLDEST: "oldest",
    ws.QUEUE_ORDER_LOWEST_SCORE: "score",
    ws.QUEUE_ORDER_CAMERA: "camera",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.review_queue",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--samples", type=int, default=100, help="calls timed per queue figure")
    parser.add_argument("--quick", action="store_true", help="a tenth of the data")
    parser.add_argument("--bulk-items", type=int, default=0, help="0: 10,000 (1,000 quick)")
    parser.add_argument("--bulk-rounds", type=int, default=5, help="applies (and undos) timed")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    bulk_items = args.bulk_items or (1_000 if args.quick else 10_000)
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
            figures = asyncio.run(
                _bench(dsn, scale, args.samples, postgres, bulk_items, args.bulk_rounds)
            )
    except PostgresUnavailable as unavailable:
        say(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    say(
        result_line(
            {
                "queue_next_p99_ms": f"{figures['queue_next']:.1f}",
                "queue_deep_p99_ms": f"{figures['queue_deep']:.1f}",
                "queue_score_p99_ms": f"{figures['queue_score']:.1f}",
                "queue_filtered_p99_ms": f"{figures['queue_filtered']:.1f}",
                "bulk_preview_ms": f"{figures['bulk_preview']:.0f}",
                "bulk_apply_ms": f"{figures['bulk_apply']:.0f}",
                "bulk_undo_ms": f"{figures['bulk_undo']:.0f}",
                "bulk_items": f"{figures['bulk_items']:.0f}",
            }
        )
    )
    missed = [name for name, target in TARGETS.items() if figures[name] > target]
    return 1 if args.check and missed else 0


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


async def _bench(
    dsn: str, scale: Scale, samples: int, postgres: int, bulk_items: int, rounds: int
) -> dict[str, float]:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    with (
        tempfile.TemporaryDirectory(prefix="bench-review-queue-") as scratch,
        running_service(
            "services.coordinator",
            {f"COORDINATOR_{key}": value for key, value in COORDINATOR_ENV.items()}
            | {"COORDINATOR_DATABASE_URL": dsn},
            Path(scratch) / "coordinator.log",
        ) as (coordinator, serving),
    ):
        async with coordinator_client(dsn, int(serving["port"])) as c:
            pids = CpuMeter({"coordinator": coordinator.pid, "postgres": postgres})
            await _setup(c, scale)
            return await _measure(c, samples, pids, bulk_items, rounds)


async def _setup(c: CoordinatorHarness, scale: Scale) -> None:
    began = time.perf_counter()
    runtime = await _world(c, scale)
    await _review_run(c, runtime, scale)
    say(f"setup: world and review run ({time.perf_counter() - began:.1f} s)")
    began = time.perf_counter()
    extra = await _scored_runs(c, runtime, scale)
    took = time.perf_counter() - began
    say(f"setup: {extra:,} more items in {scale.extra_runs} runs ({took:.1f} s)")
    began = time.perf_counter()
    await _group(c)
    say(f"setup: every timeline grouped ({time.perf_counter() - began:.1f} s)")
    async with c.db.connection() as connection:
        await connection.execute("VACUUM ANALYZE")
        total = await connection.fetchval("SELECT count(*) FROM bucket_items")
        sightings = await connection.fetchval("SELECT count(*) FROM sightings")
        mine = await connection.fetchrow(
            "SELECT count(*) AS sightings, sum(item_count) AS items, "
            "count(DISTINCT run_id) AS runs FROM sightings WHERE bucket_id = $1",
            BUCKET,
        )
    say(
        f"data: {total:,} items in {sightings:,} sightings; bucket {BUCKET}: "
        f"{mine['items']:,} items in {mine['sightings']:,} sightings of {mine['runs']} runs"
    )


async def _scored_runs(c: CoordinatorHarness, runtime: str, scale: Scale) -> int:
    """bench.review's summary runs, each box with a score (the queue's lowest-score order)."""
    rng = random.Random(11)
    inserted = 0
    for number in range(scale.extra_runs):
        run_id = f"extra-{number:03d}"
        await _create(c, run_id, WORKFLOWS[number % len(WORKFLOWS)], runtime)
        async with c.db.connection() as connection:
            jobs = await connection.fetch(
                "SELECT job_index FROM jobs WHERE run_id = $1 ORDER BY job_index", run_id
            )
            for job in jobs:
                saved_at = c.clock.now() - timedelta(minutes=rng.randrange(0, 90 * 24 * 60))
                boxes = _objects(rng, scale.extra_items_per_job)
                bucket = BUCKETS[(number + job["job_index"]) % len(BUCKETS)]
                await connection.execute(
                    INSERT_ITEMS, run_id, bucket, saved_at, boxes, job["job_index"]
                )
                inserted += scale.extra_items_per_job
    return inserted


def _objects(rng: random.Random, frames: int) -> list[str]:
    """One box a frame (JSON text each, as INSERT_ITEMS takes them): objects of a random
    class seen for 1 to 10 consecutive frames each at one place, with a score of their own
    (0.20..1.00, a little noise per frame), the next one far away: a sighting each."""
    boxes: list[str] = []
    number = 0
    while len(boxes) < frames:
        class_name = rng.choice(("person", "vehicle"))
        score = rng.uniform(0.2, 0.98)
        x = 0.1 if number % 2 == 0 else 0.7
        for step in range(rng.randint(1, 10)):
            box = {
                "class_name": class_name,
                "score": round(min(1.0, score + rng.uniform(0, 0.02)), 3),
                "x": x + 0.0001 * step,
                "y": 0.3,
                "w": 0.05,
                "h": 0.1,
            }
            boxes.append(json.dumps([box]))
        number += 1
    return boxes[:frames]


def _token(order: ws.QueueOrder.ValueType, wanted: ws.SightingFilter, key: QueueKey) -> str:
    domain = SightingFilter(
        class_name=wanted.class_name, camera_id=wanted.camera_id, review_states=()
    )
    return queue_token(domain.fingerprint(BUCKET, ORDER_NAMES[order]), key)


async def _deep_key(c: CoordinatorHarness, order: str, where: str = "") -> QueueKey:
    """The key of the sighting after 90% of the bucket's pending ones in `order`."""
    keys = {
        "oldest": "first_frame_time, run_id, sighting_id",
        "score": "score, first_frame_time, run_id, sighting_id",
        "camera": "camera_id, first_frame_time, run_id, sighting_id",
    }[order]
    async with c.db.connection() as connection:
        count = await connection.fetchval(
            f"SELECT count(*) FROM sightings WHERE bucket_id = $1 AND review_state = 'pending' "
            f"{where}",
            BUCKET,
        )
        row = await connection.fetchrow(
            f"SELECT score, camera_id, first_frame_time, run_id, sighting_id FROM sightings "
            f"WHERE bucket_id = $1 AND review_state = 'pending' {where} ORDER BY {keys} "
            f"OFFSET $2 LIMIT 1",
            BUCKET,
            count * 9 // 10,
        )
    return QueueKey(
        row["score"], row["camera_id"], row["first_frame_time"], row["run_id"], row["sighting_id"]
    )


async def _measure(
    c: CoordinatorHarness, samples: int, pids: CpuMeter, bulk_items: int, rounds: int
) -> dict[str, float]:
    def next_of(
        order: ws.QueueOrder.ValueType, wanted: ws.SightingFilter, token: str = ""
    ) -> Callable[[int], Awaitable[object]]:
        request = ws.GetReviewQueueRequest(
            bucket_id=BUCKET, filter=wanted, order=order, page_size=1, page_token=token
        )
        return lambda _: c.workshop.GetReviewQueue(request, metadata=c.admin, timeout=RPC_TIMEOUT_S)

    anything = ws.SightingFilter()
    narrow = ws.SightingFilter(class_name="vehicle", camera_id="cam-03")
    deep_oldest = _token(ws.QUEUE_ORDER_OLDEST, anything, await _deep_key(c, "oldest"))
    deep_score = _token(ws.QUEUE_ORDER_LOWEST_SCORE, anything, await _deep_key(c, "score"))
    deep_camera = _token(ws.QUEUE_ORDER_CAMERA, anything, await _deep_key(c, "camera"))
    deep_narrow = _token(
        ws.QUEUE_ORDER_OLDEST,
        narrow,
        await _deep_key(c, "oldest", "AND class_name = 'vehicle' AND camera_id = 'cam-03'"),
    )
    calls: dict[str, Callable[[int], Awaitable[object]]] = {
        "oldest": next_of(ws.QUEUE_ORDER_OLDEST, anything),
        "oldest_deep": next_of(ws.QUEUE_ORDER_OLDEST, anything, deep_oldest),
        "score": next_of(ws.QUEUE_ORDER_LOWEST_SCORE, anything),
        "score_deep": next_of(ws.QUEUE_ORDER_LOWEST_SCORE, anything, deep_score),
        "camera": next_of(ws.QUEUE_ORDER_CAMERA, anything),
        "camera_deep": next_of(ws.QUEUE_ORDER_CAMERA, anything, deep_camera),
        "filtered_deep": next_of(ws.QUEUE_ORDER_OLDEST, narrow, deep_narrow),
    }
    p99 = await _time_calls(calls, samples, pids)

    # the bulk decision: the first sightings of the bucket holding bulk_items items
    async with c.db.connection() as connection:
        edge = await connection.fetchrow(
            "SELECT first_frame_time, total FROM (SELECT first_frame_time, sum(item_count) OVER "
            "(ORDER BY first_frame_time, run_id, sighting_id) AS total FROM sightings "
            "WHERE bucket_id = $1 AND review_state = 'pending') s WHERE total >= $2 "
            "ORDER BY total LIMIT 1",
            BUCKET,
            bulk_items,
        )
    end = edge["first_frame_time"] + timedelta(microseconds=1)
    selection = ws.SightingFilter()
    selection.frame_time_to.FromDatetime(end)
    bulk: dict[str, list[float]] = {"preview": [], "apply": [], "undo": []}
    items = 0
    for _ in range(rounds):
        began = time.perf_counter()
        preview = await c.workshop.BulkDecideSightings(
            ws.BulkDecideSightingsRequest(
                bucket_id=BUCKET,
                filter=selection,
                decision=ws.REVIEW_DECISION_CONFIRM,
                dry_run=True,
            ),
            metadata=c.admin,
            timeout=RPC_TIMEOUT_S,
        )
        bulk["preview"].append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        applied = await c.workshop.BulkDecideSightings(
            ws.BulkDecideSightingsRequest(
                bucket_id=BUCKET,
                filter=selection,
                decision=ws.REVIEW_DECISION_CONFIRM,
                expected_selection_revision=preview.selection_revision,
            ),
            metadata=c.admin,
            timeout=RPC_TIMEOUT_S,
        )
        bulk["apply"].append((time.perf_counter() - began) * 1000)
        items = applied.items_changed
        began = time.perf_counter()
        await c.workshop.UndoBulkDecision(
            ws.UndoBulkDecisionRequest(action_id=applied.action.action_id),
            metadata=c.admin,
            timeout=RPC_TIMEOUT_S,
        )
        bulk["undo"].append((time.perf_counter() - began) * 1000)
    say(
        f"bulk decision: {preview.sightings_selected:,} sightings, {items:,} items "
        f"(first frame time before {end.isoformat()})"
    )
    say(f"{'bulk':<14}{'median ms':>10}{'max ms':>10}")
    for name, timings in bulk.items():
        say(f"{name:<14}{median(timings):>10.0f}{max(timings):>10.0f}")
    # decided, the range is skipped by index: the next pending sighting again
    await c.workshop.BulkDecideSightings(
        ws.BulkDecideSightingsRequest(
            bucket_id=BUCKET, filter=selection, decision=ws.REVIEW_DECISION_NONE
        ),
        metadata=c.admin,
        timeout=RPC_TIMEOUT_S,
    )
    after = await _time_calls({"oldest_after_bulk": calls["oldest"]}, samples, pids)
    queue_calls = [*p99.values(), *after.values()]
    return {
        "queue_next": max(queue_calls),
        "queue_deep": max(p99["oldest_deep"], p99["camera_deep"]),
        "queue_score": max(p99["score"], p99["score_deep"]),
        "queue_filtered": p99["filtered_deep"],
        "bulk_preview": max(bulk["preview"]),
        "bulk_apply": max(bulk["apply"]),
        "bulk_undo": max(bulk["undo"]),
        "bulk_items": float(items),
    }


async def _time_calls(
    calls: dict[str, Callable[[int], Awaitable[object]]], samples: int, pids: CpuMeter
) -> dict[str, float]:
    figures: dict[str, float] = {}
    say(
        f"{'call':<18}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}"
        f"{'coord CPU ms':>14}{'pg CPU ms':>11}"
    )
    for name, call in calls.items():
        await call(0)  # warm: the statement prepared on the backend
        timings: list[float] = []
        cpu_before = pids.mark()
        for n in range(samples):
            began = time.perf_counter()
            await call(n + 1)
            timings.append((time.perf_counter() - began) * 1000)
        figures[name] = percentile(timings, 0.99)
        used = {part: ms / samples * 1000 for part, ms in delta(pids.mark(), cpu_before).items()}
        say(
            f"{name:<18}{median(timings):>10.1f}{figures[name]:>10.1f}{max(timings):>10.1f}"
            f"{used['coordinator']:>14.1f}{used['postgres']:>11.1f}"
        )
    return figures


if __name__ == "__main__":
    raise SystemExit(main())
