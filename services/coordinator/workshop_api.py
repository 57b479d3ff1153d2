"""Runs for the website and agents (docs/runs-and-jobs.md); workflow documents are the
workflows room's (`workflows.documents`).

CreateRun is the heart of admission: it validates the workflow at the asked
revision, resolves the day and the models, lists the input recordings into jobs
with their expected slots, and freezes everything in an immutable snapshot, in
one transaction that re-checks the revision under a row lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from google.protobuf import json_format

from services.coordinator import convert, planning
from services.coordinator.identity import auth
from services.coordinator.identity.auth import Principal, ScopeName
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import (
    Connection,
    Database,
    Row,
    fetch_all,
    fetch_column,
    fetch_one,
    sql,
)
from services.coordinator.platform.errors import (
    NEEDS_TRACKING_MESSAGE,
    AtCapacity,
    IdConflict,
    InvalidField,
    NeedsTracking,
    NotFound,
)
from services.coordinator.platform.fields import check_id
from services.coordinator.resources import registry
from services.coordinator.resources.registry import ModelVersionRow, RuntimeRow
from services.coordinator.status import RunCounts
from services.coordinator.workflows import documents, validation
from services.coordinator.workflows.documents import STALE_RUN, spec_from_json
from workshop.kit import limits
from workshop.kit.hashing import canonical_json, sha256_hex
from workshop.v1 import common_pb2, snapshot_pb2, workflow_pb2

TEST_RESULT_LIFETIME = timedelta(hours=1)
PHOTO_PREFIX = "photo-"


@dataclasses.dataclass(frozen=True, slots=True)
class RunFingerprint(Row):
    run_id: str
    fingerprint: str


@dataclasses.dataclass(frozen=True, slots=True)
class RunRow(Row):
    """A run with the counts its status and detail are worked out from (run_status)."""

    run_id: str
    seq: int
    kind: str  # "workflow" | "photo"
    mode: str  # "test" | "full"
    workflow_id: str
    workflow_revision: int
    runtime_id: str
    image_limit: int
    created_by: dict[str, str]  # the creating Principal.to_json
    created_at: datetime
    expires_at: datetime | None
    last_job_update: datetime | None
    counts: RunCounts


@dataclasses.dataclass(frozen=True, slots=True)
class JobRow(Row):
    """A job as a run's detail shows it."""

    job_index: int
    camera_id: str
    recording_id: str
    recording_generation: int
    state: str
    phase: str | None
    progress: int
    slot_count: int
    generation: int
    failure_reason: str | None
    failure_message: str | None
    decoder: str | None
    updated_at: datetime
    lease_expires_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class RunImageRow(Row):
    """One of a run's recent images: a published preview or a bucket item."""

    item_id: str
    source: str  # "preview" | "item"
    job_index: int
    slot_index: int
    camera_id: str
    frame_time: datetime
    boxes: list[dict[str, object]] | None
    bucket_id: str
    published_at: datetime
    expires_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotRecordingRow(Row):
    """A recording as a run's snapshot froze it, with its job's slot count."""

    job_index: int
    recording_id: str
    camera_id: str
    generation: int
    sha256: str
    byte_size: int
    object_key: str
    start_at: datetime
    end_at: datetime
    fps: float
    slot_count: int


@dataclasses.dataclass(frozen=True, slots=True)
class CurrentRecording(Row):
    """A current recording as admission lists it (runs and photos)."""

    recording_id: str
    camera_id: str
    generation: int
    start_at: datetime
    end_at: datetime
    fps: float
    object_key: str
    sha256: str
    byte_size: int
    expires_at: datetime

    def ref(self) -> planning.RecordingRef:
        return planning.RecordingRef(
            recording_id=self.recording_id,
            camera_id=self.camera_id,
            generation=self.generation,
            start=self.start_at,
            end=self.end_at,
            fps=self.fps,
            object_key=self.object_key,
            sha256=self.sha256,
            byte_size=self.byte_size,
        )


@dataclasses.dataclass(frozen=True)
class RunRequest:
    run_id: str
    workflow_id: str
    runtime_id: str
    revision: int
    mode: str  # "test" | "full"
    image_limit: int  # resolved: 1..100 for tests, 0 for full runs

    def fingerprint(self) -> str:
        """Digest of the request body: the same id must come with the same body."""
        body = dataclasses.asdict(self)
        del body["run_id"]
        return sha256_hex(canonical_json(body))


def run_request(
    *,
    run_id: str,
    workflow_id: str,
    runtime_id: str,
    revision: int,
    mode: str,
    image_limit: int | None,
) -> RunRequest:
    """Checks the fields of a CreateRun request and resolves the image limit's default."""
    check_id("run_id", run_id)
    if run_id.startswith(PHOTO_PREFIX):
        raise InvalidField(f"Run ids starting with {PHOTO_PREFIX!r} are reserved for photos.")
    check_id("workflow_id", workflow_id)
    check_id("runtime_id", runtime_id)
    if revision < 1:
        raise InvalidField("revision must be the workflow's current revision (1 or more).")
    if mode == "test":
        bounds = limits.IMAGE_LIMIT
        limit = bounds.default if image_limit is None else image_limit
        if not bounds.allows(limit):
            raise InvalidField(
                f"image_limit must be from {bounds.minimum} to {bounds.maximum} for a test run "
                f"(got {limit})."
            )
    elif mode == "full":
        if image_limit is not None:
            raise InvalidField(
                "image_limit applies to test runs only; leave it out for a full run."
            )
        limit = 0
    else:
        raise InvalidField("mode must be RUN_MODE_TEST or RUN_MODE_FULL.")
    return RunRequest(run_id, workflow_id, runtime_id, revision, mode, limit)


class WorkshopApi:
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
            admission = await self._admit(connection, who, request, now)
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
            policy_revision = await connection.fetchval(sql("runs", "policy_revision_share"))
            inserted = await self._insert(
                connection, who, request, admission, fingerprint, policy_revision, now
            )
        if not inserted:  # a concurrent call with the same id won the insert
            async with self.db.connection() as connection:
                existing = await fetch_one(
                    connection, RunFingerprint, sql("runs", "run_fingerprint"), request.run_id
                )
            assert existing is not None  # the run that won the insert
            return _settle_existing(request.run_id, existing.fingerprint, fingerprint)
        return request.run_id, True

    async def plan_run(self, who: Principal, request: RunRequest) -> Admission:
        """What create_run would admit, checked the same way, with nothing inserted
        (CreateRun validate_only): the id is not looked up and capacity is not checked."""
        auth.require(who, ScopeName.WORKSHOP)
        async with self.db.transaction() as connection:
            return await self._admit(connection, who, request, self.clock.now())

    async def _admit(
        self, connection: Connection, who: Principal, request: RunRequest, now: datetime
    ) -> Admission:
        workflow = await documents.live_workflow(connection, request.workflow_id)
        if workflow.revision != request.revision:
            raise documents.stale(
                request.workflow_id, request.revision, workflow.revision, STALE_RUN
            )
        runtime = await fetch_one(
            connection, RuntimeRow, sql("resources", "runtime_get"), request.runtime_id
        )
        if runtime is None:
            raise NotFound(
                "runtime", request.runtime_id, f"Runtime {request.runtime_id!r} is not registered."
            )
        spec = spec_from_json(workflow.spec)
        catalog = await documents.load_catalog(connection)
        result = validation.validate_workflow(spec, catalog)
        if not result.valid:
            raise documents.invalid(result)
        missing = set(result.required_capabilities) - set(runtime.capabilities)
        if missing:
            raise NeedsTracking(NEEDS_TRACKING_MESSAGE, metadata={"runtime_id": runtime.runtime_id})
        return await admit(connection, spec, catalog, request, runtime, now)

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
            sql("runs", "run_insert"),
            request.run_id,
            "workflow",
            request.mode,
            request.workflow_id,
            request.revision,
            request.runtime_id,
            request.image_limit,
            fingerprint,
            who.to_json(),
            policy_revision,
            now,
            expires_at,
            admission.snapshot.code_sha256,
        )
        if seq is None:
            return False
        snapshot = admission.snapshot
        snapshot.run_id = request.run_id
        snapshot.created_by.CopyFrom(principal_proto(who))
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
            sql("runs", "snapshot_recordings_insert"),
            request.run_id,
            [job.job_index for job in jobs],
            [r.recording_id for r in recordings],
            [r.camera_id for r in recordings],
            [r.generation for r in recordings],
            [r.sha256 for r in recordings],
            [r.byte_size for r in recordings],
            [r.object_key for r in recordings],
            [r.start for r in recordings],
            [r.end for r in recordings],
            [r.fps for r in recordings],
            [job.slot_count for job in jobs],
        )
        await connection.execute(
            sql("runs", "jobs_insert"),
            request.run_id,
            seq,
            request.runtime_id,
            admission.interval_ms,
            now,
            [job.job_index for job in jobs],
            [r.camera_id for r in recordings],
            [r.recording_id for r in recordings],
            [r.generation for r in recordings],
            [job.first_slot_at for job in jobs],
            [job.slot_count for job in jobs],
            [
                _job_expiry(admission.recording_expiry[job.recording.recording_id], expires_at)
                for job in jobs
            ],
        )
        return True

    async def get_run(
        self, who: Principal, run_id: str, job_limit: int, *, images: int = 0
    ) -> RunView:
        """A run with up to `job_limit` jobs and `images` recent images (none once expired).
        The gateway's key reads any run too: it serves one WatchRun stream per run to every
        client it authorized with the client's own credential."""
        auth.require(who, ScopeName.WORKSHOP, ScopeName.GATEWAY)
        async with self.db.connection() as connection:
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
        self, who: Principal, workflow_id: str, before_seq: int | None, limit: int
    ) -> list[RunView]:
        auth.require(who, ScopeName.WORKSHOP)
        async with self.db.connection() as connection:
            rows = await fetch_all(
                connection, RunRow, sql("runs", "run_list"), workflow_id or None, before_seq, limit
            )
            return [await self._view(connection, row, []) for row in rows]

    async def view(self, row: RunRow) -> RunView:
        """A run row with its status and the runs it waits behind."""
        async with self.db.connection() as connection:
            return await self._view(connection, row, [])

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


@dataclasses.dataclass
class Admission:
    """What CreateRun resolved before inserting: the snapshot (sans identity) and jobs."""

    snapshot: snapshot_pb2.RunSnapshot
    jobs: list[planning.JobPlan]
    interval_ms: int  # the sample step's interval, exact milliseconds (jobs.interval_ms)
    recording_expiry: dict[str, datetime]


async def admit(
    connection: Connection,
    spec: workflow_pb2.WorkflowSpec,
    catalog: validation.Catalog,
    request: RunRequest,
    runtime: RuntimeRow,
    now: datetime,
) -> Admission:
    """Resolves day, window, models and input; plans the jobs; builds the snapshot."""
    steps = {step.step_id: step for step in spec.graph.steps}
    input_id, input_step = next((k, s) for k, s in steps.items() if s.WhichOneof("kind") == "input")
    sample_id, sample = next((k, s) for k, s in steps.items() if s.WhichOneof("kind") == "sample")
    day = planning.resolve_day(input_step.input, spec.time_zone, now)
    window = planning.window_instants(
        day, input_step.input.window_start, input_step.input.window_end, spec.time_zone
    )
    rows = await fetch_all(
        connection,
        CurrentRecording,
        sql("resources", "recording_list_for_input"),
        now,
        list(input_step.input.camera_ids),
        window[0],
        window[1],
    )
    refs = [row.ref() for row in rows]
    interval_ms = planning.interval_ms(sample.sample.interval_seconds)
    jobs = planning.plan_jobs(
        refs, window, interval_ms, request.image_limit if request.mode == "test" else None
    )
    snapshot = snapshot_pb2.RunSnapshot(
        kind=common_pb2.RUN_KIND_WORKFLOW,
        workflow_id=request.workflow_id,
        workflow_revision=request.revision,
        workflow=spec,
        inputs=[
            snapshot_pb2.ResolvedInput(
                step_id=input_id,
                camera_ids=list(input_step.input.camera_ids),
                date=common_pb2.CalendarDate(year=day.year, month=day.month, day=day.day),
            )
        ],
        models=_pinned_models(spec, catalog, await _model_rows(connection)),
        sampling=snapshot_pb2.Sampling(
            step_id=sample_id,
            # the interval the jobs use, in seconds (0.5 for 500 ms)
            interval_seconds=interval_ms / 1000,
            keep_by_change=sample.sample.keep_by_change
            if sample.sample.HasField("keep_by_change")
            else None,
            dropped_allowed=validation.dropped_allowed(spec),
        ),
        outputs=[
            snapshot_pb2.SnapshotOutput(step_id=k, bucket_id=s.output.bucket_id)
            for k, s in steps.items()
            if s.WhichOneof("kind") == "output"
        ],
        mode=common_pb2.RUN_MODE_TEST if request.mode == "test" else common_pb2.RUN_MODE_FULL,
        image_limit=request.image_limit,
        runtime_id=runtime.runtime_id,
        code_sha256=runtime.code_sha256,
        recording_count=len(jobs),
        recordings_sha256=_recordings_digest(jobs),
    )
    snapshot.inputs[0].window_start.FromDatetime(window[0])
    snapshot.inputs[0].window_end.FromDatetime(window[1])
    return Admission(
        snapshot=snapshot,
        jobs=jobs,
        interval_ms=interval_ms,
        recording_expiry={r.recording_id: r.expires_at for r in rows},
    )


async def _model_rows(connection: Connection) -> dict[tuple[str, int], ModelVersionRow]:
    rows = await registry.model_versions(connection)
    return {(r.name, r.version): r for r in rows}


def _pinned_models(
    spec: workflow_pb2.WorkflowSpec,
    catalog: validation.Catalog,
    rows: Mapping[tuple[str, int], ModelVersionRow],
) -> list[snapshot_pb2.PinnedModel]:
    pinned = []
    for step in spec.graph.steps:
        if step.WhichOneof("kind") != "model":
            continue
        name = step.model.model_name
        latest = not step.model.HasField("version")
        version = max(catalog.models[name]) if latest else step.model.version
        row = rows[(name, version)]
        pinned.append(
            snapshot_pb2.PinnedModel(
                step_id=step.step_id,
                name=name,
                version=version,
                resolved_from_latest=latest,
                weights_sha256=row.weights_sha256,
                classes=list(row.classes),
                input_shape=list(row.input_shape),
            )
        )
    return pinned


def _recordings_digest(jobs: Sequence[planning.JobPlan]) -> str:
    return sha256_hex(
        canonical_json(
            [
                [
                    j.job_index,
                    j.recording.recording_id,
                    j.recording.generation,
                    j.recording.sha256,
                    j.slot_count,
                ]
                for j in jobs
            ]
        )
    )


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


def principal_proto(who: Principal) -> common_pb2.Principal:
    return convert.principal(who.to_json())


async def cancel_workflow_runs(
    connection: Connection, workflow_id: str, now: datetime
) -> list[str]:
    """Cancels a deleted workflow's unfinished runs in its deleting transaction (the
    workflows room's `CancelRuns`, wired in app.py); returns their ids."""
    return await fetch_column(
        connection, str, sql("runs", "runs_cancel_for_workflow"), workflow_id, now
    )
