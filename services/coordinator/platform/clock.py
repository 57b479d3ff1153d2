"""The coordinator's clock, injected everywhere time matters.

Every time-dependent statement takes `now` from a Clock rather than calling
now() in SQL, so tests move time instead of sleeping. `StoredClock` (enabled by
COORDINATOR_MANUAL_CLOCK=1) follows real time plus an offset that an admin
moves forward with AdvanceClock; it never moves backwards, so leases, expiries
and check-ins stay monotonic. The offset is kept in the database, so every
replica and every restart of the coordinator follow the same clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from services.coordinator.platform.db import Database, sql
from services.coordinator.platform.errors import ClockNotManual, InvalidField

CLOCK_CHANNEL = "workshop_clock"


class Clock(Protocol):
    @property
    def manual(self) -> bool: ...

    def now(self) -> datetime:
        """The time, from memory: what every time-dependent statement is given."""
        ...

    async def current(self) -> datetime:
        """The time as every replica agrees on it (GetClock)."""
        ...

    async def forward(self, by: timedelta) -> datetime:
        """Moves the clock forward (AdvanceClock); the time after the move."""
        ...


def _forward_only(by: timedelta) -> None:
    if by < timedelta(0):
        raise InvalidField(f"The clock only moves forward; got {by}.")


class SystemClock:
    manual = False

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def current(self) -> datetime:
        return self.now()

    async def forward(self, by: timedelta) -> datetime:
        raise ClockNotManual(
            "The clock is real time; start the coordinator with COORDINATOR_MANUAL_CLOCK=1 "
            "to move it (tests only)."
        )


class StoredClock:
    """Real time plus an offset that only grows, kept in the `manual_clock` row.

    Reading it is free: `now()` adds the offset this process last saw. The offset is
    read at start (`load`), taken from the answer of every move this process makes, and
    heard from the moves other replicas make: a move announces the new offset on
    CLOCK_CHANNEL, which RunEvents' LISTEN connection delivers to `heard` and after every
    (re)connect reads again through `resync`. A late or repeated announcement never
    moves the clock back, and GetClock (`current`) reads the row itself.
    """

    manual = True
    channel = CLOCK_CHANNEL

    def __init__(self, db: Database, ahead: timedelta) -> None:
        self._db = db
        self._ahead = ahead

    @classmethod
    async def load(cls, db: Database) -> StoredClock:
        clock = cls(db, timedelta(0))
        await clock.current()
        return clock

    def now(self) -> datetime:
        return datetime.now(UTC) + self._ahead

    async def current(self) -> datetime:
        async with self._db.connection() as connection:
            await self.resync(connection)
        return self.now()

    async def forward(self, by: timedelta) -> datetime:
        _forward_only(by)
        step = by // timedelta(microseconds=1)
        async with self._db.connection() as connection:
            ahead: int = await connection.fetchval(sql("clock", "manual_clock_advance"), step)
        self._saw(ahead)
        return self.now()

    def heard(self, payload: str) -> None:
        """An announcement of the offset (microseconds) by the replica that moved it."""
        self._saw(int(payload))

    async def resync(self, connection: Any) -> None:
        """Reads the offset on `connection` (RunEvents calls it once it listens again)."""
        self._saw(await connection.fetchval(sql("clock", "manual_clock_get")))

    def _saw(self, ahead_us: int) -> None:
        self._ahead = max(self._ahead, timedelta(microseconds=ahead_us))


class FrozenClock:
    """A clock that stands still until moved: for in-process tests."""

    manual = True

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("FrozenClock needs an aware datetime")
        self._now = start

    def now(self) -> datetime:
        return self._now

    async def current(self) -> datetime:
        return self._now

    async def forward(self, by: timedelta) -> datetime:
        return self.advance(by)

    def advance(self, by: timedelta) -> datetime:
        _forward_only(by)
        self._now += by
        return self._now
