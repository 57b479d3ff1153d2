"""What saving bucket items costs Postgres.

    .venv/bin/python -m bench.item_insert [--rounds 40] [--items 120] [--existing 100000]

A Complete of a full run inserts one bucket item per frame that reaches an output, in one
statement whose triggers lock the items' timelines and count them for the summary.

One throwaway Postgres cluster and a database with a world built through an in-process
coordinator (a full run over an hour of one camera, bucket `yard`). It first gets
`--existing` committed items of one job (so that lookups are index probes into a table
of realistic size, as in a deployment), three boxes each. Then `--rounds` times, on one
long-lived connection: one statement inserts `--items` more items of that job with their
boxes (what a Complete of that many frames inserts, its foreign keys and statement
trigger included; since migration 0002 a commit also writes each item's box sightings,
grouped before the insert, which this insert leaves NULL), then rolls back. Measured
per round: the wall time around the statement and the server process's CPU (/proc,
summed over the rounds). The first two rounds warm the plans and are not counted.

Until release 0.1 it also measured the schema before migration 0023 beside it (ratio
0.71, docs/benchmarks.md); release 0.1's baseline squashed those migrations, so only this
version is measured now. Last line: `RESULT head_us_per_item=<x>` from the server
process's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field

import asyncpg

from bench.proc_stats import proc_stat
from bench.stats import median
from testbed.coordinator_world import build_world, run_request, save_workflow, workflow_spec
from testbed.harness.coordinator import running_coordinator
from testbed.harness.postgres import (
    PostgresUnavailable,
    create_migrated_database,
    postgres_cluster,
)
from workshop.v1 import common_pb2

RUN = "items"
WARM_ROUNDS = 2
BOXES = json.dumps(
    [
        {"class_name": "person", "score": 0.91, "x": 0.1, "y": 0.2, "w": 0.05, "h": 0.1},
        {"class_name": "person", "score": 0.87, "x": 0.5, "y": 0.3, "w": 0.06, "h": 0.12},
        {"class_name": "vehicle", "score": 0.78, "x": 0.7, "y": 0.6, "w": 0.2, "h": 0.1},
    ]
)

# Items $2.. $2+$3-1 of the run's first job, saved at $4 (slots past the job's end are
# fine: nothing checks them, and the insert is rolled back).
INSERT_ITEMS = """
INSERT INTO bucket_items (item_id, bucket_id, run_id, job_index, slot_index, step_id, camera_id,
                          recording_id, recording_generation, frame_time, boxes, object_key,
                          sha256, saved_at)
SELECT 'it_' || md5($1 || '/' || s), 'yard', $1, j.job_index, s, 'save', j.camera_id,
       j.recording_id, j.recording_generation, j.first_slot_at + s * interval '1 second',
       $5::jsonb, 'uploads/' || $1 || '/' || s || '.jpg', repeat('ab', 32), $4
FROM jobs j CROSS JOIN generate_series($2::integer, $2::integer + $3::integer - 1) AS s
WHERE j.run_id = $1 AND j.job_index = 0
"""


@dataclass
class Side:
    name: str
    connection: asyncpg.Connection
    server_pid: int
    wall_s: list[float] = field(default_factory=list)
    cpu_s: float = 0.0


async def _world(dsn: str) -> None:
    async with running_coordinator(dsn) as c:
        world = await build_world(c, recordings_per_camera=1)
        await save_workflow(c, "watch", workflow_spec(interval=1, window=(8, 9)))
        await c.workshop.CreateRun(
            run_request(RUN, "watch", world.tracking_runtime, mode=common_pb2.RUN_MODE_FULL),
            metadata=c.admin,
        )


async def _side(name: str, dsn: str, existing: int, extra: list[str]) -> Side:
    await _world(dsn)
    connection = await asyncpg.connect(dsn)
    for statement in extra:
        await connection.execute(statement)
    now = await connection.fetchval("SELECT now()")
    await connection.execute(INSERT_ITEMS, RUN, 0, existing, now, BOXES)
    await connection.execute("VACUUM ANALYZE")
    pid = await connection.fetchval("SELECT pg_backend_pid()")
    return Side(name, connection, pid)


def _cpu(pid: int) -> float:
    stat = proc_stat(pid)
    assert stat is not None, "the server process of the connection is gone"
    return stat[0]


async def _measure(sides: list[Side], rounds: int, items: int, existing: int) -> None:
    for number in range(rounds + WARM_ROUNDS):
        for side in sides if number % 2 == 0 else reversed(sides):
            cpu_before = _cpu(side.server_pid)
            now = await side.connection.fetchval("SELECT now()")
            transaction = side.connection.transaction()
            await transaction.start()
            began = time.perf_counter()
            await side.connection.execute(INSERT_ITEMS, RUN, existing, items, now, BOXES)
            wall = time.perf_counter() - began
            await transaction.rollback()
            if number >= WARM_ROUNDS:
                side.wall_s.append(wall)
                side.cpu_s += _cpu(side.server_pid) - cpu_before


async def _bench(dsn: str, args: argparse.Namespace) -> None:
    side = await _side("head", dsn, args.existing, [])
    try:
        await _measure([side], args.rounds, args.items, args.existing)
    finally:
        await side.connection.close()
    print(
        f"{args.rounds} rounds; {args.items} items a statement into a table of {args.existing:,}:"
    )
    per_item = side.cpu_s / (args.rounds * args.items) * 1e6
    print(
        f"wall p50 {median(side.wall_s) * 1e3:.2f} ms, min {min(side.wall_s) * 1e3:.2f} ms; "
        f"server CPU {per_item:.1f} us/item"
    )
    print(f"RESULT head_us_per_item={per_item:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--items", type=int, default=120, help="items a statement inserts")
    parser.add_argument("--existing", type=int, default=100_000, help="items already saved")
    args = parser.parse_args()
    try:
        with postgres_cluster() as cluster:
            asyncio.run(_bench(create_migrated_database(cluster, "items_head"), args))
    except PostgresUnavailable as unavailable:
        print(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
