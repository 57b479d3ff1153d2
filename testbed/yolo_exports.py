"""A bucket's YOLO export as the preview service streams it (`images/<id>.jpg`,
`labels/<id>.txt` for each item, `classes.txt` last), made in process from the demo's
scenes: what `workshop models evaluate`'s pass reads, for its benchmark and its tests
without a coordinator or a preview service."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator

from testbed.harness.preview import jpeg_of
from tools.demo.scenes import ground_truth, random_scene, render_frame
from tools.model_repository.detector import CLASSES

CHUNK = 1 << 20


def scene_items(count: int) -> list[tuple[bytes, bytes]]:
    """`count` frames of the demo's scenes (640x360, the demo detector's size) as JPEGs
    (PyAV's mjpeg, as the processor's previews), each with its YOLO labels: the scene's
    ground truth."""
    items = []
    for n in range(count):
        scene = random_scene(n + 1)
        t = (n % 10) * 0.7
        labels = "".join(
            f"{CLASSES.index(box.class_name)} {b.x + b.w / 2:.6f} {b.y + b.h / 2:.6f} "
            f"{b.w:.6f} {b.h:.6f}\n"
            for box in ground_truth(scene, t)
            if box.class_name in CLASSES
            for b in [box.normalized(scene.width, scene.height)]
        )
        items.append((jpeg_of(render_frame(scene, t)), labels.encode()))
    return items


def export_chunks(items: int, images: list[tuple[bytes, bytes]]) -> Iterator[bytes]:
    """A YOLO export of `items` items (`images` over and over; the classes are the demo
    detector's) as chunks of CHUNK bytes, written as they are read."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w|") as tar:
        for n in range(items):
            jpeg, labels = images[n % len(images)]
            for name, data in (
                (f"images/it_{n:08d}.jpg", jpeg),
                (f"labels/it_{n:08d}.txt", labels),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            if buffer.tell() >= CHUNK:
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
        classes = "".join(f"{c}\n" for c in CLASSES).encode()
        info = tarfile.TarInfo("classes.txt")
        info.size = len(classes)
        tar.addfile(info, io.BytesIO(classes))
    yield buffer.getvalue()
