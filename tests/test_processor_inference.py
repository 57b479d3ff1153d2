"""The processor's Triton client against the real bundled Triton."""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from services.processor.inference import ModelServer, ModelUnavailable, Pin
from tests.harness.triton import TritonServer
from workshop.demo.scenes import ground_truth, random_scene, render_frame
from workshop.models.detector import CLASSES, build_detector, weights_sha256
from workshop.models.repository import publish_version

pytestmark = pytest.mark.triton
HEIGHT, WIDTH = 360, 640


async def test_pinned_version_is_loaded_checked_and_batched(triton_server: TritonServer) -> None:
    name = f"detector_{secrets.token_hex(4)}"
    weights = build_detector(HEIGHT, WIDTH)
    publish_version(
        triton_server.model_repository, name, 1, weights, classes=CLASSES, max_batch_size=4
    )
    server = ModelServer(triton_server.grpc_url, triton_server.model_repository)
    try:
        served = await server.ensure(Pin(name, 1, weights_sha256(weights)))
        assert (served.max_batch_size, served.height, served.width) == (4, HEIGHT, WIDTH)
        scenes = [random_scene(seed, width=WIDTH, height=HEIGHT) for seed in range(6)]
        frames = np.stack([render_frame(scene, 1.0) for scene in scenes])
        found = await server.infer(served, frames)  # 6 frames: two batches of at most 4
        for scene, detections in zip(scenes, found, strict=True):
            truth = {box.class_name: box for box in ground_truth(scene, 1.0)}
            assert {d.class_name for d in detections} == set(truth)
            for detection in detections:
                box = truth[detection.class_name]
                assert abs(detection.x * WIDTH - box.x) <= 1
                assert abs(detection.w * WIDTH - box.w) <= 1
                assert abs(detection.y * HEIGHT - box.y) <= 1
        with pytest.raises(ModelUnavailable, match="pinned"):
            await ModelServer(triton_server.grpc_url, triton_server.model_repository).ensure(
                Pin(name, 1, "0" * 64)
            )
        with pytest.raises(ModelUnavailable, match="not in the model repository"):
            await server.ensure(Pin(name, 7, weights_sha256(weights)))
    finally:
        await server.close()
