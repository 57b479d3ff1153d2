"""Run events and claimable jobs across coordinator replicas (docs/runs-and-jobs.md).

A committing function calls `pg_notify('workshop_run', run_id)` inside its
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

The busiest commits (a job's Complete, a Claim, a batch of preview records) notify
nothing themselves (migration 0018): Postgres serializes every notifying transaction's
commit on one lock. Their caller `announce`s them once committed: this process's own
waiters wake at once, and the announcements of many commits go out together, at most
ANNOUNCE_SECONDS later, as one statement on the LISTEN connection (its own
notifications are not heard again). Announcements not yet sent when the connection
drops are sent after it reconnects; those of a process that dies before sending them
are lost, and the other replicas' waiters hear of those changes only with the next
event of the same run or runtime (a waiting Claim also returns at its deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, Protocol

from services.coordinator.platform.db import connect, sql

CHANNEL = "workshop_run"
JOBS_CHANNEL = "workshop_jobs"
RECONNECT_SECONDS = 1.0
# How long an announcement waits for others to go out with it: one notifying transaction
# per replica at most this often, instead of one per commit.
ANNOUNCE_SECONDS = 0.02
STOP_SEND_SECONDS = 1.0  # how long a stop waits for the announcements still unsent

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
        self._unsent: dict[tuple[str, str], None] = {}  # announced, not yet sent (in order)
        self._announced = asyncio.Event()  # set while _unsent holds any
        self._sent = asyncio.Event()  # set while _unsent is empty
        self._sent.set()
        self._listener_pid: int | None = None  # the LISTEN connection's backend

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="run-events")
            await self._ready.wait()

    async def stop(self) -> None:
        if self._task is None:
            return
        if self._listener_pid is not None:  # a graceful stop first sends what was announced
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.sent(), STOP_SEND_SECONDS)
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

    def announce_runs(self, run_ids: Iterable[str]) -> None:
        """After a commit that changed these runs and notified nothing itself."""
        self._announce(CHANNEL, run_ids)

    def announce_claimable(self, runtime_ids: Iterable[str]) -> None:
        """After a commit that may have made jobs of these runtimes claimable (a job ended)
        and notified nothing itself."""
        self._announce(JOBS_CHANNEL, runtime_ids)

    @property
    def listener_pid(self) -> int | None:
        """The backend of the LISTEN connection (which sends the announcements); None while
        not listening."""
        return self._listener_pid

    async def sent(self) -> None:
        """Returns once no announcement is left unsent (a test's fence: notifications of
        other transactions may arrive before the announcements of earlier commits)."""
        await self._sent.wait()

    def _announce(self, channel: str, keys: Iterable[str]) -> None:
        for key in keys:
            self._wake(channel, key)
            self._unsent[channel, key] = None
        if self._unsent:
            self._sent.clear()
            self._announced.set()

    def _notified(self, _connection: Any, pid: int, channel: str, key: str) -> None:
        if pid != self._listener_pid:  # this process's own were woken when announced
            self._wake(channel, key)

    def _wake(self, channel: str, key: str) -> None:
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
            self._listener_pid = connection.get_server_pid()
            self._wake_all()  # anything may have changed while we were not listening
            self._ready.set()
            tasks = [
                asyncio.create_task(self._send(connection), name="run-events-announce"),
                asyncio.create_task(lost.wait()),
            ]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._listener_pid = None
            if not connection.is_closed():
                await connection.close()

    async def _send(self, connection: Any) -> None:
        """Sends the announcements as they come, each batch after ANNOUNCE_SECONDS; returns
        when the connection fails (what was not sent is sent after the reconnect)."""
        statement = sql("runs", "run_events_announce")
        while True:
            await self._announced.wait()
            await asyncio.sleep(ANNOUNCE_SECONDS)
            batch, self._unsent = list(self._unsent), {}  # what comes meanwhile: next time
            try:
                await connection.execute(
                    statement, [channel for channel, _ in batch], [key for _, key in batch]
                )
            except BaseException as error:  # also cancelled mid-send: keep them for the next
                self._unsent = dict.fromkeys([*batch, *self._unsent])
                if not isinstance(error, Exception):
                    raise
                log.warning("run events: cannot announce (%s: %s)", type(error).__name__, error)
                return  # the connection is gone (asyncpg raises many kinds)
            if not self._unsent:
                self._announced.clear()
                self._sent.set()


def _to(follower: Follower) -> Any:
    def heard(_connection: Any, _pid: int, _channel: str, payload: str) -> None:
        follower.heard(payload)

    return heard
