"""One WebSocket of the live channel (docs/live.md): a slot, a sender and close codes.

Each socket holds at most one pending message (the latest wins); a message goes out at
once when the socket is idle, else its own sender sends the latest when the current send
is done, so a slow reader costs one reference to a message every socket of the run
shares and never delays the others. A send that does not complete within
`stall_seconds` means the client stopped reading and every buffer on the way is full:
the socket is closed with 1013. Cancelling a send is safe with every uvicorn WebSocket
implementation: a frame is written whole, synchronously, before or after the only await
(uvicorn's websockets-sansio waits until the transport is writable, then writes; the
legacy websockets protocol writes, then drains).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Protocol, cast

from starlette.websockets import WebSocket

CLOSE_NORMAL = 1000  # the run reached a final status; its last detail was sent
CLOSE_GOING_AWAY = 1001  # the gateway is shutting down
CLOSE_UNAVAILABLE = 1011  # the gateway cannot follow this run (its stream was refused)
CLOSE_POLICY = 1008  # the client's credential no longer allows following the run
CLOSE_SLOW = 1013  # "try again later": the reader stayed behind for stall_seconds
SLOW_REASON = "reader too slow; reconnect and fetch the run again"
# The kernel's send buffer of a live socket (Linux doubles it): autotuned, it grows to
# net.ipv4.tcp_wmem's maximum (4 MiB by default), which a client that stopped reading
# fills before any send blocks, so a stall would be seen only after megabytes. Fixed, a
# reader is at most about this much (plus the transport's 64 KiB) behind when it stalls;
# a live channel needs little bandwidth, so the cap costs nothing on slow links.
SEND_BUFFER_BYTES = 128 * 1024

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    CLOSED = "closed"  # we closed it: final, shutdown or unavailable
    LEFT = "left"  # the client closed it or the connection broke
    SLOW = "slow"  # closed with CLOSE_SLOW


class LiveSocket:
    """The sending side of one accepted WebSocket; `run()` returns once it is closed.

    A message offered to an idle socket is sent at once, inside `offer`: the ASGI send is
    stepped by hand, and with a writable transport it completes in that first step (uvicorn
    awaits nothing then), so the common case wakes no task and allocates no future: with
    1,000 sockets, waking each socket's task for each update cost a third of the gateway's
    CPU, and the futures that outlived a young collection brought a full one (100-200 ms)
    every 15 s (bench.live_fanout). A send that has to wait (the transport is paused) is
    handed, as it stands, to the socket's own task, which finishes it under the stall
    timeout; meanwhile newer messages go to the slot.
    """

    def __init__(
        self,
        websocket: WebSocket,
        *,
        stall_seconds: float,
        on_sent: Callable[[], None],
        on_stall: Callable[[], None],
    ) -> None:
        self._websocket = websocket
        self._stall = stall_seconds
        self._on_sent = on_sent
        self._on_stall = on_stall
        self._slot: str | None = None
        self._waiting: Awaitable[None] | None = None  # a send begun by offer(), not done
        self._waiting_since = 0.0
        self._running = False  # the sender runs and is between sends
        self._wake = asyncio.Event()
        self._left = False
        self._close: tuple[int, str] | None = None  # sent once the slot is flushed
        self._deadline: float | None = None  # loop time by which a shutdown must be done
        self._send_timeout: asyncio.Timeout | None = None
        self._transport: Transport | None = transport_of(websocket)
        _limit_send_buffer(self._transport)

    def offer(self, text: str) -> None:
        """Sends `text` now if the socket is idle; otherwise makes it the pending message,
        replacing one not sent yet (latest wins). Never waits."""
        if self._running and self._slot is None and self._waiting is None:
            self._send_now(text)
        else:
            self._slot = text
            self._wake.set()

    def finish(self, code: int, reason: str, *, deadline: float | None = None) -> None:
        """Closes with `code` after the pending message; with `deadline` (loop time) the
        socket is given up (aborted) if the client has not taken both by then."""
        if self._close is None:
            self._close = (code, reason)
        if deadline is not None:
            self._deadline = deadline if self._deadline is None else min(deadline, self._deadline)
            if self._send_timeout is not None:
                when = self._send_timeout.when()
                if when is None or when > deadline:
                    self._send_timeout.reschedule(deadline)
        self._running = False  # from now on the sender sends (and then closes)
        self._wake.set()

    def buffered_bytes(self) -> int:
        """What this socket holds: its pending message (a reference to the run's shared
        text, counted anyway) and the transport's write buffer, where reachable."""
        pending = len(self._slot) if self._slot is not None else 0
        return pending + (self._transport.get_write_buffer_size() if self._transport else 0)

    async def run(self) -> Outcome:
        receiver = asyncio.create_task(self._receive(), name="live-socket-receive")
        try:
            return await self._send_loop()
        finally:
            self._running = False
            receiver.cancel()
            if self._waiting is not None:
                _close_awaitable(self._waiting)
                self._waiting = None

    def _send_now(self, text: str) -> None:
        send = self._websocket.send_text(text)
        try:
            waits_on = send.send(None)
        except StopIteration:
            self._on_sent()
            return
        except Exception as error:  # the client is gone (see _send)
            log.debug("live socket: send failed (%s: %s)", type(error).__name__, error)
            self._left = True
            self._wake.set()
            return
        self._waiting = _resumed(send, waits_on)
        self._waiting_since = asyncio.get_running_loop().time()
        self._wake.set()

    async def _send_loop(self) -> Outcome:
        while True:
            # Every check runs before the wake is cleared: nothing offered meanwhile is missed.
            self._running = False
            if self._left:
                return Outcome.LEFT
            if self._waiting is not None:
                ended = await self._send(self._waiting, self._waiting_since)
                self._waiting = None
                if ended is not None:
                    return ended
                continue
            if self._slot is not None:
                text, self._slot = self._slot, None
                loop_time = asyncio.get_running_loop().time()
                ended = await self._send(self._websocket.send_text(text), loop_time)
                if ended is not None:
                    return ended
                continue
            if self._close is not None:
                await self._send_close(*self._close)
                return Outcome.CLOSED
            self._running = True  # idle: offer() may send by itself
            self._wake.clear()
            await self._wake.wait()

    async def _send(self, send: Awaitable[None], began: float) -> Outcome | None:
        """Awaits a send begun at loop time `began`, for at most `stall_seconds` from then
        (or until the shutdown deadline); None once sent, otherwise how the socket ended."""
        try:
            async with asyncio.timeout_at(self._limit(began)) as timeout:
                self._send_timeout = timeout
                await send
        except TimeoutError:
            if self._deadline is not None and asyncio.get_running_loop().time() >= self._deadline:
                self._abort()  # shutting down: the client had its chance
                return Outcome.CLOSED
            self._on_stall()
            await self._send_close(CLOSE_SLOW, SLOW_REASON)
            return Outcome.SLOW
        except Exception as error:  # WebSocketDisconnect, ClientDisconnected, or a
            # RuntimeError from uvicorn once its keepalive failed the connection
            log.debug("live socket: send failed (%s: %s)", type(error).__name__, error)
            return Outcome.LEFT
        finally:
            self._send_timeout = None
        self._on_sent()
        return None

    async def _send_close(self, code: int, reason: str) -> None:
        """Sends the close frame, waiting at most `stall_seconds` (or the shutdown deadline)
        for the transport to take it; a client that still reads nothing is aborted then, so
        its connection and buffer do not outlive the socket."""
        try:
            async with asyncio.timeout_at(self._limit(asyncio.get_running_loop().time())):
                await self._websocket.close(code, reason)
        except TimeoutError:
            self._abort()
            return
        except Exception as error:  # already gone
            log.debug("live socket: close failed (%s: %s)", type(error).__name__, error)
            return
        if code == CLOSE_SLOW and self._transport is not None:
            # The close frame sits behind what the client has not read yet; uvicorn's own
            # close timer only calls transport.close(), which waits for the buffer to drain.
            asyncio.get_running_loop().call_later(self._stall, self._abort)

    def _limit(self, began: float) -> float:
        """The loop time by which what began at `began` must be done."""
        when = began + self._stall
        return when if self._deadline is None else min(when, self._deadline)

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    async def _receive(self) -> None:
        """Reads (and drops) what the client sends, so that its close and the end of the
        connection are noticed even when no message is due."""
        try:
            while True:
                message = await self._websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
        except Exception as error:  # a receive after a disconnect was already seen
            log.debug("live socket: receive ended (%s: %s)", type(error).__name__, error)
        self._left = True
        self._wake.set()


@types.coroutine
def _resumed(send: Coroutine[Any, Any, None], waits_on: Any) -> Generator[Any, Any, None]:
    """The rest of a send stepped by hand, for a task to await: what the send waits on is
    handed to that task, and what the task sends or throws in (a cancellation) goes on
    to the send."""
    while True:
        try:
            value = yield waits_on
        except GeneratorExit:
            send.close()
            raise
        except BaseException as error:
            try:
                waits_on = send.throw(error)
            except StopIteration:
                return
        else:
            try:
                waits_on = send.send(value)
            except StopIteration:
                return


def _close_awaitable(awaitable: Awaitable[None]) -> None:
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()


class Transport(Protocol):
    """What a socket uses of the server's transport (asyncio's and uvloop's have both)."""

    def get_write_buffer_size(self) -> int: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...

    def abort(self) -> None: ...


def _limit_send_buffer(transport: Transport | None) -> None:
    raw = transport.get_extra_info("socket") if transport is not None else None
    if raw is not None:
        try:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        except (OSError, AttributeError) as error:  # not a TCP socket: keep its default
            log.debug("live socket: SO_SNDBUF not set (%s)", error)


def transport_of(websocket: WebSocket) -> Transport | None:
    """The server's transport under `websocket`, or None.

    ASGI gives no access to it; uvicorn's WebSocket protocols hand the application a bound
    method (`send`) of an object holding `transport`, which Starlette's middleware wraps in
    closures. The transport lets a socket whose client reads nothing be aborted: closing it
    would wait for its buffer to drain, which never happens. Without it (another server)
    stall detection still works; only the abort is left to the server."""
    todo: list[Any] = [websocket._send]
    seen: set[int] = set()
    while todo and len(seen) < 32:
        candidate = todo.pop()
        if id(candidate) in seen:
            continue
        seen.add(id(candidate))
        owner = getattr(candidate, "__self__", None)
        transport = getattr(owner, "transport", None)
        if callable(getattr(transport, "abort", None)) and callable(
            getattr(transport, "get_write_buffer_size", None)
        ):
            return cast(Transport, transport)
        for cell in getattr(candidate, "__closure__", None) or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(contents):
                todo.append(contents)
    return None
