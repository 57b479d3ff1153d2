"""`workshop models evaluate`'s figures are pycocotools': scoring each class on its own with
COCOeval over compact box arrays gives the AP of pycocotools' usual whole-dataset COCOeval on
random detections and truths; the precision and recall at IoU 0.50 of a case worked by hand;
the YOLO export read as a stream of chunks, handed to the pass's thread at most
CHUNKS_AHEAD ahead; a pass over a bucket with a stand-in Triton maps
letterboxed answers back to the images' pixels; the baseline chosen from the runs' pins and
put beside the version in the table; a Triton that does not answer is UNAVAILABLE."""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import tarfile
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from testbed.harness.preview import jpeg_bytes
from tools.cli.operator import _side_by_side
from tools.localstack.host import free_ports
from workshop.kit import evaluation as evaluate
from workshop.kit.errors import Unavailable
from workshop.kit.evaluation import (
    Boxes,
    EvaluationError,
    ServedModel,
    YoloStream,
    run_over,
    score,
)
from workshop.kit.evaluation_plan import CHUNKS_AHEAD, Ask, ExportFeed, Pin, _pass, baseline_of
from workshop.kit.model_io import CONTRACT_OUTPUTS, LETTERBOX_INPUT
from workshop.v1 import preview_pb2, resources_pb2


@dataclass(frozen=True)
class Found:
    image: int
    class_name: str
    score: float
    box: tuple[float, ...]


def _boxes(rows: list[tuple[int, str, float, Sequence[float]]]) -> Boxes:
    boxes = Boxes(capacity=2)  # grows
    for image, label, value, box in rows:
        boxes.add(
            image,
            np.array([CLASSES.index(label)], np.int32),
            np.array([value], np.float32),
            np.array([box], np.float32),
        )
    return boxes


def _score(
    truth: Mapping[int, Sequence[tuple[str, Sequence[float]]]],
    found: Sequence[Found],
    classes: Sequence[str],
) -> Any:
    gt = _boxes([(i, label, 1.0, box) for i, boxes in truth.items() for label, box in boxes])
    dt = _boxes([(d.image, d.class_name, d.score, d.box) for d in found])
    known = [(c, CLASSES.index(c), CLASSES.index(c)) for c in classes if c in CLASSES]
    return score(gt, dt, known)


CLASSES = ("person", "car", "dog")


def _random_case(seed: int) -> tuple[dict[int, list[tuple[str, tuple[float, ...]]]], list[Found]]:
    rng = random.Random(seed)
    truth: dict[int, list[tuple[str, tuple[float, ...]]]] = {}
    found: list[Found] = []
    for image in range(12):
        truth[image] = []
        for _ in range(rng.randint(0, 6)):
            label = rng.choice(CLASSES)
            x, y = rng.uniform(0, 500), rng.uniform(0, 300)
            box = (x, y, x + rng.uniform(10, 120), y + rng.uniform(10, 120))
            truth[image].append((label, box))
            if rng.random() < 0.8:  # found, a little off, sometimes as another class
                dx, dy = rng.gauss(0, 6), rng.gauss(0, 6)
                moved = (box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy)
                other = label if rng.random() < 0.85 else rng.choice(CLASSES)
                found.append(Found(image, other, rng.uniform(0.2, 1.0), moved))
        for _ in range(rng.randint(0, 3)):  # false alarms
            x, y = rng.uniform(0, 500), rng.uniform(0, 300)
            box = (x, y, x + rng.uniform(10, 80), y + rng.uniform(10, 80))
            found.append(Found(image, rng.choice(CLASSES), rng.uniform(0.05, 0.9), box))
    return truth, found


def _pycocotools(
    truth: dict[int, list[tuple[str, tuple[float, ...]]]], found: list[Found]
) -> list[float]:
    ids = {name: n + 1 for n, name in enumerate(CLASSES)}
    dataset = {
        "images": [{"id": image, "width": 640, "height": 480} for image in truth],
        "annotations": [
            {
                "id": n + 1,
                "image_id": image,
                "category_id": ids[label],
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "area": (x2 - x1) * (y2 - y1),
                "iscrowd": 0,
            }
            for n, (image, label, (x1, y1, x2, y2)) in enumerate(
                (image, label, box) for image, boxes in truth.items() for label, box in boxes
            )
        ],
        "categories": [{"id": i, "name": name} for name, i in ids.items()],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = dataset
        gt.createIndex()
        dt = gt.loadRes(
            [
                {
                    "image_id": d.image,
                    "category_id": ids[d.class_name],
                    "bbox": [d.box[0], d.box[1], d.box[2] - d.box[0], d.box[3] - d.box[1]],
                    "score": d.score,
                }
                for d in found
            ]
        )
        evaluation = COCOeval(gt, dt, "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return [float(evaluation.stats[0]), float(evaluation.stats[1])]


def _f32(values: Sequence[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(values, np.float32).tolist())


@pytest.mark.parametrize("block", [5000, 5])
@pytest.mark.parametrize("seed", range(8))
def test_average_precision_is_cocoevals(
    seed: int, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Matched in blocks of images (12 images in blocks of 5: three) or in one, then
    accumulated over all: the AP of one whole-dataset COCOeval."""
    monkeypatch.setattr(evaluate, "IMAGES_PER_BLOCK", block)
    truth, found = _random_case(seed)
    # the boxes as float32, as the evaluation stores them
    truth = {i: [(label, _f32(box)) for label, box in boxes] for i, boxes in truth.items()}
    found = [Found(d.image, d.class_name, _f32([d.score])[0], _f32(d.box)) for d in found]
    figures = _score(truth, found, CLASSES)
    expected = _pycocotools(truth, found)
    assert figures.ap50_95 == pytest.approx(expected[0], abs=1e-9)
    assert figures.ap50 == pytest.approx(expected[1], abs=1e-9)


def test_precision_and_recall_at_half_overlap() -> None:
    truth = {
        0: [("car", (0.0, 0.0, 10.0, 10.0)), ("car", (20.0, 20.0, 30.0, 30.0))],
        1: [("dog", (0.0, 0.0, 10.0, 10.0))],
    }
    found = [
        Found(0, "car", 0.9, (0.0, 0.0, 10.0, 10.0)),  # hit
        Found(0, "car", 0.8, (0.0, 0.0, 10.0, 10.0)),  # the same truth again: a miss
        Found(1, "dog", 0.7, (5.0, 0.0, 15.0, 10.0)),  # IoU 1/3: a miss
        Found(1, "person", 0.6, (0.0, 0.0, 10.0, 10.0)),  # no person truth: not scored
    ]
    figures = _score(truth, found, ("car", "dog", "person"))
    assert (figures.precision, figures.recall) == (1 / 3, 1 / 3)
    assert set(figures.per_class) == {"car", "dog"}
    car, dog = figures.per_class["car"], figures.per_class["dog"]
    assert (car["ground_truth"], car["detections"], car["precision"], car["recall"]) == (
        2,
        2,
        0.5,
        0.5,
    )
    assert (dog["ap50"], dog["precision"], dog["recall"]) == (0.0, 0.0, 0.0)


def test_no_shared_class_is_an_error() -> None:
    with pytest.raises(EvaluationError, match="no box of a class the model knows"):
        _score({0: [("dog", (0.0, 0.0, 1.0, 1.0))]}, [], ("person",))


def _yolo_archive(items: list[tuple[str, bytes, str]], classes: list[str] | None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in [
            *(
                (f"{kind}/{item_id}.{ext}", blob)
                for item_id, jpeg, labels in items
                for kind, ext, blob in (("images", "jpg", jpeg), ("labels", "txt", labels.encode()))
            ),
            *([("classes.txt", "".join(f"{c}\n" for c in classes).encode())] if classes else []),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _chunks(data: bytes, seed: int) -> list[bytes]:
    rng, parts, at = random.Random(seed), [], 0
    while at < len(data):
        size = rng.randint(1, 3000)
        parts.append(data[at : at + size])
        at += size
    return parts


def test_the_yolo_export_is_read_as_its_chunks_arrive() -> None:
    items = [(f"it_{n}", jpeg_bytes(seed=n), f"{n % 2} 0.5 0.5 0.25 0.5\n" * n) for n in range(5)]
    stream = YoloStream(_chunks(_yolo_archive(items, ["a", "b"]), 1))
    read = list(stream)
    assert [(i.number, i.item_id) for i in read] == [(n, f"it_{n}") for n in range(5)]
    assert [len(i.labels) for i in read] == [0, 1, 2, 3, 4]
    assert read[3].jpeg == items[3][1]
    assert stream.classes == ("a", "b")
    with pytest.raises(EvaluationError, match=r"without its classes\.txt"):
        list(YoloStream([_yolo_archive(items, None)]))
    cut = _yolo_archive(items, ["a", "b"])
    with pytest.raises(EvaluationError, match="not a YOLO archive"):
        list(YoloStream([cut[: len(cut) // 2]]))


def test_the_export_feed_reads_ahead_by_its_places_and_hands_over_every_chunk() -> None:
    total = CHUNKS_AHEAD * 3
    streamed = 0

    async def export(request: Any, metadata: Any) -> AsyncIterator[Any]:
        nonlocal streamed
        for n in range(total):
            streamed += 1
            yield SimpleNamespace(data=bytes([n]), last=n == total - 1)

    async def main() -> None:
        services: Any = SimpleNamespace(preview=SimpleNamespace(ExportBucket=export), metadata=())
        feed = ExportFeed(services, preview_pb2.ExportBucketRequest())
        for _ in range(200):  # the reader runs until it waits for a place
            await asyncio.sleep(0)
        # CHUNKS_AHEAD handed over, one more read from the stream and waiting for a place
        assert streamed == CHUNKS_AHEAD + 1
        # the pass's thread is a daemon, so that a place never given back (the pass
        # waiting for ever) fails this test instead of hanging it: a guard, not a timing
        taken: list[bytes] = []
        done = asyncio.Event()
        loop = asyncio.get_running_loop()

        def take() -> None:
            taken.extend(feed.chunks())
            loop.call_soon_threadsafe(done.set)

        threading.Thread(target=take, daemon=True).start()
        try:
            await asyncio.wait_for(done.wait(), 30)
        finally:
            feed.close()
        assert taken == [bytes([n]) for n in range(total)]

    asyncio.run(main())


class _Reply:
    def __init__(self, outputs: dict[str, Any]) -> None:
        self._outputs = outputs

    def as_numpy(self, name: str) -> Any:
        return self._outputs[name]


class _Triton:
    """Answers one box over the letterboxed picture of a 200x100 image in a 64x64 frame
    (the picture lies at rows 16..48), class 1 at 0.9."""

    def __init__(self) -> None:
        self.frames: list[Any] = []

    def infer(self, name: str, inputs: list[Any], **_: Any) -> _Reply:
        answer = ([[1]], [[[0, 16, 64, 48]]], [[0.9]], [[1]])
        values = dict(zip(CONTRACT_OUTPUTS, answer, strict=True))
        return _Reply({k: np.array(v) for k, v in values.items()})

    def close(self) -> None:
        pass


def test_a_pass_over_the_bucket_maps_answers_to_the_images_pixels() -> None:
    items = [(f"it_{n}", jpeg_bytes(200, 100, seed=n), "1 0.5 0.5 1 1\n") for n in range(7)]
    chunks = _chunks(_yolo_archive(items, ["x", "y"]), 2)
    model = ServedModel("m", 1, ("y", "x"), LETTERBOX_INPUT, 64, 64, True)
    evaluation = run_over(chunks, _Triton, [model], workers=2)
    assert (evaluation.items, evaluation.truth.count, evaluation.bucket_classes) == (
        7,
        7,
        ("x", "y"),
    )
    images, _, boxes = evaluation.found[0].of_class(1)
    assert images.tolist() == list(range(7))
    assert np.allclose(boxes, [[0, 0, 200, 100]] * 7, atol=0.5)
    # the model's class 1 is "x", the bucket's "y" is the model's 0: nothing found of it
    report = evaluation.report(0)
    assert report["classes"]["y"]["recall"] == 0.0
    assert report["ap50"] == 0.0


def test_the_baseline_is_the_version_most_items_came_from() -> None:
    pins = [
        Pin("demo", 1, ("person",), 90, ("r1",)),
        Pin("yard", 1, ("person",), 60, ("r2", "r3")),
        Pin("yard", 2, ("person",), 10, ("r4",)),
    ]
    assert baseline_of(pins, "yard", 3) == pins[1]  # the same model first
    assert baseline_of(pins, "other", 1) == pins[0]  # else the model most items came from
    assert baseline_of(pins, "yard", 1) is None  # the version itself: nothing to compare
    assert baseline_of([], "yard", 1) is None


def test_the_table_puts_the_baseline_beside_the_version() -> None:
    figures = {
        "model": "yard",
        "version": 2,
        "classes": {"car": {"ground_truth": 4, "ap50": 0.9, "ap50_95": 0.5}},
    }
    baseline = {
        "model": "yard",
        "version": 1,
        "classes": {"car": {"ground_truth": 4, "ap50": 0.7}, "dog": {"ground_truth": 1}},
    }
    rows = _side_by_side(figures, baseline)
    assert [r["class"] for r in rows] == ["car", "dog"]
    assert (rows[0]["ground_truth"], rows[0]["ap50 v2"], rows[0]["ap50 v1"]) == (4, 0.9, 0.7)
    assert rows[1]["ap50 v2"] == ""  # a class only the baseline knows
    alone = _side_by_side(figures, None)
    assert alone[0]["ap50"] == 0.9


def test_a_triton_that_does_not_answer_makes_the_evaluation_unavailable() -> None:
    """UNAVAILABLE (ask again), as EvaluationService's contract says, not FAILED_PRECONDITION,
    which is kept for what Triton answers about the version."""
    (port,) = free_ports(1)  # nothing listens there
    ask = Ask(name="m", version=1, bucket="b")
    version = resources_pb2.ModelVersion(name="m", version=1, classes=["a"])
    with pytest.raises(Unavailable, match="Triton did not answer"):
        _pass(f"127.0.0.1:{port}", ask, version, None, iter([]), None)
