"""The runtime gauges the coordinator's /metrics reads at scrape time, with one query."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import Database, sql

# Runtimes not seen for longer than this are left out of the scrape (each processor
# version is a runtime: the series would grow with every release).
SEEN_WITHIN = timedelta(days=7)


class RuntimeGauges:
    """`workshop_coordinator_runtime_last_seen_timestamp_seconds{runtime,device}`: when each
    runtime seen within SEEN_WITHIN, or newest on its device, last checked in (a claim or a
    renewal; never seen: no series), and `workshop_coordinator_device_newest_runtime{device,
    runtime}` = 1 for each device's newest registered runtime: the runtime a device's pool
    runs, which the processors' KEDA trigger selects the queue depth of."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    async def collect_now(self) -> Iterable[Metric]:
        seen = GaugeMetricFamily(
            "workshop_coordinator_runtime_last_seen_timestamp_seconds",
            "When the runtime last checked in (a claim or a lease renewal), Unix seconds.",
            labels=["runtime", "device"],
        )
        newest = GaugeMetricFamily(
            "workshop_coordinator_device_newest_runtime",
            "1 for each device's newest registered runtime (the one its processors run).",
            labels=["device", "runtime"],
        )
        async with self.db.connection() as connection:
            rows = await connection.fetch(
                sql("resources", "runtime_gauges"), self.clock.now() - SEEN_WITHIN
            )
        for row in rows:
            if row["last_seen_at"] is not None:
                seen.add_metric(
                    [row["runtime_id"], row["device_id"]], row["last_seen_at"].timestamp()
                )
            if row["newest"]:
                newest.add_metric([row["device_id"], row["runtime_id"]], 1)
        return [seen, newest]
