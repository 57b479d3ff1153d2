"""`workshop_coordinator_jobs`: the jobs gauge the coordinator's /metrics reads at scrape time."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from services.coordinator.db import Database, sql


class JobsByState:
    """`workshop_coordinator_jobs{runtime,state}`: unfinished jobs now, read at scrape time
    with one query over the partial indexes of queued and leased jobs. Finished jobs are
    not counted here: that would scan every job ever run on each scrape."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def collect_now(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "workshop_coordinator_jobs",
            "Unfinished jobs now, by runtime and state (queued, leased).",
            labels=["runtime", "state"],
        )
        async with self.db.connection() as connection:
            rows = await connection.fetch(sql("metrics", "jobs_by_state"))
        for row in rows:
            family.add_metric([row["runtime_id"], row["state"]], row["jobs"])
        return [family]
