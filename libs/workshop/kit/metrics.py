"""Prometheus metrics: one registry per process and a small `/metrics` endpoint.

Series that code increments as it works (counters, histograms) live in `REGISTRY`, one
per process rather than prometheus-client's global default, so nothing a library
registers there by import ends up in our scrape and the names stay ours. Series that are
state read at scrape time (jobs queued per runtime, sockets open now) come from
`ScrapeCollector`s owned by the one server that reports them, so two servers started
in one process (the test stacks) never register the same series twice.

The endpoint is plain asyncio on the server's event loop: a scrape-time collector may
await the database, and no thread is added to the process. It answers `GET /metrics`
in the text format and 404 to anything else. docs/metrics.md lists every series.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import ParamSpec, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

# Seconds: from a fast unary call (a heartbeat: ~1 ms) to a long-poll Claim (up to 60 s).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

RPC_REQUESTS = Counter(
    "workshop_rpc_requests",
    "gRPC calls answered, by serving process, full method and status code.",
    ["service", "method", "code"],
    registry=REGISTRY,
)
RPC_DURATION = Histogram(
    "workshop_rpc_duration_seconds",
    "Seconds from a call's arrival to its answer (a server stream: its whole life).",
    ["service", "method"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
RPC_REFUSALS = Counter(
    "workshop_rpc_refusals",
    "Calls answered with an error, by the ErrorInfo reason of the error catalog.",
    ["service", "method", "reason"],
    registry=REGISTRY,
)


P = ParamSpec("P")
T = TypeVar("T")


def timed(histogram: Histogram) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """A coroutine function's seconds, each call observed in `histogram` (errors too)."""

    def decorate(function: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        @functools.wraps(function)
        async def measured(*args: P.args, **kwargs: P.kwargs) -> T:
            started = time.perf_counter()
            try:
                return await function(*args, **kwargs)
            finally:
                histogram.observe(time.perf_counter() - started)

        return measured

    return decorate


class ScrapeCollector(Protocol):
    """State read when a scrape arrives (one query, one look at a live structure)."""

    async def collect_now(self) -> Iterable[Metric]: ...


class Cached:
    """A scrape-time collector read at most once per `max_age_seconds`: a scrape within that
    time of the last read answers what it read, and scrapes that arrive while a read is in
    flight share it. So several Prometheus servers, or one scraping every second, cost the
    database one query per `max_age_seconds` at most. 0 reads on every scrape. A read that
    fails is not kept (the next scrape reads again)."""

    def __init__(
        self,
        collector: ScrapeCollector,
        max_age_seconds: float,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.collector = collector
        self.max_age_seconds = max_age_seconds
        self._monotonic = monotonic
        self._read: tuple[float, list[Metric]] | None = None
        self._lock = asyncio.Lock()

    async def collect_now(self) -> Iterable[Metric]:
        if self.max_age_seconds <= 0:
            return await self.collector.collect_now()
        async with self._lock:  # scrapes behind a read in flight take its answer
            if self._read is not None and self._monotonic() - self._read[0] < self.max_age_seconds:
                return self._read[1]
            started = self._monotonic()
            metrics = list(await self.collector.collect_now())
            self._read = (started, metrics)
            return metrics

    def __repr__(self) -> str:
        return f"Cached({self.collector!r}, {self.max_age_seconds:g} s)"


class _Collected:
    """What the scrape-time collectors answered, as something a registry can hold."""

    def __init__(self, metrics: Sequence[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


async def render(collectors: Sequence[ScrapeCollector] = ()) -> bytes:
    """The process's series and those of `collectors`, in the Prometheus text format.

    A collector that fails (the database is down) is logged and left out of this
    scrape; the process's own series are still answered.
    """
    collected: list[Metric] = []
    for collector in collectors:
        try:
            collected.extend(await collector.collect_now())
        except Exception:
            log.warning("metrics: %s failed; left out of this scrape", collector, exc_info=True)
    scraped = CollectorRegistry(auto_describe=False)
    scraped.register(_Collected(collected))
    return generate_latest(REGISTRY) + generate_latest(scraped)


class MetricsEndpoint:
    """`GET /metrics` over HTTP/1.1 on `host:port` (0: a free port), one answer per connection."""

    def __init__(self, host: str, port: int, collectors: Sequence[ScrapeCollector] = ()) -> None:
        self.host = host
        self.port = port
        self.collectors = list(collectors)
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._answer, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 1.0)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            method, _, rest = head.partition(b" ")
            path = rest.partition(b" ")[0].partition(b"?")[0]
            if method in (b"GET", b"HEAD") and path == b"/metrics":
                body = await render(self.collectors)
                status, content_type = b"200 OK", CONTENT_TYPE_LATEST.encode()
            else:
                body = b"Only GET /metrics is served here.\n"
                status, content_type = b"404 Not Found", b"text/plain; charset=utf-8"
            writer.write(
                b"HTTP/1.1 " + status + b"\r\nContent-Type: " + content_type
                + b"\r\nContent-Length: " + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + (body if method != b"HEAD" else b"")
            )  # fmt: skip
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a client that went away or sent no request: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
