"""Admission of a run (docs/runs-and-jobs.md): a CreateRun request checked and resolved
into the jobs to insert and the immutable snapshot.

It validates the workflow at the asked revision, resolves the day and the models, lists
the input recordings into jobs with their expected slots (`planning`), and builds the
snapshot; `Runs.create_run` inserts the result in the transaction that re-checks the
revision under a row lock. Nothing here writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime

from services.coordinator.platform.db import Connection
from services.coordinator.platform.errors import (
    NEEDS_TRACKING_MESSAGE,
    InvalidField,
    NeedsTracking,
    NotFound,
)
from services.coordinator.platform.fields import check_id
from services.coordinator.resources import registry
from services.coordinator.resources.registry import CurrentRecording, ModelVersionRow, RuntimeRow
from services.coordinator.runs import planning
from services.coordinator.workflows import documents, validation
from services.coordinator.workflows.documents import STALE_RUN, spec_from_json
from workshop.kit import limits
from workshop.kit.hashing import canonical_json, sha256_hex
from workshop.v1 import common_pb2, snapshot_pb2, workflow_pb2

PHOTO_PREFIX = "photo-"


def recording_ref(row: CurrentRecording) -> planning.RecordingRef:
    """A current recording as planning reads it."""
    return planning.RecordingRef(
        recording_id=row.recording_id,
        camera_id=row.camera_id,
        generation=row.generation,
        start=row.start_at,
        end=row.end_at,
        fps=row.fps,
        object_key=row.object_key,
        sha256=row.sha256,
        byte_size=row.byte_size,
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


async def admission_for(connection: Connection, request: RunRequest, now: datetime) -> Admission:
    """Checks the request against the workflow at its revision, the runtime and the
    catalog, then admits it (create_run inserts what this returns; plan_run shows it)."""
    workflow = await documents.live_workflow(connection, request.workflow_id)
    if workflow.revision != request.revision:
        raise documents.stale(request.workflow_id, request.revision, workflow.revision, STALE_RUN)
    runtime = await registry.runtime(connection, request.runtime_id)
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
    rows = await registry.recordings_for_input(connection, now, input_step.input.camera_ids, window)
    refs = [recording_ref(row) for row in rows]
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
