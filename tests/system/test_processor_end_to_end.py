"""A processor runs real jobs end to end: real coordinator (Postgres), preview service and
recordings (SeaweedFS), decoding (DALI/PyAV) and inference (the bundled Triton)."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import pytest

from services.processor.calls import Transport
from testbed.coordinator_world import run_request, save_workflow
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.processor_world import (
    CAMERAS,
    START,
    build_world,
    finished,
    put_recording,
    running_processor,
    yard_spec,
)
from tools.demo.scenes import ground_truth, write_recording
from workshop.v1 import common_pb2

pytestmark = pytest.mark.triton


@pytest.mark.parametrize(
    ("mode", "transport"),
    [
        (common_pb2.RUN_MODE_TEST, "session"),
        (common_pb2.RUN_MODE_FULL, "session"),
        (common_pb2.RUN_MODE_FULL, "unary"),  # PROCESSOR_JOB_TRANSPORT=unary
    ],
)
async def test_a_run_labels_every_sampled_frame_like_the_ground_truth(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
    mode: common_pb2.RunMode.ValueType,
    transport: Transport,
) -> None:
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path)
    await save_workflow(c, "yard", yard_spec(world.model))
    test = mode == common_pb2.RUN_MODE_TEST
    request = run_request(
        "r1", "yard", world.runtime_id, mode=mode, image_limit=20 if test else None
    )
    await c.workshop.CreateRun(request, metadata=c.admin)
    async with running_processor(c, preview, triton_server, world.runtime_id, transport=transport):
        detail = await finished(c, "r1")
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
            assert abs(box.x * scene.width - expected.x) <= 4
            assert abs(box.y * scene.height - expected.y) <= 4
            assert abs(box.w * scene.width - expected.w) <= 4
    if mode == common_pb2.RUN_MODE_FULL:
        assert run.counts.items_saved == 20
        assert all(image.source == 2 for image in images)  # bucket items replaced previews
        assert await preview.keys("uploads/") == []  # each item's object is its preview's
    else:
        assert run.counts.previews_published == 20


async def test_a_recording_shorter_than_its_slots_fails_the_job(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """cam-a's file holds 5 s of footage though the recording says 20 s: the job fails with
    processor_failed and the decoder's reason; cam-b's job completes."""
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path)
    short = tmp_path / "short.vp9"
    write_recording(short, world.scenes["cam-a"], seconds=5, fps=10, codec="vp9")
    await put_recording(c, preview, "cam-a-0", "cam-a", short)
    await save_workflow(c, "yard", yard_spec(world.model, classes=("person",)))
    await c.workshop.CreateRun(
        run_request("r1", "yard", world.runtime_id, image_limit=20), metadata=c.admin
    )
    async with running_processor(c, preview, triton_server, world.runtime_id):
        detail = await finished(c, "r1")
    assert detail.run.status == common_pb2.RUN_STATUS_FAILED
    failed = {job.camera_id: job for job in detail.jobs}
    assert failed["cam-a"].state == common_pb2.JOB_STATE_FAILED
    assert failed["cam-a"].failure_reason == common_pb2.FAILURE_REASON_PROCESSOR_FAILED
    assert "before the last slot starts" in failed["cam-a"].failure_message
    assert failed["cam-b"].state == common_pb2.JOB_STATE_COMPLETED
    assert set(CAMERAS) == set(failed)


async def test_a_corrupt_recording_fails_the_job_with_the_decoders_message(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """cam-a's object is not a decodable container (its checksum matches, so only the decoder
    can tell): the job fails with processor_failed and FFmpeg's words; cam-b completes."""
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path)
    corrupt = tmp_path / "corrupt.vp9"
    header = world.files["cam-a"].read_bytes()[:64]  # a real WebM start, then noise
    corrupt.write_bytes(header + bytes(range(256)) * 400)
    await put_recording(c, preview, "cam-a-0", "cam-a", corrupt)
    await save_workflow(c, "yard", yard_spec(world.model))
    await c.workshop.CreateRun(
        run_request("r1", "yard", world.runtime_id, image_limit=20), metadata=c.admin
    )
    async with running_processor(c, preview, triton_server, world.runtime_id):
        detail = await finished(c, "r1")
    jobs = {job.camera_id: job for job in detail.jobs}
    assert jobs["cam-a"].state == common_pb2.JOB_STATE_FAILED
    assert jobs["cam-a"].failure_reason == common_pb2.FAILURE_REASON_PROCESSOR_FAILED
    assert jobs["cam-a"].failure_message.startswith("Cannot read recording cam-a-0: ")
    assert "End of file" in jobs["cam-a"].failure_message  # FFmpeg's words
    assert jobs["cam-b"].state == common_pb2.JOB_STATE_COMPLETED
