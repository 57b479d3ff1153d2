"""A processor runs real jobs end to end: real coordinator (Postgres), preview service and
recordings (SeaweedFS), decoding (DALI/PyAV) and inference (the bundled Triton)."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, timedelta
from pathlib import Path
from typing import Literal

import pytest

from services.coordinator.auth import Grant, ScopeName
from services.processor.inference import ModelServer
from services.processor.manifest import code_sha256
from services.processor.recordings import RecordingStore
from services.processor.worker import Processor
from tests.coordinator_world import DAY, save_workflow, stamp, workflow_spec
from tests.harness.coordinator import CoordinatorHarness
from tests.harness.preview import PreviewHarness
from tests.harness.triton import TritonServer
from workshop.demo.scenes import Scene, ground_truth, random_scene, write_recording
from workshop.kit.auth import bearer_metadata
from workshop.models.detector import CLASSES, build_detector, weights_sha256
from workshop.models.repository import publish_version
from workshop.v1 import common_pb2, jobs_pb2_grpc, preview_pb2_grpc
from workshop.v1 import operator_pb2 as op
from workshop.v1 import workshop_pb2 as ws

pytestmark = pytest.mark.triton
START = DAY + timedelta(hours=8)
SECONDS = 20
CAMERAS: dict[str, tuple[Literal["vp9", "h264"], int]] = {
    "cam-a": ("vp9", 11),
    "cam-b": ("h264", 12),
}


async def _world(
    c: CoordinatorHarness, preview: PreviewHarness, triton: TritonServer, tmp: Path
) -> tuple[str, str, dict[str, Scene]]:
    """Device, runtime of this processor's code, cameras with real recordings in S3, the demo
    detector in Triton's repository and the coordinator, a bucket; returns the runtime id,
    the model name and each camera's scene."""
    md = c.admin
    await c.operator.RegisterDevice(op.RegisterDeviceRequest(device_id="gpu-box"), metadata=md)
    runtime = await c.operator.RegisterRuntime(
        op.RegisterRuntimeRequest(
            device_id="gpu-box",
            engine="workshop-processor",
            code_sha256=code_sha256(),
            capabilities=["workshop-v3"],
        ),
        metadata=md,
    )
    client = preview.bucket.server.client()
    scenes = {}
    for camera, (codec, seed) in CAMERAS.items():
        scenes[camera] = random_scene(seed, seconds=SECONDS)
        path = tmp / f"{camera}.{codec}"
        write_recording(path, scenes[camera], seconds=SECONDS, fps=10, codec=codec)
        data = path.read_bytes()
        key = f"recordings/{camera}.{codec}"
        await asyncio.to_thread(client.fput_object, preview.bucket.name, key, str(path))
        await c.operator.PutCamera(op.PutCameraRequest(camera_id=camera), metadata=md)
        await c.operator.PutRecording(
            op.PutRecordingRequest(
                recording_id=f"{camera}-0",
                camera_id=camera,
                start=stamp(START),
                end=stamp(START + timedelta(seconds=SECONDS)),
                fps=10,
                object_key=key,
                sha256=hashlib.sha256(data).hexdigest(),
                byte_size=len(data),
            ),
            metadata=md,
        )
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
    return runtime.runtime.runtime_id, name, scenes


@pytest.fixture
async def processor(
    coordinator: CoordinatorHarness, preview: PreviewHarness, triton_server: TritonServer
) -> AsyncIterator[Processor]:
    key = await coordinator.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"))
    server = preview.bucket.server
    recordings = RecordingStore(
        server.endpoint, server.access_key, server.secret_key, preview.bucket.name
    )
    models = ModelServer(triton_server.grpc_url, triton_server.model_repository)
    worker = Processor(
        jobs=jobs_pb2_grpc.JobServiceStub(coordinator.channel),
        previews=preview_pb2_grpc.PreviewServiceStub(preview.channel),
        credentials=bearer_metadata(key),
        runtime_id="",  # set by the test once the runtime is registered
        code_sha256=code_sha256(),
        recordings=recordings,
        models=models,
        idle_seconds=0.2,
    )
    try:
        yield worker
    finally:
        await worker.stop()
        await models.close()
        recordings.close()


async def _finished(c: CoordinatorHarness, run_id: str) -> ws.GetRunResponse:
    for _ in range(600):
        reply: ws.GetRunResponse = await c.workshop.GetRun(
            ws.GetRunRequest(run_id=run_id), metadata=c.admin
        )
        if reply.detail.run.status not in (
            common_pb2.RUN_STATUS_QUEUED,
            common_pb2.RUN_STATUS_RUNNING,
        ):
            return reply
        await asyncio.sleep(0.1)
    raise AssertionError(f"run {run_id} did not finish: {reply.detail.run}")


@pytest.mark.parametrize("mode", [common_pb2.RUN_MODE_TEST, common_pb2.RUN_MODE_FULL])
async def test_a_run_labels_every_sampled_frame_like_the_ground_truth(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    processor: Processor,
    tmp_path: Path,
    mode: common_pb2.RunMode.ValueType,
) -> None:
    c = coordinator
    runtime_id, model, scenes = await _world(c, preview, triton_server, tmp_path)
    spec = workflow_spec(cameras=list(CAMERAS), interval=2, window=(8, 9))
    spec.graph.steps[2].model.model_name = model
    spec.graph.steps[3].rule.class_names[:] = list(CLASSES)
    await save_workflow(c, "yard", spec)
    request = ws.CreateRunRequest(
        run_id="r1", workflow_id="yard", runtime_id=runtime_id, revision=1, mode=mode
    )
    if mode == common_pb2.RUN_MODE_TEST:
        request.image_limit = 20
    await c.workshop.CreateRun(request, metadata=c.admin)
    processor.runtime_id = runtime_id
    await processor.start()
    detail = (await _finished(c, "r1")).detail
    run = detail.run
    assert run.status == common_pb2.RUN_STATUS_COMPLETED, detail
    assert (run.counts.jobs_completed, run.counts.slots_frame) == (2, 20)
    assert {job.decoder for job in detail.jobs} == {"dali-cpu", "pyav"}
    images = detail.recent_images
    assert len(images) == 20
    for image in images:
        scene = scenes[image.camera_id]
        t = (image.frame_time.ToDatetime(tzinfo=UTC) - START).total_seconds()
        truth = {box.class_name: box for box in ground_truth(scene, t)}
        assert {box.class_name for box in image.boxes} == set(truth)
        for box in image.boxes:
            expected = truth[box.class_name]
            assert abs(box.x * scene.width - expected.x) <= 4
            assert abs(box.y * scene.height - expected.y) <= 4
            assert abs(box.w * scene.width - expected.w) <= 4
    if mode == common_pb2.RUN_MODE_FULL:
        assert run.counts.items_saved == 20
        assert all(image.source == 2 for image in images)  # bucket items replaced previews
    else:
        assert run.counts.previews_published == 20


async def test_a_recording_shorter_than_its_slots_fails_the_job(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    processor: Processor,
    tmp_path: Path,
) -> None:
    """cam-a's file holds 5 s of footage though the recording says 20 s: the job fails with
    processor_failed and the decoder's reason; cam-b's job completes."""
    c = coordinator
    runtime_id, model, scenes = await _world(c, preview, triton_server, tmp_path)
    short = tmp_path / "short.vp9"
    write_recording(short, scenes["cam-a"], seconds=5, fps=10, codec="vp9")
    data = short.read_bytes()
    client = preview.bucket.server.client()
    await asyncio.to_thread(client.fput_object, preview.bucket.name, "recordings/short", str(short))
    await c.operator.PutRecording(
        op.PutRecordingRequest(
            recording_id="cam-a-0",
            camera_id="cam-a",
            start=stamp(START),
            end=stamp(START + timedelta(seconds=SECONDS)),
            fps=10,
            object_key="recordings/short",
            sha256=hashlib.sha256(data).hexdigest(),
            byte_size=len(data),
        ),
        metadata=c.admin,
    )
    spec = workflow_spec(cameras=list(CAMERAS), interval=2, window=(8, 9))
    spec.graph.steps[2].model.model_name = model
    await save_workflow(c, "yard", spec)
    await c.workshop.CreateRun(
        ws.CreateRunRequest(
            run_id="r1",
            workflow_id="yard",
            runtime_id=runtime_id,
            revision=1,
            mode=common_pb2.RUN_MODE_TEST,
            image_limit=20,
        ),
        metadata=c.admin,
    )
    processor.runtime_id = runtime_id
    await processor.start()
    detail = (await _finished(c, "r1")).detail
    assert detail.run.status == common_pb2.RUN_STATUS_FAILED
    failed = {job.camera_id: job for job in detail.jobs}
    assert failed["cam-a"].state == common_pb2.JOB_STATE_FAILED
    assert failed["cam-a"].failure_reason == common_pb2.FAILURE_REASON_PROCESSOR_FAILED
    assert "before the last slot starts" in failed["cam-a"].failure_message
    assert failed["cam-b"].state == common_pb2.JOB_STATE_COMPLETED
