"""The live channel: one WatchRun stream per run fanned out to its WebSockets (docs/live.md).

The route authorizes each socket with the client's own credential, fetches the run
(GetRun) and hands both to `LiveHub.serve`. The hub keeps one WatchRun stream per run
for all of that run's sockets, opened with the gateway's key through `open_watch`, and
turns its messages into updates: bursts are coalesced (the first message of a quiet
period goes out at once, later ones within `window_seconds` are merged into one trailing
update), each update is encoded once, numbered (`seq`) and offered to every socket,
which sends only the latest it has not sent (services/gateway/live_socket.py). Nothing
here writes anything: a closed socket or a lost stream changes nothing in processing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import grpc
from starlette.websockets import WebSocket

from services.gateway.live_listener import LiveListener
from services.gateway.live_socket import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_UNAVAILABLE,
    LiveSocket,
)
from workshop.v1 import common_pb2
from workshop.v1 import workshop_pb2 as ws

OpenWatch = Callable[[str], AsyncIterable[ws.WatchRunResponse]]
Encode = Callable[[ws.WatchRunResponse], dict[str, Any]]
# Whether the socket's own credential still allows it to follow the run (False: revoked,
# expired, disabled, or the scope is gone); a check that fails for other reasons keeps it.
StillAllowed = Callable[[], Awaitable[bool]]

REOPEN_FIRST_SECONDS = 0.2  # a broken stream is reopened after this, doubling per failure
REOPEN_MAX_SECONDS = 5.0  # the longest pause between attempts: the coordinator's own
# restart takes about a second, and a socket shows stale state meanwhile
SHUTDOWN_SECONDS = 5.0  # close(): how long sockets get to take their last message and 1001
# A stream refused for these reasons would be refused again: its sockets are closed with
# CLOSE_UNAVAILABLE rather than left open without updates.
PERMANENT = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)
UNAVAILABLE_REASON = "live updates unavailable for this run; fetch it again"
FINAL_REASON = "run finished"
SHUTDOWN_REASON = "gateway shutting down; reconnect"
REVOKED_REASON = "your credential no longer allows this; sign in again"
_ACTIVE = (common_pb2.RUN_STATUS_QUEUED, common_pb2.RUN_STATUS_RUNNING)

log = logging.getLogger(__name__)


class Subscriber(Protocol):
    """What the hub offers a run's updates to: a WebSocket (`LiveSocket`) or a request
    that reads them in its own time (`LiveListener`, the MCP watch)."""

    def offer(self, text: str) -> None: ...

    def finish(self, code: int, reason: str, *, deadline: float | None = None) -> None: ...

    def buffered_bytes(self) -> int: ...


@dataclasses.dataclass(eq=False)
class _Feed:
    """One run's stream, coalescing state and subscribers (named sockets: most are)."""

    run_id: str
    sockets: set[Subscriber] = dataclasses.field(default_factory=set)
    seq: int = 0
    detail: str | None = None  # JSON of the last detail sent, to skip an unchanged one
    last: str | None = None  # the final message, once sent
    emitted_at: float = float("-inf")  # loop time of the last update
    pending: ws.WatchRunResponse | None = None  # merged into the trailing update
    trailer: asyncio.TimerHandle | None = None
    linger: asyncio.TimerHandle | None = None
    stream: asyncio.Task[None] | None = None


class LiveHub:
    def __init__(
        self,
        open_watch: OpenWatch,
        encode: Encode,
        *,
        window_seconds: float = 0.12,
        stall_seconds: float = 10.0,
        linger_seconds: float = 5.0,
        recheck_seconds: float = 30.0,
    ) -> None:
        self._open_watch = open_watch
        self._encode = encode
        self._window = window_seconds
        self._stall = stall_seconds
        self._linger = linger_seconds
        self._recheck = recheck_seconds
        self._feeds: dict[str, _Feed] = {}
        self._serving: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._counts = dict.fromkeys(
            (
                "streams_opened",
                "stream_messages",
                "updates",
                "messages",
                "slow_closes",
                "sockets_served",
                "rechecks",
            ),
            0,
        )

    async def serve(
        self,
        websocket: WebSocket,
        run_id: str,
        first: ws.GetRunResponse | dict[str, Any],
        still_allowed: StillAllowed | None = None,
    ) -> None:
        """The socket is accepted and authorized; sends `first` (the detail the route fetched
        with the client's own credential) as message seq=<the hub's current seq for the run>,
        then every coalesced update, until the run is final, the client leaves, the reader
        stalls or the hub closes; returns when the socket is closed.

        `first` is a GetRunResponse, or its JSON as `encode` writes it ({"detail": {...}},
        optionally with "final"). Every `recheck_seconds` the socket's own credential is
        checked again with `still_allowed`: one revoked since the handshake closes the
        socket with 1008 (the shared stream runs under the gateway's key, so this is what
        keeps a signed-out user from following on)."""
        socket = LiveSocket(
            websocket, stall_seconds=self._stall, on_sent=self._sent, on_stall=self._stalled
        )
        feed = self._attach(socket, run_id, first)
        task = asyncio.current_task()
        if task is not None:
            self._serving.add(task)
        self._counts["sockets_served"] += 1
        recheck = None
        if still_allowed is not None:
            recheck = asyncio.create_task(self._recheck_until_refused(socket, still_allowed))
        try:
            await socket.run()
        finally:
            if recheck is not None:
                recheck.cancel()
            if task is not None:
                self._serving.discard(task)
            self._leave(feed, socket)

    @contextlib.asynccontextmanager
    async def listen(
        self, run_id: str, first: ws.GetRunResponse | dict[str, Any]
    ) -> AsyncIterator[LiveListener]:
        """A subscriber of the run's shared stream for a request rather than a socket (the
        MCP `runs` watch): it gets `first` and then the same coalesced updates as the run's
        sockets, in the same envelopes, the latest one waiting until it is read. The caller
        authorized `first` with its own credential; leaving the block unsubscribes."""
        listener = LiveListener()
        feed = self._attach(listener, run_id, first)
        try:
            yield listener
        finally:
            self._leave(feed, listener)

    def _attach(
        self, subscriber: Subscriber, run_id: str, first: ws.GetRunResponse | dict[str, Any]
    ) -> _Feed:
        """Offers `first` (or the final message, if the run finished since) and joins the
        run's stream, or finishes the subscriber at once (final, or shutting down)."""
        feed = self._feed(run_id)
        detail, final = self._first(first)
        if feed.last is not None:
            subscriber.offer(feed.last)  # the run finished since the route read it
            final = True
        else:
            subscriber.offer(_envelope(feed.seq, final, detail))
            if feed.seq == 0 and not feed.sockets:
                feed.detail = detail  # the stream's first read, if the same, is not news
            elif detail != feed.detail:
                feed.detail = None  # this socket's first may differ: send the next read
        if self._closing:
            subscriber.finish(CLOSE_GOING_AWAY, SHUTDOWN_REASON, deadline=self._shutdown_deadline())
        elif final:
            subscriber.finish(CLOSE_NORMAL, FINAL_REASON)
        else:
            self._join(feed, subscriber)
        return feed

    async def _recheck_until_refused(self, socket: LiveSocket, still_allowed: StillAllowed) -> None:
        while True:
            await asyncio.sleep(self._recheck)
            if not await still_allowed():
                socket.finish(CLOSE_POLICY, REVOKED_REASON)
                return
            self._counts["rechecks"] += 1

    async def close(self) -> None:
        """Shutdown: every socket gets its pending message, then 1001 (each within
        SHUTDOWN_SECONDS, else it is aborted); every stream is cancelled. Call it before
        stopping uvicorn, whose own shutdown closes sockets with 1012 at once."""
        self._closing = True
        deadline = self._shutdown_deadline()
        for feed in self._feeds.values():
            if feed.trailer is not None:  # the merged update is due: flush it
                feed.trailer.cancel()
                self._trail(feed)
            for socket in feed.sockets:
                socket.finish(CLOSE_GOING_AWAY, SHUTDOWN_REASON, deadline=deadline)
        streams = [feed.stream for feed in self._feeds.values() if feed.stream is not None]
        for stream in streams:
            stream.cancel()
        if self._serving:
            await asyncio.wait(list(self._serving), timeout=SHUTDOWN_SECONDS + 1.0)
        for stream in streams:
            with contextlib.suppress(asyncio.CancelledError):
                await stream
        for feed in list(self._feeds.values()):
            self._drop(feed)

    @property
    def window_seconds(self) -> float:
        """How long after a quiet period's first update later ones are merged."""
        return self._window

    def stats(self) -> dict[str, int]:
        """runs (streamed or lingering), streams (open now), streams_opened (WatchRun calls),
        stream_messages (WatchRun messages received), sockets (open now), sockets_served,
        updates (emitted, each one seq), messages (sent, over all sockets), slow_closes
        (1013), rechecks (of a socket's credential, passed), buffered_bytes (pending
        messages and transport buffers of all sockets)."""
        feeds = self._feeds.values()
        return {
            "runs": len(self._feeds),
            "streams": sum(feed.stream is not None and not feed.stream.done() for feed in feeds),
            "sockets": sum(len(feed.sockets) for feed in feeds),
            "buffered_bytes": sum(s.buffered_bytes() for feed in feeds for s in feed.sockets),
            **self._counts,
        }

    # Sockets joining and leaving ----------------------------------------------------------

    def _feed(self, run_id: str) -> _Feed:
        feed = self._feeds.get(run_id)
        if feed is None:
            feed = self._feeds[run_id] = _Feed(run_id)
        if feed.linger is not None:
            feed.linger.cancel()
            feed.linger = None
        return feed

    def _join(self, feed: _Feed, socket: Subscriber) -> None:
        feed.sockets.add(socket)
        if feed.stream is None or feed.stream.done():
            feed.stream = asyncio.create_task(self._follow(feed), name=f"live-{feed.run_id}")

    def _leave(self, feed: _Feed, socket: Subscriber) -> None:
        feed.sockets.discard(socket)
        if feed.sockets or self._feeds.get(feed.run_id) is not feed:
            return
        if self._closing or feed.last is not None:
            self._drop(feed)
        elif feed.linger is None:
            # A page that reloads reconnects within a moment: keep its stream meanwhile.
            loop = asyncio.get_running_loop()
            feed.linger = loop.call_later(self._linger, self._lingered, feed)

    def _lingered(self, feed: _Feed) -> None:
        feed.linger = None
        if not feed.sockets:
            self._drop(feed)

    def _drop(self, feed: _Feed) -> None:
        for handle in (feed.trailer, feed.linger):
            if handle is not None:
                handle.cancel()
        feed.trailer = feed.linger = None
        if feed.stream is not None:
            feed.stream.cancel()
        if self._feeds.get(feed.run_id) is feed:
            del self._feeds[feed.run_id]

    def _sent(self) -> None:
        self._counts["messages"] += 1

    def _stalled(self) -> None:
        self._counts["slow_closes"] += 1  # counted when found, before the close is taken

    def _shutdown_deadline(self) -> float:
        return asyncio.get_running_loop().time() + SHUTDOWN_SECONDS

    # The stream ---------------------------------------------------------------------------

    async def _follow(self, feed: _Feed) -> None:
        """Reads the run's WatchRun stream until its final message, reopening it with
        backoff when it breaks; the first message after a reopen is the fresh detail."""
        delay = REOPEN_FIRST_SECONDS
        while True:
            self._counts["streams_opened"] += 1
            stream = self._open_watch(feed.run_id)
            try:
                async for response in stream:
                    delay = REOPEN_FIRST_SECONDS
                    self._counts["stream_messages"] += 1
                    self._arrived(feed, response)
                    if response.final:
                        return
                log.info("live %s: stream ended before the run finished; reopening", feed.run_id)
            except grpc.aio.AioRpcError as error:
                if error.code() in PERMANENT:
                    log.warning("live %s: stream refused (%s)", feed.run_id, error.code().name)
                    self._unavailable(feed)
                    return
                log.info("live %s: stream broke (%s); reopening", feed.run_id, error.code().name)
            except Exception as error:  # whatever open_watch raises: retried likewise
                log.warning("live %s: stream failed (%s: %s)", feed.run_id, type(error), error)
            finally:
                await _cancel(stream)
            await asyncio.sleep(delay)
            delay = min(delay * 2, REOPEN_MAX_SECONDS)

    def _arrived(self, feed: _Feed, response: ws.WatchRunResponse) -> None:
        """Leading and trailing edge: a message after a quiet window goes out at once;
        later ones within the window wait for one trailing update carrying the latest."""
        if response.final:
            if feed.trailer is not None:
                feed.trailer.cancel()
                feed.trailer, feed.pending = None, None
            self._emit(feed, response)
            return
        if feed.trailer is not None:
            feed.pending = response
            return
        loop = asyncio.get_running_loop()
        if loop.time() - feed.emitted_at >= self._window:
            self._emit(feed, response)
        else:
            feed.pending = response
            feed.trailer = loop.call_at(feed.emitted_at + self._window, self._trail, feed)

    def _trail(self, feed: _Feed) -> None:
        feed.trailer = None
        response, feed.pending = feed.pending, None
        if response is not None:
            self._emit(feed, response)

    def _emit(self, feed: _Feed, response: ws.WatchRunResponse) -> None:
        """Encodes one update once and offers the same text to every socket of the run."""
        detail = _json(self._encode(response).get("detail", {}))
        if detail == feed.detail and not response.final:
            return  # e.g. the first read of a (re)opened stream when nothing changed
        feed.seq += 1
        feed.detail = detail
        feed.emitted_at = asyncio.get_running_loop().time()
        self._counts["updates"] += 1
        text = _envelope(feed.seq, response.final, detail)
        if response.final:
            feed.last = text
        for socket in feed.sockets:
            socket.offer(text)
            if response.final:
                socket.finish(CLOSE_NORMAL, FINAL_REASON)

    def _unavailable(self, feed: _Feed) -> None:
        for socket in feed.sockets:
            socket.finish(CLOSE_UNAVAILABLE, UNAVAILABLE_REASON)

    def _first(self, first: ws.GetRunResponse | dict[str, Any]) -> tuple[str, bool]:
        """(detail JSON, final) of what the route fetched."""
        if isinstance(first, dict):
            return _json(first.get("detail", {})), bool(first.get("final", False))
        final = first.detail.run.status not in _ACTIVE
        encoded = self._encode(ws.WatchRunResponse(detail=first.detail, final=final))
        return _json(encoded.get("detail", {})), final


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _envelope(seq: int, final: bool, detail: str) -> str:
    """The message text: seq first, so a client (or a benchmark) can read it cheaply."""
    sent_at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return (
        f'{{"seq":{seq},"sent_at":"{sent_at}","final":{"true" if final else "false"},'
        f'"detail":{detail}}}'
    )


async def _cancel(stream: AsyncIterable[ws.WatchRunResponse]) -> None:
    """Ends a stream left early: a gRPC call is cancelled, an async generator closed."""
    cancel = getattr(stream, "cancel", None)
    if callable(cancel):
        cancel()
        return
    aclose = getattr(stream, "aclose", None)
    if callable(aclose):
        with contextlib.suppress(Exception):
            await aclose()
