"""The coordinator's clock, injected everywhere time matters.

Every time-dependent statement takes `now` from a Clock rather than calling
now() in SQL, so tests move time instead of sleeping. `ManualClock` (enabled by
COORDINATOR_MANUAL_CLOCK=1) follows real time plus an offset that an admin
moves forward with AdvanceClock; it never moves backwards, so leases, expiries
and check-ins stay monotonic.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

from services.coordinator.errors import ClockNotManual, InvalidField


class Clock(Protocol):
    @property
    def manual(self) -> bool: ...

    def now(self) -> datetime: ...

    def advance(self, by: timedelta) -> datetime: ...


class SystemClock:
    manual = False

    def now(self) -> datetime:
        return datetime.now(UTC)

    def advance(self, by: timedelta) -> datetime:
        raise ClockNotManual(
            "The clock is real time; start the coordinator with COORDINATOR_MANUAL_CLOCK=1 "
            "to move it (tests only)."
        )


class ManualClock:
    """Real time plus an offset that only grows."""

    manual = True

    def __init__(self, start_offset: timedelta = timedelta(0)) -> None:
        self._offset = start_offset

    def now(self) -> datetime:
        return datetime.now(UTC) + self._offset

    def advance(self, by: timedelta) -> datetime:
        if by < timedelta(0):
            raise InvalidField(f"The clock only moves forward; got {by}.")
        self._offset += by
        return self.now()


class FrozenClock:
    """A clock that stands still until moved: for in-process tests."""

    manual = True

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("FrozenClock needs an aware datetime")
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, by: timedelta) -> datetime:
        if by < timedelta(0):
            raise InvalidField(f"The clock only moves forward; got {by}.")
        self._now += by
        return self._now
