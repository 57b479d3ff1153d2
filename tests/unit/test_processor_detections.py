"""A model's detections with a NaN or infinite value are left out, and counted."""

from __future__ import annotations

import math

import numpy as np

from services.processor.inference import finite_detections
from workshop.kit.metrics import REGISTRY


def dropped(model: str) -> float:
    value = REGISTRY.get_sample_value(
        "workshop_processor_detections_dropped_total", {"model": model}
    )
    return value or 0.0


def test_only_finite_detections_of_the_counted_ones_are_kept() -> None:
    boxes = np.array(
        [
            [1.0, 2.0, 3.0, 4.0],
            [1.0, math.nan, 3.0, 4.0],  # a coordinate NaN
            [1.0, 2.0, math.inf, 4.0],  # a coordinate infinite
            [5.0, 6.0, 7.0, 8.0],  # a score NaN below
            [0.0, 0.0, 1.0, 1.0],
            [math.nan, math.nan, math.nan, math.nan],  # past the count: never read
        ],
        dtype=np.float32,
    )
    scores = np.array([0.9, 0.8, 0.7, math.nan, -math.inf, math.nan], dtype=np.float32)
    before = dropped("nan-model")
    assert finite_detections(5, boxes, scores, "nan-model") == [0]
    assert dropped("nan-model") - before == 4
    assert finite_detections(1, boxes, scores, "nan-model") == [0]
    assert dropped("nan-model") - before == 4  # nothing more dropped


def test_an_image_without_detections_keeps_none_and_drops_none() -> None:
    boxes = np.full((3, 4), math.nan, dtype=np.float32)
    scores = np.full(3, math.nan, dtype=np.float32)
    before = dropped("empty-model")
    assert finite_detections(0, boxes, scores, "empty-model") == []
    assert dropped("empty-model") == before
