"""A photo (docs/photos.md) through the whole path: RequestPhoto, a processor claims the one-frame
job, the frame is published, and its image reads back as the scene at that instant."""

from __future__ import annotations

import asyncio
import io
from datetime import UTC, timedelta
from pathlib import Path

import av
import numpy as np
import pytest

from testbed.coordinator_world import stamp
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.processor_world import START, build_world, running_processor
from tools.demo.scenes import render_frame
from workshop.v1 import common_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import workshop_pb2 as ws

pytestmark = pytest.mark.triton
ASKED = START + timedelta(seconds=7.3)


def _decode_jpeg(data: bytes) -> np.ndarray:  # type: ignore[type-arg]
    with av.open(io.BytesIO(data), mode="r") as container:
        frame = next(container.decode(video=0))
        return frame.to_ndarray(format="rgb24")


async def test_a_photo_shows_the_scene_at_the_asked_instant(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path, cameras=["cam-a"])
    async with running_processor(c, preview, triton_server, world.runtime_id):
        # A photo goes to the newest runtime that checked in: wait for the first claim.
        for _ in range(100):
            runtimes = await c.operator.ListRuntimes(op.ListRuntimesRequest(), metadata=c.admin)
            if any(r.HasField("last_seen_at") for r in runtimes.runtimes):
                break
            await asyncio.sleep(0.05)
        asked = await c.workshop.RequestPhoto(
            ws.RequestPhotoRequest(camera_id="cam-a", time=stamp(ASKED)), metadata=c.admin
        )
        photo_id = asked.photo.photo_id
        for _ in range(600):
            photo = (
                await c.workshop.GetPhoto(ws.GetPhotoRequest(photo_id=photo_id), metadata=c.admin)
            ).photo
            if photo.status not in (common_pb2.RUN_STATUS_QUEUED, common_pb2.RUN_STATUS_RUNNING):
                break
            await asyncio.sleep(0.1)
    assert photo.status == common_pb2.RUN_STATUS_COMPLETED, photo
    assert photo.item_id
    frame_time = photo.frame_time.ToDatetime(tzinfo=UTC)
    assert abs((frame_time - ASKED).total_seconds()) <= 0.1  # 10 fps: the nearest frame
    image = await preview.stub.ReadImage(
        pb.ReadImageRequest(run_id=photo_id, item_id=photo.item_id), metadata=c.admin
    )
    assert image.content_type == "image/jpeg"
    pixels = _decode_jpeg(image.image)
    expected = render_frame(world.scenes["cam-a"], (frame_time - START).total_seconds())
    assert pixels.shape == expected.shape
    # Lossy twice (VP9, then JPEG), yet the same picture: small mean error per channel.
    assert np.abs(pixels.astype(np.int16) - expected.astype(np.int16)).mean() < 4
