"""What a full run's published frame costs Postgres: its preview's record and its commit.

    .venv/bin/python -m bench.frame_costs [--rounds 12] [--batch 60]

A processor of a full run records each frame's preview (its boxes with it) in batches,
then its Complete names every preview as its frame's upload and leaves the boxes to the
record (RoutedOutput.boxes_recorded), as `bench.processor_throughput` does. This runs that
per job through an in-process coordinator on gRPC (unary calls: Claim, the preview
service's RecordPreviews in batches of `--batch`, Complete) against a throwaway Postgres
cluster, one full run per round (120 frames a job), and measures the CPU of the whole
Postgres cluster (its live processes: every backend, the writer, the WAL writer, from
/proc/<pid>/schedstat) during the records and during the commits, per frame. The
coordinator's pool holds `--pool` connections, as deployed (10). The first two rounds
warm the backends' plans and caches and are not counted; `--verbose` prints every round.
`--profile` adds pg_stat_statements per frame (`bench/profiling.py`; it costs a little
CPU itself). Other work on the machine does not count in a process's CPU, so the figures
hold on a busy host far better than wall time.

Last line: `RESULT record_us_per_frame=<r> commit_us_per_frame=<c> total_us_per_frame=<t>`.
"""

from __future__ import annotations

import argparse
import asyncio

import asyncpg

from bench.proc_stats import children
from bench.profiling import enable_pg_stat_statements, statements_report, statements_reset
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


def family_cpu_s(root: int) -> float:
    """CPU seconds of the cluster's live processes, to the nanosecond (/proc/<pid>/schedstat:
    /proc/<pid>/stat counts 10 ms ticks, too coarse for one job's statements)."""
    total = 0
    for pid in (root, *children(root)):
        try:
            with open(f"/proc/{pid}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile
    return total / 1e9


BOX = common_pb2.Box(class_name="person", score=0.9, x=0.1, y=0.1, w=0.2, h=0.3)


async def _round(
    c: CoordinatorHarness, s: Setup, run_id: str, batch: int, postmaster: int
) -> tuple[int, float, float]:
    """One full run's first job: its frames, the CPU of its records and of its commit."""
    await create_run(c, s, run_id)
    job = await claim(c, s)
    assert job is not None
    assert job.lease.run_id == run_id, job
    requests = [
        record_request(job, slot.index, test=False, data=b"frame-%d" % slot.index)
        for slot in job.input.slots
    ]
    began = family_cpu_s(postmaster)
    for start in range(0, len(requests), batch):
        await c.publication.RecordPreviews(
            pub.RecordPreviewsRequest(previews=requests[start : start + batch]),
            metadata=on_behalf(s),
        )
    recorded = family_cpu_s(postmaster)
    result = empty_result(job)
    for request, out in zip(requests, result.slots, strict=True):
        out.outcome = common_pb2.SLOT_OUTCOME_FRAME
        out.frame_time.CopyFrom(request.frame_time)
        out.outputs.add(step_id="save", boxes_recorded=True)
        out.upload_key = request.object_key
        out.upload_sha256 = request.sha256
    reply: jobs_pb2.CompleteResponse = await c.jobs.Complete(
        complete_request(job, result), metadata=s.processor
    )
    committed = family_cpu_s(postmaster)
    assert reply.receipt.items_saved == len(requests), reply
    return len(requests), recorded - began, committed - recorded


async def _bench(dsn: str, postmaster: int, args: argparse.Namespace) -> None:
    frames = 0
    record_s = commit_s = 0.0
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
            count, record, commit = await _round(c, s, f"f{number}", args.batch, postmaster)
            if number == WARM_ROUNDS - 1 and args.profile:
                await statements_reset(dsn)
            if args.verbose:
                print(
                    f"round {number}: record {record / count * 1e6:.1f} us/frame, "
                    f"commit {commit / count * 1e6:.1f} us/frame"
                )
            if number >= WARM_ROUNDS:
                frames += count
                record_s += record
                commit_s += commit
    if args.profile:
        await statements_report(dsn, frames, "frame")
    record_us = record_s / frames * 1e6
    commit_us = commit_s / frames * 1e6
    print(
        f"{args.rounds} jobs of {frames // args.rounds} frames, records in batches of "
        f"{args.batch}: Postgres CPU per frame: record {record_us:.1f} us, commit "
        f"{commit_us:.1f} us, both {record_us + commit_us:.1f} us"
    )
    print(
        f"RESULT record_us_per_frame={record_us:.1f} commit_us_per_frame={commit_us:.1f} "
        f"total_us_per_frame={record_us + commit_us:.1f}"
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
    parser.add_argument("--verbose", action="store_true", help="each round's figures")
    parser.add_argument(
        "--profile", action="store_true", help="pg_stat_statements per frame (bench.profiling)"
    )
    args = parser.parse_args()
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
