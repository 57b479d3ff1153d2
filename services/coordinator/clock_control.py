"""The manual clock as an admin reads and moves it (GetClock, AdvanceClock).

The clock is the platform's (`platform/clock.py`); who may read and move it is identity's
rule (admin). It belongs to no domain room, so it sits with the composition root
(docs/architecture.md).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from services.coordinator.identity import auth
from services.coordinator.identity.auth import Principal, ScopeName
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.errors import InvalidField


class ClockControl:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def get_clock(self, who: Principal) -> tuple[datetime, bool]:
        auth.require(who, ScopeName.ADMIN)
        return await self.clock.current(), self.clock.manual

    async def advance_clock(
        self, who: Principal, by: timedelta | None, to: datetime | None
    ) -> datetime:
        auth.require(who, ScopeName.ADMIN)
        if to is not None:
            by = to - await self.clock.current()
        if by is None:
            raise InvalidField("Give either 'by' (a duration) or 'to' (a time).")
        return await self.clock.forward(by)
