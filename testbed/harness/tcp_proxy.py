"""A loopback TCP proxy that can hold the end of a server's stream.

`HeldEndProxy` forwards both ways between its clients and one upstream address. When
the upstream closes a connection (a database backend terminated, say), the bytes it
sent last reach the client at once but the end of the stream does not: the client's
socket stays open until the test opens `gate`. That holds open, for as long as a test
needs, the moment between a server's goodbye message and the client seeing the socket
close, a window that is otherwise over within one turn of the event loop.
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
