"""What a full run's published frame costs Postgres: its preview's record and its commit.

    .venv/bin/python -m bench.frame_costs [--rounds 12] [--batch 60] [--boxes 1] [--join-gap S]
    .venv/bin/python -m bench.frame_costs --python [--batch 90] [--boxes 3]

A processor of a full run records each frame's preview (its boxes with it) in batches,
then its Complete names every preview as its frame's upload and leaves the boxes to the
record (RoutedOutput.boxes_recorded), as `bench.processor_throughput` does. This runs that
per job through an in-process coordinator on gRPC (unary calls: Claim, the preview
service's RecordPreviews in batches of `--batch`, Complete) against a throwaway Postgres
cluster, one full run per round (120 frames a job), and measures the CPU of the whole
Postgres cluster (every backend, the writer, the WAL writer: each live process by its
CPU-time clock, in nanoseconds, and what they reaped; `bench.proc_stats.family_cpu_s`)
during the records and during the commits, per frame. The
coordinator's pool holds `--pool` connections, as deployed (10). The first two rounds
warm the backends' plans and caches and are not counted; `--verbose` prints every round.
`--profile` adds pg_stat_statements per frame (`bench/profiling.py`; it costs a little
CPU itself). Other work on the machine does not count in a process's CPU, so the figures
hold on a busy host far better than wall time.

Also printed: this process's CPU per frame (`time.process_time`), which is the
coordinator's Python and C code plus the benchmark's own gRPC client (its requests are
built before the clock starts): the same client for every tree, so it compares the
coordinator's per-frame CPU of two trees. `--boxes N` gives each preview N boxes (the demo
detector of `bench.processor_throughput` finds 3). Frames are 30 s apart, so each box would
start a sighting of its own (a commit then writes 120 x N sightings); `--join-gap S` lets
boxes up to S seconds apart join (it sets review's `sightings.MAX_GAP` in this process,
where the coordinator runs), as the processor benchmark's frames 0.5 s apart do: 60 gives
that benchmark's few sightings a job.

`--python` starts nothing and times the coordinator's own handler Python for the same
frames instead, piece by piece (`bench/frame_python.py`).

Last line: `RESULT record_us_per_frame=<r> commit_us_per_frame=<c> total_us_per_frame=<t>
coordinator_us_per_frame=<p>` (Postgres, then this process).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from datetime import timedelta

import asyncpg

from bench import frame_python
from bench.proc_stats import family_cpu_s
from bench.profiling import enable_pg_stat_statements, statements_report, statements_reset
from services.coordinator.review import sightings
from testbed.coordinator_leases import (
    Setup,
    claim,
    complete_request,
    create_run,
    empty_result,
    on_behalf,
    record_request,
    setup,
)
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from testbed.harness.postgres import (
    PostgresUnavailable,
    create_migrated_database,
    postgres_cluster,
)
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import publication_pb2 as pub

WARM_ROUNDS = 2


def _boxes(slot: int, count: int) -> list[common_pb2.Box]:
    """A frame's boxes: `count` objects side by side, each moving a little a frame."""
    return [
        common_pb2.Box(
            class_name="person", score=0.9, x=0.1 + 0.25 * n + 0.001 * slot, y=0.1, w=0.2, h=0.3
        )
        for n in range(count)
    ]


@dataclasses.dataclass
class Costs:
    """CPU seconds of one job: Postgres's and this process's, during records and commit."""

    frames: int
    record: float = 0.0
    commit: float = 0.0
    record_here: float = 0.0
    commit_here: float = 0.0


async def _round(
    c: CoordinatorHarness, s: Setup, run_id: str, batch: int, boxes: int, postmaster: int
) -> Costs:
    """One full run's first job: its frames, the CPU of its records and of its commit."""
    await create_run(c, s, run_id)
    job = await claim(c, s)
    assert job is not None
    assert job.lease.run_id == run_id, job
    requests = []
    for slot in job.input.slots:
        request = record_request(job, slot.index, test=False, data=b"frame-%d" % slot.index)
        del request.boxes[:]
        request.boxes.extend(_boxes(slot.index, boxes))
        requests.append(request)
    batches = [
        pub.RecordPreviewsRequest(previews=requests[start : start + batch])
        for start in range(0, len(requests), batch)
    ]
    began, began_here = family_cpu_s(postmaster), time.process_time()
    for message in batches:
        await c.publication.RecordPreviews(message, metadata=on_behalf(s))
    recorded, recorded_here = family_cpu_s(postmaster), time.process_time()
    result = empty_result(job)
    for request, out in zip(requests, result.slots, strict=True):
        out.outcome = common_pb2.SLOT_OUTCOME_FRAME
        out.frame_time.CopyFrom(request.frame_time)
        out.outputs.add(step_id="save", boxes_recorded=True)
        out.upload_key = request.object_key
        out.upload_sha256 = request.sha256
    completing = complete_request(job, result)
    began_commit, began_commit_here = family_cpu_s(postmaster), time.process_time()
    reply: jobs_pb2.CompleteResponse = await c.jobs.Complete(completing, metadata=s.processor)
    committed, committed_here = family_cpu_s(postmaster), time.process_time()
    assert reply.receipt.items_saved == len(requests), reply
    return Costs(
        len(requests),
        recorded - began,
        committed - began_commit,
        recorded_here - began_here,
        committed_here - began_commit_here,
    )


async def _bench(dsn: str, postmaster: int, args: argparse.Namespace) -> None:
    total = Costs(0)
    if args.join_gap is not None:
        sightings.MAX_GAP = timedelta(seconds=args.join_gap)
    for setting in args.setting:
        name, _, value = setting.partition("=")
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(f"ALTER DATABASE frames SET {name} = '{value}'")
        finally:
            await connection.close()
    async with running_coordinator(dsn, pool_size=args.pool) as c:
        s = await setup(c, spec_kwargs={"interval": 30, "window": (8, 9)})
        async with c.db.connection() as connection:
            for statement in args.before:
                await connection.execute(statement)
        for number in range(args.rounds + WARM_ROUNDS):
            costs = await _round(c, s, f"f{number}", args.batch, args.boxes, postmaster)
            if number == WARM_ROUNDS - 1 and args.profile:
                await statements_reset(dsn)
            if args.verbose:
                print(
                    f"round {number}: record {costs.record / costs.frames * 1e6:.1f} us/frame, "
                    f"commit {costs.commit / costs.frames * 1e6:.1f} us/frame"
                )
            if number >= WARM_ROUNDS:
                for name in ("frames", "record", "commit", "record_here", "commit_here"):
                    setattr(total, name, getattr(total, name) + getattr(costs, name))
    frames = total.frames
    if args.profile:
        await statements_report(dsn, frames, "frame")
    record_us = total.record / frames * 1e6
    commit_us = total.commit / frames * 1e6
    record_here_us = total.record_here / frames * 1e6
    commit_here_us = total.commit_here / frames * 1e6
    print(
        f"{args.rounds} jobs of {frames // args.rounds} frames, {args.boxes} boxes each, "
        f"records in batches of {args.batch}: Postgres CPU per frame: record {record_us:.1f} us, "
        f"commit {commit_us:.1f} us, both {record_us + commit_us:.1f} us; this process "
        f"(the coordinator and the client): record {record_here_us:.1f} us, commit "
        f"{commit_here_us:.1f} us, both {record_here_us + commit_here_us:.1f} us"
    )
    print(
        f"RESULT record_us_per_frame={record_us:.1f} commit_us_per_frame={commit_us:.1f} "
        f"total_us_per_frame={record_us + commit_us:.1f} "
        f"coordinator_us_per_frame={record_here_us + commit_here_us:.1f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--batch", type=int, default=60, help="previews a record call takes")
    parser.add_argument("--pool", type=int, default=10, help="the coordinator's connections")
    parser.add_argument(
        "--before", action="append", default=[], help="SQL to run first (an experiment)"
    )
    parser.add_argument(
        "--setting", action="append", default=[], help="NAME=VALUE for the database (an experiment)"
    )
    parser.add_argument("--boxes", type=int, default=1, help="boxes a preview holds")
    parser.add_argument(
        "--join-gap",
        type=float,
        default=None,
        help="seconds between frames whose boxes may join a sighting (review's is 5)",
    )
    parser.add_argument("--verbose", action="store_true", help="each round's figures")
    parser.add_argument(
        "--profile", action="store_true", help="pg_stat_statements per frame (bench.profiling)"
    )
    parser.add_argument(
        "--python",
        action="store_true",
        help="the coordinator's handler Python per frame only, no servers (bench.frame_python)",
    )
    args = parser.parse_args()
    if args.python:
        frame_python.report(args.batch, args.boxes)
        return 0
    try:
        with postgres_cluster() as cluster:
            if args.profile:
                enable_pg_stat_statements(cluster)
            dsn = create_migrated_database(cluster, "frames")
            assert cluster.pid, "the cluster has no postmaster"
            asyncio.run(_bench(dsn, cluster.pid, args))
    except PostgresUnavailable as unavailable:
        print(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
