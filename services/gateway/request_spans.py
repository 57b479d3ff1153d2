"""An ASGI middleware that starts a server span for each HTTP request, when tracing is on.

The span continues a `traceparent` the client sent and is named by the route template
(`POST /v1/workshop/runs`, never a run's id), so the gRPC calls the request makes
(traced by the client interceptors on the gateway's channels) are its children and the
services they reach continue the same trace. WebSockets and lifespan pass untouched.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_tracer = trace.get_tracer("workshop.gateway")


class RequestSpans:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        method = scope["method"]
        with _tracer.start_as_current_span(
            method,
            context=propagate.extract(headers),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method},
        ) as span:

            async def sending(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status: int = message["status"]
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            try:
                await self.app(scope, receive, sending)
            finally:
                route: Any = scope.get("route")  # set by the router once it matched
                if route is not None and hasattr(route, "path"):
                    span.update_name(f"{method} {route.path}")
                    span.set_attribute("http.route", route.path)
