"""The gateway's HTTP application and the worker that serves it with uvicorn.

`GET /healthz` answers `{"status": "ok"}`. The routes for the website
(`/api/workshop/...`) and for Agent keys (`/v1/workshop/...`) are not implemented
yet: they answer 501 with a JSON error instead of pretending to work.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from workshop.kit.server import announce


async def healthz(_: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def not_implemented(request: Request) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": "NOT_IMPLEMENTED", "message": f"{request.url.path} is not served yet."}},
        status_code=501,
    )


def build_app() -> Starlette:
    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/api/{rest:path}", not_implemented, methods=methods),
            Route("/v1/{rest:path}", not_implemented, methods=methods),
        ]
    )


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handling: the gRPC bootstrap owns SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpWorker:
    """Serves the HTTP app next to the gRPC server, on the same event loop."""

    def __init__(self, app: Starlette, *, host: str, port: int, label: str) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._label = label
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is not None:
            return
        sock = socket.create_server((self._host, self._port), reuse_port=False)
        config = uvicorn.Config(self._app, lifespan="off", log_config=None, access_log=False)
        self._server = _EmbeddedServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                await self._task  # re-raise why it could not start
                raise OSError("HTTP server stopped during start-up")
            await asyncio.sleep(0.01)
        announce(self._label, event="http", host=self._host, port=sock.getsockname()[1])

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        await self._task
        self._server, self._task = None, None
