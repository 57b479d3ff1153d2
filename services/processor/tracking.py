"""Object tracking for keep-by-change sampling and the motion route (capability "workshop-v3").

Pure and deterministic: no I/O, no clock, no randomness. A job makes one `Tracker`
and feeds it every sampled frame in slot order.

Units. Every box is normalized as in `common.proto` `Box`: x and w are fractions
of the frame width, y and h fractions of the frame height. The *displacement*
of an object is the Euclidean distance between two of its box centres in those
normalized units, ``hypot(Δcx, Δcy)``: a move of 2 % of the width, or of 2 % of
the height, is a displacement of 0.02. This is the "normalized frame units as
in Box" of `KeepByChange.min_displacement` and `MotionRoute.min_displacement`.

Thresholds travel as proto ``float`` (32 bits), so `at_least` compares a
score or displacement and its threshold after rounding both to 32-bit floats: a box
moved by exactly 0.05 in the test's decimal numbers does count as moving at a
threshold of 0.05.

Tracker
- Tracks live in *groups* (the model step that produced the boxes) and carry a
  class; a detection can only continue a track of its own group and class.
- Each frame, every (track, detection) pair of the same group and class with
  IoU ≥ `iou_threshold` (default 0.3) is a candidate; candidates are taken
  greedily by highest IoU (ties: lower track id, then the detection's position
  in the input), each track and each detection at most once.
- An unmatched detection starts a new track; ids are 1, 2, 3 … within the
  tracker (one tracker per job), never reused, assigned in input order.
- An unmatched track keeps its last box and counts a missed frame; it survives
  up to `max_missed` (default 3) consecutive missed frames and is dropped at
  the next one, so an object gone for more than `max_missed` sampled frames
  comes back with a new id.
- `TrackedFrame.previous` holds, for every continued track, the box it had the
  last time it was seen (the previous sampled frame unless it was missed in
  between). New tracks have no previous box: the motion route counts them as
  moving ("or when it first appears").

Keep-by-change (`ChangeDetector`)
- The first frame is always kept. A later frame is kept when the set of track
  ids on it differs from the set on the last kept frame (an object appeared or
  disappeared) or when a track present on both moved at least
  `min_displacement` (0 means the default 0.02) since the last kept frame.
- "Kept" means kept by the sample step: the reference becomes that frame even
  if the rules later route it to Do nothing.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from workshop.v1 import common_pb2

DEFAULT_IOU_THRESHOLD = 0.3
DEFAULT_MAX_MISSED = 3
DEFAULT_MIN_DISPLACEMENT = 0.02


@dataclass(frozen=True)
class Box:
    """One detection; mirrors `common.proto` Box (coordinates normalized 0..1)."""

    class_name: str
    score: float
    x: float
    y: float
    w: float
    h: float
    track_id: int | None = None

    @property
    def centre(self) -> tuple[float, float]:
        return (self.x + self.w / 2, self.y + self.h / 2)

    def with_track(self, track_id: int | None) -> Box:
        return replace(self, track_id=track_id)


def box_to_proto(box: Box) -> common_pb2.Box:
    message = common_pb2.Box(
        class_name=box.class_name, score=box.score, x=box.x, y=box.y, w=box.w, h=box.h
    )
    if box.track_id is not None:
        message.track_id = box.track_id
    return message


def box_from_proto(message: common_pb2.Box) -> Box:
    return Box(
        class_name=message.class_name,
        score=message.score,
        x=message.x,
        y=message.y,
        w=message.w,
        h=message.h,
        track_id=message.track_id if message.HasField("track_id") else None,
    )


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes (0 when either has no area)."""
    left, right = max(a.x, b.x), min(a.x + a.w, b.x + b.w)
    top, bottom = max(a.y, b.y), min(a.y + a.h, b.y + b.h)
    intersection = max(0.0, right - left) * max(0.0, bottom - top)
    union = a.w * a.h + b.w * b.h - intersection
    return intersection / union if union > 0 else 0.0


def displacement(a: Box, b: Box) -> float:
    """Distance between the centres of two boxes, in normalized frame units."""
    (ax, ay), (bx, by) = a.centre, b.centre
    return math.hypot(bx - ax, by - ay)


def _float32(value: float) -> float:
    result: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return result


def effective_min_displacement(value: float) -> float:
    """The threshold a proto `min_displacement` stands for: 0 means the default 0.02."""
    return value if value > 0 else DEFAULT_MIN_DISPLACEMENT


def at_least(value: float, threshold: float) -> bool:
    """`value >= threshold`, both rounded to 32-bit floats as the contract carries them."""
    return _float32(value) >= _float32(threshold)


@dataclass(frozen=True)
class TrackedFrame:
    """One frame after tracking.

    `boxes`: per group, the input boxes in input order with their `track_id` set.
    `current`: track id -> its box on this frame.
    `previous`: track id -> its box the last time it was seen (continued tracks only).
    """

    boxes: Mapping[str, tuple[Box, ...]]
    current: Mapping[int, Box]
    previous: Mapping[int, Box] = field(default_factory=dict)

    @property
    def track_ids(self) -> frozenset[int]:
        return frozenset(self.current)

    def displacement(self, track_id: int) -> float | None:
        """How far the track moved since it was last seen; None when it first appears here."""
        before = self.previous.get(track_id)
        if before is None:
            return None
        return displacement(before, self.current[track_id])


@dataclass
class _Track:
    track_id: int
    group: str
    box: Box
    missed: int = 0


class Tracker:
    """Greedy IoU tracker, per group and class; see the module docstring."""

    def __init__(
        self,
        *,
        iou_threshold: float = DEFAULT_IOU_THRESHOLD,
        max_missed: int = DEFAULT_MAX_MISSED,
    ) -> None:
        if not 0 < iou_threshold <= 1:
            raise ValueError(f"iou_threshold must be in (0, 1], not {iou_threshold}")
        if max_missed < 0:
            raise ValueError(f"max_missed must be >= 0, not {max_missed}")
        self._iou_threshold = iou_threshold
        self._max_missed = max_missed
        self._tracks: list[_Track] = []
        self._next_id = 1

    @property
    def live_track_ids(self) -> tuple[int, ...]:
        """Ids of the tracks still kept (seen, or missed at most `max_missed` times in a row)."""
        return tuple(track.track_id for track in self._tracks)

    def update(self, detections: Mapping[str, Sequence[Box]]) -> TrackedFrame:
        """Track one frame: `detections` maps a group (model step id) to its boxes."""
        candidates: list[tuple[float, int, int, int, _Track]] = []
        for group_index, (group, boxes) in enumerate(detections.items()):
            for box_index, box in enumerate(boxes):
                for track in self._tracks:
                    if track.group != group or track.box.class_name != box.class_name:
                        continue
                    overlap = iou(track.box, box)
                    if overlap >= self._iou_threshold:
                        candidates.append((-overlap, track.track_id, group_index, box_index, track))
        candidates.sort(key=lambda candidate: candidate[:4])

        assigned: dict[tuple[int, int], int] = {}
        matched: dict[int, _Track] = {}
        for _, track_id, group_index, box_index, track in candidates:
            if track_id in matched or (group_index, box_index) in assigned:
                continue
            assigned[(group_index, box_index)] = track_id
            matched[track_id] = track

        tracked: dict[str, tuple[Box, ...]] = {}
        current: dict[int, Box] = {}
        previous: dict[int, Box] = {}
        new_tracks: list[_Track] = []
        for group_index, (group, boxes) in enumerate(detections.items()):
            out: list[Box] = []
            for box_index, box in enumerate(boxes):
                found = assigned.get((group_index, box_index))
                if found is None:
                    track_id = self._next_id
                    self._next_id += 1
                    new_tracks.append(_Track(track_id=track_id, group=group, box=box))
                else:
                    track_id = found
                    track = matched[track_id]
                    previous[track_id] = track.box
                    track.box = box
                    track.missed = 0
                labelled = box.with_track(track_id)
                current[track_id] = labelled
                out.append(labelled)
            tracked[group] = tuple(out)

        survivors: list[_Track] = []
        for track in self._tracks:
            if track.track_id not in matched:
                track.missed += 1
                if track.missed > self._max_missed:
                    continue
            survivors.append(track)
        self._tracks = survivors + new_tracks
        return TrackedFrame(boxes=tracked, current=current, previous=previous)


class ChangeDetector:
    """Keep-by-change: which frames the sample step keeps; see the module docstring."""

    def __init__(self, min_displacement: float = 0.0) -> None:
        self._min_displacement = effective_min_displacement(min_displacement)
        self._kept: dict[int, Box] | None = None

    @property
    def min_displacement(self) -> float:
        return self._min_displacement

    def changed(self, frame: TrackedFrame) -> bool:
        """True when `frame` differs from the last kept frame (or no frame was kept yet)."""
        if self._kept is None:
            return True
        if frame.track_ids != frozenset(self._kept):
            return True
        return any(
            at_least(displacement(self._kept[track_id], box), self._min_displacement)
            for track_id, box in frame.current.items()
        )

    def keep(self, frame: TrackedFrame) -> bool:
        """Decide for `frame`; a kept frame becomes the reference for the next ones."""
        if not self.changed(frame):
            return False
        self._kept = dict(frame.current)
        return True
