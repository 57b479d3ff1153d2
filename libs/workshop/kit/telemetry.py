"""Logging and tracing set-up shared by every service process."""

from __future__ import annotations

import logging
import os
import sys

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

    With OTEL_TRACES_EXPORTER unset (the default) the OpenTelemetry API stays a
    no-op and the server interceptor costs almost nothing. `console` prints spans
    on stderr; any other exporter is wired by `opentelemetry-instrument` in the
    container image, which sets its own provider before we get here.
    """
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() != "console":
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    trace.set_tracer_provider(provider)


def tracing_enabled() -> bool:
    """Whether a real tracer provider is installed (ours, or opentelemetry-instrument's).

    Without one every span is a no-op, so servers skip the tracing interceptor and
    its per-call cost altogether.
    """
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
