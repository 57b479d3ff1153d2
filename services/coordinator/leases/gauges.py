"""The jobs gauges the coordinator's /metrics reads at scrape time, with one query."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from services.coordinator.platform.db import Database, sql


class JobsByState:
    """`workshop_coordinator_jobs{runtime,state}`: unfinished jobs now (queued, leased),
    `workshop_coordinator_claimable_jobs{runtime}`: the queued jobs a Claim for the
    runtime could take now (the queue depth a processor autoscaler and the alerts follow:
    one run at a time per runtime means queued jobs of later runs wait, however many
    processors there are), and `workshop_coordinator_runs_unfinished{runtime}`: runs with
    queued or leased jobs. Every runtime with an unfinished job has all four series, at 0
    where it has none of a kind, so sums and comparisons across them never miss a side.
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
        runs = GaugeMetricFamily(
            "workshop_coordinator_runs_unfinished",
            "Runs (photos included) with queued or leased jobs now, by runtime.",
            labels=["runtime"],
        )
        async with self.db.connection() as connection:
            rows = await connection.fetch(sql("metrics", "jobs_by_state"))
        counts: dict[str, dict[str, int]] = {}
        for row in rows:
            counts.setdefault(row["runtime_id"], {})[row["state"]] = row["jobs"]
        for runtime, of_runtime in counts.items():
            for state in ("queued", "leased"):
                jobs.add_metric([runtime, state], of_runtime.get(state, 0))
            claimable.add_metric([runtime], of_runtime.get("claimable", 0))
            runs.add_metric([runtime], of_runtime.get("runs", 0))
        return [jobs, claimable, runs]
