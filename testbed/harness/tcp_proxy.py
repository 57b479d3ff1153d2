"""Loopback TCP proxies that break a connection where a test says.

`HeldEndProxy` forwards both ways between its clients and one upstream address. When
the upstream closes a connection (a database backend terminated, say), the bytes it
sent last reach the client at once but the end of the stream does not: the client's
socket stays open until the test opens `gate`. That holds open, for as long as a test
needs, the moment between a server's goodbye message and the client seeing the socket
close, a window that is otherwise over within one turn of the event loop.

`SwitchingProxy` stands in front of service replicas: new connections go to the replica
the test names, and it can drop every answer, so a call does its work and its caller
never hears (a replica killed between its commit and its answer).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

CHUNK = 65536


class HeldEndProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.gate = asyncio.Event()  # open: ends are passed on (and held ones released)
        self.opened = 0  # connections proxied so far
        self.held = 0  # connections whose upstream ended, held open toward the client
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        self.gate.set()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.opened += 1
        try:
            server_in, server_out = await asyncio.open_connection(*self._upstream)
        except OSError:
            client_out.close()
            self._tasks.discard(task)
            return
        upward = asyncio.create_task(_pump(client_in, server_out))
        try:
            await _pump(server_in, client_out, close=False)
            if not upward.done():  # the server ended it, not the client
                self.held += 1
                try:
                    await self.gate.wait()
                finally:
                    self.held -= 1
        finally:
            upward.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await upward
            for writer in (client_out, server_out):
                writer.close()
            self._tasks.discard(task)


async def _pump(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, close: bool = True
) -> None:
    """Copies `source` to `sink` until `source` ends (or fails); closes `sink` if asked."""
    with contextlib.suppress(OSError):
        while chunk := await source.read(CHUNK):
            sink.write(chunk)
            await sink.drain()
    if close:
        sink.close()


@contextlib.asynccontextmanager
async def held_end_proxy(upstream_host: str, upstream_port: int) -> AsyncIterator[HeldEndProxy]:
    proxy = HeldEndProxy(upstream_host, upstream_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


class SwitchingProxy:
    """A loopback TCP proxy in front of one of several replicas, as a Service in front of
    its pods: each new connection goes to `upstream` (the test switches it), and while
    `lose_replies_of` names an upstream, every byte it sends is dropped, so a call reaches
    that server and does its work but its answer never arrives. When the upstream closes (its
    process killed), the client's connection closes too and the client reconnects, to
    whichever upstream is current then."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.lose_replies_of: tuple[str, int] | None = None
        self.lost_bytes = 0  # bytes dropped under lose_replies_of
        self.opened: list[tuple[str, int]] = []  # the upstream of each proxied connection
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream = self.upstream
        try:
            server_in, server_out = await asyncio.open_connection(*upstream)
        except OSError:
            client_out.close()
            self._tasks.discard(task)
            return
        self.opened.append(upstream)
        upward = asyncio.create_task(_pump(client_in, server_out))
        try:
            with contextlib.suppress(OSError):
                while chunk := await server_in.read(CHUNK):
                    if self.lose_replies_of == upstream:
                        self.lost_bytes += len(chunk)
                        continue
                    client_out.write(chunk)
                    await client_out.drain()
        finally:
            upward.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await upward
            for writer in (client_out, server_out):
                writer.close()
            self._tasks.discard(task)


@contextlib.asynccontextmanager
async def switching_proxy(upstream: tuple[str, int]) -> AsyncIterator[SwitchingProxy]:
    proxy = SwitchingProxy(upstream)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
