"""A whole run with a YOLO-shaped model (docs/bring-your-own-model.md): published from an ONNX
file with a YOLOv8 export's signature by `python -m tools.model_repository publish` (checked on
the real Triton, registered with the real coordinator), pinned by a run that keeps its version
while a new one is published, and run by a processor that letterboxes the frames (DALI for
cam-a's VP9, PyAV for cam-b's H.264), has Triton decode the raw head, and reports boxes in the
frames' own coordinates, as the scenes' ground truth has them."""

from __future__ import annotations

import asyncio
import contextlib
import io
import secrets
from datetime import UTC
from pathlib import Path

import pytest

from testbed.coordinator_world import run_request, save_workflow
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from testbed.yolo_models import colour_blob_yolov8
from tests.processor_world import START, build_world, finished, running_processor, yard_spec
from tools.demo.scenes import ground_truth
from tools.model_repository.__main__ import main as publish
from workshop.v1 import common_pb2
from workshop.v1 import workshop_pb2 as ws

pytestmark = pytest.mark.triton


async def _publish(
    c: CoordinatorHarness, triton: TritonServer, model: Path, name: str, *args: str
) -> str:
    key = dict(c.admin)["authorization"].removeprefix("Bearer ")
    argv = [
        "publish",
        *("--repository", str(triton.model_repository), "--name", name, "--onnx", str(model)),
        *("--triton", triton.grpc_url, "--coordinator", f"127.0.0.1:{c.port}", "--key", key),
        *args,
    ]
    printed = io.StringIO()

    def run() -> None:
        with contextlib.redirect_stdout(printed):
            publish(argv)

    await asyncio.to_thread(run)
    return printed.getvalue()


async def test_a_yolov8_export_labels_a_run_in_the_frames_coordinates(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path)
    model = tmp_path / "yolov8-blobs.onnx"
    model.write_bytes(colour_blob_yolov8(640))
    name = f"yolo_{secrets.token_hex(4)}"
    assert '"family": "yolov8"' in await _publish(c, triton_server, model, name, "--version", "1")
    await save_workflow(c, "yard", yard_spec(name))
    await c.workshop.CreateRun(
        run_request("r1", "yard", world.runtime_id, image_limit=20), metadata=c.admin
    )
    # A new version (other thresholds: other served weights) after the run pinned version 1.
    await _publish(c, triton_server, model, name, "--version", "2", "--confidence", "0.5")

    async with running_processor(c, preview, triton_server, world.runtime_id):
        detail = await finished(c, "r1")

    snapshot = (
        await c.workshop.GetRunSnapshot(ws.GetRunSnapshotRequest(run_id="r1"), metadata=c.admin)
    ).snapshot
    assert [(m.name, m.version) for m in snapshot.models] == [(name, 1)]
    run = detail.run
    assert run.status == common_pb2.RUN_STATUS_COMPLETED, detail
    assert (run.counts.jobs_completed, run.counts.slots_frame) == (2, 20)
    assert {job.decoder for job in detail.jobs} == {"dali-cpu", "pyav"}
    images = detail.recent_images
    assert len(images) == 20
    for image in images:
        scene = world.scenes[image.camera_id]
        t = (image.frame_time.ToDatetime(tzinfo=UTC) - START).total_seconds()
        truth = {box.class_name: box for box in ground_truth(scene, t)}
        assert {box.class_name for box in image.boxes} == set(truth)
        for box in image.boxes:
            expected = truth[box.class_name]
            # The scenes are 640x360 and the model's input 640x640: the frame fills the
            # width, so the letterbox neither scales nor rounds; lossy coding moves edges.
            assert abs(box.x * scene.width - expected.x) <= 4
            assert abs(box.y * scene.height - expected.y) <= 4
            assert abs(box.w * scene.width - expected.w) <= 4
            assert abs(box.h * scene.height - expected.h) <= 4
