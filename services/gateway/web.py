"""The gateway's HTTP application and the worker that serves it with uvicorn.

Routes: every operation of `services.gateway.routes` under `/api` (session cookie) and
`/v1` (bearer key); the session routes under `/api/session`; the live channel
(`.../runs/{run_id}/live`, a WebSocket); the OpenAPI documents at `/api/openapi.json`
and `/v1/openapi.json`; the MCP server at `/v1/mcp` (`services.gateway.mcp_app`, whose
session manager the app's lifespan runs); `GET /healthz`; the web console
(`services.gateway.pages`): its entry page at `/` and its files under `/console/`.
Every refusal answers through `services.gateway.problems`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import uvicorn
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from services.gateway import media, pages
from services.gateway.dispatch import build_request, credential, parse_json, read_body
from services.gateway.guard import check_csrf, check_origin
from services.gateway.live import LiveHub
from services.gateway.live_metrics import LiveMetrics
from services.gateway.mcp_app import McpEndpoint
from services.gateway.openapi import openapi_document
from services.gateway.problems import error_body, problem_response
from services.gateway.request_metrics import RequestMetrics
from services.gateway.request_spans import RequestSpans
from services.gateway.routes import API, IMAGE, OPERATIONS, TAR, V1, Operation
from services.gateway.session import SessionRoutes
from services.gateway.settings import GatewaySettings
from services.gateway.upstream import Upstream, UpstreamError
from services.gateway.ws_protocol import GatewayWebSocketProtocol
from workshop.kit import errors, jsonmap, metrics
from workshop.kit.server import announce
from workshop.kit.telemetry import tracing_enabled
from workshop.v1 import workshop_pb2

Endpoint = Callable[[Request], Awaitable[Response]]
LIVE_PATH = "/workshop/runs/{run_id}/live"


class UpgradeRequired(errors.InvalidArgument):
    reason = "UPGRADE_REQUIRED"


def guarded(endpoint: Endpoint, *, cookie: bool = False) -> Endpoint:
    """`endpoint` with every error answered by the catalog (never a bare 500 page);
    `cookie` for a route whose credential is the session cookie (problems.py words a
    refused credential for it)."""

    async def answer(request: Request) -> Response:
        try:
            return await endpoint(request)
        except Exception as error:
            return problem_response(error, cookie=cookie)

    return answer


class Gateway:
    """The application: its routes, its gRPC clients and its live hub."""

    def __init__(self, settings: GatewaySettings, upstream: Upstream, hub: LiveHub) -> None:
        self.settings = settings
        self.upstream = upstream
        self.hub = hub
        self.allowed_origins = frozenset(
            origin.strip() for origin in settings.allowed_origins.split(",") if origin.strip()
        )
        self.session = SessionRoutes(
            upstream=upstream,
            gateway_key=settings.key,
            allowed_origins=self.allowed_origins,
            cookie_secure=settings.cookie_secure,
            max_body_bytes=settings.max_body_bytes,
        )
        self.mcp = McpEndpoint(
            upstream,
            hub,
            allowed_hosts=settings.mcp_allowed_hosts,
            allowed_origins=settings.mcp_allowed_origins,
            max_body_bytes=settings.max_body_bytes,
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=self.routes(),
            # with tracing on, each request starts the trace its gRPC calls continue
            middleware=[Middleware(RequestMetrics)]
            + ([Middleware(RequestSpans)] if tracing_enabled() else []),
            exception_handlers={HTTPException: _http_exception},  # type: ignore[dict-item]
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, _: Starlette) -> AsyncIterator[None]:
        # The MCP transport's task group lives as long as the server (uvicorn runs this).
        async with self.mcp.running():
            yield

    def routes(self) -> list[BaseRoute]:
        routes: list[BaseRoute] = [
            Route("/healthz", healthz),
            Route("/", pages.entry, methods=["GET"]),
            Mount(pages.ASSETS_PATH, app=pages.assets(), name="console"),
            Route("/api/session", guarded(self.session.login, cookie=True), methods=["POST"]),
            Route("/api/session", guarded(self.session.current, cookie=True), methods=["GET"]),
            Route("/api/session", guarded(self.session.logout, cookie=True), methods=["DELETE"]),
            self.mcp.route(),
        ]
        if self.settings.http_metrics:
            routes.append(Route("/metrics", self._metrics, methods=["GET"]))
        for prefix in (API, V1):
            routes.append(Route(f"/{prefix}/openapi.json", self._document(prefix), methods=["GET"]))
            routes.append(WebSocketRoute(f"/{prefix}{LIVE_PATH}", self._live(prefix)))
            routes.append(Route(f"/{prefix}{LIVE_PATH}", guarded(_needs_upgrade)))
            for operation in OPERATIONS:
                if prefix in operation.prefixes:
                    routes.append(
                        Route(
                            f"/{prefix}{operation.path}",
                            guarded(self._endpoint(operation, prefix), cookie=prefix == API),
                            methods=[operation.method],
                            name=f"{prefix}_{operation.name}",
                        )
                    )
        return routes

    async def _metrics(self, _: Request) -> Response:
        """Prometheus text: the process's series and this gateway's live sockets."""
        body = await metrics.render([LiveMetrics(self.hub)])
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    def _endpoint(self, operation: Operation, prefix: str) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            secret = credential(request, prefix)
            if prefix == API and operation.writes:
                check_origin(request.headers, self.allowed_origins)
                if secret:
                    check_csrf(request.headers, secret)
            body: Any = {}
            if operation.body:
                raw = await read_body(request, self.settings.max_body_bytes)
                body = parse_json(raw, request.headers.get("content-type"))
            message = build_request(operation, request, body)
            if operation.answer == IMAGE:
                return await media.image(self.upstream, request, message, secret)  # type: ignore[arg-type]
            if operation.answer == TAR:
                return await media.export(self.upstream, message, secret, request)  # type: ignore[arg-type]
            answer = await self.upstream.call(operation.service, operation.rpc, message, secret)
            return JSONResponse(jsonmap.to_json(answer), headers={"Cache-Control": "no-store"})

        return endpoint

    def _document(self, prefix: str) -> Endpoint:
        document = JSONResponse(openapi_document(prefix)).body  # encoded once

        async def serve(_: Request) -> Response:
            return Response(document, media_type="application/json")

        return serve

    def _live(self, prefix: str) -> Callable[[WebSocket], Awaitable[None]]:
        async def live(websocket: WebSocket) -> None:
            run_id = websocket.path_params["run_id"]
            try:
                if prefix == API:
                    check_origin(websocket.headers, self.allowed_origins)
                secret = credential(websocket, prefix)  # type: ignore[arg-type]
                first = await self.upstream.call(
                    "workshop", "GetRun", workshop_pb2.GetRunRequest(run_id=run_id), secret
                )
            except Exception as error:
                await _deny(websocket, problem_response(error, cookie=prefix == API))
                return
            await websocket.accept()
            await self.hub.serve(websocket, run_id, first, self._still_allowed(run_id, secret))

        return live

    def _still_allowed(self, run_id: str, secret: str) -> Callable[[], Awaitable[bool]]:
        """Whether `secret` may still read the run (a refusal of the credential or its scope
        ends the socket; a service that cannot be reached now does not)."""
        request = workshop_pb2.GetRunRequest(run_id=run_id, job_limit=1)

        async def check() -> bool:
            try:
                await self.upstream.call("workshop", "GetRun", request, secret)
            except UpstreamError as refused:
                return refused.http_status not in (401, 403, 404)
            return True

        return check


async def _deny(websocket: WebSocket, response: Response) -> None:
    """Refuse a handshake with the HTTP error itself where the server allows it."""
    try:
        await websocket.send_denial_response(response)
    except RuntimeError:
        await websocket.close(code=1008)


async def healthz(_: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def _needs_upgrade(request: Request) -> Response:
    raise UpgradeRequired(
        f"{request.url.path} is a WebSocket: connect with 'Upgrade: websocket' (docs/live.md)."
    )


async def _http_exception(request: Request, error: HTTPException) -> Response:
    reason = {404: "ROUTE_NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(
        error.status_code, "INVALID_ARGUMENT"
    )
    code = {404: "NOT_FOUND", 405: "UNIMPLEMENTED"}.get(error.status_code, "INVALID_ARGUMENT")
    message = {
        404: f"No route {request.url.path}; see /api/openapi.json or /v1/openapi.json.",
        405: f"{request.method} is not allowed on {request.url.path}.",
    }.get(error.status_code, str(error.detail))
    body = error_body(code=code, status=error.status_code, reason=reason, message=message)
    headers = dict(error.headers or {})
    if error.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
    return JSONResponse(body, status_code=error.status_code, headers=headers)


def _allowed_methods(request: Request) -> str:
    """Every method served at the request's path. Each operation is a route of its own, and
    Starlette's 405 names only the methods of the first route whose path matched."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods is not None:
            matched, _ = route.matches(request.scope)
            if matched is not Match.NONE:
                methods |= route.methods
        elif (
            isinstance(route, Mount)
            and isinstance(route.app, StaticFiles)
            # (not route.matches: the scope here is the mount's own, relative to it)
            and request.url.path.startswith(f"{route.path}/")
        ):
            methods |= {"GET", "HEAD"}
    return ", ".join(sorted(methods))


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handling: the gRPC bootstrap owns SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpWorker:
    """Serves the HTTP app next to the gRPC server, on the same event loop. Stopping
    runs `before_stop` first (the live hub closes its sockets with 1001), then lets
    uvicorn finish the requests in flight and stop."""

    def __init__(
        self,
        app: Starlette,
        *,
        host: str,
        port: int,
        label: str,
        before_stop: Callable[[], Awaitable[None]] | None = None,
        forwarded_allow_ips: str = "",
    ) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._label = label
        self._before_stop = before_stop
        self._forwarded = forwarded_allow_ips
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None
        self.port = 0  # the bound port, once started

    async def start(self) -> None:
        if self._task is not None:
            return
        sock = socket.create_server((self._host, self._port), reuse_port=False)
        # Accepted sockets inherit it. asyncio's loop sets it only on sockets made with
        # IPPROTO_TCP (this one has proto 0): without it, Nagle holds a response's body
        # behind its headers until the client's delayed ACK, ~40 ms per keep-alive request.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        config = uvicorn.Config(
            self._app,
            lifespan="on",  # the app's lifespan runs the MCP session manager
            log_config=None,
            access_log=False,
            # websockets-sansio, answering a handshake it cannot read (ws_protocol.py)
            ws=GatewayWebSocketProtocol,
            # Compression would cost each socket its own deflate of every update (87 us
            # a message instead of 25 in bench.live_fanout, and p99 342 ms against 161).
            ws_per_message_deflate=False,
            proxy_headers=bool(self._forwarded),
            forwarded_allow_ips=self._forwarded or None,
        )
        self._server = _EmbeddedServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                await self._task  # re-raise why it could not start
                raise OSError("HTTP server stopped during start-up")
            await asyncio.sleep(0.01)
        self.port = sock.getsockname()[1]
        announce(self._label, event="http", host=self._host, port=self.port)

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        if self._before_stop is not None:
            await self._before_stop()
        self._server.should_exit = True
        await self._task
        self._server, self._task = None, None
