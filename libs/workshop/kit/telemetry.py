"""Logging and tracing set-up shared by every service process."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from opentelemetry import trace


def configure_logging(service: str, level: str) -> None:
    """Plain-text logs on stderr, one line per record, prefixed with the service name."""
    logging.basicConfig(
        stream=sys.stderr,
        level=level.upper(),
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )


def configure_tracing(service: str) -> None:
    """Install an SDK tracer provider when the operator asks for one.

    Off by default: with neither OTEL_TRACES_EXPORTER nor an OTLP endpoint set, the
    OpenTelemetry API stays a no-op, servers add no tracing interceptor and nothing is
    exported or logged. `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`, or
    OTEL_TRACES_EXPORTER=otlp) exports spans over OTLP/gRPC in batches, with the
    exporter's own standard variables (headers, timeout, OTEL_BSP_* for the batches);
    `console` prints them on stderr; `none` turns tracing off. A provider installed
    before we get here (`opentelemetry-instrument`) is kept.
    """
    chosen = _exporter_choice()
    if not chosen or tracing_enabled():
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if chosen == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        # Batches, exported off the event loop by the processor's own thread; what is
        # still queued is flushed when the process exits (the provider's atexit hook).
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def _exporter_choice() -> str:
    """`console`, `otlp`, or "" (tracing off), from the standard OTEL_* variables."""
    chosen = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if chosen in ("console", "otlp"):
        return chosen
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    return "otlp" if not chosen and endpoint else ""


def client_interceptors() -> list[Any]:
    """The OpenTelemetry gRPC client interceptors when tracing is on (they carry the trace
    context to the called service), else none: an aio client interceptor costs tens of
    microseconds of CPU per call (workshop.kit.channels)."""
    if not tracing_enabled():
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors())  # type: ignore[no-untyped-call]


def tracing_enabled() -> bool:
    """Whether a real tracer provider is installed (ours, or opentelemetry-instrument's).

    Without one every span is a no-op, so servers skip the tracing interceptor and
    its per-call cost altogether.
    """
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
