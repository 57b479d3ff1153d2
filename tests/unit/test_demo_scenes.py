"""Synthetic scenes: deterministic, in frame, drawn where ground truth says, and encodable."""

from __future__ import annotations

import hashlib
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from tools.demo.scenes import (
    BACKGROUND,
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

SEEDS = range(20)


def test_random_scene_is_a_function_of_its_seed() -> None:
    assert random_scene(5) == random_scene(5)
    assert random_scene(5) != random_scene(6)
    assert np.array_equal(render_frame(random_scene(5), 1.3), render_frame(random_scene(5), 1.3))


@pytest.mark.parametrize("seed", SEEDS)
def test_random_scene_objects_stay_whole_and_apart(seed: int) -> None:
    scene = random_scene(seed, seconds=4.0)
    for t in np.linspace(0.0, 4.0, 41):
        boxes = ground_truth(scene, float(t))
        assert sorted(b.class_name for b in boxes) == sorted(CLASS_COLOURS)
        for box, obj in zip(boxes, scene.objects, strict=True):
            assert (box.w, box.h) == obj.size, "clipped although the scene keeps objects in frame"
            assert 30 <= box.w <= 80
            assert 30 <= box.h <= 80
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                assert not _overlap(a, b)


def test_frame_shows_each_box_in_its_colour_on_the_background() -> None:
    scene = random_scene(11)
    frame = render_frame(scene, 2.5)
    assert frame.shape == (360, 640, 3)
    assert frame.dtype == np.uint8
    covered = np.zeros(frame.shape[:2], dtype=bool)
    for box in ground_truth(scene, 2.5):
        x1, y1, x2, y2 = (int(v) for v in box.corners)
        assert (frame[y1:y2, x1:x2] == CLASS_COLOURS[box.class_name]).all()
        covered[y1:y2, x1:x2] = True
    assert (frame[~covered] == BACKGROUND).all()


def test_ground_truth_clips_to_the_frame_and_drops_objects_outside() -> None:
    leaving = SceneObject("person", CLASS_COLOURS["person"], (600.0, -10.0), (100.0, 0.0), (50, 40))
    scene = Scene(width=640, height=360, objects=(leaving,))

    (box,) = ground_truth(scene, 0.0)

    assert box == Box("person", 600, 0, 40, 30)
    assert box.normalized(640, 360) == Box("person", 600 / 640, 0.0, 40 / 640, 30 / 360)
    assert ground_truth(scene, 1.0) == []
    assert (render_frame(scene, 1.0) == BACKGROUND).all()


def test_motion_is_linear_in_pixels_per_second() -> None:
    obj = SceneObject("animal", CLASS_COLOURS["animal"], (10.0, 20.0), (30.0, -4.0), (40, 40))
    assert obj.top_left(0.0) == (10, 20)
    assert obj.top_left(2.0) == (70, 12)
    assert obj.top_left(0.1) == (13, 20)  # 19.6 rounds to the nearest pixel


@pytest.mark.parametrize(("codec", "time_base"), [("vp9", Fraction(1, 1000)), ("h264", None)])
def test_recording_decodes_to_the_rendered_frames(
    tmp_path: Path, codec: Codec, time_base: Fraction | None
) -> None:
    scene = random_scene(3, seconds=1.0)
    path = tmp_path / f"scene.{codec}"

    info = write_recording(path, scene, seconds=1.0, fps=10, codec=codec)

    data = path.read_bytes()
    assert info.frames == 10
    assert info.fps == 10
    assert info.duration == 1.0
    assert info.byte_size == len(data) < 20_000
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    if time_base is not None:
        assert info.time_base == time_base
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == codec
        assert stream.time_base == info.time_base
        decoded = list(container.decode(stream))
    assert len(decoded) == 10
    assert [float(f.time or 0.0) for f in decoded] == pytest.approx([i / 10 for i in range(10)])
    for index in (0, 9):
        frame = decoded[index].to_ndarray(format="rgb24")
        error = np.abs(frame.astype(np.int16) - render_frame(scene, index / 10)).mean()
        assert error < 2.0, "the encoder blurred the solid colours too much"


def test_recording_bytes_are_reproducible(tmp_path: Path) -> None:
    scene = random_scene(4)
    first = write_recording(tmp_path / "a.webm", scene, seconds=0.5)
    second = write_recording(tmp_path / "b.webm", scene, seconds=0.5)
    assert first.sha256 == second.sha256


def test_write_recording_rejects_unknown_codecs_and_odd_sizes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="codec"):
        write_recording(tmp_path / "x", random_scene(1), seconds=1, codec="hevc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="even"):
        write_recording(tmp_path / "x", Scene(width=641, height=360, objects=()), seconds=1)


def _overlap(a: Box, b: Box) -> bool:
    return a.x < b.x + b.w and b.x < a.x + a.w and a.y < b.y + b.h and b.y < a.y + a.h
