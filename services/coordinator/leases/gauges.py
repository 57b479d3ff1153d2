"""The jobs gauges the coordinator's /metrics reads at scrape time, with one query."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from services.coordinator.platform.db import Database, sql


class JobsByState:
    """`workshop_coordinator_jobs{runtime,state}`: unfinished jobs now (queued, leased),
    and `workshop_coordinator_claimable_jobs{runtime}`: the queued jobs a Claim for the
    runtime could take now (what a processor autoscaler follows: one run at a time per
    runtime means queued jobs of later runs wait, however many processors there are).
    Finished jobs are not counted here: that would scan every job ever run on each scrape.
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    async def collect_now(self) -> Iterable[Metric]:
        jobs = GaugeMetricFamily(
            "workshop_coordinator_jobs",
            "Unfinished jobs now, by runtime and state (queued, leased).",
            labels=["runtime", "state"],
        )
        claimable = GaugeMetricFamily(
            "workshop_coordinator_claimable_jobs",
            "Queued jobs a Claim for the runtime could take now: its photo jobs and the "
            "queued jobs of its head run.",
            labels=["runtime"],
        )
        async with self.db.connection() as connection:
            rows = await connection.fetch(sql("metrics", "jobs_by_state"))
        for row in rows:
            if row["state"] == "claimable":
                claimable.add_metric([row["runtime_id"]], row["jobs"])
            else:
                jobs.add_metric([row["runtime_id"], row["state"]], row["jobs"])
        return [jobs, claimable]
