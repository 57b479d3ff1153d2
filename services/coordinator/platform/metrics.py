"""The coordinator's own series (docs/metrics.md); RPC series come from the kit, and
the jobs and runtime gauges are read at scrape time (services/coordinator/leases/gauges.py,
services/coordinator/resources/gauges.py)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from workshop.kit.metrics import LATENCY_BUCKETS, REGISTRY

CLAIM_SECONDS = Histogram(
    "workshop_coordinator_claim_seconds",
    "Seconds one claim attempt takes (the job_claim statement and the run's snapshot), "
    "not the long poll's wait for a job; a Complete's next claim made in its commit's "
    "statement counts that whole statement.",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
LEASE_LAPSES = Counter(
    "workshop_coordinator_lease_lapses",
    "Leases that lapsed and were taken back by maintenance: the job queued again "
    "(requeued) or failed after its last attempt (exhausted).",
    ["outcome"],
    registry=REGISTRY,
)
FENCE_REFUSALS = Counter(
    "workshop_coordinator_fence_refusals",
    "Calls refused by a fence (docs/leases-and-fences.md), by reason.",
    ["reason"],
    registry=REGISTRY,
)
PREVIEWS_RECORDED = Counter(
    "workshop_coordinator_previews_recorded",
    "Previews recorded for jobs (RecordPreview, RecordPreviews), refusals not counted.",
    registry=REGISTRY,
)
COMMIT_BOXES = Counter(
    "workshop_coordinator_commit_boxes",
    "Commits whose items left their boxes to their previews' records, by where the "
    "grouping read those boxes: remembered (this coordinator recorded them and their rows "
    "are unchanged) or rows (read back from the rows: recorded by another replica, one by "
    "one, or again since).",
    ["source"],
    registry=REGISTRY,
)
RUNS_CREATED = Counter(
    "workshop_coordinator_runs_created",
    "Runs created (a CreateRun or RequestPhoto answered with an existing run is not counted), "
    "by kind (workflow, photo) and mode (test, full).",
    ["kind", "mode"],
    registry=REGISTRY,
)
for _kind, _mode in (("workflow", "test"), ("workflow", "full"), ("photo", "test")):
    RUNS_CREATED.labels(_kind, _mode)  # every series from the start, at 0
