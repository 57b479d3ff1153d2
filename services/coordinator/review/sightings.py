"""Sightings: which boxes of a timeline's items show the same object (docs/review.md).

A timeline is one run's items of one bucket and camera, in frame order (frame time,
then item id). Walking it, each item's boxes either extend a sighting that is still
open or start one:

- a sighting is open for a box when its class is the box's class, its last item is
  earlier than the box's item by more than 0 and at most 5 s, and the centre of the
  box is within 3 of the box's own widths of the centre of the sighting's last box
  (Euclidean distance in normalised frame coordinates, x in frame widths, y in frame
  heights; compared with 3 times the new box's w);
- of the (box, open sighting) pairs, the nearest pair is joined first (ties: lower box
  index, then lower sighting id), and each box and each sighting is used once per item;
- a box that joins nothing starts a sighting whose id is "<item id>~<box index>".

An item without boxes is one pseudo-box (index -1, class '') with no geometry: such
items group with the previous box-less item at most 5 s earlier.

Grouping is incremental: items committed later only regroup the timeline from their
first frame time on, starting from the sightings open just before it; the result is the
same as grouping the whole timeline at once, which is what the tests check.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from workshop.kit.values import hot_value

MAX_GAP = timedelta(seconds=5)
REACH_IN_WIDTHS = 3.0
NO_BOX = -1


@hot_value
class Detection:
    """One box of an item (box_index -1: an item without boxes), as the timeline holds it."""

    item_id: str
    box_index: int
    frame_time: datetime
    class_name: str
    x: float
    y: float
    w: float
    h: float
    # its detected score as review reads it (0 when it has none). Grouping never reads it:
    # a commit sets it on the boxes it adds, for the review of the sightings made from them
    # alone (reviews._new_sighting_score); a box read back from a timeline leaves it 0.
    score: float = 0.0

    @property
    def key(self) -> tuple[str, int]:
        return self.item_id, self.box_index

    @property
    def centre(self) -> tuple[float, float]:
        return self.x + self.w / 2, self.y + self.h / 2


@dataclasses.dataclass(slots=True)
class _Open:
    """A sighting with its last detection: where the object was last seen."""

    sighting_id: str
    last: Detection


def sighting_id(first: Detection) -> str:
    return f"{first.item_id}~{first.box_index}"


def parse_sighting_id(value: str) -> tuple[str, int] | None:
    """(item id, box index) of a sighting id, or None when it is not one."""
    item, separator, index = value.rpartition("~")
    if not separator or not item or not index.lstrip("-").isdigit() or len(index) > 6:
        return None
    box = int(index)
    return (item, box) if box >= NO_BOX else None


def group(
    detections: Iterable[Detection], open_before: Sequence[tuple[str, Detection]] = ()
) -> dict[tuple[str, int], str]:
    """The sighting of every detection, walking them in frame order.

    `open_before` are the sightings as they stood just before the first detection: each
    sighting's id with its last detection before that point (only those at most 5 s
    earlier can matter)."""
    open_sightings = [_Open(sid, last) for sid, last in open_before]
    assigned: dict[tuple[str, int], str] = {}
    by_item: dict[str, list[Detection]] = {}
    order: list[tuple[datetime, str]] = []
    for detection in detections:
        boxes = by_item.get(detection.item_id)
        if boxes is None:
            boxes = by_item[detection.item_id] = []
            order.append((detection.frame_time, detection.item_id))
        boxes.append(detection)
    for frame_time, item_id in sorted(order):
        # sightings whose last box is over 5 s old can never be joined again
        open_sightings = [s for s in open_sightings if frame_time - s.last.frame_time <= MAX_GAP]
        boxes = sorted(by_item[item_id], key=lambda d: d.box_index)
        pairs = _pairs(boxes, open_sightings, frame_time)
        taken_boxes: set[int] = set()
        taken_sightings: set[int] = set()
        for _, _, sid, index, position in pairs:
            if index in taken_boxes or position in taken_sightings:
                continue
            taken_boxes.add(index)
            taken_sightings.add(position)
            assigned[boxes[index].key] = sid
            open_sightings[position].last = boxes[index]
        for index, box in enumerate(boxes):
            if index not in taken_boxes:
                sid = sighting_id(box)
                assigned[box.key] = sid
                open_sightings.append(_Open(sid, box))
    return assigned


def _pairs(
    boxes: Sequence[Detection], open_sightings: Sequence[_Open], frame_time: datetime
) -> list[tuple[float, int, str, int, int]]:
    """Every (box, open sighting) pair of one item's `boxes` (all of `frame_time`) that may
    join, as (distance, box index, sighting id, box position, sighting position), nearest
    first: the rule of the module's docstring.

    Called for every item a commit groups (about 9 pairs a frame), so the frame time is
    compared once per sighting rather than per pair, and the centres are worked out inline
    (the same sums as `Detection.centre`, so the same distances)."""
    # (the caller dropped the sightings more than MAX_GAP old; one whose last box is of
    # this frame time, another item's, cannot be joined by this one)
    joinable = [
        (position, sighting)
        for position, sighting in enumerate(open_sightings)
        if sighting.last.frame_time < frame_time
    ]
    pairs = []
    for index, box in enumerate(boxes):
        class_name, box_index = box.class_name, box.box_index
        x, y, reach = box.x + box.w / 2, box.y + box.h / 2, REACH_IN_WIDTHS * box.w
        for position, sighting in joinable:
            last = sighting.last
            if last.class_name != class_name:
                continue
            if box_index == NO_BOX:
                if last.box_index == NO_BOX:
                    pairs.append((0.0, box_index, sighting.sighting_id, index, position))
                continue
            moved = math.hypot(x - (last.x + last.w / 2), y - (last.y + last.h / 2))
            if moved <= reach:
                pairs.append((moved, box_index, sighting.sighting_id, index, position))
    pairs.sort()
    return pairs
