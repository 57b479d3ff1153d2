"""`workshop models evaluate`'s figures are COCO's: the same AP as pycocotools' COCOeval
(the reference reader of the dataset export) on random detections and truths, and the
precision and recall at IoU 0.50 of a case worked by hand."""

from __future__ import annotations

import contextlib
import io
import random

import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from tools.model_repository.evaluate import EvaluationError, Found, score

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


@pytest.mark.parametrize("seed", range(8))
def test_average_precision_is_cocoevals(seed: int) -> None:
    truth, found = _random_case(seed)
    figures = score(truth, found, CLASSES)  # type: ignore[arg-type]
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
    figures = score(truth, found, ("car", "dog", "person"))
    assert (figures.precision, figures.recall) == (1 / 3, 1 / 3)
    assert set(figures.per_class) == {"car", "dog"}
    assert figures.per_class["car"]["ground_truth"] == 2
    assert figures.per_class["dog"]["ap50"] == 0.0


def test_no_shared_class_is_an_error() -> None:
    with pytest.raises(EvaluationError, match="no box of a class the model knows"):
        score({0: [("cat", (0.0, 0.0, 1.0, 1.0))]}, [], ("dog",))
