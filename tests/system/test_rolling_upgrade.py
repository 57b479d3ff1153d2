"""A rolling upgrade (docs/upgrading.md#rolling-upgrade): the previous release's coordinator
serves beside this tree's against one database.

The previous release is the commit in `deploy/releases/previous`, extracted with `git
archive` and run as a process from that tree (same virtualenv). Its own migrations make a
new database; this tree's pre-migrations follow while it serves; this tree's coordinator
starts beside it and real work goes through both (runs, claims, progress, heartbeats,
staged uploads, completes and their receipts, a job claimed on one and completed through
the other; this tree's processor transport: unary on N, which has no Session stream, and
on the stream on N+1). Then the old one stops, this tree post-migrates, and the new one
still serves.
Catalog checks cover what the RPCs here do not reach: the pre-migrations keep every
function and column of the previous release, and no phase leaves out a function this
tree's SQL calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from services.coordinator.platform.migrate import MigrationRefused
from services.coordinator.platform.migrate import migrate as migrate_in_process
from services.coordinator.platform.versions import MIGRATIONS_DIR, list_migrations
from services.processor.calls import SessionJobs
from testbed.coordinator_leases import (
    Setup,
    claimed,
    complete_request,
    create_run,
    empty_result,
    frame_result,
    setup,
)
from testbed.harness.coordinator import CoordinatorHarness, coordinator_client
from testbed.harness.postgres import PostgresCluster, quote_ident
from testbed.harness.processes import REPO
from tools.localstack.processes import ServiceProcess
from workshop.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from workshop.v1 import workshop_pb2 as ws

RELEASE_FILE = REPO / "deploy" / "releases" / "previous"
# where the previous release migrates (names its connections from the release after 1677730 on)
MIGRATE_MODULE = Path("services", "coordinator", "platform", "migrate.py")

# Every function (name, arguments, result) and column (table, name, type) of the schema.
CATALOG = """
SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid)
       || ') -> ' || pg_get_function_result(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public'
UNION ALL
SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type
FROM information_schema.columns WHERE table_schema = 'public'
"""
FUNCTIONS = """
SELECT DISTINCT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public'
"""


def previous_release(tmp_path: Path) -> Path:
    """The previous release's `services` and `libs`, extracted under `tmp_path`; skips
    where this checkout lacks its commit (a shallow clone, a source archive)."""
    lines = RELEASE_FILE.read_text(encoding="utf-8").splitlines()
    commit = next(line.split()[0] for line in lines if line.strip() and line[0] != "#")
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed: the previous release cannot be extracted")
    probe = subprocess.run(
        [git, "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(
            f"this checkout lacks the previous release's commit {commit} "
            "(deploy/releases/previous): a shallow clone? `git fetch --unshallow` lets "
            "this test run"
        )
    archive = subprocess.run(
        [git, "-C", str(REPO), "archive", "--format=tar", commit, "services", "libs"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    tree = tmp_path / "previous"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    # its processes import its code, not this tree's (installed in the virtualenv too)
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import services.coordinator, workshop.kit; "
            "print(services.coordinator.__file__); print(workshop.kit.__file__)",
        ],
        cwd=tree,
        env={**os.environ, **coordinator_env(tree, "")},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert all(Path(line).is_relative_to(tree) for line in imported.stdout.splitlines()), imported
    return tree


def coordinator_env(tree: Path, dsn: str) -> dict[str, str]:
    """The coordinator of `tree` (its code first on the path) on `dsn`, on free ports."""
    settings = {
        "DATABASE_URL": dsn,
        "HOST": "127.0.0.1",
        "PORT": "0",
        "DRAIN_SECONDS": "0",
        "GRACE_SECONDS": "1",
        "SCHEDULER_INTERVAL_SECONDS": "0",
    }
    return {
        "PYTHONPATH": f"{tree / 'libs'}{os.pathsep}{tree}",
        **{f"COORDINATOR_{key}": value for key, value in settings.items()},
    }


async def migrate(tree: Path, dsn: str, *args: str) -> dict[str, Any]:
    """`python -m services.coordinator migrate ARGS` of `tree`; its `migrated` line."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "services.coordinator", "migrate", *args],
        cwd=tree,
        env={**os.environ, **coordinator_env(tree, dsn)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    migrated = [line for line in lines if line.get("event") == "migrated"]
    assert len(migrated) == 1, done.stdout
    line: dict[str, Any] = migrated[0]
    return line


@contextlib.asynccontextmanager
async def serving(
    tree: Path, dsn: str, log: Path
) -> AsyncIterator[tuple[ServiceProcess, CoordinatorHarness]]:
    """The coordinator of `tree` as a process, and a harness of stubs on it; stopped (by its
    PID) however the body ends."""
    service = ServiceProcess("services.coordinator", coordinator_env(tree, dsn), log, cwd=tree)
    try:
        port = int((await asyncio.to_thread(service.wait_event, "serving", 60))["port"])
        async with coordinator_client(dsn, port) as harness:
            yield service, harness
    finally:
        service.stop()


async def catalog(dsn: str, query: str) -> set[str]:
    connection = await asyncpg.connect(dsn)
    try:
        return {row[0] for row in await connection.fetch(query)}
    finally:
        await connection.close()


def functions_called(tree: Path) -> set[str]:
    """Names that `tree`'s coordinator SQL calls and its migrations define."""
    coordinator = tree / "services" / "coordinator"
    named = [p for p in coordinator.glob("*/*.sql") if p.parent.name != "migrations"]  # sql/, rooms
    text = "\n".join(p.read_text(encoding="utf-8") for p in named)
    called = set(re.findall(r"\b([a-z_][a-z0-9_]*)\s*\(", re.sub(r"--[^\n]*", "", text)))
    migrations = "\n".join(  # files and folders (release 0.1's baseline is one)
        p.read_text(encoding="utf-8") for p in (coordinator / "migrations").rglob("*.sql")
    )
    defined = set(re.findall(r"CREATE (?:OR REPLACE )?FUNCTION ([a-z_][a-z0-9_]*)", migrations))
    return called & defined


async def run_counts(c: CoordinatorHarness, run_id: str) -> tuple[int, int, int]:
    """(jobs completed, jobs total, frames committed) of a run as `c` reports it."""
    detail = (await c.workshop.GetRun(ws.GetRunRequest(run_id=run_id), metadata=c.admin)).detail
    counts = detail.run.counts
    return counts.jobs_completed, counts.jobs_total, counts.slots_frame


async def progress(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, percent: int) -> int:
    reply = await c.jobs.ReportProgress(
        jobs_pb2.ReportProgressRequest(lease=job.lease, percent=percent), metadata=s.processor
    )
    return reply.percent


async def complete(
    c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, result: jobs_pb2.JobResult
) -> jobs_pb2.CompleteResponse:
    reply: jobs_pb2.CompleteResponse = await c.jobs.Complete(
        complete_request(job, result), metadata=s.processor
    )
    return reply


@pytest.fixture
async def empty_dsn(pg_cluster: PostgresCluster) -> AsyncIterator[str]:
    """A new, empty database (no migrations), dropped afterwards."""
    name = f"rolling_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_cluster.admin_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {quote_ident(name)}")
    finally:
        await admin.close()
    try:
        yield pg_cluster.dsn(name)
    finally:
        admin = await asyncpg.connect(pg_cluster.admin_dsn)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
        finally:
            await admin.close()


@pytest.mark.slow
async def test_the_previous_release_serves_beside_this_one_through_the_upgrade(
    empty_dsn: str, tmp_path: Path
) -> None:
    dsn = empty_dsn
    old_tree = previous_release(tmp_path)
    old_versions = {m.version for m in list_migrations(old_tree / MIGRATIONS_DIR.relative_to(REPO))}
    old_level = max(old_versions)
    new = [m for m in list_migrations() if m.version not in old_versions]
    new_pre = [m.label for m in new if m.phase == "pre"]
    new_post = [m.label for m in new if m.phase == "post"]

    # version N: its own migrations (all of them: its rollout is long finished)
    await migrate(old_tree, dsn)
    if "--phase" in (old_tree / "services" / "coordinator" / "__main__.py").read_text():
        await migrate(old_tree, dsn, "--phase", "post")
    before = await catalog(dsn, CATALOG)

    async with serving(old_tree, dsn, tmp_path / "old.log") as (old, a):
        s = await setup(a)  # the world, built through N
        await create_run(a, s, "r1")  # a full run, jobs j0 and j1
        j0 = await claimed(a, s)

        # step 1: pre-migrate while N serves
        pre = await migrate(REPO, dsn)
        assert (pre["phase"], pre["applied"], pre["pending"]) == ("pre", new_pre, new_post)
        kept = await catalog(dsn, CATALOG)
        assert before - kept == set(), "a pre-migration dropped or changed what N uses"
        assert functions_called(REPO) <= await catalog(dsn, FUNCTIONS)
        assert await progress(a, s, j0, 10) == 10  # N still serves its lease

        # step 2: N+1 starts beside N
        async with serving(REPO, dsn, tmp_path / "new.log") as (new_service, b):
            # claimed on N, reported and completed through N+1; N answers the receipt again
            assert await progress(b, s, j0, 60) == 60
            done = await complete(b, s, j0, empty_result(j0))
            assert not done.already_committed
            again = await complete(a, s, j0, empty_result(j0))
            assert again.already_committed
            assert again.receipt == done.receipt

            # claimed on N+1, uploads staged, renewed and reported through N, completed
            # through N; N+1 answers the receipt again
            j1 = await claimed(b, s)
            assert (j1.lease.run_id, j1.lease.job_id) == ("r1", "j1")
            # N may serve its Complete: it takes recorded boxes too (every release from 0.1)
            assert j1.takes_recorded_boxes
            result = await frame_result(a, s, j1)
            # a processor of this tree renews through N: N has no Session stream, so its
            # transport falls back to unary (once, for good) and the call is answered
            on_old = SessionJobs(jobs_pb2_grpc.JobServiceStub(a.channel))
            renewed = await on_old.Heartbeat(
                jobs_pb2.HeartbeatRequest(lease=j1.lease), metadata=s.processor
            )
            assert renewed.HasField("lease_expires_at")
            assert on_old.unary
            await on_old.close()
            assert await progress(a, s, j1, 90) == 90
            committed = await complete(a, s, j1, result)
            assert committed.receipt.items_saved == 2
            assert (await complete(b, s, j1, result)).receipt == committed.receipt
            assert await run_counts(a, "r1") == await run_counts(b, "r1") == (2, 2, 2)

            # a run created on N+1 is claimed on N and completed through N+1
            await create_run(b, s, "r2")
            k0 = await claimed(a, s)
            assert k0.lease.run_id == "r2"
            await complete(b, s, k0, empty_result(k0))
            assert (await run_counts(a, "r2"))[0] == 1

            # step 4 too early: refused while N is connected (N names its connections
            # from the release after 1677730 on, docs/upgrading.md#rolling-upgrade)
            if new_post and "application_name" in (old_tree / MIGRATE_MODULE).read_text():
                with pytest.raises(MigrationRefused, match=rf"pid \d+ .*{old_level:04d}"):
                    await migrate_in_process(dsn, "post", wait_seconds=0)

            # step 4: every replica runs N+1; post-migrate while it serves
            assert old.stop() == 0, old.log_tail()
            post = await migrate(REPO, dsn, "--phase", "post")
            assert (post["applied"], post["pending"]) == (new_post, [])
            assert functions_called(REPO) <= await catalog(dsn, FUNCTIONS)

            k1 = await claimed(b, s)
            assert (k1.lease.run_id, k1.lease.job_id) == ("r2", "j1")
            assert await progress(b, s, k1, 50) == 50
            # and through N+1 on its Session stream
            on_new = SessionJobs(jobs_pb2_grpc.JobServiceStub(b.channel))
            reported = await on_new.ReportProgress(
                jobs_pb2.ReportProgressRequest(lease=k1.lease, percent=60), metadata=s.processor
            )
            assert reported.percent == 60
            assert (on_new.unary, on_new.streams_opened) == (False, 1)
            await on_new.close()
            beat = await b.jobs.Heartbeat(
                jobs_pb2.HeartbeatRequest(leases=[k1.lease]), metadata=s.processor
            )
            assert [renewal.renewed for renewal in beat.renewals] == [True]
            assert not (await complete(b, s, k1, empty_result(k1))).already_committed
            await create_run(b, s, "r3")
            assert (await claimed(b, s)).lease.run_id == "r3"
            detail = await b.workshop.GetRun(ws.GetRunRequest(run_id="r2"), metadata=b.admin)
            assert detail.detail.run.status == common_pb2.RUN_STATUS_COMPLETED
            assert new_service.stop() == 0, new_service.log_tail()
