"""What a commit's refresh of the review queue's columns costs as a sighting grows.

    .venv/bin/python -m bench.sightings_refresh [--rounds 20] [--items 120]
        [--lengths 1000,10000,100000]

A commit sets the queue columns (state, pending items, score, ...) of each sighting it
extends. `sightings_refresh_v1` (migration 0010) recomputed them from every item of the
sighting, so a sighting open across many jobs (a parked car) made each commit into it
cost more than the one before; `sightings_refresh_v2` (0015) takes a sighting the commit
only appended to from its columns and the boxes of the commit's own items.

One throwaway Postgres cluster and migrated database; for each length N of `--lengths`,
one sighting of N items (synthetic rows written with triggers off, one box each, the last
`--items` of them standing for the commit's new items). Then `--rounds` times each way, on
one connection, in a transaction rolled back after it: the full refresh of the sighting
(v1) and the appended one (v2 with the commit's items). Measured: the server process's
CPU (its CPU-time clock, in nanoseconds), per commit. The first two rounds warm the plans
and are not counted.

Last line: `RESULT v1_ms_at_<N>=<x> v2_ms_at_<N>=<y> ...`, server CPU ms per commit.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import asyncpg

from bench.proc_stats import process_clock_s
from testbed.harness.postgres import (
    PostgresUnavailable,
    create_migrated_database,
    postgres_cluster,
)

WARM_ROUNDS = 2
BOXES = json.dumps([{"class_name": "car", "score": 0.5, "x": 0.1, "y": 0.1, "w": 0.1, "h": 0.1}])
ITEMS = """
INSERT INTO bucket_items (item_id, bucket_id, run_id, job_index, slot_index, step_id,
    camera_id, recording_id, recording_generation, frame_time, boxes, box_sightings,
    object_key, sha256, saved_at)
SELECT $1 || '-' || g, 'yard', $1, g / 120, g % 120, 'save', 'cam-a', 'cam-a-0', 1,
       timestamptz '2026-01-01' + g * interval '1 second', $2::jsonb, ARRAY[$1 || '-0~0'],
       $1 || '/' || g, 'x', now()
FROM generate_series(0, $3 - 1) g
"""
SIGHTING = """
INSERT INTO sightings (run_id, sighting_id, bucket_id, camera_id, class_name,
    first_frame_time, last_frame_time, item_count)
VALUES ($1, $1 || '-0~0', 'yard', 'cam-a', 'car', timestamptz '2026-01-01',
        timestamptz '2026-01-01' + ($2 - 1) * interval '1 second', $2)
"""


async def _server_cpu_ms(
    connection: asyncpg.Connection, rounds: int, statement: str, params: tuple[object, ...]
) -> float:
    """The server's CPU per call of `statement`, ms, over `rounds` calls each rolled back."""
    pid = connection.get_server_pid()
    total = 0.0
    for number in range(rounds + WARM_ROUNDS):
        transaction = connection.transaction()
        await transaction.start()
        before = process_clock_s(pid)
        await connection.execute(statement, *params)
        after = process_clock_s(pid)
        assert before is not None, "the connection's server is gone"
        assert after is not None, "the connection's server is gone"
        await transaction.rollback()
        if number >= WARM_ROUNDS:
            total += after - before
    return total / rounds * 1000


async def _bench(dsn: str, args: argparse.Namespace) -> None:
    connection = await asyncpg.connect(dsn)
    results = []
    try:
        # synthetic rows: the counters' triggers and foreign keys stay out of it
        await connection.execute("SET session_replication_role = replica")
        for length in args.lengths:
            run = f"r{length}"
            await connection.execute(ITEMS, run, BOXES, length)
            await connection.execute(SIGHTING, run, length)
            await connection.execute("ANALYZE bucket_items; ANALYZE sightings")
            sighting = f"{run}-0~0"
            added = [f"{run}-{g}" for g in range(length - args.items, length)]
            v1 = await _server_cpu_ms(
                connection, args.rounds, "SELECT sightings_refresh_v1($1, $2)", ([run], [sighting])
            )
            v2 = await _server_cpu_ms(
                connection,
                args.rounds,
                "SELECT sightings_refresh_v2($1, '{}', $2, $3)",
                (run, [sighting], added),
            )
            print(
                f"a sighting of {length:,} items, a commit of {args.items}: "
                f"v1 {v1:.2f} ms, v2 {v2:.2f} ms of server CPU"
            )
            results += [f"v1_ms_at_{length}={v1:.2f}", f"v2_ms_at_{length}={v2:.2f}"]
    finally:
        await connection.close()
    print("RESULT " + " ".join(results))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--items", type=int, default=120, help="the commit's new items")
    parser.add_argument(
        "--lengths",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[1_000, 10_000, 100_000],
        help="sighting lengths, in items",
    )
    args = parser.parse_args()
    try:
        with postgres_cluster() as cluster:
            asyncio.run(_bench(create_migrated_database(cluster, "refresh"), args))
    except PostgresUnavailable as unavailable:
        print(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
