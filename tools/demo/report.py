"""The demo's result table: each frame of the run, its detections, and where its preview is.

Images are read back through the gateway as a user reads them
(`GET /v1/workshop/runs/{run_id}/previews/{item_id}/image`, with the demo user's Agent key)
and copied under the work directory, so they outlive the stack; the table also names each
preview's object key in the preview bucket, found by listing the run's prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

from tools.demo.script import GatewayRefused, image_path, refusal
from tools.demo.stack import PREVIEW_BUCKET, Stack
from tools.demo.terminal import table
from workshop.v1 import common_pb2, run_pb2

# Test runs keep their previews under this prefix (README, "Object storage").
TEST_PREVIEWS = "workshop-tests/previews"
HEADERS = ("#", "time (UTC)", "camera", "detections: class score (x,y wxh px)", "preview")


@dataclass(frozen=True)
class Frame:
    camera_id: str
    frame_time: datetime
    boxes: tuple[common_pb2.Box, ...]
    object_key: str
    copy: Path
    path: str  # where the gateway serves it
    content_type: str
    byte_size: int


def collect_frames(
    stack: Stack, http: httpx.Client, run_id: str, images: list[run_pb2.RunImage]
) -> list[Frame]:
    """The run's images in camera and time order, each read through the gateway with
    `http` (the Agent key's client) and copied to `<workdir>/previews/`."""
    keys = _preview_keys(stack, run_id)
    directory = stack.workdir / "previews"
    directory.mkdir(exist_ok=True)
    frames = []
    ordered = sorted(images, key=lambda image: (image.camera_id, image.frame_time.ToDatetime()))
    for image in ordered:
        path = image_path(run_id, image.item_id)
        read = http.get(path)
        if not read.is_success:
            raise GatewayRefused(refusal(read))
        content_type = read.headers.get("content-type", "")
        frame_time = image.frame_time.ToDatetime(tzinfo=UTC)
        extension = "png" if content_type == "image/png" else "jpg"
        copy = directory / f"{image.camera_id}-{frame_time:%H%M%S}.{extension}"
        copy.write_bytes(read.content)
        frames.append(
            Frame(
                camera_id=image.camera_id,
                frame_time=frame_time,
                boxes=tuple(sorted(image.boxes, key=lambda box: box.class_name)),
                object_key=keys.get((image.job_id, image.slot_index), "(not found)"),
                copy=copy,
                path=path,
                content_type=content_type,
                byte_size=len(read.content),
            )
        )
    return frames


def previews_prefix(run_id: str) -> str:
    """Where a test run's previews are: `<prefix><job>/<lease generation>/<slot>.jpg`."""
    return f"{TEST_PREVIEWS}/{run_id}/"


def frame_table(frames: list[Frame], run_id: str, width: int, height: int) -> list[str]:
    """One row per frame; boxes in pixels of the `width` x `height` frame, preview keys
    relative to `previews_prefix(run_id)`."""
    prefix = previews_prefix(run_id)
    rows = [
        (
            str(number),
            f"{frame.frame_time:%H:%M:%S}",
            frame.camera_id,
            "; ".join(_box(box, width, height) for box in frame.boxes) or "(none)",
            frame.object_key.removeprefix(prefix),
        )
        for number, frame in enumerate(frames, start=1)
    ]
    return table(HEADERS, rows)


def _box(box: common_pb2.Box, width: int, height: int) -> str:
    x, y = round(box.x * width), round(box.y * height)
    w, h = round(box.w * width), round(box.h * height)
    return f"{box.class_name} {box.score:.2f} ({x},{y} {w}x{h})"


def _preview_keys(stack: Stack, run_id: str) -> dict[tuple[str, int], str]:
    """(job id, slot index) -> object key of the run's previews, from the latest lease
    generation when a job ran more than once.

    Keys are `<prefix>/<run>/<job>/<generation>/<slot>.<ext>`.
    """
    found: dict[tuple[str, int], tuple[int, str]] = {}
    client = stack.s3.client()
    for item in client.list_objects(PREVIEW_BUCKET, prefix=previews_prefix(run_id), recursive=True):
        key = item.object_name
        if key is None:
            continue
        job_id, generation, name = key.rsplit("/", 3)[-3:]
        slot = int(name.split(".", 1)[0])
        if (job_id, slot) not in found or found[(job_id, slot)][0] < int(generation):
            found[(job_id, slot)] = (int(generation), key)
    return {place: key for place, (_, key) in found.items()}
