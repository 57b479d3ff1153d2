"""Run events and claimable jobs across coordinator replicas (docs/runs-and-jobs.md).

Every committing function calls `pg_notify('workshop_run', run_id)` inside its
transaction, so an event exists exactly when the change it announces is
committed, whichever replica committed it; a trigger announces every job that
becomes claimable on `workshop_jobs` with its runtime id (migration 0009).
Each coordinator process holds one LISTEN connection and wakes the WatchRun
streams of that run, or the Claims waiting for that runtime. A wake carries no
data: the woken re-read the database, so coalesced or duplicate wakes lose
nothing. If the LISTEN connection drops (database restart), the hub reconnects
and wakes everyone, since notifications sent meanwhile are lost. Followers (the
stored manual clock) hear their own channel's payloads on the same connection and
read their state again after each (re)connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from services.coordinator.platform.db import connect

CHANNEL = "workshop_run"
JOBS_CHANNEL = "workshop_jobs"
RECONNECT_SECONDS = 1.0

log = logging.getLogger(__name__)


class Follower(Protocol):
    """State announced on a channel of its own, kept current over the LISTEN connection."""

    @property
    def channel(self) -> str: ...

    def heard(self, payload: str) -> None:
        """A notification on `channel`, in order of commit."""

    async def resync(self, connection: Any) -> None:
        """Reads the state again (on the LISTEN connection, once it listens)."""


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
    def __init__(self, dsn: str, *, followers: Sequence[Follower] = ()) -> None:
        self._dsn = dsn
        self._followers = tuple(followers)
        self._subscriptions: dict[tuple[str, str], set[Subscription]] = defaultdict(set)
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

    def subscribe(self, run_id: str) -> contextlib.AbstractAsyncContextManager[Subscription]:
        """Wakes when the run changes."""
        return self._subscribed(CHANNEL, run_id)

    def claimable(self, runtime_id: str) -> contextlib.AbstractAsyncContextManager[Subscription]:
        """Wakes when a job of the runtime becomes claimable."""
        return self._subscribed(JOBS_CHANNEL, runtime_id)

    @contextlib.asynccontextmanager
    async def _subscribed(self, channel: str, key: str) -> AsyncIterator[Subscription]:
        subscription = Subscription()
        self._subscriptions[channel, key].add(subscription)
        try:
            yield subscription
        finally:
            watchers = self._subscriptions[channel, key]
            watchers.discard(subscription)
            if not watchers:
                del self._subscriptions[channel, key]

    def _notified(self, _connection: Any, _pid: int, channel: str, key: str) -> None:
        for subscription in self._subscriptions.get((channel, key), ()):
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
            except Exception as error:  # asyncpg raises more than OSError and PostgresError
                # for a server going away mid-handshake (InterfaceError, InternalClientError)
                log.warning(
                    "run events: cannot listen (%s: %s); retrying", type(error).__name__, error
                )
                self._ready.set()  # start() must not hang on a database that is down
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _listen_once(self) -> None:
        """LISTEN until the connection is lost."""
        connection = await connect(self._dsn, named=True)
        try:
            lost = asyncio.Event()
            connection.add_termination_listener(lambda _connection: lost.set())
            await connection.add_listener(CHANNEL, self._notified)
            await connection.add_listener(JOBS_CHANNEL, self._notified)
            for follower in self._followers:
                await connection.add_listener(follower.channel, _to(follower))
                await follower.resync(connection)  # after LISTEN: no move falls between
            self._wake_all()  # anything may have changed while we were not listening
            self._ready.set()
            await lost.wait()
        finally:
            if not connection.is_closed():
                await connection.close()


def _to(follower: Follower) -> Any:
    def heard(_connection: Any, _pid: int, _channel: str, payload: str) -> None:
        follower.heard(payload)

    return heard
