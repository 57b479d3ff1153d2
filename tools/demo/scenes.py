"""Deterministic synthetic scenes: solid-coloured rectangles moving linearly, one colour per class.

Colours are far apart in every channel from each other and from the dark gray background, so
that the operator-built detector (`tools.model_repository.detector`) can find them by per-channel
thresholds even after lossy yuv420p encoding.

Geometry is in pixels. An object's top-left corner at time `t` is `start + velocity * t`,
rounded to the nearest pixel; its box is clipped to the frame. Later objects are drawn on top
of earlier ones; ground truth reports every visible object's full (clipped) box regardless of
occlusion, so scenes meant for detector checks should keep objects apart (`random_scene` does).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import av
import numpy as np

Codec = Literal["vp9", "h264"]
RGB = tuple[int, int, int]
Frame = np.ndarray[Any, np.dtype[np.uint8]]

BACKGROUND: RGB = (40, 40, 40)
CLASS_COLOURS: Mapping[str, RGB] = {
    "person": (220, 30, 30),
    "vehicle": (30, 30, 220),
    "animal": (30, 200, 30),
}
DEFAULT_WIDTH = 640
DEFAULT_HEIGHT = 360
DEFAULT_FPS = 10
MIN_SIZE = 30
MAX_SIZE = 80

# Encoder settings: near-lossless enough that solid colours stay solid, fast, small files.
_CONTAINERS: Mapping[str, tuple[str, str, dict[str, str]]] = {
    "vp9": (
        "webm",
        "libvpx-vp9",
        {"crf": "20", "b": "0", "deadline": "realtime", "cpu-used": "8", "row-mt": "1"},
    ),
    "h264": ("mp4", "libx264", {"crf": "20", "preset": "veryfast", "tune": "stillimage"}),
}


@dataclass(frozen=True)
class SceneObject:
    """One rectangle: `start` is its top-left corner at t=0, `velocity` in pixels per second."""

    class_name: str
    colour: RGB
    start: tuple[float, float]
    velocity: tuple[float, float]
    size: tuple[int, int]

    def top_left(self, t: float) -> tuple[int, int]:
        x = self.start[0] + self.velocity[0] * t
        y = self.start[1] + self.velocity[1] * t
        return math.floor(x + 0.5), math.floor(y + 0.5)


@dataclass(frozen=True)
class Scene:
    width: int
    height: int
    objects: tuple[SceneObject, ...]
    background: RGB = BACKGROUND
    seed: int | None = None


@dataclass(frozen=True)
class Box:
    """An axis-aligned box: top-left `(x, y)` and size `(w, h)`, in pixels unless normalized."""

    class_name: str
    x: float
    y: float
    w: float
    h: float

    def normalized(self, width: int, height: int) -> Box:
        """The same box as fractions of the frame size."""
        return Box(
            self.class_name, self.x / width, self.y / height, self.w / width, self.h / height
        )

    @property
    def corners(self) -> tuple[float, float, float, float]:
        """`(x1, y1, x2, y2)`, the layout of the detector's `det_boxes`."""
        return self.x, self.y, self.x + self.w, self.y + self.h


@dataclass(frozen=True)
class RecordingInfo:
    frames: int
    fps: int
    time_base: Fraction
    duration: float
    sha256: str
    byte_size: int


def _visible_box(scene: Scene, obj: SceneObject, t: float) -> tuple[int, int, int, int] | None:
    """Clipped `(x1, y1, x2, y2)` with exclusive x2/y2, or None when off-frame."""
    x, y = obj.top_left(t)
    x1, y1 = max(x, 0), max(y, 0)
    x2, y2 = min(x + obj.size[0], scene.width), min(y + obj.size[1], scene.height)
    if x2 <= x1 or y2 <= y1:
        return None
    return x1, y1, x2, y2


def render_frame(scene: Scene, t: float) -> Frame:
    """The scene at `t` seconds as an `(height, width, 3)` uint8 RGB array."""
    frame = np.empty((scene.height, scene.width, 3), dtype=np.uint8)
    frame[:] = scene.background
    for obj in scene.objects:
        box = _visible_box(scene, obj, t)
        if box is not None:
            x1, y1, x2, y2 = box
            frame[y1:y2, x1:x2] = obj.colour
    return frame


def ground_truth(scene: Scene, t: float) -> list[Box]:
    """Pixel boxes of the objects visible at `t`, in drawing order (use `Box.normalized`)."""
    boxes = []
    for obj in scene.objects:
        box = _visible_box(scene, obj, t)
        if box is not None:
            x1, y1, x2, y2 = box
            boxes.append(Box(obj.class_name, x1, y1, x2 - x1, y2 - y1))
    return boxes


def frame_times(frames: int, fps: int) -> list[float]:
    return [index / fps for index in range(frames)]


def write_recording(
    path: Path, scene: Scene, *, seconds: float, fps: int = DEFAULT_FPS, codec: Codec = "vp9"
) -> RecordingInfo:
    """Encode `seconds` of the scene (frame i shows t = i / fps): VP9 in WebM or H.264 in MP4."""
    if codec not in _CONTAINERS:
        raise ValueError(f"unsupported codec {codec!r}; expected one of {sorted(_CONTAINERS)}")
    if scene.width % 2 or scene.height % 2:
        raise ValueError("yuv420p needs an even frame width and height")
    container_format, encoder, options = _CONTAINERS[codec]
    frames = max(1, round(seconds * fps))
    # bitexact: no random segment UID or muxer version string, so equal input gives equal bytes.
    with av.open(
        str(path), mode="w", format=container_format, options={"fflags": "+bitexact"}
    ) as container:
        stream = container.add_stream(encoder, rate=fps, options=dict(options))
        assert isinstance(stream, av.VideoStream)
        stream.width = scene.width
        stream.height = scene.height
        stream.pix_fmt = "yuv420p"
        for t in frame_times(frames, fps):
            video_frame = av.VideoFrame.from_ndarray(render_frame(scene, t), format="rgb24")
            container.mux(stream.encode(video_frame))
        container.mux(stream.encode(None))
    time_base = stream.time_base
    data = path.read_bytes()
    return RecordingInfo(
        frames=frames,
        fps=fps,
        time_base=Fraction(time_base) if time_base is not None else Fraction(1, fps),
        duration=frames / fps,
        sha256=hashlib.sha256(data).hexdigest(),
        byte_size=len(data),
    )


def random_scene(
    seed: int,
    *,
    width: int = DEFAULT_WIDTH,
    height: int = DEFAULT_HEIGHT,
    classes: Sequence[str] = tuple(CLASS_COLOURS),
    seconds: float = 10.0,
    size_range: tuple[int, int] = (MIN_SIZE, MAX_SIZE),
) -> Scene:
    """One object per entry of `classes`, each in its own horizontal lane, fully in frame for
    `seconds` (motion is linear, so in frame at both ends means in frame throughout).

    Lanes keep objects apart, so ground truth equals what is visible. Repeat a class in
    `classes` for several objects of it.
    """
    rng = random.Random(seed)
    lane_height = height // max(1, len(classes))
    low, high = size_range
    if lane_height < low or width < low:
        raise ValueError(f"{len(classes)} lanes of {lane_height} px cannot fit {low} px objects")
    order = list(classes)
    rng.shuffle(order)
    objects = []
    for lane, class_name in enumerate(order):
        w = rng.randint(low, min(high, width))
        h = rng.randint(low, min(high, lane_height))
        lane_top = lane * lane_height
        start = (
            _coordinate(rng, 0, width - w),
            _coordinate(rng, lane_top, lane_top + lane_height - h),
        )
        end = (
            _coordinate(rng, 0, width - w),
            _coordinate(rng, lane_top, lane_top + lane_height - h),
        )
        velocity = ((end[0] - start[0]) / seconds, (end[1] - start[1]) / seconds)
        objects.append(SceneObject(class_name, CLASS_COLOURS[class_name], start, velocity, (w, h)))
    return Scene(width=width, height=height, objects=tuple(objects), seed=seed)


def _coordinate(rng: random.Random, low: int, high: int) -> float:
    """Whole pixels at both ends keep rounding from pushing an object out of its lane."""
    return float(rng.randint(low, high))
