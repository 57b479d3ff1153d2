"""Run events across coordinator replicas (SPEC §8 live).

Every committing function calls `pg_notify('workshop_run', run_id)` inside its
transaction, so an event exists exactly when the change it announces is
committed, whichever replica committed it. Each coordinator process holds one
LISTEN connection and wakes the WatchRun streams of that run. A wake carries no
data: watchers re-read the run, so coalesced or duplicate wakes lose nothing.
If the LISTEN connection drops (database restart), the hub reconnects and
wakes every watcher, since notifications sent meanwhile are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

CHANNEL = "workshop_run"
RECONNECT_SECONDS = 1.0

log = logging.getLogger(__name__)


class Subscription:
    """Wakes when its run changes; `wait()` returns at once if a wake is pending."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()

    def wake(self) -> None:
        self._changed.set()

    async def wait(self) -> None:
        await self._changed.wait()
        self._changed.clear()


class RunEvents:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._subscriptions: dict[str, set[Subscription]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="run-events")
            await self._ready.wait()

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self._ready.clear()

    @contextlib.asynccontextmanager
    async def subscribe(self, run_id: str) -> AsyncIterator[Subscription]:
        subscription = Subscription()
        self._subscriptions[run_id].add(subscription)
        try:
            yield subscription
        finally:
            watchers = self._subscriptions[run_id]
            watchers.discard(subscription)
            if not watchers:
                del self._subscriptions[run_id]

    def _notified(self, _connection: Any, _pid: int, _channel: str, run_id: str) -> None:
        for subscription in self._subscriptions.get(run_id, ()):
            subscription.wake()

    def _wake_all(self) -> None:
        for watchers in self._subscriptions.values():
            for subscription in watchers:
                subscription.wake()

    async def _listen(self) -> None:
        while True:
            try:
                await self._listen_once()
                log.warning("run events: LISTEN connection lost; reconnecting")
            except (OSError, asyncpg.PostgresError) as error:
                log.warning("run events: cannot listen (%s); retrying", error)
                self._ready.set()  # start() must not hang on a database that is down
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _listen_once(self) -> None:
        """LISTEN until the connection is lost."""
        connection = await asyncpg.connect(self._dsn)
        try:
            lost = asyncio.Event()
            connection.add_termination_listener(lambda _connection: lost.set())
            await connection.add_listener(CHANNEL, self._notified)
            self._wake_all()  # anything may have changed while we were not listening
            self._ready.set()
            await lost.wait()
        finally:
            if not connection.is_closed():
                await connection.close()
