"""Encoding sampled frames as JPEG for previews and uploads, with PyAV's MJPEG encoder
(already a processor dependency; no image library needed)."""

from __future__ import annotations

import av
import numpy as np
import numpy.typing as npt

JPEG = "image/jpeg"
QUALITY = 4  # FFmpeg qscale: 2 (best) .. 31; 4 keeps solid colours and edges crisp


def encode_jpeg(frame: npt.NDArray[np.uint8]) -> bytes:
    """One RGB frame (H, W, 3) as baseline JPEG bytes."""
    height, width = frame.shape[:2]
    codec = av.CodecContext.create("mjpeg", "w")
    codec.width, codec.height = width, height
    codec.pix_fmt = "yuvj420p"
    codec.options = {"qscale": str(QUALITY)}
    picture = av.VideoFrame.from_ndarray(frame, format="rgb24").reformat(format="yuvj420p")
    packets = [*codec.encode(picture), *codec.encode(None)]
    return b"".join(bytes(packet) for packet in packets)
