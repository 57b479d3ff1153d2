"""The prod-gpu KEDA trigger's PromQL, as rendered, over a real coordinator's scrape: it
counts the jobs the pool's runtime holds or could claim now, one run at a time, never the
runs queued behind, and each job once however many coordinator replicas report it.
promtool evaluates the query (tests/promtool.py) over the series the coordinator's
/metrics answers, as two replicas' scrapes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.coordinator.leases.maintenance import Maintenance
from services.coordinator.platform.clock import FrozenClock
from testbed.coordinator_leases import Setup, create_run, setup
from testbed.coordinator_world import DAY, run_request, stamp
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from tests.deploy_render import named, rendered
from tests.promtool import Sample, assert_evaluates
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import workshop_pb2 as ws

POOL_DEVICE = 'device="gpu-pool"'
NEW_CODE = "d1" * 32
REPLICAS = ("coordinator-0", "coordinator-1")


@pytest.fixture
async def coordinator(pg_dsn: str) -> AsyncIterator[CoordinatorHarness]:
    async with running_coordinator(pg_dsn, clock=FrozenClock(datetime.now(UTC))) as harness:
        yield harness


def scaling_query() -> str:
    """The ScaledObject's query, pointed at the test world's device instead of the pool's."""
    scaled = named(rendered("overlays/prod-gpu"), "ScaledObject", "processor")
    query: str = scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert query.count(POOL_DEVICE) == 1
    return query.replace(POOL_DEVICE, 'device="gpu-box"')


async def scraped(c: CoordinatorHarness) -> list[Sample]:
    """The coordinator's gauges as two replicas' scrapes report them (instance labels)."""
    async with httpx.AsyncClient() as client:
        answer = await client.get(f"http://127.0.0.1:{c.metrics_port}/metrics")
    assert answer.status_code == 200
    return [
        (sample.name, {**sample.labels, "instance": replica, "job": "coordinator"}, sample.value)
        for family in text_string_to_metric_families(answer.text)
        if family.type == "gauge" and family.name.startswith("workshop_coordinator_")
        for sample in family.samples
        for replica in REPLICAS
    ]


async def assert_demand(c: CoordinatorHarness, expected: int, tmp_path: Path) -> None:
    assert_evaluates(scaling_query(), await scraped(c), expected, tmp_path)


async def register_newer_runtime(c: CoordinatorHarness) -> str:
    """A runtime on gpu-box registered after the world's: the image being rolled out."""
    c.clock.advance(timedelta(seconds=1))
    reply = await c.operator.RegisterRuntime(
        op.RegisterRuntimeRequest(
            device_id="gpu-box",
            engine="workshop-processor",
            code_sha256=NEW_CODE,
            capabilities=["workshop-v3"],
        ),
        metadata=c.admin,
    )
    runtime: str = reply.runtime.runtime_id
    return runtime


async def claim(c: CoordinatorHarness, s: Setup, runtime: str) -> jobs_pb2.ClaimedJob:
    reply = await c.jobs.Claim(
        jobs_pb2.ClaimRequest(runtime_id=runtime, code_sha256=NEW_CODE), metadata=s.processor
    )
    assert reply.HasField("job")
    return reply.job


async def test_counts_the_head_run_of_the_newest_runtime(
    coordinator: CoordinatorHarness, tmp_path: Path
) -> None:
    c = coordinator
    s = await setup(c)
    await assert_demand(c, 0, tmp_path)
    await create_run(c, s, "old")  # the older runtime's two jobs: another image's work
    runtime = await register_newer_runtime(c)
    await assert_demand(c, 0, tmp_path)
    full = common_pb2.RUN_MODE_FULL
    for run_id in ("r1", "r2"):
        await c.workshop.CreateRun(
            run_request(run_id, "yard", runtime, mode=full), metadata=c.admin
        )
    # two jobs a run (one a recording); r2 waits behind r1 on the same runtime
    await assert_demand(c, 2, tmp_path)

    job = await claim(c, s, runtime)
    assert job.lease.run_id == "r1"
    await assert_demand(c, 2, tmp_path)  # one leased, one claimable: both need a processor

    # a photo job is claimable whatever run is the head (the claim just marked the new
    # runtime seen, so the photo goes to it)
    photo = ws.RequestPhotoRequest(camera_id="cam-a", time=stamp(DAY + timedelta(hours=8)))
    reply = await c.workshop.RequestPhoto(photo, metadata=c.admin)
    async with c.db.connection() as connection:
        assert (
            await connection.fetchval(
                "SELECT runtime_id FROM jobs WHERE run_id = $1", reply.photo.photo_id
            )
            == runtime
        )
    await assert_demand(c, 3, tmp_path)

    async with c.db.connection() as connection:  # r1's queued job passes its expiry
        await connection.execute(
            "UPDATE jobs SET expires_at = $1 WHERE run_id = 'r1' AND state = 'queued'",
            c.clock.now() - timedelta(seconds=1),
        )
    # maintenance expires it (every COORDINATOR_MAINTENANCE_INTERVAL_SECONDS, 5 s)
    assert (await Maintenance(c.db, c.clock, interval_seconds=1).run_once()).expired == 1
    await assert_demand(c, 2, tmp_path)

    await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)
    await assert_demand(c, 3, tmp_path)  # r2 is the head now, beside the photo
