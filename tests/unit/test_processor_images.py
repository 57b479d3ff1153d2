"""JPEG encoding of sampled frames: one reused encoder per thread, at a fixed quality."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import av
import numpy as np
from numpy.typing import NDArray

from services.processor.images import encode_jpeg
from tools.demo.scenes import random_scene, render_frame


def _decoded(data: bytes) -> NDArray[np.uint8]:
    with av.open(io.BytesIO(data), mode="r") as container:
        frame = next(container.decode(video=0))
        return np.asarray(frame.to_ndarray(format="rgb24"), dtype=np.uint8)


def test_quality_does_not_drift_as_the_encoder_is_reused() -> None:
    """Rate control would lower a reused encoder's quality frame after frame."""
    frames = [render_frame(random_scene(seed), 2.0) for seed in range(4)]

    first = [encode_jpeg(frame) for frame in frames]
    later = [encode_jpeg(frame) for _ in range(5) for frame in frames][-len(frames) :]

    assert first == later
    for frame, data in zip(frames, first, strict=True):
        assert data[:2] == b"\xff\xd8"
        difference = np.abs(_decoded(data).astype(np.int16) - frame.astype(np.int16))
        assert difference.mean() < 3


def test_frame_sizes_and_threads_each_get_their_own_encoder() -> None:
    big = render_frame(random_scene(1), 1.0)
    small = render_frame(random_scene(2, width=320, height=180), 1.0)

    with ThreadPoolExecutor(max_workers=3) as pool:
        images = list(pool.map(encode_jpeg, [big, small, big, small, big, small]))

    assert [_decoded(data).shape for data in images] == [(360, 640, 3), (180, 320, 3)] * 3
    assert images[0] == images[2] == images[4]
