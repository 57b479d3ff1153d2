"""Loopback TCP proxies for tests: one that holds the end of a server's stream, one that
switches between replicas, one that makes network faults (FaultProxy: partitions,
resets, refusals, delay).

`HeldEndProxy` forwards both ways between its clients and one upstream address. When
the upstream closes a connection (a database backend terminated, say), the bytes it
sent last reach the client at once but the end of the stream does not: the client's
socket stays open until the test opens `gate`. That holds open, for as long as a test
needs, the moment between a server's goodbye message and the client seeing the socket
close, a window that is otherwise over within one turn of the event loop.

`SwitchingProxy` stands in front of service replicas: new connections go to the replica
the test names, and it can drop every answer, so a call does its work and its caller
never hears (a replica killed between its commit and its answer).

`FaultProxy` is described in its own docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import struct
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

CHUNK = 65536
P = TypeVar("P", bound="LoopbackProxy")


class LoopbackProxy:
    """What every proxy here shares: a listener on a free loopback port, one task per
    proxied connection (`_serve`, which subclasses write), and a `close` that ends them
    all."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        self._closing()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _closing(self) -> None:
        """What a proxy lets go of before its connections are cancelled."""

    async def _accept(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(client_in, client_out)
        finally:
            self._tasks.discard(task)

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        raise NotImplementedError


@contextlib.asynccontextmanager
async def running(proxy: P) -> AsyncIterator[P]:
    """`proxy` started, and closed on the way out."""
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


class HeldEndProxy(LoopbackProxy):
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        super().__init__()
        self._upstream = (upstream_host, upstream_port)
        self.gate = asyncio.Event()  # open: ends are passed on (and held ones released)
        self.opened = 0  # connections proxied so far
        self.held = 0  # connections whose upstream ended, held open toward the client

    def _closing(self) -> None:
        self.gate.set()

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        self.opened += 1
        try:
            server_in, server_out = await asyncio.open_connection(*self._upstream)
        except OSError:
            client_out.close()
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


def held_end_proxy(
    upstream_host: str, upstream_port: int
) -> contextlib.AbstractAsyncContextManager[HeldEndProxy]:
    return running(HeldEndProxy(upstream_host, upstream_port))


class SwitchingProxy(LoopbackProxy):
    """A loopback TCP proxy in front of one of several replicas, as a Service in front of
    its pods: each new connection goes to `upstream` (the test switches it), and while
    `lose_replies_of` names an upstream, every byte it sends is dropped, so a call reaches
    that server and does its work but its answer never arrives. When the upstream closes (its
    process killed), the client's connection closes too and the client reconnects, to
    whichever upstream is current then."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__()
        self.upstream = upstream
        self.lose_replies_of: tuple[str, int] | None = None
        self.lost_bytes = 0  # bytes dropped under lose_replies_of
        self.opened: list[tuple[str, int]] = []  # the upstream of each proxied connection

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        upstream = self.upstream
        try:
            server_in, server_out = await asyncio.open_connection(*upstream)
        except OSError:
            client_out.close()
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


def switching_proxy(
    upstream: tuple[str, int],
) -> contextlib.AbstractAsyncContextManager[SwitchingProxy]:
    return running(SwitchingProxy(upstream))


# A proxy that breaks the network on purpose --------------------------------------------------


@dataclasses.dataclass
class _Trigger:
    pattern: bytes
    action: Callable[[], object]
    fired: asyncio.Event


@dataclasses.dataclass(eq=False)  # hashed by identity: a set of open links
class _Link:
    """One proxied connection: the client's socket and, once connected, the upstream's."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    lost: bool = False  # black-holed: nothing of it is forwarded again

    def reset(self) -> None:
        """Ends both sides with a TCP RST (SO_LINGER 0), as a peer that dropped the
        connection does: the other end's next read or write fails at once."""
        for writer in (self.client, self.server):
            if writer is None or writer.is_closing():
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()


class FaultProxy(LoopbackProxy):
    """A loopback TCP proxy in front of one upstream that a test breaks and heals on
    purpose (docs/reliability.md, network faults). A client is pointed at `port` instead of
    the upstream; every fault acts on the bytes between them, in both directions:

    - `stall()`: a partition. Nothing is forwarded and nothing is reset: connections stay
      open, bytes sent meanwhile are held (as TCP holds and retransmits them), a new
      connection is accepted but reaches the upstream only at `heal()`. What a client sees
      of a partition: silence, until its own deadline.
    - `reset()`: every open connection is ended with an RST (a middlebox that dropped its
      flows, a peer that restarted); new connections go through.
    - `refuse()`: `reset()`, and every new connection is reset as soon as it is accepted
      (the upstream gone: the client's calls fail at once) until `heal()`.
    - `blackhole()`: the open connections go silent for good (a stateful firewall that
      forgot their flows and drops their packets, a peer host gone without a word) while
      new connections go through: a client learns it only by giving up on the old one.
    - `delay(seconds)`: each chunk is forwarded `seconds` after it arrived, in order.
    - `heal()`: forwarding resumes; bytes held by a stall go on, nothing is lost (a
      black-holed connection stays lost).
    - `when_sent(pattern, action)`: runs `action` (one of the above, on this proxy or
      another) just before the first chunk a client sends that contains `pattern` is
      forwarded; so a fault starts at a known point of a conversation (the request that
      names an object key, say), not at a moment a test guesses.
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        super().__init__()
        self._upstream = (upstream_host, upstream_port)
        self._links: set[_Link] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._refusing = False
        self._delay = 0.0
        self._triggers: list[_Trigger] = []
        self.opened = 0  # connections accepted so far
        self.refused = 0  # connections reset on accept while refusing
        self.resets = 0  # open connections ended with an RST
        self.held = 0  # chunks waiting at a stall now

    def _closing(self) -> None:
        for link in list(self._links):
            link.reset()

    def stall(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._refusing = False
        self._delay = 0.0
        self._flowing.set()

    def reset(self) -> None:
        for link in list(self._links):
            self.resets += 1
            link.reset()

    def blackhole(self) -> None:
        for link in self._links:
            link.lost = True

    def refuse(self) -> None:
        self._refusing = True
        self.reset()

    def delay(self, seconds: float) -> None:
        self._delay = seconds

    def when_sent(self, pattern: bytes, action: Callable[[], object]) -> asyncio.Event:
        """`action` runs once, before the first client chunk holding `pattern` is forwarded
        (the chunk then meets the fault); the event is set when it has run."""
        trigger = _Trigger(pattern, action, asyncio.Event())
        self._triggers.append(trigger)
        return trigger.fired

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        self.opened += 1
        link = _Link(client_out)
        self._links.add(link)
        try:
            if self._refusing:
                self.refused += 1
                link.reset()
                return
            await self._flowing.wait()  # a partition: accepted, but nothing reaches upstream
            try:
                server_in, link.server = await asyncio.open_connection(*self._upstream)
            except OSError:
                link.reset()
                return
            if self._refusing or client_out.is_closing():  # refused or reset meanwhile
                link.reset()
                return
            await asyncio.gather(
                self._pump(client_in, link.server, link, upward=True),
                self._pump(server_in, client_out, link, upward=False),
            )
        except asyncio.CancelledError:  # closed: the server's callback must not see it
            pass
        finally:
            self._links.discard(link)
            for writer in (link.client, link.server):
                if writer is not None:
                    writer.close()

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        link: _Link,
        *,
        upward: bool,
    ) -> None:
        """Copies `source` to `sink` through the delay line and the stall; at the end,
        passes the end of the stream on (a FIN for a FIN)."""
        loop = asyncio.get_running_loop()
        line: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(maxsize=64)

        async def read() -> None:
            tail = b""
            try:
                while chunk := await source.read(CHUNK):
                    if upward and self._triggers:
                        tail = self._check(tail + chunk)
                    await line.put((loop.time(), chunk))
            except OSError:
                pass
            await line.put(None)

        reading = asyncio.create_task(read())
        try:
            while (item := await line.get()) is not None:
                arrived, chunk = item
                if self._delay:
                    await asyncio.sleep(max(0.0, arrived + self._delay - loop.time()))
                if not self._flowing.is_set() and not link.lost:
                    self.held += 1
                    try:
                        await self._flowing.wait()
                    finally:
                        self.held -= 1
                if link.lost:
                    continue  # dropped on the floor
                sink.write(chunk)
                await sink.drain()
            if sink.can_write_eof() and not link.lost:
                sink.write_eof()
        except OSError:
            pass
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading

    def _check(self, window: bytes) -> bytes:
        """Runs the triggers whose pattern is in `window`; answers the tail to keep so that
        a pattern split across two chunks is still found."""
        for trigger in list(self._triggers):
            if trigger.pattern in window:
                self._triggers.remove(trigger)
                trigger.action()
                trigger.fired.set()
        keep = max((len(t.pattern) for t in self._triggers), default=1) - 1
        return window[-keep:] if keep else b""


def fault_proxy(
    upstream_host: str, upstream_port: int
) -> contextlib.AbstractAsyncContextManager[FaultProxy]:
    return running(FaultProxy(upstream_host, upstream_port))
