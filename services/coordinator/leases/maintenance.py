"""Maintenance (docs/runs-and-jobs.md): rescue lapsed leases and expire jobs with their source;
forget failed logins older than the login window (docs/concepts.md#signing-in).

Runs on one replica at a time (a session advisory lock, on a connection from
`Database.session()` so the lock never goes back to the pool); every pass follows the
injected clock, so tests move time and call `run_once` instead of sleeping.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta

from services.coordinator.identity.signin import LOGIN_WINDOW, forget_login_failures
from services.coordinator.leases.jobs import AttemptsEnded, nothing_ended
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import Database, Row, fetch_all, sql
from services.coordinator.platform.metrics import LEASE_LAPSES
from services.coordinator.review import reviews
from workshop.kit.periodic import Periodic

log = logging.getLogger(__name__)

MAX_LAPSES = 3
BATCH = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class RescuedJob(Row):
    """A lapsed job the rescue handled: queued again, or failed once out of attempts."""

    run_id: str
    job_index: int
    state: str  # "queued" | "failed"


@dataclasses.dataclass(frozen=True)
class Pass:
    """What one maintenance pass changed."""

    requeued: int = 0
    exhausted: int = 0
    expired: int = 0
    grouped: int = 0  # timelines of items saved before sightings existed, grouped now
    logins_forgotten: int = 0  # failed-login rows older than the login window
    skipped: bool = False  # another replica held the lock


def count_lapses(rescued: list[RescuedJob]) -> None:
    for job in rescued:
        LEASE_LAPSES.labels("exhausted" if job.state == "failed" else "requeued").inc()


class Maintenance(Periodic):
    def __init__(
        self,
        db: Database,
        clock: Clock,
        *,
        interval_seconds: float,
        login_window: timedelta = LOGIN_WINDOW,
        attempts_ended: AttemptsEnded = nothing_ended,
    ) -> None:
        super().__init__("maintenance", self._pass, interval_seconds=interval_seconds)
        self.db = db
        self.clock = clock
        self.login_window = login_window
        self.attempts_ended = attempts_ended

    async def _pass(self) -> None:
        done = await self.run_once()
        if done.requeued or done.exhausted or done.expired or done.grouped:
            log.info("maintenance: %s", done)

    async def run_once(self) -> Pass:
        async with self.db.session() as connection:
            if not await connection.fetchval(sql("jobs", "maintenance_try_lock")):
                return Pass(skipped=True)
            try:
                now = self.clock.now()
                # Expiry first: a job whose source expired is expired, not retried.
                expired = 0
                while True:
                    rows = await connection.fetch(sql("jobs", "jobs_expire"), now, BATCH)
                    expired += len(rows)
                    if len(rows) < BATCH:
                        break
                requeued = exhausted = 0
                while True:
                    rescued = await fetch_all(
                        connection,
                        RescuedJob,
                        sql("jobs", "jobs_rescue_lapsed"),
                        now,
                        MAX_LAPSES,
                        BATCH,
                    )
                    exhausted += sum(job.state == "failed" for job in rescued)
                    requeued += sum(job.state == "queued" for job in rescued)
                    count_lapses(rescued)
                    # each job's latest lapsed attempt (the rescue answers no generation)
                    self.attempts_ended([(job.run_id, job.job_index, None) for job in rescued])
                    if len(rescued) < BATCH:
                        break
                grouped = await reviews.group_backlog(self.db)
                forgotten = await forget_login_failures(connection, now - self.login_window)
            finally:
                await connection.execute(sql("jobs", "maintenance_unlock"))
        return Pass(
            requeued=requeued,
            exhausted=exhausted,
            expired=expired,
            grouped=grouped,
            logins_forgotten=forgotten,
        )
