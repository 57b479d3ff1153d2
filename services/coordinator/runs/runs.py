"""Runs for the website and agents (docs/runs-and-jobs.md): the `Runs` service creates
(through `admission`), reads, lists and cancels runs and pages their snapshots.

CreateRun inserts what admission resolved (the run, its snapshot and its jobs) in one
transaction that re-checks the workflow's revision under a row lock and the coordinator's
capacity; the same run id with the same request answers the run already made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, Sequence
from datetime import datetime, timedelta

from google.protobuf import json_format

from services.coordinator.identity import auth
from services.coordinator.identity.auth import Principal, ScopeName
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import (
    Connection,
    Database,
    bind,
    fetch_all,
    fetch_column,
    fetch_one,
    sql,
)
from services.coordinator.platform.errors import (
    AtCapacity,
    IdConflict,
    NotFound,
)
from services.coordinator.platform.metrics import RUNS_CREATED
from services.coordinator.runs.admission import Admission, RunRequest, admission_for
from services.coordinator.runs.events import RunEvents
from services.coordinator.runs.rows import (
    JobRow,
    RunFingerprint,
    RunImageRow,
    RunRow,
    SnapshotRecordingRow,
)
from services.coordinator.runs.runs_params import (
    JobsInsert,
    RunInsert,
    RunList,
    SnapshotRecordingsInsert,
)
from services.coordinator.runs.traces import record_trace
from services.coordinator.workflows import documents
from services.coordinator.workflows.documents import STALE_RUN

TEST_RESULT_LIFETIME = timedelta(hours=1)
# The recent images a run's detail shows (GetRun, WatchRun).
DETAIL_IMAGES = 100


class Runs:
    def __init__(self, db: Database, clock: Clock, *, capacity: int = 1_000_000) -> None:
        self.db = db
        self.clock = clock
        self.capacity = capacity

    # runs ---------------------------------------------------------------------------------

    async def create_run(self, who: Principal, request: RunRequest) -> tuple[str, bool]:
        """Admits a run; returns its id and whether this call created it."""
        auth.require(who, ScopeName.WORKSHOP)
        fingerprint = request.fingerprint()
        async with self.db.connection() as connection:
            existing = await fetch_one(
                connection, RunFingerprint, sql("runs", "run_fingerprint"), request.run_id
            )
        if existing is not None:
            return _settle_existing(request.run_id, existing.fingerprint, fingerprint)
        now = self.clock.now()
        async with self.db.transaction() as connection:
            admission = await admission_for(connection, request, now)
            # The revision again, under a row lock, in the transaction that inserts.
            locked = await documents.lock_revision(connection, request.workflow_id)
            if locked != request.revision:
                raise documents.stale(request.workflow_id, request.revision, locked, STALE_RUN)
            unfinished = await connection.fetchval(sql("runs", "unfinished_job_count"))
            if unfinished + len(admission.jobs) > self.capacity:
                raise AtCapacity(
                    f"The coordinator holds {unfinished} unfinished jobs; this run's "
                    f"{len(admission.jobs)} would pass the capacity of {self.capacity}. "
                    "Try again when runs have finished."
                )
            policy_revision = await auth.policy_revision_for_run(connection)
            inserted = await self._insert(
                connection, who, request, admission, fingerprint, policy_revision, now
            )
            if inserted:
                await record_trace(connection, request.run_id)
        if not inserted:  # a concurrent call with the same id won the insert
            async with self.db.connection() as connection:
                existing = await fetch_one(
                    connection, RunFingerprint, sql("runs", "run_fingerprint"), request.run_id
                )
            assert existing is not None  # the run that won the insert
            return _settle_existing(request.run_id, existing.fingerprint, fingerprint)
        RUNS_CREATED.labels("workflow", request.mode).inc()
        return request.run_id, True

    async def plan_run(self, who: Principal, request: RunRequest) -> Admission:
        """What create_run would admit, checked the same way, with nothing inserted
        (CreateRun validate_only): the id is not looked up and capacity is not checked."""
        auth.require(who, ScopeName.WORKSHOP)
        async with self.db.transaction() as connection:
            admission = await admission_for(connection, request, self.clock.now())
        admission.snapshot.run_id = request.run_id  # the snapshot the run would freeze
        return admission

    async def create_run_view(self, who: Principal, request: RunRequest) -> tuple[RunView, bool]:
        """create_run, answered with the run as it stands after (no jobs listed)."""
        run_id, created = await self.create_run(who, request)
        return await self.get_run(who, run_id, 0), created

    async def _insert(
        self,
        connection: Connection,
        who: Principal,
        request: RunRequest,
        admission: Admission,
        fingerprint: str,
        policy_revision: int,
        now: datetime,
    ) -> bool:
        expires_at = now + TEST_RESULT_LIFETIME if request.mode == "test" else None
        seq = await connection.fetchval(
            *bind(
                RunInsert(
                    run_id=request.run_id,
                    kind="workflow",
                    mode=request.mode,
                    workflow_id=request.workflow_id,
                    workflow_revision=request.revision,
                    runtime_id=request.runtime_id,
                    image_limit=request.image_limit,
                    fingerprint=fingerprint,
                    created_by=who.to_json(),
                    policy_revision=policy_revision,
                    created_at=now,
                    expires_at=expires_at,
                    code_sha256=admission.snapshot.code_sha256,
                )
            )
        )
        if seq is None:
            return False
        snapshot = admission.snapshot
        snapshot.run_id = request.run_id
        snapshot.created_by.CopyFrom(auth.principal_proto(who.to_json()))
        snapshot.policy_revision = policy_revision
        snapshot.created_at.FromDatetime(now)
        if expires_at is not None:
            snapshot.expires_at.FromDatetime(expires_at)
        await connection.execute(
            sql("runs", "snapshot_insert"),
            request.run_id,
            json_format.MessageToDict(snapshot, preserving_proto_field_name=True),
        )
        jobs = admission.jobs
        recordings = [job.recording for job in jobs]
        await connection.execute(
            *bind(
                SnapshotRecordingsInsert(
                    run_id=request.run_id,
                    job_index=[job.job_index for job in jobs],
                    recording_id=[r.recording_id for r in recordings],
                    camera_id=[r.camera_id for r in recordings],
                    generation=[r.generation for r in recordings],
                    sha256=[r.sha256 for r in recordings],
                    byte_size=[r.byte_size for r in recordings],
                    object_key=[r.object_key for r in recordings],
                    start_at=[r.start for r in recordings],
                    end_at=[r.end for r in recordings],
                    fps=[r.fps for r in recordings],
                    slot_count=[job.slot_count for job in jobs],
                )
            )
        )
        await connection.execute(
            *bind(
                JobsInsert(
                    run_id=request.run_id,
                    run_seq=seq,
                    runtime_id=request.runtime_id,
                    interval_ms=admission.interval_ms,
                    updated_at=now,
                    job_index=[job.job_index for job in jobs],
                    camera_id=[r.camera_id for r in recordings],
                    recording_id=[r.recording_id for r in recordings],
                    recording_generation=[r.generation for r in recordings],
                    first_slot_at=[job.first_slot_at for job in jobs],
                    slot_count=[job.slot_count for job in jobs],
                    expires_at=[
                        _job_expiry(
                            admission.recording_expiry[job.recording.recording_id], expires_at
                        )
                        for job in jobs
                    ],
                )
            )
        )
        return True

    async def get_run(
        self, who: Principal, run_id: str, job_limit: int, *, images: int = 0
    ) -> RunView:
        """A run with up to `job_limit` jobs and `images` recent images (none once expired).
        The gateway's key reads any run too: it serves one WatchRun stream per run to every
        client it authorized with the client's own credential."""
        auth.require(who, ScopeName.WORKSHOP, ScopeName.GATEWAY)
        # One snapshot for the run's counts and its jobs: read apart, a claim and a
        # progress report committed between the two reads showed a job's progress in a
        # run still "queued".
        async with self.db.snapshot() as connection:
            row = await fetch_one(connection, RunRow, sql("runs", "run_get"), run_id)
            if row is None:
                raise NotFound("run", run_id, f"Run {run_id!r} does not exist.")
            jobs = await fetch_all(connection, JobRow, sql("runs", "run_jobs"), run_id, job_limit)
            view = await self._view(connection, row, jobs)
            if images and view.status != "expired":
                view.images.extend(
                    await fetch_all(
                        connection,
                        RunImageRow,
                        sql("runs", "run_recent_images"),
                        run_id,
                        self.clock.now(),
                        images,
                    )
                )
            return view

    async def list_runs(
        self,
        who: Principal,
        workflow_id: str,
        before_seq: int | None,
        limit: int,
        *,
        status: str = "",
        mode: str = "",
    ) -> list[RunView]:
        """A page of runs, newest first; `status` and `mode` ("": any) keep those that match."""
        auth.require(who, ScopeName.WORKSHOP)
        async with self.db.connection() as connection:
            rows = await fetch_all(
                connection,
                RunRow,
                *bind(
                    RunList(
                        workflow_id=workflow_id or None,
                        before_seq=before_seq,
                        mode=mode or None,
                        status=status or None,
                        now=self.clock.now(),
                        limit=limit,
                    )
                ),
            )
            return [await self._view(connection, row, []) for row in rows]

    async def views(self, rows: Sequence[RunRow]) -> dict[str, RunView]:
        """Run rows read elsewhere (the summary's last runs) with their status and the runs
        they wait behind, by run id."""
        if not rows:
            return {}
        async with self.db.connection() as connection:
            return {row.run_id: await self._view(connection, row, []) for row in rows}

    async def _view(self, connection: Connection, row: RunRow, jobs: Sequence[JobRow]) -> RunView:
        status = row.counts.status(expired_by_time=_past(row.expires_at, self.clock.now()))
        waiting: list[str] = []
        if status == "queued":
            waiting = await fetch_column(
                connection, str, sql("runs", "run_waiting_behind"), row.runtime_id, row.seq
            )
        return RunView(row=row, status=status, waiting_behind=waiting, jobs=list(jobs))

    async def cancel_run(self, who: Principal, run_id: str) -> int:
        """Cancels the run's queued and leased jobs; returns how many (0 when finished)."""
        auth.require(who, ScopeName.WORKSHOP)
        async with self.db.transaction() as connection:
            if await connection.fetchrow(sql("runs", "run_fingerprint"), run_id) is None:
                raise NotFound("run", run_id, f"Run {run_id!r} does not exist.")
            cancelled: int = await connection.fetchval(
                sql("runs", "run_cancel"), run_id, self.clock.now()
            )
        return cancelled

    async def cancel_run_view(self, who: Principal, run_id: str) -> tuple[RunView, int]:
        """cancel_run, answered with the run as it stands after and how many jobs ended."""
        cancelled = await self.cancel_run(who, run_id)
        return await self.get_run(who, run_id, 0), cancelled

    async def run_detail(self, who: Principal, run_id: str, job_limit: int) -> RunView:
        """A run's detail: get_run with up to `job_limit` jobs and DETAIL_IMAGES images."""
        return await self.get_run(who, run_id, job_limit, images=DETAIL_IMAGES)

    async def watch_run(
        self, who: Principal, run_id: str, job_limit: int, events: RunEvents
    ) -> AsyncGenerator[RunView, None]:
        """The run's detail now (run_detail), then after every change, until it has finished:
        the last view yielded is `final`. Subscribed before the first read, so no change
        between a read and the wait is missed."""
        async with events.subscribe(run_id) as changes:
            while True:
                view = await self.run_detail(who, run_id, job_limit)
                yield view
                if view.final:
                    return
                await changes.wait()

    async def run_snapshot(
        self, who: Principal, run_id: str, after_index: int, limit: int
    ) -> tuple[dict[str, object], list[SnapshotRecordingRow]]:
        auth.require(who, ScopeName.WORKSHOP)
        async with self.db.connection() as connection:
            snapshot: dict[str, object] | None = await connection.fetchval(
                sql("runs", "run_snapshot_get"), run_id
            )
            if snapshot is None:
                raise NotFound("run", run_id, f"Run {run_id!r} does not exist.")
            rows = await fetch_all(
                connection,
                SnapshotRecordingRow,
                sql("runs", "snapshot_recordings_page"),
                run_id,
                after_index,
                limit,
            )
        return snapshot, rows


@dataclasses.dataclass(frozen=True)
class RunView:
    """A run as its detail shows it: the row, its status and what GetRun adds."""

    row: RunRow
    status: str
    waiting_behind: list[str]
    jobs: list[JobRow]
    images: list[RunImageRow] = dataclasses.field(default_factory=list)

    @property
    def final(self) -> bool:
        """The run has finished: its status changes no more (WatchRun ends here)."""
        return self.status not in ("queued", "running")

    @property
    def finished_at(self) -> datetime | None:
        """When its last job ended, once no job is queued or leased (an expired test run
        may still have some)."""
        counts = self.row.counts
        if counts.jobs_queued == 0 and counts.jobs_leased == 0:
            return self.row.last_job_update
        return None


def _job_expiry(recording_expiry: datetime, run_expiry: datetime | None) -> datetime:
    """A job expires with its source: the recording's retention, or the test's hour."""
    return recording_expiry if run_expiry is None else min(recording_expiry, run_expiry)


def _past(moment: datetime | None, now: datetime) -> bool:
    return moment is not None and moment <= now


def _settle_existing(run_id: str, stored: str, asked: str) -> tuple[str, bool]:
    if stored != asked:
        raise IdConflict(
            f"Run id {run_id!r} was already used with a different request; run ids are never "
            "reused. Choose a new id.",
            metadata={"run_id": run_id},
        )
    return run_id, False


async def cancel_workflow_runs(
    connection: Connection, workflow_id: str, now: datetime
) -> list[str]:
    """Cancels a deleted workflow's unfinished runs in its deleting transaction (the
    workflows room's `CancelRuns`, wired in app.py); returns their ids."""
    return await fetch_column(
        connection, str, sql("runs", "runs_cancel_for_workflow"), workflow_id, now
    )


async def cancel_bucket_runs(connection: Connection, bucket_id: str, now: datetime) -> list[str]:
    """Cancels the unfinished runs whose snapshot writes into a deleted bucket, in its
    deleting transaction (resources' `CancelBucketRuns`, wired in app.py); returns their
    ids."""
    return await fetch_column(
        connection, str, sql("runs", "runs_cancel_for_bucket"), bucket_id, now
    )
