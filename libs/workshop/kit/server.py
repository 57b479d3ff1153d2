"""The `serve()` bootstrap shared by every gRPC server process.

Each server gets health (grpc.health.v1, aio), reflection, the RPC metrics
interceptor, an OpenTelemetry interceptor and the error-mapping interceptor, and a
Prometheus `/metrics` endpoint on its own port unless `metrics_port` is -1. On SIGTERM
or SIGINT it reports NOT_SERVING, waits `drain_seconds` so load balancers and probes
notice (and, meanwhile, for the workers that drain: a processor's jobs in flight finish),
stops the server with `grace_seconds` for calls in flight, then stops its background
workers; the caller's `async with` blocks close pools and clients afterwards. A second
SIGTERM or SIGINT during that cuts the workers' drain short.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from opentelemetry.instrumentation.grpc.filters import any_of, negate, service_prefix

from workshop.kit.auth import MAX_METADATA_BYTES
from workshop.kit.channels import KEEPALIVE_TIME_MS
from workshop.kit.interceptors import ErrorMappingInterceptor
from workshop.kit.metrics import MetricsEndpoint, ScrapeCollector
from workshop.kit.reflection import DocumentedReflectionServicer
from workshop.kit.rpc_metrics import RpcMetricsInterceptor
from workshop.kit.settings import between, setting
from workshop.kit.telemetry import tracing_enabled
from workshop.kit.tls import ServerTlsSettings, server_credentials

log = logging.getLogger(__name__)

HEALTH_SERVICE_NAME = "grpc.health.v1.Health"
T = TypeVar("T")
_infrastructure_call = any_of(service_prefix("grpc.health."), service_prefix("grpc.reflection."))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerSettings(ServerTlsSettings):
    """Settings every gRPC server shares (TLS: workshop.kit.tls); services extend this
    dataclass."""

    host: str = setting("127.0.0.1", help="Address the gRPC server binds (0.0.0.0 in a pod).")
    port: int = setting(0, help="gRPC port; 0 picks a free port, announced on stdout.")
    grace_seconds: float = setting(
        10.0, help="Seconds calls in flight may finish after SIGTERM before they are cancelled."
    )
    drain_seconds: float = setting(
        1.0, help="Seconds NOT_SERVING is reported after SIGTERM before the server stops."
    )
    log_level: str = setting("INFO", help="Python log level: DEBUG, INFO, WARNING, ERROR.")
    metrics_port: int = setting(
        0,
        help="Port of the Prometheus GET /metrics endpoint (on HOST); 0 picks a free port, "
        "announced on stdout (a pod sets a fixed one); -1 turns it off.",
        check=between(-1, 65535),
    )


@dataclasses.dataclass(frozen=True)
class GrpcService:
    """One gRPC service to host: its full name, how to add it to a server, and the most
    bytes one request of its methods may have (None: the server's 16 MiB)."""

    name: str
    register: Callable[[grpc.aio.Server], None]
    max_request_bytes: int | None = None


class Worker(Protocol):
    """A long-running part started after the server and stopped after it."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class DrainingWorker(Worker, Protocol):
    """A worker with work in flight to finish before it stops: `drain` is awaited once the
    server reports NOT_SERVING (while it still answers health checks), bounded by the
    worker itself; `hurry` (a second signal) asks it to end its drain at once."""

    async def drain(self) -> None: ...

    def hurry(self) -> None: ...


class Server:
    """A started gRPC server with health and reflection; see the module docstring."""

    def __init__(
        self,
        *,
        label: str,
        settings: ServerSettings,
        services: Sequence[GrpcService],
        workers: Sequence[Worker] = (),
        collectors: Sequence[ScrapeCollector] = (),
    ) -> None:
        self.label = label
        self.settings = settings
        self.services = list(services)
        self.workers = list(workers)
        self.health = HealthServicer()
        self.port = 0
        self.metrics = MetricsEndpoint(settings.host, settings.metrics_port, collectors)
        self.metrics_port: int | None = None  # bound once started, None when turned off
        self._server: grpc.aio.Server | None = None
        self._started_workers: list[Worker] = []

    async def start(self) -> int:
        """Bind, start, mark every service SERVING and start the workers; returns the port."""
        limits = {
            service.name: service.max_request_bytes
            for service in self.services
            if service.max_request_bytes is not None
        }
        server = grpc.aio.server(
            interceptors=_interceptors(self.label, limits), options=server_options()
        )
        for service in self.services:
            service.register(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
            DocumentedReflectionServicer(
                [service.name for service in self.services]
                + [HEALTH_SERVICE_NAME, reflection.SERVICE_NAME]
            ),
            server,
        )
        address = f"{self.settings.host}:{self.settings.port}"
        credentials = server_credentials(self.settings)
        self.port = (
            server.add_insecure_port(address)
            if credentials is None
            else server.add_secure_port(address, credentials)
        )
        if self.port == 0:
            raise OSError(f"cannot bind {self.settings.host}:{self.settings.port}")
        await server.start()
        self._server = server
        if self.settings.metrics_port >= 0:
            self.metrics_port = await self.metrics.start()
        for worker in self.workers:
            await worker.start()
            self._started_workers.append(worker)
        for name in ["", *(service.name for service in self.services)]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self.port

    async def stop(self) -> None:
        """NOT_SERVING, drain (and the workers' own drain), stop(grace), then stop
        workers (idempotent)."""
        if self._server is None:
            return
        server, self._server = self._server, None
        await self.health.enter_graceful_shutdown()
        draining = [w.drain() for w in self._started_workers if isinstance(w, DrainingWorker)]
        await asyncio.gather(asyncio.sleep(self.settings.drain_seconds), *draining)
        await server.stop(self.settings.grace_seconds)
        while self._started_workers:
            await self._started_workers.pop().stop()
        await self.metrics.stop()  # last: what the shutdown itself counted stays scrapeable

    def hurry(self) -> None:
        """Asks the workers that drain to end their drain now (a second signal)."""
        for worker in self._started_workers:
            if isinstance(worker, DrainingWorker):
                worker.hurry()


def server_options() -> list[tuple[str, int]]:
    """The channel arguments of every Workshop gRPC server (bench.grpc_message_cost
    measures a bare server built with them)."""
    return [
        ("grpc.max_receive_message_length", 16 * 1024 * 1024),
        # A call's metadata up to gRPC's hard limit reaches the handler, none
        # dropped at random past the 8 KiB soft limit: an oversized credential is
        # answered CREDENTIAL_MALFORMED every time (workshop.kit.auth).
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.so_reuseport", 0),
        # Clients ping a call that has been silent for 10 s (kit.channels keepalive);
        # by default a server calls pings closer than 5 minutes apart without data
        # abuse and, after two, closes the connection (too_many_pings), which would
        # end a long-polling Claim.
        ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
        ("grpc.http2.max_ping_strikes", 0),
    ]


def _interceptors(label: str, request_limits: dict[str, int]) -> list[grpc.aio.ServerInterceptor]:
    """Metrics, outermost so they count each call's final status; the error mapper, which
    sees what tracing re-raises; then tracing, when a tracer provider is configured.
    Tracing skips health and reflection: probes are noise, and their write-style streams
    are not what the OTel aio wrapper expects."""
    interceptors: list[grpc.aio.ServerInterceptor] = [
        RpcMetricsInterceptor(label),
        ErrorMappingInterceptor(request_limits),
    ]
    if tracing_enabled():
        interceptors.append(
            aio_server_interceptor(filter_=negate(_infrastructure_call))  # type: ignore[no-untyped-call]
        )
    return interceptors


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, on uvloop when it is installed (the coordinator's and the
    preview service's extras install it). Its loop and socket transports are C: the
    coordinator spent 4-27 % less CPU per lease cycle on it (measured in bench.claim_cycle;
    see docs/benchmarks.md). Without it, the standard loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def announce(label: str, **fields: object) -> None:
    """One JSON line on stdout that tools and tests read (e.g. the bound port)."""
    print(json.dumps({"service": label, **fields}, sort_keys=True), file=sys.stdout, flush=True)


async def serve(
    *,
    label: str,
    settings: ServerSettings,
    services: Sequence[GrpcService],
    workers: Sequence[Worker] = (),
    collectors: Sequence[ScrapeCollector] = (),
) -> None:
    """Run a server until SIGTERM/SIGINT, then shut it down gracefully; a second signal
    cuts the workers' drain short."""
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    server = Server(
        label=label,
        settings=settings,
        services=services,
        workers=workers,
        collectors=collectors,
    )

    def on_signal() -> None:
        if stop_requested.is_set():
            log.info("%s: second stop signal: ending the drain now", label)
            server.hurry()
        stop_requested.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    try:
        port = await server.start()
        # What start-up built (modules, stubs, descriptors, pools) lives as long as the
        # process: out of the collector's way, a full collection no longer walks it in
        # the middle of a request (GetReview's p99 fell from about 77 to 45 ms with it).
        gc.collect()
        gc.freeze()
        announce(
            label, event="serving", host=settings.host, port=port, metrics_port=server.metrics_port
        )
        log.info("%s serving on %s:%d", label, settings.host, port)
        await stop_requested.wait()
        log.info("%s stopping: NOT_SERVING, then %.1fs grace", label, settings.grace_seconds)
    finally:
        await server.stop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
    announce(label, event="stopped")
