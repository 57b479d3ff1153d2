"""The demo's scenario on a running stack: publish the demo detector, import two cameras'
recordings, save a workflow, run a test run of 20 images and follow it live.

Every step goes through the public surfaces an operator uses: the `tools.model_repository publish`
command, S3 for the footage, and the coordinator's OperatorService and WorkshopService.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, time, timedelta

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from tools.demo.footage import FPS, SECONDS, Footage
from tools.demo.stack import CALL_TIMEOUT_S, RECORDINGS_BUCKET, Stack
from tools.demo.terminal import Console
from tools.localstack.host import tail
from tools.localstack.processes import run_module
from workshop.v1 import common_pb2, operator_pb2_grpc, workflow_pb2, workshop_pb2_grpc
from workshop.v1 import operator_pb2 as op
from workshop.v1 import workshop_pb2 as ws

MODEL = "demo_detector"
MODEL_VERSION = 1
WORKFLOW_ID = "yard-watch"
BUCKET_ID = "yard"
RUN_ID = "demo-run"
IMAGE_LIMIT = 20
# 30 s recordings sampled every 3 s: 10 slots per camera, 20 in all.
INTERVAL_SECONDS = 3
RECORDING_START = time(8, 0)
WINDOW = (8, 9)  # hours, UTC
# 20 frames take seconds; a run still unfinished after this is stuck (see the logs).
WATCH_TIMEOUT_S = 180.0
FINAL = (
    common_pb2.RUN_STATUS_COMPLETED,
    common_pb2.RUN_STATUS_FAILED,
    common_pb2.RUN_STATUS_CANCELLED,
    common_pb2.RUN_STATUS_EXPIRED,
)


def publish_detector(stack: Stack, console: Console) -> list[str]:
    """`python -m tools.model_repository publish --demo-detector`; returns the model's classes."""
    with console.stage(
        f"publishing the demo detector {MODEL} v{MODEL_VERSION} (tools.model_repository)"
    ):
        printed = run_module(
            "tools.model_repository",
            [
                "publish",
                "--repository",
                str(stack.triton.model_repository),
                "--name",
                MODEL,
                "--version",
                str(MODEL_VERSION),
                "--demo-detector",
            ],
            stack.operator_env(),
            stack.logs / "publish-model.log",
            base_env=stack.base_env,
        )
    return [str(name) for name in json.loads(printed)["classes"]]


def import_footage(
    stack: Stack, channel: grpc.Channel, footage: list[Footage], day: datetime
) -> None:
    """Upload each recording to the recordings bucket and register camera and recording."""
    operator = operator_pb2_grpc.OperatorServiceStub(channel)
    client = stack.s3.client()
    start = datetime.combine(day.date(), RECORDING_START, tzinfo=UTC)
    for clip in footage:
        key = f"{clip.camera_id}/{start:%Y-%m-%dT%H%M%S}{clip.path.suffix}"
        client.fput_object(RECORDINGS_BUCKET, key, str(clip.path))
        operator.PutCamera(
            op.PutCameraRequest(camera_id=clip.camera_id, name=f"demo {clip.codec} camera"),
            metadata=stack.admin,
            timeout=CALL_TIMEOUT_S,
        )
        operator.PutRecording(
            op.PutRecordingRequest(
                recording_id=f"{clip.camera_id}-{start:%Y%m%d-%H%M}",
                camera_id=clip.camera_id,
                start=_stamp(start),
                end=_stamp(start + timedelta(seconds=SECONDS)),
                fps=FPS,
                object_key=key,
                sha256=clip.info.sha256,
                byte_size=clip.info.byte_size,
            ),
            metadata=stack.admin,
            timeout=CALL_TIMEOUT_S,
        )


def save_workflow(
    channel: grpc.Channel, stack: Stack, cameras: list[str], classes: list[str]
) -> int:
    """The bucket and the workflow; returns the saved revision."""
    operator = operator_pb2_grpc.OperatorServiceStub(channel)
    operator.CreateBucket(
        op.CreateBucketRequest(bucket_id=BUCKET_ID, name="Yard"),
        metadata=stack.admin,
        timeout=CALL_TIMEOUT_S,
    )
    workshop = workshop_pb2_grpc.WorkshopServiceStub(channel)
    saved = workshop.SaveWorkflow(
        ws.SaveWorkflowRequest(
            workflow_id=WORKFLOW_ID, expected_revision=0, spec=workflow_spec(cameras, classes)
        ),
        metadata=stack.admin,
        timeout=CALL_TIMEOUT_S,
    )
    return saved.workflow.revision


def workflow_spec(cameras: list[str], classes: list[str]) -> workflow_pb2.WorkflowSpec:
    """Yesterday 08:00-09:00 UTC of every camera, a frame every 3 s, labelled by the
    detector; frames with any class scoring 0.5 are saved to the bucket, others dropped."""
    next_ = workflow_pb2.EDGE_BRANCH_NEXT
    steps = [
        workflow_pb2.Step(
            step_id="in",
            input=workflow_pb2.InputStep(
                camera_ids=cameras,
                day=workflow_pb2.INPUT_DAY_PREVIOUS_DAY,
                window_start=common_pb2.TimeOfDay(hours=WINDOW[0]),
                window_end=common_pb2.TimeOfDay(hours=WINDOW[1]),
            ),
        ),
        workflow_pb2.Step(
            step_id="sample", sample=workflow_pb2.SampleStep(interval_seconds=INTERVAL_SECONDS)
        ),
        workflow_pb2.Step(step_id="detect", model=workflow_pb2.ModelStep(model_name=MODEL)),
        workflow_pb2.Step(
            step_id="rule", rule=workflow_pb2.RuleStep(class_names=classes, min_score=0.5)
        ),
        workflow_pb2.Step(step_id="save", output=workflow_pb2.OutputStep(bucket_id=BUCKET_ID)),
        workflow_pb2.Step(step_id="drop", do_nothing=workflow_pb2.DoNothingStep()),
    ]
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
    return workflow_pb2.WorkflowSpec(
        name="Yard watch (demo)",
        time_zone="UTC",
        graph=workflow_pb2.WorkflowGraph(steps=steps, edges=edges),
    )


def create_run(channel: grpc.Channel, stack: Stack, revision: int) -> None:
    workshop = workshop_pb2_grpc.WorkshopServiceStub(channel)
    workshop.CreateRun(
        ws.CreateRunRequest(
            run_id=RUN_ID,
            workflow_id=WORKFLOW_ID,
            runtime_id=stack.runtime_id,
            revision=revision,
            mode=common_pb2.RUN_MODE_TEST,
            image_limit=IMAGE_LIMIT,
        ),
        metadata=stack.admin,
        timeout=CALL_TIMEOUT_S,
    )


def follow_run(channel: grpc.Channel, stack: Stack, console: Console) -> ws.WatchRunResponse:
    """Draw a progress bar from WorkshopService.WatchRun until the run is final."""
    workshop = workshop_pb2_grpc.WorkshopServiceStub(channel)
    stream = workshop.WatchRun(
        ws.WatchRunRequest(run_id=RUN_ID), metadata=stack.admin, timeout=WATCH_TIMEOUT_S
    )
    last: ws.WatchRunResponse | None = None
    try:
        for message in stream:
            last = message
            _draw(console, message)
            if message.final or message.detail.run.status in FINAL:
                break
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
        log = stack.logs / "processor.log"
        raise RuntimeError(
            f"run {RUN_ID} did not finish within {WATCH_TIMEOUT_S:.0f} s; the processor's "
            f"last lines ({log}):\n{tail(log, 10)}"
        ) from None
    finally:
        stream.cancel()
        console.end_progress()
    if last is None:
        raise RuntimeError(f"WatchRun ended without a message for run {RUN_ID}")
    return last


def _draw(console: Console, message: ws.WatchRunResponse) -> None:
    run = message.detail.run
    counts = run.counts
    committed = counts.slots_frame + counts.slots_empty + counts.slots_dropped
    # Previews appear frame by frame; slots are committed per job, when the job completes.
    done = max(committed, counts.previews_published)
    finished = counts.jobs_completed + counts.jobs_failed + counts.jobs_cancelled
    status = common_pb2.RunStatus.Name(run.status).removeprefix("RUN_STATUS_").lower()
    console.progress(
        f"run {RUN_ID}",
        int(done),
        int(counts.slots_expected),
        f"frames, {finished}/{counts.jobs_total} jobs done, {status}",
    )


def _stamp(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp
