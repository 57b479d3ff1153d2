"""Where a YOLO-family model's decoding runs, measured (docs/bring-your-own-model.md).

    .venv/bin/python -m bench.yolo_decode [--frames 200] [--classes 80] [--check]

The served graph (tools.model_repository.families) decodes the raw head inside the model
Triton runs: best class per anchor, confidence threshold, class-wise NonMaxSuppression, the
best K. The alternative is to serve the raw head and decode in the processor. Both are
measured on a planted 640x640 YOLOv8 head, [1, 84, 8400] float32 for 80 classes (2.8 MB a
frame): 8,400 anchors of low scores plus 20 objects of 10 overlapping anchors each, so NMS
has work to do. The planted "model" costs nothing itself, so the figures are the costs of
the two ways, not of a network.

- `graph_ms`: the served graph in onnxruntime in this process (the engine Triton's python
  backend runs) minus the raw-head graph (the same cast, scale and transpose of the frame,
  the head out): what decoding in the graph costs per frame.
- `numpy_ms`: the same decoding in numpy in this process (argmax, threshold, greedy
  class-wise NMS, best K): what decoding in the processor would cost, on the head it would
  first have to receive. Its boxes are checked against the graph's.
- `served_ms`, `raw_ms`: a frame (uint8 640x640, 1.2 MB, over gRPC) through the bundled
  Triton, round trip, for the served graph (answers 2.8 kB) and for the raw head (answers
  2.8 MB); `raw_ms + numpy_ms - served_ms` is what serving the raw head would add per frame
  on this machine (`in_graph_saves_ms`).
- `letterbox_ms`, `stretch_ms`: DALI on the CPU (the processor's own `DaliDecoder`), per
  frame of a 1280x720 VP9 recording, letterboxed to 640x640 (resize keeping the aspect +
  padded slice) and stretched to 640x640 (resize): what the letterbox costs beyond the
  resize the processor made before.

Last line: `RESULT graph_ms=... numpy_ms=... served_ms=... raw_ms=... in_graph_saves_ms=...
letterbox_ms=... stretch_ms=...`, medians per frame. `--check` exits 1 when decoding in the
graph costs more per frame than receiving the raw head and decoding it in numpy.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import tritonclient.grpc.aio as grpcclient

from bench.results import result_line
from services.processor.decode import DaliDecoder
from testbed.yolo_models import Planted, planted_model, yolov8_head
from tools.demo.scenes import random_scene, write_recording
from tools.localstack.triton import running_triton
from tools.model_repository.families import (
    DEFAULT_CONFIDENCE,
    DEFAULT_IOU,
    DEFAULT_MAX_DETECTIONS,
    inspect,
    served_graph,
)
from tools.model_repository.repository import publish_version
from workshop.kit.letterbox import letterbox
from workshop.kit.model_io import CONTRACT_OUTPUTS, LETTERBOX_INPUT

SIZE, ANCHORS, OBJECTS, SPREAD = 640, 8400, 20, 10


def realistic_head(classes: int, seed: int = 7) -> Any:
    """A YOLOv8 head: every anchor scores low (as sigmoid outputs of background do), and
    OBJECTS objects each show on SPREAD overlapping anchors around their box."""
    rng = np.random.default_rng(seed)
    planted = []
    for _ in range(OBJECTS):
        x, y = rng.uniform(0, SIZE - 120, 2)
        w, h = rng.uniform(20, 120, 2)
        label = int(rng.integers(classes))
        for _ in range(SPREAD):
            dx, dy = rng.normal(0, 3, 2)
            score = float(rng.uniform(0.3, 0.95))
            planted.append(Planted(label, score, x + dx, y + dy, x + dx + w, y + dy + h))
    head = yolov8_head(planted, classes, ANCHORS)
    background = rng.uniform(0.0, 0.05, (classes, ANCHORS - len(planted))).astype(np.float32)
    head[0, 4:, len(planted) :] = background
    head[0, :2, len(planted) :] = rng.uniform(0, SIZE, (2, ANCHORS - len(planted)))
    head[0, 2:4, len(planted) :] = rng.uniform(4, 64, (2, ANCHORS - len(planted)))
    return head


def numpy_decode(head: Any, confidence: float, iou: float, k: int) -> list[tuple[int, float]]:
    """What the processor would run on a raw [4+C, A] head: (class, score) of the kept boxes,
    best first, and their corners (checked against the graph's)."""
    boxes, scores = head[:4].T, head[4:]
    label = scores.argmax(0)
    best = scores[label, np.arange(scores.shape[1])]
    keep = best > confidence
    boxes, best, label = boxes[keep], best[keep], label[keep]
    xyxy = np.concatenate([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2], 1)
    kept: list[int] = []
    for c in np.unique(label):
        index = np.flatnonzero(label == c)
        index = index[np.argsort(-best[index], kind="stable")]
        while index.size:
            first, rest = index[0], index[1:]
            kept.append(int(first))
            low = np.maximum(xyxy[first, :2], xyxy[rest, :2])
            high = np.minimum(xyxy[first, 2:], xyxy[rest, 2:])
            inter = np.prod(np.clip(high - low, 0, None), axis=1)
            area = np.prod(xyxy[:, 2:] - xyxy[:, :2], axis=1)
            overlap = inter / (area[first] + area[rest] - inter)
            index = rest[overlap <= iou]
    kept.sort(key=lambda i: -best[i])
    return [(int(label[i]), round(float(best[i]), 5)) for i in kept[:k]]


def per_frame_ms(call: Callable[[], object], frames: int) -> float:
    call()  # warm
    times = []
    for _ in range(frames):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def per_frame_ms_async(call: Callable[[], Any], frames: int) -> float:
    await call()
    times = []
    for _ in range(frames):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def letterbox_costs(frames: int, work: Path) -> tuple[float, float]:
    scene = random_scene(3, seconds=20, width=1280, height=720)
    path = work / "hd.vp9"
    write_recording(path, scene, seconds=20, fps=10, codec="vp9")
    decoder = DaliDecoder("cpu")
    indices = list(range(0, 200, 2))[: max(1, min(frames, 100))]
    place = letterbox(720, 1280, SIZE, SIZE)
    results = {}
    for name, placement in (("letterbox", place), ("stretch", None)):
        decoder.decode(path, indices[:4], out_height=SIZE, out_width=SIZE, placement=placement)
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            decoder.decode(path, indices, out_height=SIZE, out_width=SIZE, placement=placement)
            best = min(best, (time.perf_counter() - started) * 1000 / len(indices))
        results[name] = best
    return results["letterbox"], results["stretch"]


async def triton_costs(served: bytes, raw: bytes, frames: int, work: Path) -> tuple[float, float]:
    (work / "triton").mkdir()
    with running_triton(work / "triton") as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            names = {}
            for kind, model in (("served", served), ("raw", raw)):
                name = f"bench_{kind}_{secrets.token_hex(3)}"
                publish_version(
                    server.model_repository, name, 1, model, classes=("c",), max_batch_size=0
                )
                await client.load_model(name)
                names[kind] = name
            image = np.full((1, SIZE, SIZE, 3), 114, np.uint8)

            def call(name: str, outputs: tuple[str, ...]) -> Callable[[], Any]:
                async def once() -> Any:
                    request = grpcclient.InferInput(LETTERBOX_INPUT, list(image.shape), "UINT8")
                    request.set_data_from_numpy(image)
                    return await client.infer(
                        name,
                        [request],
                        outputs=[grpcclient.InferRequestedOutput(o) for o in outputs],
                    )

                return once

            served_ms = await per_frame_ms_async(call(names["served"], CONTRACT_OUTPUTS), frames)
            raw_ms = await per_frame_ms_async(call(names["raw"], ("output0",)), frames)
            for name in names.values():
                await client.unload_model(name)
            return served_ms, raw_ms
        finally:
            await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200, help="frames per figure")
    parser.add_argument("--classes", type=int, default=80)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()

    head = realistic_head(args.classes)
    names = "{" + ", ".join(f"{i}: 'c{i}'" for i in range(args.classes)) + "}"
    source = planted_model(head, names=names)
    inspection = inspect(source)
    assert inspection.metadata_classes is not None
    served = served_graph(source, inspection, inspection.metadata_classes)
    raw = planted_model(head, raw_served=True)
    image = np.full((1, SIZE, SIZE, 3), 114, np.uint8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = {
        kind: ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        for kind, model in (("served", served), ("raw", raw))
    }
    feed = {LETTERBOX_INPUT: image}
    answer = dict(
        zip(CONTRACT_OUTPUTS, sessions["served"].run(list(CONTRACT_OUTPUTS), feed), strict=True)
    )
    in_graph = [
        (int(answer["det_classes"][0, i]), round(float(answer["det_scores"][0, i]), 5))
        for i in range(int(answer["num_dets"][0, 0]))
    ]
    decoded = numpy_decode(head[0], DEFAULT_CONFIDENCE, DEFAULT_IOU, DEFAULT_MAX_DETECTIONS)
    assert in_graph == decoded, (in_graph, decoded)
    served_ort = per_frame_ms(lambda: sessions["served"].run(None, feed), args.frames)
    raw_ort = per_frame_ms(lambda: sessions["raw"].run(None, feed), args.frames)
    graph_ms = max(0.0, served_ort - raw_ort)
    raw_head = sessions["raw"].run(None, feed)[0][0]
    numpy_ms = per_frame_ms(
        lambda: numpy_decode(raw_head, DEFAULT_CONFIDENCE, DEFAULT_IOU, DEFAULT_MAX_DETECTIONS),
        args.frames,
    )
    print(f"{len(in_graph)} detections a frame from {OBJECTS * SPREAD} candidates; same in numpy")
    print(f"onnxruntime, 1 thread: served graph {served_ort:.2f} ms, raw head {raw_ort:.2f} ms")
    print(f"decoding in the graph {graph_ms:.2f} ms, in numpy {numpy_ms:.2f} ms per frame")
    with tempfile.TemporaryDirectory(prefix="bench-yolo-") as directory:
        work = Path(directory)
        served_ms, raw_ms = asyncio.run(triton_costs(served, raw, args.frames, work))
        print(f"bundled Triton round trip: served {served_ms:.2f} ms, raw head {raw_ms:.2f} ms")
        letterbox_ms, stretch_ms = letterbox_costs(args.frames, work)
        print(
            f"DALI CPU 1280x720 -> 640x640: letterbox {letterbox_ms:.2f}, stretch {stretch_ms:.2f}"
        )
    saves = raw_ms + numpy_ms - served_ms
    print(
        result_line(
            {
                "graph_ms": f"{graph_ms:.2f}",
                "numpy_ms": f"{numpy_ms:.2f}",
                "served_ms": f"{served_ms:.2f}",
                "raw_ms": f"{raw_ms:.2f}",
                "in_graph_saves_ms": f"{saves:.2f}",
                "letterbox_ms": f"{letterbox_ms:.2f}",
                "stretch_ms": f"{stretch_ms:.2f}",
            }
        )
    )
    if args.check and saves < 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
