"""A run's timeline (docs/runs-and-jobs.md, "A run's timeline"): each job's attempts in
order, as migration 0011's `job_attempts` records them from the jobs' own writes (a claim
begins an attempt, the lease's end closes it, a fence's refusal is counted on it), and one
OpenTelemetry trace per ended attempt, linked to the trace of the CreateRun that made its
run (docs/metrics.md#traces).

Nothing here runs on the claim, renewal or frame paths: the rows are the trigger's, and a
span is read and exported after an attempt ends, only while tracing is on, off the
caller's answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.coordinator.identity import auth
from services.coordinator.identity.auth import Principal, ScopeName
from services.coordinator.leases.jobs import heartbeat_interval, job_id
from services.coordinator.platform.db import Database, Row, fetch_all, fetch_one, sql
from services.coordinator.platform.errors import NotFound
from workshop.kit.telemetry import tracing_enabled

log = logging.getLogger(__name__)

TRACER = "workshop.coordinator.attempts"
# An attempt that ended: run id, job index, lease generation (None: the job's latest lapsed
# one, as a maintenance pass's rescue names it).
Ended = tuple[str, int, int | None]
# Attempt spans exported at once at most; more wait (their ends are rare: one per job).
SPANS_IN_FLIGHT = 64


@dataclasses.dataclass(frozen=True, slots=True)
class TimelineRow(Row):
    """One attempt of a job of the page, or a job without one (generation None)."""

    job_index: int
    state: str
    camera_id: str
    recording_id: str
    runtime_id: str
    lapses: int
    failure_reason: str | None
    failure_message: str | None
    device_id: str | None
    generation: int | None
    claimed_by: str | None
    claimed_at: datetime | None
    lease_seconds: float | None
    ended_at: datetime | None
    outcome: str | None
    attempt_failure_reason: str | None
    lease_until: datetime | None
    refusals: dict[str, int] | None


@dataclasses.dataclass(frozen=True, slots=True)
class TimelineRunRow(Row):
    run_id: str
    runtime_id: str
    traceparent: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class AttemptRow(Row):
    """An attempt as its span shows it."""

    run_id: str
    job_index: int
    generation: int
    runtime_id: str
    claimed_by: str | None
    claimed_at: datetime
    lease_seconds: float
    ended_at: datetime | None
    outcome: str | None
    failure_reason: str | None
    lease_until: datetime | None
    refusals: dict[str, int]
    traceparent: str | None


@dataclasses.dataclass(frozen=True)
class Attempt:
    generation: int
    claimed_by: str
    runtime_id: str
    device_id: str
    claimed_at: datetime
    ended_at: datetime | None
    outcome: str  # "running" while held
    lease_until: datetime | None
    heartbeats_missed: int
    refusals: dict[str, int]
    failure_reason: str | None


@dataclasses.dataclass(frozen=True)
class JobTimeline:
    job_index: int
    state: str
    camera_id: str
    recording_id: str
    lapses: int
    failure_reason: str | None
    failure_message: str | None
    attempts: list[Attempt]

    @property
    def job_id(self) -> str:
        return job_id(self.job_index)


def heartbeats_missed(
    outcome: str | None,
    lease_seconds: float,
    lease_until: datetime | None,
    ended_at: datetime | None,
) -> int:
    """A lapsed attempt's heartbeats due between its last renewal (its lease's end less
    the lease) and its rescue; 0 for any other. Renewals are not recorded one by one (a
    heartbeat writes nothing here), so the last one is inferred from the lease's end."""
    if outcome != "lapsed" or lease_until is None or ended_at is None or lease_seconds <= 0:
        return 0
    lease = timedelta(seconds=lease_seconds)
    return int((ended_at - (lease_until - lease)) / heartbeat_interval(lease))


def timelines(rows: Iterable[TimelineRow]) -> list[JobTimeline]:
    """The page's rows (one per attempt, in job and generation order) as jobs."""
    jobs: dict[int, JobTimeline] = {}
    for row in rows:
        job = jobs.get(row.job_index)
        if job is None:
            job = jobs[row.job_index] = JobTimeline(
                row.job_index,
                row.state,
                row.camera_id,
                row.recording_id,
                row.lapses,
                row.failure_reason,
                row.failure_message,
                [],
            )
        if row.generation is None or row.claimed_at is None:
            continue
        job.attempts.append(
            Attempt(
                generation=row.generation,
                claimed_by=row.claimed_by or "",
                runtime_id=row.runtime_id,
                device_id=row.device_id or "",
                claimed_at=row.claimed_at,
                ended_at=row.ended_at,
                outcome=row.outcome or "running",
                lease_until=row.lease_until,
                heartbeats_missed=heartbeats_missed(
                    row.outcome, row.lease_seconds or 0.0, row.lease_until, row.ended_at
                ),
                refusals=dict(row.refusals or {}),
                failure_reason=row.attempt_failure_reason,
            )
        )
    return list(jobs.values())


class Timelines:
    """Reads runs' timelines, and exports each ended attempt as a trace while tracing is on."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._exporting: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(SPANS_IN_FLIGHT)

    async def page(
        self, who: Principal, run_id: str, after_index: int, limit: int
    ) -> list[JobTimeline]:
        auth.require(who, ScopeName.WORKSHOP)
        async with self.db.connection() as connection:
            run = await fetch_one(
                connection, TimelineRunRow, sql("timeline", "timeline_run"), run_id
            )
            if run is None:
                raise NotFound("run", run_id, f"Run {run_id!r} does not exist.")
            rows = await fetch_all(
                connection,
                TimelineRow,
                sql("timeline", "timeline_page"),
                run_id,
                after_index,
                limit,
            )
        return timelines(rows)

    # traces ------------------------------------------------------------------------------

    def ended(self, attempts: Sequence[Ended]) -> None:
        """Attempts (run, job index, generation) that just ended: each one's span is read
        and exported in the background when tracing is on; nothing otherwise."""
        if not attempts or not tracing_enabled():
            return
        task = asyncio.get_running_loop().create_task(self._export(list(attempts)))
        self._exporting.add(task)
        task.add_done_callback(self._exporting.discard)

    async def _export(self, attempts: list[Ended]) -> None:
        async with self._slots:
            try:
                async with self.db.connection() as connection:
                    for run_id, job_index, generation in attempts:
                        row = await fetch_one(
                            connection,
                            AttemptRow,
                            sql("timeline", "job_attempt_of"),
                            run_id,
                            job_index,
                            generation,
                        )
                        if row is not None and row.ended_at is not None:
                            export_span(row)
            except Exception:  # a span is never worth an error: the attempt stands
                log.warning("attempt spans: could not export %s", attempts, exc_info=True)


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def creation_link(traceparent: str | None) -> list[trace.Link]:
    """A link to the span of the CreateRun that made the run, when it recorded one."""
    if not traceparent:
        return []
    carrier = {"traceparent": traceparent}
    found = trace.get_current_span(TraceContextTextMapPropagator().extract(carrier))
    span_context = found.get_span_context()
    if not span_context.is_valid:
        return []
    return [trace.Link(span_context, {"workshop.link": "run.created"})]


def export_span(row: AttemptRow) -> None:
    """One trace of its own per attempt: a root span from the claim to the attempt's end,
    linked to its run's creation, with an event per fence refusal reason."""
    assert row.ended_at is not None
    attributes: dict[str, Any] = {
        "workshop.run_id": row.run_id,
        "workshop.job_id": job_id(row.job_index),
        "workshop.lease.generation": row.generation,
        "workshop.runtime_id": row.runtime_id,
        "workshop.claimed_by": row.claimed_by or "",
        "workshop.attempt.outcome": row.outcome or "",
        "workshop.heartbeats_missed": heartbeats_missed(
            row.outcome, row.lease_seconds, row.lease_until, row.ended_at
        ),
    }
    if row.failure_reason:
        attributes["workshop.failure_reason"] = row.failure_reason
    span = trace.get_tracer(TRACER).start_span(
        "job attempt",
        context=otel_context.Context(),  # a trace of its own, not the ending call's
        kind=trace.SpanKind.INTERNAL,
        attributes=attributes,
        links=creation_link(row.traceparent),
        start_time=_ns(row.claimed_at),
    )
    span.add_event("claimed", {"workshop.claimed_by": row.claimed_by or ""}, _ns(row.claimed_at))
    for reason, count in sorted(row.refusals.items()):
        span.add_event(
            "fence refused", {"workshop.reason": reason, "workshop.count": count}, _ns(row.ended_at)
        )
    span.add_event(row.outcome or "ended", {}, _ns(row.ended_at))
    if row.outcome in ("failed", "lapsed"):
        span.set_status(trace.Status(trace.StatusCode.ERROR, row.failure_reason or row.outcome))
    span.end(end_time=_ns(row.ended_at))
