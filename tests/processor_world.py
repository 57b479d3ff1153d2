"""The world processor tests run in, on the real components: a device and the runtime of
this checkout's code, cameras with real recordings in SeaweedFS, the demo detector in
Triton's model repository and the coordinator, the bucket `yard`; and an in-process
processor on the harness's coordinator and preview service."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import secrets
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import grpc

from services.coordinator.identity.auth import Grant, ScopeName
from services.processor.calls import SessionJobs, Transport, UnaryJobs, job_transport
from services.processor.inference import ModelServer
from services.processor.recordings import RecordingStore
from services.processor.worker import Processor
from testbed.coordinator_world import DAY, run_request, save_workflow, stamp, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tools.demo.scenes import Scene, random_scene, write_recording
from tools.model_repository.detector import CLASSES, build_detector, weights_sha256
from tools.model_repository.repository import publish_version
from workshop.kit.auth import bearer_metadata
from workshop.kit.processor_manifest import code_sha256, registration
from workshop.v1 import common_pb2, jobs_pb2_grpc, preview_pb2_grpc, run_pb2, workflow_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import workshop_pb2 as ws

START = DAY + timedelta(hours=8)
SECONDS = 20  # each recording's length; a 2 s interval gives 10 slots per job
DEVICE = "gpu-box"
CAMERAS: dict[str, tuple[Literal["vp9", "h264"], int]] = {
    "cam-a": ("vp9", 11),
    "cam-b": ("h264", 12),
}
# Cameras a world may also have (codec and scene seed), for runs of more than two jobs.
MORE_CAMERAS: dict[str, tuple[Literal["vp9", "h264"], int]] = {"cam-c": ("vp9", 13)}


@dataclasses.dataclass(frozen=True)
class ProcessorWorld:
    runtime_id: str
    model: str  # the detector's name in Triton's repository and the coordinator
    scenes: dict[str, Scene]  # each camera's scene, for its ground truth
    files: dict[str, Path]  # each camera's recording file, as uploaded


async def build_world(
    c: CoordinatorHarness,
    preview: PreviewHarness,
    triton: TritonServer,
    tmp: Path,
    cameras: Iterable[str] = CAMERAS,
) -> ProcessorWorld:
    """The device, runtime, cameras (recording `<camera>-0` each, SECONDS long from START),
    model and bucket a processor of this checkout works with."""
    md = c.admin
    await c.operator.RegisterDevice(op.RegisterDeviceRequest(device_id=DEVICE), metadata=md)
    runtime = await c.operator.RegisterRuntime(registration(DEVICE), metadata=md)
    scenes, files = {}, {}
    for camera in cameras:
        codec, seed = {**CAMERAS, **MORE_CAMERAS}[camera]
        scenes[camera] = random_scene(seed, seconds=SECONDS)
        path = files[camera] = tmp / f"{camera}.{codec}"
        write_recording(path, scenes[camera], seconds=SECONDS, fps=10, codec=codec)
        await c.operator.PutCamera(op.PutCameraRequest(camera_id=camera), metadata=md)
        await put_recording(c, preview, f"{camera}-0", camera, path)
    name = f"detector_{secrets.token_hex(4)}"
    weights = build_detector(360, 640)
    publish_version(triton.model_repository, name, 1, weights, classes=CLASSES)
    await c.operator.PublishModelVersion(
        op.PublishModelVersionRequest(
            name=name,
            version=1,
            weights_sha256=weights_sha256(weights),
            classes=list(CLASSES),
            input_shape=[360, 640, 3],
        ),
        metadata=md,
    )
    await c.operator.CreateBucket(op.CreateBucketRequest(bucket_id="yard"), metadata=md)
    return ProcessorWorld(runtime.runtime.runtime_id, name, scenes, files)


async def put_recording(
    c: CoordinatorHarness, preview: PreviewHarness, recording_id: str, camera: str, path: Path
) -> op.PutRecordingResponse:
    """Uploads the file to S3 and (re)places the recording SECONDS long from START; a put
    of an existing id is a replacement (a new generation)."""
    data = await asyncio.to_thread(path.read_bytes)
    key = f"recordings/{recording_id}-{hashlib.sha256(data).hexdigest()[:12]}"
    client = preview.bucket.server.client()
    await asyncio.to_thread(client.fput_object, preview.bucket.name, key, str(path))
    reply: op.PutRecordingResponse = await c.operator.PutRecording(
        op.PutRecordingRequest(
            recording_id=recording_id,
            camera_id=camera,
            start=stamp(START),
            end=stamp(START + timedelta(seconds=SECONDS)),
            fps=10,
            object_key=key,
            sha256=hashlib.sha256(data).hexdigest(),
            byte_size=len(data),
        ),
        metadata=c.admin,
    )
    return reply


def yard_spec(
    model: str, cameras: Sequence[str] = tuple(CAMERAS), classes: Sequence[str] = CLASSES
) -> workflow_pb2.WorkflowSpec:
    """Every 2 s from 08:00 to 09:00, the detector; frames with one of `classes` go to `yard`
    (the default: every class the detector knows, so every slot with an object is saved)."""
    spec = workflow_spec(cameras=list(cameras), interval=2, window=(8, 9))
    spec.graph.steps[2].model.model_name = model
    spec.graph.steps[3].rule.class_names[:] = list(classes)
    return spec


async def one_camera_run(
    c: CoordinatorHarness, preview: PreviewHarness, triton: TritonServer, tmp: Path
) -> ProcessorWorld:
    """cam-a's world, workflow `yard` over it and full run r1 (one job)."""
    world = await build_world(c, preview, triton, tmp, cameras=["cam-a"])
    await save_workflow(c, "yard", yard_spec(world.model, ["cam-a"]))
    await c.workshop.CreateRun(
        run_request("r1", "yard", world.runtime_id, mode=common_pb2.RUN_MODE_FULL),
        metadata=c.admin,
    )
    return world


async def run_key(c: CoordinatorHarness) -> str:
    """A workshop:run key bound to the device: what a processor authenticates with."""
    return await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id=DEVICE), name="processor")


def job_calls(
    channel: grpc.aio.Channel, transport: Transport = "session"
) -> SessionJobs | UnaryJobs:
    """A processor's JobService calls on `channel` (by default on the session stream), for
    a test's wrapper around them (processor_gates.Spy); the stream ends with the channel
    or `close()`."""
    return job_transport(transport, jobs_pb2_grpc.JobServiceStub(channel))


@asynccontextmanager
async def running_processor(
    c: CoordinatorHarness,
    preview: PreviewHarness,
    triton: TritonServer,
    runtime_id: str,
    *,
    jobs: Any = None,
    previews: Any = None,
    transport: Transport = "session",
    **fields: Any,
) -> AsyncIterator[Processor]:
    """A started in-process processor; its JobService calls go over `transport` (the
    processor's default: the session stream), or `jobs` (a test's wrapper around
    job_calls(), or around a stub for unary calls) replaces them; `previews` replaces its
    preview stub; `fields` set Processor fields. Stopped on exit."""
    server = preview.bucket.server
    recordings = RecordingStore(
        server.endpoint, server.access_key, server.secret_key, preview.bucket.name
    )
    models = ModelServer(triton.grpc_url, triton.model_repository)
    own = job_calls(c.channel, transport) if jobs is None else None
    worker = Processor(
        jobs=jobs if own is None else own,
        previews=preview_pb2_grpc.PreviewServiceStub(preview.channel)
        if previews is None
        else previews,
        credentials=bearer_metadata(await run_key(c)),
        runtime_id=runtime_id,
        code_sha256=code_sha256(),
        recordings=recordings,
        models=models,
        **{"idle_seconds": 0.2, **fields},
    )
    try:
        await worker.start()
        yield worker
    finally:
        await worker.stop()
        if own is not None:
            await own.close()
        await models.close()
        recordings.close()


async def run_detail(c: CoordinatorHarness, run_id: str) -> run_pb2.RunDetail:
    reply: ws.GetRunResponse = await c.workshop.GetRun(
        ws.GetRunRequest(run_id=run_id), metadata=c.admin
    )
    return reply.detail


async def finished(c: CoordinatorHarness, run_id: str) -> run_pb2.RunDetail:
    """The run's detail once it is neither queued nor running (polls for up to 60 s; a
    poll answered UNAVAILABLE, as during a database outage a test makes, is a poll)."""
    detail = run_pb2.RunDetail()
    for _ in range(600):
        try:
            detail = await run_detail(c, run_id)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        else:
            if detail.run.status not in (
                common_pb2.RUN_STATUS_QUEUED,
                common_pb2.RUN_STATUS_RUNNING,
            ):
                return detail
        await asyncio.sleep(0.1)
    raise AssertionError(f"run {run_id} did not finish: {detail.run}")
