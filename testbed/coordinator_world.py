"""Builders for coordinator tests: a device, runtimes, cameras, recordings, a model,
a bucket, and workflow documents, created through the real OperatorService."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from services.coordinator.resources.registry import RECORDING_RETENTION
from testbed.harness.coordinator import CoordinatorHarness
from workshop.v1 import common_pb2, workflow_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import workshop_pb2 as ws

DAY = datetime(2026, 11, 29, tzinfo=UTC)  # the day before the harness's frozen "now"
CODE = "c0de" * 16


def stamp(value: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(value)
    return out


def error_reason(error: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """(code, ErrorInfo reason, ErrorInfo metadata) of a failed call."""
    status = rpc_status.from_call(error)
    info = error_details_pb2.ErrorInfo()
    if status is not None and status.details:
        status.details[0].Unpack(info)
    return error.code(), info.reason, dict(info.metadata)


@dataclasses.dataclass
class World:
    tracking_runtime: str
    plain_runtime: str


async def build_world(c: CoordinatorHarness, *, recordings_per_camera: int = 2) -> World:
    """gpu-box with a tracking and a plain runtime; cam-a and cam-b with hour-long recordings
    on DAY from 08:00; model `detector` v1 (person, vehicle); bucket `yard`."""
    md = c.admin
    await c.operator.RegisterDevice(op.RegisterDeviceRequest(device_id="gpu-box"), metadata=md)
    tracking = await c.operator.RegisterRuntime(
        op.RegisterRuntimeRequest(
            device_id="gpu-box",
            engine="workshop-processor",
            code_sha256=CODE,
            capabilities=["workshop-v3"],
        ),
        metadata=md,
    )
    plain = await c.operator.RegisterRuntime(
        op.RegisterRuntimeRequest(
            device_id="gpu-box", engine="workshop-processor-old", code_sha256=CODE
        ),
        metadata=md,
    )
    for camera in ("cam-a", "cam-b"):
        await c.operator.PutCamera(op.PutCameraRequest(camera_id=camera), metadata=md)
        for index in range(recordings_per_camera):
            await put_recording(c, f"{camera}-{index}", camera, DAY + timedelta(hours=8 + index))
    await c.operator.PublishModelVersion(
        op.PublishModelVersionRequest(
            name="detector",
            version=1,
            weights_sha256="ab" * 32,
            classes=["person", "vehicle"],
            input_shape=[3, 360, 640],
        ),
        metadata=md,
    )
    await c.operator.CreateBucket(op.CreateBucketRequest(bucket_id="yard"), metadata=md)
    return World(tracking.runtime.runtime_id, plain.runtime.runtime_id)


async def put_recording(
    c: CoordinatorHarness,
    recording_id: str,
    camera: str,
    start: datetime,
    length: timedelta = timedelta(hours=1),
) -> op.PutRecordingResponse:
    response: op.PutRecordingResponse = await c.operator.PutRecording(
        op.PutRecordingRequest(
            recording_id=recording_id,
            camera_id=camera,
            start=stamp(start),
            end=stamp(start + length),
            fps=30,
            object_key=f"recordings/{recording_id}.mp4",
            sha256=hashlib.sha256(recording_id.encode()).hexdigest(),
            byte_size=1000,
        ),
        metadata=c.admin,
    )
    return response


def workflow_spec(
    *,
    cameras: Sequence[str] = ("cam-a",),
    interval: float = 60,  # seconds, fractional allowed
    day: workflow_pb2.InputDay.ValueType = workflow_pb2.INPUT_DAY_DATE,
    date: tuple[int, int, int] = (2026, 11, 29),
    window: tuple[int, int] = (8, 18),
    time_zone: str = "UTC",
    keep_by_change: bool = False,
    classes: Sequence[str] = ("person",),
    bucket: str = "yard",
    schedule: tuple[int, int] | None = None,
    drop_unmatched: bool = True,
) -> workflow_pb2.WorkflowSpec:
    """input → sample → model → rule → (match) output / (no match) do nothing."""
    sample = workflow_pb2.SampleStep(interval_seconds=interval)
    if keep_by_change:
        sample.keep_by_change.min_displacement = 0.05
    steps = [
        workflow_pb2.Step(
            step_id="in",
            input=workflow_pb2.InputStep(
                camera_ids=list(cameras),
                day=day,
                date=common_pb2.CalendarDate(year=date[0], month=date[1], day=date[2])
                if day == workflow_pb2.INPUT_DAY_DATE
                else None,
                window_start=common_pb2.TimeOfDay(hours=window[0]),
                window_end=common_pb2.TimeOfDay(hours=window[1]),
            ),
        ),
        workflow_pb2.Step(step_id="sample", sample=sample),
        workflow_pb2.Step(step_id="detect", model=workflow_pb2.ModelStep(model_name="detector")),
        workflow_pb2.Step(
            step_id="rule", rule=workflow_pb2.RuleStep(class_names=list(classes), min_score=0.5)
        ),
        workflow_pb2.Step(step_id="save", output=workflow_pb2.OutputStep(bucket_id=bucket)),
        workflow_pb2.Step(step_id="drop", do_nothing=workflow_pb2.DoNothingStep())
        if drop_unmatched
        else workflow_pb2.Step(step_id="drop", output=workflow_pb2.OutputStep(bucket_id=bucket)),
    ]
    next_ = workflow_pb2.EDGE_BRANCH_NEXT
    edges = [
        workflow_pb2.Edge(from_step_id="in", to_step_id="sample", branch=next_),
        workflow_pb2.Edge(from_step_id="sample", to_step_id="detect", branch=next_),
        workflow_pb2.Edge(from_step_id="detect", to_step_id="rule", branch=next_),
        workflow_pb2.Edge(
            from_step_id="rule", to_step_id="save", branch=workflow_pb2.EDGE_BRANCH_MATCH
        ),
        workflow_pb2.Edge(
            from_step_id="rule", to_step_id="drop", branch=workflow_pb2.EDGE_BRANCH_NO_MATCH
        ),
    ]
    spec = workflow_pb2.WorkflowSpec(
        name="yard watch",
        time_zone=time_zone,
        graph=workflow_pb2.WorkflowGraph(steps=steps, edges=edges),
    )
    if schedule is not None:
        spec.schedule.time_of_day.hours, spec.schedule.time_of_day.minutes = schedule
    return spec


async def save_workflow(
    c: CoordinatorHarness, workflow_id: str, spec: workflow_pb2.WorkflowSpec, expected: int = 0
) -> workflow_pb2.Workflow:
    response = await c.workshop.SaveWorkflow(
        ws.SaveWorkflowRequest(workflow_id=workflow_id, expected_revision=expected, spec=spec),
        metadata=c.admin,
    )
    return response.workflow


def run_request(
    run_id: str,
    workflow_id: str,
    runtime_id: str,
    revision: int = 1,
    *,
    mode: common_pb2.RunMode.ValueType = common_pb2.RUN_MODE_TEST,
    image_limit: int | None = None,
) -> ws.CreateRunRequest:
    request = ws.CreateRunRequest(
        run_id=run_id,
        workflow_id=workflow_id,
        runtime_id=runtime_id,
        revision=revision,
        mode=mode,
    )
    if image_limit is not None:
        request.image_limit = image_limit
    return request


RECORDING_COLUMNS = (
    "recording_id",
    "camera_id",
    "generation",
    "start_at",
    "end_at",
    "fps",
    "object_key",
    "sha256",
    "byte_size",
    "put_at",
    "expires_at",
)


async def copy_recordings(
    c: CoordinatorHarness,
    spans: Sequence[tuple[str, str, datetime, datetime]],
    *,
    byte_size: int = 1000,
) -> None:
    """Many recordings at once, straight into the table (set-up for scale tests and
    benchmarks; PutRecording is what operators use): (recording id, camera, start, end),
    each as a first put would write it (generation 1, 40-day retention)."""
    now = c.clock.now()
    records = [
        (
            recording_id,
            camera,
            1,
            start,
            end,
            30.0,
            f"recordings/{recording_id}.mp4",
            hashlib.sha256(recording_id.encode()).hexdigest(),
            byte_size,
            now,
            now + RECORDING_RETENTION,
        )
        for recording_id, camera, start, end in spans
    ]
    async with c.db.connection() as connection:
        await connection.copy_records_to_table(
            "recordings", columns=list(RECORDING_COLUMNS), records=records
        )
