"""The boxes this coordinator recorded with a full run's previews, kept for their commit.

A full run's processor records each frame's preview with its boxes, then completes the
job naming every preview as its frame's upload and sending no boxes (boxes_recorded). The
commit groups the items from those boxes before it writes them. Reading them back from
the staged rows, and splitting each box into values, was most of job_commit_prepare's
time; the coordinator that recorded them (a processor's session stream stays on one
replica) already had them split. So the previews room remembers, for each preview it
recorded, its boxes as the grouping reads them and the `staged_at` it recorded them
with, and the commit takes them from here.

A remembered preview is used only while its staged row is still the one this coordinator
wrote: the commit's job_commit_prepare answers each staged row's `staged_at` (read under
the job's lock), and any that differs (recorded again since, by another replica or an
earlier release) sends the whole commit back to reading the boxes from the rows. A
preview recorded elsewhere was never remembered here, which does the same. Nothing is
remembered for test runs (their commits save no items), and what is never taken (a lease
that lapsed, a job refused) is dropped oldest first past `limit` entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from services.coordinator.leases.boxes import FrameBoxes

# About 0.6 kB an entry (a frame of 3 boxes): a few hundred jobs of 120 frames in flight.
LIMIT = 50_000

Remembered = tuple[datetime, FrameBoxes]


class RecordedBoxes:
    def __init__(self, limit: int = LIMIT) -> None:
        self._limit = limit
        self._entries: dict[str, Remembered] = {}

    def remember(self, staged_at: datetime, recorded: Iterable[tuple[str, FrameBoxes]]) -> None:
        """The boxes each preview (key, boxes) of a batch was recorded with at `staged_at`
        (their rows'). A key recorded again keeps its place in the order of dropping."""
        self._entries.update((key, (staged_at, boxes)) for key, boxes in recorded)
        while len(self._entries) > self._limit:
            del self._entries[next(iter(self._entries))]

    def take(self, keys: Sequence[str]) -> list[Remembered] | None:
        """What was remembered for every one of `keys`, forgotten here now; None (and
        nothing forgotten) when any of them is not remembered."""
        entries = self._entries
        if not all(key in entries for key in keys):
            return None
        return [entries.pop(key) for key in keys]

    def __len__(self) -> int:
        return len(self._entries)
