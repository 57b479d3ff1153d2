"""The coordinator's scrape-time gauges (docs/metrics.md): the claimable queue depth per
runtime with every state at 0 where a runtime has none, the runs in progress, when each
runtime last checked in and which is each device's newest, read from a real coordinator's
/metrics; and the bound on how often a scrape reads the database."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import httpx
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from services.coordinator.leases.gauges import JobsByState
from testbed.coordinator_leases import claimed, create_run, setup
from testbed.harness.coordinator import CoordinatorHarness
from workshop.kit.metrics import Cached

Gauges = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def gauges(c: CoordinatorHarness) -> Gauges:
    async with httpx.AsyncClient() as client:
        answer = await client.get(f"http://127.0.0.1:{c.metrics_port}/metrics")
    assert answer.status_code == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        if family.type == "gauge"
        for sample in family.samples
    }


def value(found: Gauges, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


async def test_queue_depth_and_runs_per_runtime_with_zeros(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await setup(c)
    runtime = s.world.tracking_runtime
    before = await gauges(c)
    assert value(before, "workshop_coordinator_claimable_jobs", runtime=runtime) is None
    await create_run(c, s, "r1")
    await create_run(c, s, "r2")  # waits behind r1: queued, not claimable
    queued = await gauges(c)
    assert value(queued, "workshop_coordinator_claimable_jobs", runtime=runtime) == 2
    assert value(queued, "workshop_coordinator_jobs", runtime=runtime, state="queued") == 4
    # every state of a runtime with unfinished jobs, at 0 where it has none
    assert value(queued, "workshop_coordinator_jobs", runtime=runtime, state="leased") == 0
    assert value(queued, "workshop_coordinator_runs_unfinished", runtime=runtime) == 2
    await claimed(c, s)
    await claimed(c, s)
    leased = await gauges(c)
    assert value(leased, "workshop_coordinator_claimable_jobs", runtime=runtime) == 0
    assert value(leased, "workshop_coordinator_jobs", runtime=runtime, state="leased") == 2
    assert value(leased, "workshop_coordinator_jobs", runtime=runtime, state="queued") == 2


async def test_runtimes_last_seen_and_each_devices_newest(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await setup(c)
    world = s.world
    # both runtimes of gpu-box were registered at once: the newest is the greater id
    newest = max(world.tracking_runtime, world.plain_runtime)
    found = await gauges(c)
    assert (
        value(found, "workshop_coordinator_device_newest_runtime", device="gpu-box", runtime=newest)
        == 1
    )
    seen = "workshop_coordinator_runtime_last_seen_timestamp_seconds"
    assert value(found, seen, runtime=world.tracking_runtime, device="gpu-box") is None
    await create_run(c, s)
    await claimed(c, s)  # a claim marks the runtime seen, at the coordinator's clock
    seen_at = c.clock.now().timestamp()
    found = await gauges(c)
    assert value(found, seen, runtime=world.tracking_runtime, device="gpu-box") == seen_at
    # a runtime last seen more than a week ago leaves the scrape (each release is one),
    # unless it is its device's newest
    c.clock.advance(timedelta(days=8))
    found = await gauges(c)
    kept = seen_at if world.tracking_runtime == newest else None
    assert value(found, seen, runtime=world.tracking_runtime, device="gpu-box") == kept


class Counting:
    def __init__(self, inner: JobsByState) -> None:
        self.inner = inner
        self.reads = 0

    async def collect_now(self) -> Iterable[Metric]:
        self.reads += 1
        return await self.inner.collect_now()


def claimable(metrics: Iterable[Metric]) -> float:
    [family] = [m for m in metrics if m.name == "workshop_coordinator_claimable_jobs"]
    assert isinstance(family, GaugeMetricFamily)
    return sum(sample.value for sample in family.samples)


async def test_scrapes_within_the_max_age_share_one_read(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await setup(c)
    now = [100.0]
    counting = Counting(JobsByState(c.db))
    cached = Cached(counting, 5.0, monotonic=lambda: now[0])
    await create_run(c, s, "r1")
    assert claimable(await cached.collect_now()) == 2
    await claimed(c, s)
    now[0] += 4.9  # within the max age: the first read's answer, no query
    assert claimable(await cached.collect_now()) == 2
    assert counting.reads == 1
    now[0] += 0.1
    assert claimable(await cached.collect_now()) == 1
    assert counting.reads == 2
    uncached = Cached(counting, 0.0)  # 0: every scrape reads
    await uncached.collect_now()
    await uncached.collect_now()
    assert counting.reads == 4
