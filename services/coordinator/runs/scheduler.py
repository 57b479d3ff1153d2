"""Daily schedules (docs/workflows.md): one full run per scheduled workflow and day.

Each pass looks at every scheduled workflow whose local time of day has come
and creates the run `<workflow>-<date>` on the newest runtime that ever checked
in. The id is deterministic and CreateRun is idempotent, so a restarted
scheduler or a second replica never doubles a run; an advisory lock (a session
lock, on a connection from `Database.session()`) keeps replicas from doing the
same pass twice. A day the scheduler missed entirely is not backfilled: runs are
created for the current local day only.
"""

from __future__ import annotations

import logging
import zoneinfo
from datetime import datetime

from services.coordinator.identity.auth import SCHEDULER
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import Connection, Database, sql
from services.coordinator.resources.registry import choose_runtime
from services.coordinator.runs.admission import RunRequest
from services.coordinator.runs.runs import Runs
from services.coordinator.workflows.documents import scheduled_workflows
from workshop.kit.errors import WorkshopError
from workshop.kit.periodic import Periodic

log = logging.getLogger(__name__)


def run_id_for(workflow_id: str, day: str) -> str:
    return f"{workflow_id}-{day}"


class Scheduler(Periodic):
    def __init__(self, db: Database, clock: Clock, api: Runs, *, interval_seconds: float) -> None:
        super().__init__("scheduler", self.run_once, interval_seconds=interval_seconds)
        self.db = db
        self.clock = clock
        self.api = api
        self._reported: set[str] = set()

    async def run_once(self) -> list[str]:
        """One pass; returns the ids of the runs it created."""
        async with self.db.session() as connection:
            if not await connection.fetchval(sql("runs", "scheduler_try_lock")):
                return []
            try:
                due = await self._due(connection, self.clock.now())
            finally:
                await connection.execute(sql("runs", "scheduler_unlock"))
        created = []
        for request in due:
            try:
                run_id, was_created = await self.api.create_run(SCHEDULER, request)
            except WorkshopError as error:
                self._report_once(request.run_id, error)
                continue
            if was_created:
                log.info("scheduled run %s created", run_id)
                created.append(run_id)
        return created

    async def _due(self, connection: Connection, now: datetime) -> list[RunRequest]:
        """The runs that are due now and do not exist yet."""
        requests = []
        runtime = None
        for row in await scheduled_workflows(connection):
            local = now.astimezone(zoneinfo.ZoneInfo(row.time_zone or "UTC"))
            if local.time() < row.schedule_time:
                continue
            run_id = run_id_for(row.workflow_id, local.date().isoformat())
            if await connection.fetchrow(sql("runs", "run_fingerprint"), run_id) is not None:
                continue
            if runtime is None:
                try:
                    runtime = await choose_runtime(connection, now, [], recent=False)
                except WorkshopError as error:
                    self._report_once(run_id, error)
                    return []
            requests.append(
                RunRequest(
                    run_id=run_id,
                    workflow_id=row.workflow_id,
                    runtime_id=runtime.runtime_id,
                    revision=row.revision,
                    mode="full",
                    image_limit=0,
                )
            )
        return requests

    def _report_once(self, run_id: str, error: WorkshopError) -> None:
        if run_id not in self._reported:
            self._reported.add(run_id)
            log.warning("scheduled run %s not created: %s", run_id, error.message)
