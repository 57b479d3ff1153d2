"""COORDINATOR_LEASE_SECONDS: the lease's length (5 minutes unless set) and the heartbeat
interval Claim hands out with it (0.15 of the lease, at most 45 s). The chaos soak
(bench/chaos_soak.py) runs its coordinators with 15 s leases."""

from __future__ import annotations

from datetime import timedelta

import pytest

from services.coordinator.leases.jobs import JobsApi, heartbeat_interval, lease_from
from services.coordinator.runs.events import RunEvents
from services.coordinator.runs.snapshots import SnapshotCache
from services.coordinator.servicers.common import Authenticator
from services.coordinator.servicers.jobs import claim_response
from services.coordinator.settings import PREFIX, CoordinatorSettings
from testbed.coordinator_leases import create_run, setup
from testbed.coordinator_world import CODE
from testbed.harness.coordinator import CoordinatorHarness
from workshop.kit.settings import SettingsError, load_settings

DSN = {"COORDINATOR_DATABASE_URL": "postgresql://workshop@db/workshop"}


def test_the_setting_defaults_to_five_minutes_and_refuses_less_than_ten_seconds() -> None:
    assert load_settings(CoordinatorSettings, PREFIX, DSN).lease_seconds == 300
    short = {**DSN, "COORDINATOR_LEASE_SECONDS": "15"}
    assert load_settings(CoordinatorSettings, PREFIX, short).lease_seconds == 15
    with pytest.raises(SettingsError, match="COORDINATOR_LEASE_SECONDS"):
        load_settings(CoordinatorSettings, PREFIX, {**DSN, "COORDINATOR_LEASE_SECONDS": "5"})


def test_the_heartbeat_interval_follows_a_shorter_lease() -> None:
    assert heartbeat_interval(timedelta(minutes=5)) == timedelta(seconds=45)
    assert heartbeat_interval(timedelta(hours=1)) == timedelta(seconds=45)
    assert heartbeat_interval(timedelta(seconds=20)) == timedelta(seconds=3)


async def test_a_shorter_lease_is_claimed_renewed_and_answered(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s = await setup(c)
    await create_run(c, s)
    api = JobsApi(
        c.db, c.clock, SnapshotCache(c.db), RunEvents(c.db.dsn), lease=timedelta(seconds=20)
    )
    processor = await Authenticator(c.db, c.clock).principal(s.processor_secret)
    claimed = await api.claim(processor, s.world.tracking_runtime, CODE)
    assert claimed is not None
    job = claimed.job
    assert job.lease_expires_at == c.clock.now() + timedelta(seconds=20)
    answer = claim_response([claimed], api.heartbeat_interval)
    assert answer.job.heartbeat_interval.ToTimedelta() == timedelta(seconds=3)
    lease = lease_from(job.run_id, f"j{job.job_index}", job.generation, str(job.lease_token))
    await c.clock.forward(timedelta(seconds=10))
    renewed = await api.heartbeat(processor, lease)
    assert renewed == c.clock.now() + timedelta(seconds=20)
