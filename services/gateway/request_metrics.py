"""An ASGI middleware that counts and times the gateway's HTTP requests (docs/metrics.md).

Labelled by the route template the router matched (`/v1/workshop/runs/{run_id}`, never
a run's id; `unmatched` for a path no route serves), so the label set stays bounded.
WebSockets are counted by the live hub's own series instead.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workshop.kit.metrics import LATENCY_BUCKETS, REGISTRY

HTTP_REQUESTS = Counter(
    "workshop_gateway_http_requests",
    "HTTP requests answered, by method, route template and status.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
HTTP_DURATION = Histogram(
    "workshop_gateway_http_duration_seconds",
    "Seconds from a request's arrival to the start of its answer, by method and route.",
    ["method", "route"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)


class RequestMetrics:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        answered: dict[str, Any] = {"status": 500}  # an exception answers 500 outside us

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                answered["status"] = message["status"]
                answered["seconds"] = time.perf_counter() - started
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route: Any = scope.get("route")
            path = route.path if route is not None and hasattr(route, "path") else "unmatched"
            method = scope["method"]
            HTTP_REQUESTS.labels(method, path, str(answered["status"])).inc()
            HTTP_DURATION.labels(method, path).observe(
                answered.get("seconds", time.perf_counter() - started)
            )
