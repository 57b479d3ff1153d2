"""A run's status, worked out from its jobs in the order of docs/runs-and-jobs.md."""

from __future__ import annotations

import dataclasses

from services.coordinator.platform.db import Row


@dataclasses.dataclass(frozen=True, slots=True)
class RunCounts(Row):
    """A run's job and slot counts: the count columns of the run_status view."""

    jobs_total: int = 0
    jobs_queued: int = 0
    jobs_leased: int = 0
    jobs_completed: int = 0
    jobs_failed: int = 0
    jobs_cancelled: int = 0
    jobs_expired: int = 0
    slots_expected: int = 0
    slots_frame: int = 0
    slots_empty: int = 0
    slots_dropped: int = 0
    items_saved: int = 0
    previews_published: int = 0

    def status(self, *, expired_by_time: bool = False) -> str:
        """any leased → running; any queued → queued; any failed → failed; any cancelled →
        cancelled; any expired → expired; else completed. A test run past its hour is expired."""
        if expired_by_time:
            return "expired"
        for state, count in (
            ("running", self.jobs_leased),
            ("queued", self.jobs_queued),
            ("failed", self.jobs_failed),
            ("cancelled", self.jobs_cancelled),
            ("expired", self.jobs_expired),
        ):
            if count:
                return state
        return "completed"
