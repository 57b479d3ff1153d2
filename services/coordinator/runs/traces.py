"""The trace context a run was created in (docs/metrics.md#traces): kept with the run
while tracing is on, so that each of its job attempts' traces links to the CreateRun's
(leases.timeline). With tracing off nothing is written."""

from __future__ import annotations

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.coordinator.platform.db import Connection, sql
from workshop.kit.telemetry import tracing_enabled


def current_traceparent() -> str | None:
    """The W3C traceparent of the span this call runs in (None: tracing off, or no span)."""
    if not tracing_enabled():
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


async def record_trace(connection: Connection, run_id: str) -> None:
    """Keeps the creating call's trace context with the new run `run_id`, in its transaction."""
    traceparent = current_traceparent()
    if traceparent is not None:
        await connection.execute(sql("runs", "run_trace_insert"), run_id, traceparent)
