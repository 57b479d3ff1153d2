"""A background loop that runs one pass every interval until stopped.

Maintenance and scheduling loops share this shape: a pass that may fail
(logged, retried next time) and a stop that waits for the pass in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Periodic:
    """Calls `run_pass` now and then every `interval_seconds`; `start`/`stop` are idempotent."""

    def __init__(
        self, name: str, run_pass: Callable[[], Awaitable[object]], *, interval_seconds: float
    ) -> None:
        self.name = name
        self.interval_seconds = interval_seconds
        self._run_pass = run_pass
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._stopping.set()
        await self._task
        self._task = None

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._run_pass()
            except Exception:
                log.exception("%s pass failed; retrying next pass", self.name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.interval_seconds)
