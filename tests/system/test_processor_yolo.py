"""A whole run with a YOLO-shaped model (docs/bring-your-own-model.md): published from an ONNX
file with a YOLOv8 export's signature by `python -m tools.model_repository publish` (checked on
the real Triton, registered with the real coordinator), pinned by a run that keeps its version
while a new one is published, and run by a processor that letterboxes the frames (DALI for
cam-a's VP9, PyAV for cam-b's H.264), has Triton decode the raw head, and reports boxes in the
frames' own coordinates, as the scenes' ground truth has them. Then `workshop models evaluate`
scores versions against the bucket a full run filled, in the operator's shell and on a
processor, which runs one evaluation at a time."""

from __future__ import annotations

import asyncio
import contextlib
import io
import secrets
from collections.abc import AsyncIterator
from datetime import UTC
from pathlib import Path

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.processor.evaluation import evaluation_service
from testbed.coordinator_world import error_reason, run_request, save_workflow
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from testbed.yolo_models import Planted, colour_blob_yolov8, planted_model, yolov8_head
from tests.cli_runner import workshop
from tests.processor_world import START, build_world, finished, running_processor, yard_spec
from tools.demo.scenes import ground_truth
from tools.model_repository.__main__ import main as publish
from workshop.kit.server import Server, ServerSettings
from workshop.v1 import common_pb2, evaluation_pb2, evaluation_pb2_grpc
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


async def test_models_evaluate_scores_versions_against_a_buckets_boxes(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """A full run of the demo detector fills `yard` (its items pending review); the YOLOv8
    colour-blob model finds the same boxes on the bucket's JPEGs (AP50 1), a model that
    answers one fixed box finds none of them (AP 0)."""
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path)
    await save_workflow(c, "yard", yard_spec(world.model))
    await c.workshop.CreateRun(
        run_request("r1", "yard", world.runtime_id, mode=common_pb2.RUN_MODE_FULL),
        metadata=c.admin,
    )
    async with running_processor(c, preview, triton_server, world.runtime_id):
        detail = await finished(c, "r1")
    assert detail.run.counts.items_saved == 20
    blobs, blind = tmp_path / "blobs.onnx", tmp_path / "blind.onnx"
    blobs.write_bytes(colour_blob_yolov8(640))
    names = "{0: 'person', 1: 'vehicle', 2: 'animal'}"
    fixed = [Planted(0, 0.9, 600.0, 600.0, 630.0, 630.0)]
    blind.write_bytes(planted_model(yolov8_head(fixed, 3, 8400), names=names))
    await _publish(c, triton_server, blobs, "blobs", "--version", "1")
    await _publish(c, triton_server, blind, "blind", "--version", "1")

    env = {"WORKSHOP_PREVIEW": f"127.0.0.1:{preview.port}"}
    repository = str(triton_server.model_repository)
    args = ("--bucket", "yard", "--triton", triton_server.grpc_url, "--review", "pending")
    good, bad, table = await asyncio.gather(
        workshop(
            c,
            "-o",
            "json",
            "models",
            "evaluate",
            "blobs",
            "1",
            *args,
            "--repository",
            repository,
            env=env,
        ),
        workshop(c, "-o", "json", "models", "evaluate", "blind", "1", *args, env=env),
        workshop(c, "models", "evaluate", "blobs", "1", *args, env=env),
    )
    assert good.code == 0, good.err
    figures = good.json()
    assert (figures["images"], figures["weights_checked"]) == (20, True)
    assert figures["ground_truth_boxes"] == sum(len(i.boxes) for i in detail.recent_images)
    assert figures["ap50"] == 1.0
    assert figures["ap50_95"] > 0.7  # JPEG edges move a pixel or two
    assert (figures["precision"], figures["recall"]) == (1.0, 1.0)
    assert set(figures["classes"]) == {"person", "vehicle", "animal"}
    assert {c["precision"] for c in figures["classes"].values()} == {1.0}
    # beside it, the version the bucket's items came from: the demo detector r1 pinned
    base = figures["baseline"]
    assert (base["model"], base["version"], base["runs"]) == (world.model, 1, ["r1"])
    assert base["items_from_it"] == 20
    assert base["ap50"] > 0.9  # its own boxes, found again on the previews
    assert set(base["classes"]) == {"person", "vehicle", "animal"}
    assert bad.code == 0, bad.err
    assert (bad.json()["ap50"], bad.json()["recall"]) == (0.0, 0.0)
    assert table.code == 0, table.err
    assert "AP50 1.0" in table.out
    assert f"{world.model} v1: AP50-95" in table.out  # the baseline's line

    missing = await workshop(c, "models", "evaluate", "blobs", "7", *args, env=env)
    assert missing.code != 0
    assert "model blobs has no published version 7" in missing.err

    # the same evaluation run by a processor beside its Triton (EvaluationService)
    async with evaluation_server(c, preview, triton_server) as port:
        on_processor = ("--bucket", "yard", "--processor", f"127.0.0.1:{port}")
        remote, refused = await asyncio.gather(
            workshop(
                c,
                "-o",
                "json",
                "models",
                "evaluate",
                "blobs",
                "1",
                *on_processor,
                "--review",
                "pending",
                env=env,
            ),
            workshop(
                c,
                "models",
                "evaluate",
                "blobs",
                "1",
                *on_processor,
                "--key",
                await c.key(Grant(ScopeName.WORKSHOP), name="not-admin"),
            ),
        )
        await _one_evaluation_at_a_time(c, port)
    assert remote.code == 0, remote.err
    timing = ("seconds", "items_per_second")
    assert {k: v for k, v in remote.json().items() if k not in timing} == {
        k: v for k, v in figures.items() if k not in timing
    }
    assert refused.code != 0
    assert "SCOPE_MISSING" in refused.err


async def _one_evaluation_at_a_time(c: CoordinatorHarness, port: int) -> None:
    """A processor evaluates one version at a time: a second call while the first runs is
    refused with CAPACITY, and a call after the first has finished runs. The first is held
    where it reads the version's pin from the coordinator: this test locks model_versions
    (Postgres) until the second call has been answered."""
    request = evaluation_pb2.EvaluateModelVersionRequest(
        model_name="blobs",
        version=1,
        bucket_id="yard",
        review_states=[common_pb2.REVIEW_STATE_PENDING],
        no_baseline=True,
    )

    async def evaluated(stub: evaluation_pb2_grpc.EvaluationServiceAsyncStub) -> int:
        answers = [a async for a in stub.EvaluateModelVersion(request, metadata=c.admin)]
        return answers[-1].report.images

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = evaluation_pb2_grpc.EvaluationServiceStub(channel)
        async with c.db.connection() as holder, holder.transaction():
            await holder.execute("LOCK TABLE model_versions IN ACCESS EXCLUSIVE MODE")
            first = asyncio.create_task(evaluated(stub))
            async with c.db.connection() as watcher:
                for _ in range(500):
                    waiting = await watcher.fetchval(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE wait_event_type = 'Lock' AND query LIKE '%model_versions%'"
                    )
                    if waiting:
                        break
                    await asyncio.sleep(0.01)
                assert waiting == 1, "the first evaluation never read the version's pin"
            with pytest.raises(grpc.aio.AioRpcError) as second:
                await evaluated(stub)
            code, reason, _ = error_reason(second.value)
            assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "CAPACITY")
        assert await asyncio.wait_for(first, 30) == 20
        assert await evaluated(stub) == 20  # the processor is free again


@contextlib.asynccontextmanager
async def evaluation_server(
    c: CoordinatorHarness, preview: PreviewHarness, triton: TritonServer
) -> AsyncIterator[int]:
    """The processor's EvaluationService on a server of its own (the processor's port serves
    it, `python -m services.processor`), reading with the caller's credential."""
    server = Server(
        label="processor-test",
        settings=ServerSettings(port=0, drain_seconds=0.0, grace_seconds=1.0, metrics_port=-1),
        services=[
            evaluation_service(c.channel, preview.channel, triton.grpc_url, triton.model_repository)
        ],
    )
    port = await server.start()
    try:
        yield port
    finally:
        await server.stop()
