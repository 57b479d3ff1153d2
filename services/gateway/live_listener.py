"""A subscriber of the live hub that is not a WebSocket: a request that waits on a run's
updates in its own time (the MCP `runs` watch, docs/mcp.md).

Like a socket it holds one pending message, the latest (each is the whole run detail, so
a newer one supersedes the older); unlike a socket it sends nothing: its request takes
the message with `next` when it wants it. The hub's `finish` marks it closed (the run is
final, the hub shuts down, or the run's stream was refused for good).
"""

from __future__ import annotations

import asyncio


class LiveListener:
    def __init__(self) -> None:
        self._latest: str | None = None
        self._wake = asyncio.Event()
        self.closed: tuple[int, str] | None = None  # (close code, reason) once finished

    def offer(self, text: str) -> None:
        self._latest = text
        self._wake.set()

    def finish(self, code: int, reason: str, *, deadline: float | None = None) -> None:
        if self.closed is None:
            self.closed = (code, reason)
        self._wake.set()

    def buffered_bytes(self) -> int:
        return len(self._latest) if self._latest is not None else 0

    async def next(self, seconds: float) -> str | None:
        """The latest message not taken yet, waiting at most `seconds` for one;
        None if none came in time, or at once if the listener is closed and has none."""
        if self._latest is None and self.closed is None:
            try:
                async with asyncio.timeout(max(seconds, 0.0)):
                    await self._wake.wait()
            except TimeoutError:
                return None
        self._wake.clear()
        text, self._latest = self._latest, None
        return text
