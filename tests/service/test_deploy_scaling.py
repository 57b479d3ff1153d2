"""The prod-gpu KEDA query, as rendered, on the real schema: it counts the jobs the pool's
runtime holds or could claim now, one run at a time, never the runs queued behind."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from services.coordinator.platform.clock import FrozenClock
from testbed.coordinator_leases import Setup, create_run, setup
from testbed.coordinator_world import DAY, run_request, stamp
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from tests.deploy_render import named, rendered
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import workshop_pb2 as ws

POOL_DEVICE = "device_id = 'gpu-pool'"
NEW_CODE = "d1" * 32


@pytest.fixture
async def coordinator(pg_dsn: str) -> AsyncIterator[CoordinatorHarness]:
    # The query reads Postgres's now(): the coordinator's clock must stand at real time.
    async with running_coordinator(pg_dsn, clock=FrozenClock(datetime.now(UTC))) as harness:
        yield harness


def scaling_query() -> str:
    """The ScaledObject's query, pointed at the test world's device instead of the pool's."""
    scaled = named(rendered("overlays/prod-gpu"), "ScaledObject", "processor")
    query: str = scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert query.count(POOL_DEVICE) == 1
    return query.replace(POOL_DEVICE, "device_id = 'gpu-box'")


async def demand(c: CoordinatorHarness) -> int:
    async with c.db.connection() as connection:
        value: int = await connection.fetchval(scaling_query())
        return value


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


async def test_counts_the_head_run_of_the_newest_runtime(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await setup(c)
    assert await demand(c) == 0
    await create_run(c, s, "old")  # the older runtime's two jobs: another image's work
    runtime = await register_newer_runtime(c)
    assert await demand(c) == 0
    full = common_pb2.RUN_MODE_FULL
    for run_id in ("r1", "r2"):
        await c.workshop.CreateRun(
            run_request(run_id, "yard", runtime, mode=full), metadata=c.admin
        )
    # two jobs a run (one a recording); r2 waits behind r1 on the same runtime
    assert await demand(c) == 2

    job = await claim(c, s, runtime)
    assert job.lease.run_id == "r1"
    assert await demand(c) == 2  # one leased, one claimable: both need a processor

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
    assert await demand(c) == 3

    async with c.db.connection() as connection:  # r1's queued job lapses past its expiry
        await connection.execute(
            "UPDATE jobs SET expires_at = now() - interval '1 second' "
            "WHERE run_id = 'r1' AND state = 'queued'"
        )
    assert await demand(c) == 2

    await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)
    assert await demand(c) == 3  # r2 is the head now, beside the photo
