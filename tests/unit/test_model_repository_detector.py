"""The operator-built detector finds the synthetic scenes' objects, before and after encoding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import av
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tools.demo.scenes import (
    CLASS_COLOURS,
    Box,
    Codec,
    Scene,
    SceneObject,
    ground_truth,
    random_scene,
    render_frame,
    write_recording,
)
from tools.model_repository.detector import (
    CLASSES,
    IR_VERSION,
    OUTPUT_NAMES,
    Thresholds,
    build_detector,
    weights_sha256,
)

Frames = np.ndarray[Any, np.dtype[np.uint8]]
HEIGHT, WIDTH = 360, 640
# Lossy yuv420p encoding blurs the colour edges by a pixel or two.
CODEC_TOLERANCE_PX = 4.0


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(
        build_detector(HEIGHT, WIDTH), options, providers=["CPUExecutionProvider"]
    )


def detect(session: ort.InferenceSession, frames: Frames) -> list[list[tuple[str, Box, float]]]:
    """Per frame: (class, box, score) for the leading `num_dets` slots."""
    num_dets, boxes, scores, classes = session.run(list(OUTPUT_NAMES), {"images": frames})
    assert num_dets.dtype == np.int32
    assert classes.dtype == np.int32
    assert boxes.dtype == scores.dtype == np.float32
    assert num_dets.shape == (len(frames), 1)
    assert boxes.shape == (len(frames), len(CLASSES), 4)
    results = []
    for n, frame_boxes, frame_scores, frame_classes in zip(
        num_dets[:, 0], boxes, scores, classes, strict=True
    ):
        # EfficientNMS layout: detections lead, the padding is zeroed.
        assert (frame_classes[n:] == -1).all()
        assert (frame_scores[n:] == 0).all()
        assert (frame_boxes[n:] == 0).all()
        detections = []
        for (x1, y1, x2, y2), score, class_index in zip(
            frame_boxes[:n], frame_scores[:n], frame_classes[:n], strict=True
        ):
            name = CLASSES[class_index]
            detections.append((name, Box(name, x1, y1, x2 - x1, y2 - y1), float(score)))
        results.append(detections)
    return results


def assert_matches(
    detections: list[tuple[str, Box, float]], truth: list[Box], tolerance: float
) -> None:
    found = {name: box for name, box, _ in detections}
    assert sorted(found) == sorted(b.class_name for b in truth)
    for expected in truth:
        assert found[expected.class_name].corners == pytest.approx(expected.corners, abs=tolerance)
    assert all(score > 0.9 for _, _, score in detections)


def test_model_bytes_are_deterministic_and_pinned_by_sha256() -> None:
    first = build_detector(HEIGHT, WIDTH)
    assert build_detector(HEIGHT, WIDTH) == first
    other = build_detector(HEIGHT, WIDTH, thresholds=Thresholds(high=0.55, low=0.3))
    assert other != first
    assert weights_sha256(first) != weights_sha256(other)
    assert len(weights_sha256(first)) == 64
    model = onnx.load_from_string(first)
    assert model.ir_version == IR_VERSION
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", HEIGHT, WIDTH, 3]


@pytest.mark.parametrize("seed", range(8))
def test_rendered_frames_are_detected_exactly(session: ort.InferenceSession, seed: int) -> None:
    scene = random_scene(seed, seconds=3.0)
    times = [0.0, 0.7, 1.5, 3.0]
    frames = np.stack([render_frame(scene, t) for t in times])

    for detections, t in zip(detect(session, frames), times, strict=True):
        assert_matches(detections, ground_truth(scene, t), tolerance=0.0)
        assert all(score == 1.0 for _, _, score in detections)


@pytest.mark.parametrize("codec", ["vp9", "h264"])
def test_decoded_recordings_are_detected_within_codec_blur(
    session: ort.InferenceSession, tmp_path: Path, codec: Codec
) -> None:
    scene = random_scene(21, seconds=1.0)
    path = tmp_path / f"scene.{codec}"
    write_recording(path, scene, seconds=1.0, fps=10, codec=codec)
    with av.open(str(path)) as container:
        decoded = [(f.time or 0.0, f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]

    frames = np.stack([frame for _, frame in decoded]).astype(np.uint8, copy=False)
    for detections, (t, _) in zip(detect(session, frames), decoded, strict=True):
        assert_matches(detections, ground_truth(scene, t), tolerance=CODEC_TOLERANCE_PX)


def test_absent_classes_are_padding_and_edges_are_clipped(session: ort.InferenceSession) -> None:
    entering = SceneObject(
        "vehicle", CLASS_COLOURS["vehicle"], (-20.0, 300.0), (0.0, 0.0), (50, 80)
    )
    scene = Scene(width=WIDTH, height=HEIGHT, objects=(entering,))
    empty = Scene(width=WIDTH, height=HEIGHT, objects=())
    frames = np.stack([render_frame(scene, 0.0), render_frame(empty, 0.0)])

    with_vehicle, nothing = detect(session, frames)

    assert [(name, box.corners) for name, box, _ in with_vehicle] == [
        ("vehicle", (0, 300, 30, 360))
    ]
    assert nothing == []


def test_specks_and_background_noise_are_ignored(session: ort.InferenceSession) -> None:
    scene = random_scene(2)
    frame = render_frame(scene, 0.0)
    rng = np.random.default_rng(0)
    noisy = np.clip(frame.astype(np.int16) + rng.integers(-15, 16, frame.shape), 0, 255)
    noisy = noisy.astype(np.uint8)
    truth = ground_truth(scene, 0.0)
    free = _background_point(truth)
    noisy[free[1], free[0]] = CLASS_COLOURS["person"]  # one stray pixel of a class colour

    (detections,) = detect(session, noisy[np.newaxis])

    assert_matches(detections, truth, tolerance=0.0)


def test_a_subset_of_classes_reports_only_those(session: ort.InferenceSession) -> None:
    model = build_detector(HEIGHT, WIDTH, ("animal",))
    subset = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    scene = random_scene(9)
    num_dets, boxes, _, classes = subset.run(None, {"images": render_frame(scene, 0)[np.newaxis]})
    (animal,) = (b for b in ground_truth(scene, 0) if b.class_name == "animal")
    assert num_dets.tolist() == [[1]]
    assert classes.tolist() == [[0]]
    assert boxes[0, 0].tolist() == list(animal.corners)


@pytest.mark.parametrize("classes", [("person", "robot"), ("person", "person"), ()])
def test_build_rejects_unknown_or_repeated_classes(classes: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="classes"):
        build_detector(HEIGHT, WIDTH, classes)


def test_thresholds_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="low < high"):
        Thresholds(high=0.3, low=0.4)


def _background_point(truth: list[Box]) -> tuple[int, int]:
    for y in range(5, HEIGHT, 7):
        for x in range(5, WIDTH, 7):
            if all(
                not (b.x - 3 <= x < b.x + b.w + 3 and b.y - 3 <= y < b.y + b.h + 3) for b in truth
            ):
                return x, y
    raise AssertionError("no free background")
