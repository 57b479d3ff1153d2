"""A commit reads its items' stored boxes in Python (leases.boxes.stored_boxes) exactly as
Postgres' bucket_item_boxes_of_v1 reads them, on real Postgres.

job_commit_prepare answers the boxes recorded with each item's preview as their stored
text, and the coordinator groups the items from what `stored_boxes` reads there; the
review, the summary and every later regroup read the same rows through
bucket_item_boxes_of_v1. The two must agree value for value, or a commit would group
boxes that are not the ones it saves: checked here on the texts the coordinator writes
(`boxes_json_many`, detector-like and edge values), on those earlier releases wrote
(protobuf's JSON, with "NaN" and "Infinity"), and on Postgres' own text of the stored
jsonb, which is what the statement answers.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format

from services.coordinator.leases.boxes import (
    boxes_json_and_read_many,
    boxes_json_many,
    stored_boxes,
)
from testbed.harness.coordinator import CoordinatorHarness
from workshop.v1 import common_pb2

DECOMPOSED = """
SELECT t.o, b.box_index, b.class_name, b.score, b.x, b.y, b.w, b.h
FROM unnest($1::text[]) WITH ORDINALITY AS t (boxes, o)
CROSS JOIN LATERAL bucket_item_boxes_of_v1(t.boxes::jsonb) b
ORDER BY t.o, b.box_position
"""


def _value(chooser: random.Random) -> float:
    """A 32-bit float as detectors give them, or one of the edges of the stored form."""
    kind = chooser.random()
    if kind < 0.6:
        return float(np.float32(chooser.random()))
    if kind < 0.7:
        return 0.0
    if kind < 0.75:
        return -0.0
    if kind < 0.85:
        return float(np.float32(chooser.uniform(-1, 1) * 10 ** chooser.randint(-8, 12)))
    return float(np.float32(chooser.random() * 1e-5))


def _frames(chooser: random.Random, count: int) -> list[list[common_pb2.Box]]:
    frames = []
    for _ in range(count):
        boxes = []
        for _ in range(chooser.choice((0, 1, 3, 5))):
            box = common_pb2.Box(
                class_name=chooser.choice(("person", "car", "", "bicycle")),
                score=_value(chooser),
                x=_value(chooser),
                y=_value(chooser),
                w=_value(chooser),
                h=_value(chooser),
            )
            if chooser.random() < 0.2:
                box.track_id = chooser.randint(1, 10**12)
            boxes.append(box)
        frames.append(boxes)
    return frames


def _same(left: list[Any], right: list[Any]) -> bool:
    """Equal, a NaN equal to a NaN."""
    if len(left) != len(right):
        return False
    for one, other in zip(left, right, strict=True):
        if isinstance(one, float) and isinstance(other, float):
            if not (one == other or (math.isnan(one) and math.isnan(other))):
                return False
        elif one != other:
            return False
    return True


PRINTED = """
SELECT array_agg(t.boxes::jsonb::text ORDER BY t.o)
FROM unnest($1::text[]) WITH ORDINALITY AS t (boxes, o)
"""


async def _postgres_reads(
    coordinator: CoordinatorHarness, texts: list[str]
) -> tuple[list[list[tuple[Any, ...]]], list[str]]:
    """bucket_item_boxes_of_v1's rows of each text, in stored_boxes' form, and Postgres'
    own text of each text as jsonb (what job_commit_prepare answers)."""
    async with coordinator.db.connection() as connection:
        rows = await connection.fetch(DECOMPOSED, texts)
        printed: list[str] = await connection.fetchval(PRINTED, texts)
    read: list[list[tuple[Any, ...]]] = [[] for _ in texts]
    for row in rows:
        read[row["o"] - 1].append(tuple(row)[1:])
    return read, printed


def _assert_same_frames(
    texts: Sequence[object], ours: Sequence[Any], theirs: Sequence[Any]
) -> None:
    for text, mine, its in zip(texts, ours, theirs, strict=True):
        assert len(mine) == len(its), text
        for one, other in zip(mine, its, strict=True):
            assert _same(list(one), list(other)), (text, one, other)


async def _assert_read_as_postgres_reads(coordinator: CoordinatorHarness, texts: list[str]) -> None:
    """stored_boxes reads each text, and Postgres' own text of it, as Postgres does."""
    postgres, printed = await _postgres_reads(coordinator, texts)
    _assert_same_frames(texts, stored_boxes(texts), postgres)
    _assert_same_frames(texts, stored_boxes(printed), postgres)


async def test_stored_boxes_reads_the_coordinators_texts_as_postgres_does(
    coordinator: CoordinatorHarness,
) -> None:
    texts = [
        text for text in boxes_json_many(_frames(random.Random(34), 3000)) if isinstance(text, str)
    ]
    assert len(texts) == 3000
    await _assert_read_as_postgres_reads(coordinator, texts)


async def test_stored_boxes_reads_earlier_releases_texts_as_postgres_does(
    coordinator: CoordinatorHarness,
) -> None:
    """protobuf's JSON (NaN and infinities as strings, a set -0.0), a box with no fields,
    a null where a value was never written, and an item without boxes."""
    boxes = [
        common_pb2.Box(class_name="car", score=float("nan"), x=float("inf"), y=-0.0, w=0.5),
        common_pb2.Box(x=float("-inf"), h=1e-7),
        common_pb2.Box(),
    ]
    texts = [
        json.dumps([json_format.MessageToDict(box, preserving_proto_field_name=True)])
        for box in boxes
    ]
    texts += [
        '[{"class_name": "dog", "x": null, "score": 0.25}]',
        "[]",
        '[{"w": 0.1}, {"class_name": "cat"}]',
    ]
    await _assert_read_as_postgres_reads(coordinator, texts)


async def test_the_boxes_a_record_remembers_are_those_postgres_reads_from_its_text(
    coordinator: CoordinatorHarness,
) -> None:
    """What the previews room remembers for a commit (leases.recorded) beside each text it
    stores: the values bucket_item_boxes_of_v1 reads from that text."""
    texts, read = boxes_json_and_read_many(_frames(random.Random(35), 3000))
    assert all(isinstance(text, str) for text in texts)
    assert all(frame is not None for frame in read)
    postgres, _ = await _postgres_reads(coordinator, [str(text) for text in texts])
    _assert_same_frames(texts, read, postgres)
