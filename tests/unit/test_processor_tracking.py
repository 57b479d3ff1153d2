"""IoU tracker and keep-by-change detector (services.processor.tracking)."""

from __future__ import annotations

import pytest

from services.processor.tracking import (
    Box,
    ChangeDetector,
    TrackedFrame,
    Tracker,
    at_least,
    box_from_proto,
    box_to_proto,
    displacement,
    iou,
)


def box(x: float, y: float = 0.1, *, cls: str = "person", size: float = 0.2) -> Box:
    return Box(class_name=cls, score=0.9, x=x, y=y, w=size, h=size)


def ids(frame: TrackedFrame, group: str = "detect") -> list[int | None]:
    return [b.track_id for b in frame.boxes[group]]


def test_iou_and_displacement() -> None:
    a = Box("person", 0.9, 0.0, 0.0, 0.2, 0.2)
    assert iou(a, a) == pytest.approx(1.0)
    assert iou(a, Box("person", 0.9, 0.1, 0.0, 0.2, 0.2)) == pytest.approx(1 / 3)
    assert iou(a, Box("person", 0.9, 0.5, 0.5, 0.2, 0.2)) == 0.0
    assert iou(a, Box("person", 0.9, 0.0, 0.0, 0.0, 0.0)) == pytest.approx(0.0)
    # Centre distance in normalized units: 0.03 across and 0.04 down is 0.05.
    assert displacement(a, Box("person", 0.9, 0.03, 0.04, 0.2, 0.2)) == pytest.approx(0.05)


def test_at_least_compares_as_float32() -> None:
    assert at_least(0.15 - 0.1, 0.05)  # 0.04999999999999999 in float64
    assert at_least(0.3, 0.3)
    assert not at_least(0.29, 0.3)


def test_box_proto_round_trip() -> None:
    plain = Box("car", 0.5, 0.25, 0.5, 0.125, 0.25)
    tracked = plain.with_track(7)
    assert box_from_proto(box_to_proto(plain)) == plain
    assert box_from_proto(box_to_proto(tracked)) == tracked
    assert not box_to_proto(plain).HasField("track_id")
    assert box_to_proto(tracked).track_id == 7


def test_ids_are_stable_for_a_moving_object() -> None:
    tracker = Tracker()
    first = tracker.update({"detect": [box(0.1), box(0.6)]})
    assert ids(first) == [1, 2]
    assert first.previous == {}
    assert first.displacement(1) is None
    second = tracker.update({"detect": [box(0.62), box(0.13)]})
    assert ids(second) == [2, 1]
    assert second.displacement(1) == pytest.approx(0.03)
    assert second.displacement(2) == pytest.approx(0.02)


def test_greedy_matching_prefers_highest_iou() -> None:
    tracker = Tracker()
    tracker.update({"detect": [box(0.1)]})
    # Both overlap track 1; the closer one continues it, the other starts track 2.
    frame = tracker.update({"detect": [box(0.18), box(0.11)]})
    assert ids(frame) == [2, 1]


def test_matching_is_per_class_and_per_group() -> None:
    tracker = Tracker()
    tracker.update({"detect": [box(0.1)], "other": [box(0.1)]})
    frame = tracker.update({"detect": [box(0.1, cls="car")], "other": [box(0.1)]})
    assert ids(frame, "detect") == [3]  # same place, other class: a new object
    assert ids(frame, "other") == [2]


def test_low_overlap_starts_a_new_track() -> None:
    tracker = Tracker(iou_threshold=0.3)
    tracker.update({"detect": [box(0.1)]})
    assert ids(tracker.update({"detect": [box(0.22)]})) == [2]  # IoU 1/9 < 0.3


def test_track_survives_max_missed_frames_then_is_dropped() -> None:
    tracker = Tracker(max_missed=3)
    tracker.update({"detect": [box(0.1)]})
    for _ in range(3):
        tracker.update({"detect": []})
    assert tracker.live_track_ids == (1,)
    back = tracker.update({"detect": [box(0.1)]})
    assert ids(back) == [1]
    assert back.displacement(1) == pytest.approx(0.0)  # since it was last seen

    for _ in range(4):
        tracker.update({"detect": []})
    assert not tracker.live_track_ids
    assert ids(tracker.update({"detect": [box(0.1)]})) == [2]


def test_tracker_is_deterministic() -> None:
    frames = [
        {"detect": [box(0.1), box(0.5), box(0.5, cls="car")]},
        {"detect": [box(0.52), box(0.11)]},
        {"detect": [box(0.55, cls="car"), box(0.12), box(0.54)]},
    ]
    runs = []
    for _ in range(2):
        tracker = Tracker()
        runs.append([tracker.update(frame).boxes for frame in frames])
    assert runs[0] == runs[1]


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="iou_threshold"):
        Tracker(iou_threshold=0)
    with pytest.raises(ValueError, match="max_missed"):
        Tracker(max_missed=-1)


def test_change_detector_drops_static_frames() -> None:
    tracker = Tracker()
    change = ChangeDetector(0.05)
    assert change.keep(tracker.update({"detect": [box(0.1)]}))  # first frame
    assert not change.keep(tracker.update({"detect": [box(0.12)]}))  # moved 0.02
    # Small steps add up against the last *kept* frame: 0.05 in total.
    assert change.keep(tracker.update({"detect": [box(0.15)]}))
    assert not change.keep(tracker.update({"detect": [box(0.15)]}))
    assert change.keep(tracker.update({"detect": [box(0.15), box(0.6)]}))  # appeared
    assert change.keep(tracker.update({"detect": [box(0.6)]}))  # disappeared


def test_change_detector_default_and_empty_scene() -> None:
    tracker = Tracker()
    change = ChangeDetector()
    assert change.min_displacement == pytest.approx(0.02)
    assert change.keep(tracker.update({"detect": []}))
    assert not change.keep(tracker.update({"detect": []}))
    assert change.keep(tracker.update({"detect": [box(0.3)]}))
    assert change.keep(tracker.update({"detect": [box(0.32)]}))  # exactly the default
