"""leases.boxes.box_dict stores a box exactly as json_format.MessageToDict did,
leases.boxes.boxes_json writes the same values as JSON text, and boxes_json_many the same
text as boxes_json for a batch of frames; both refuse a NaN or infinite value, naming it
(workshop.kit.box_values)."""

from __future__ import annotations

import json
import math
import random
import struct
from collections.abc import Sequence
from decimal import Decimal

import numpy as np
import pytest
from google.protobuf import json_format

from services.coordinator import convert
from services.coordinator.leases.boxes import box_dict, boxes_json, boxes_json_many, float_texts
from services.coordinator.servicers.dataset_views import frozen_boxes
from workshop.kit.box_values import NonFiniteBox, all_finite, non_finite_box
from workshop.v1 import common_pb2


def _message_to_dict(box: common_pb2.Box) -> dict[str, object]:
    return json_format.MessageToDict(box, preserving_proto_field_name=True)


def _boxes(seed: int) -> list[common_pb2.Box]:
    chosen = random.Random(seed)
    floats = [0.0, -0.0, 1.0, 0.1, 0.87, 1e-38, 3.4e38, 1e-45, float("inf"), float("-inf")]
    boxes = [
        common_pb2.Box(),
        common_pb2.Box(class_name="person", score=0.87, x=0.1, y=0.2, w=0.05, h=0.1, track_id=3),
        common_pb2.Box(class_name="car", track_id=0),
        common_pb2.Box(score=float("nan")),
        common_pb2.Box(x=-0.0, w=-0.5, track_id=-(2**63)),
    ]
    for _ in range(5000):
        box = common_pb2.Box(
            class_name=chosen.choice(["", "person", "café", "x" * 200]),
            score=chosen.choice([*floats, chosen.random()]),
            x=chosen.random() * chosen.choice([1.0, 1e-7, 1e7]),
            y=chosen.choice(floats),
            w=chosen.random(),
            h=-chosen.random(),
        )
        if chosen.random() < 0.5:
            box.track_id = chosen.choice([0, 7, 2**62, -5])
        boxes.append(box)
    return boxes


def test_box_dict_is_message_to_dict_for_every_kind_of_value() -> None:
    boxes = _boxes(17)
    for box in boxes:
        assert box_dict(box) == _message_to_dict(box), box
    # the same JSON text too (key order included), as the rows store it
    assert [list(box_dict(b)) for b in boxes] == [list(_message_to_dict(b)) for b in boxes]


def _stored(text: str) -> object:
    """JSON text as Postgres's jsonb keeps it: numbers as exact decimals."""
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


def _first_non_finite(frame: Sequence[common_pb2.Box]) -> str | None:
    """The field of the frame's first NaN or infinite value, found the plain way."""
    for position, box in enumerate(frame):
        for name in ("score", "x", "y", "w", "h"):
            if not math.isfinite(getattr(box, name)):
                return f"boxes[{position}].{name}"
    return None


def test_boxes_json_holds_box_dicts_values_as_the_same_decimals() -> None:
    boxes = _boxes(18)
    refused = 0
    for start in range(0, len(boxes), 3):  # a frame's few boxes at a time
        frame = boxes[start : start + 3]
        field = _first_non_finite(frame)
        if field is not None:
            with pytest.raises(NonFiniteBox) as caught:
                boxes_json(frame)
            assert caught.value.metadata == {"field": field}
            refused += 1
            continue
        expected = json.dumps([box_dict(box) for box in frame])
        assert _stored(boxes_json(frame)) == _stored(expected), frame
    assert refused > 100
    assert boxes_json([]) == "[]"


def test_a_non_finite_value_is_named_with_its_field_and_value() -> None:
    frame = [
        common_pb2.Box(score=0.5, x=0.1),
        common_pb2.Box(score=0.9, w=math.inf, h=math.nan),
    ]
    assert not all_finite(frame)
    refusal = non_finite_box(frame)
    assert refusal is not None
    assert (refusal.reason, refusal.metadata) == ("INVALID_FIELD", {"field": "boxes[1].w"})
    assert refusal.message.startswith("boxes[1].w is Infinity:")
    below = non_finite_box(frame, "result.slots[3].outputs[0].boxes")
    assert below is not None
    assert below.metadata == {"field": "result.slots[3].outputs[0].boxes[1].w"}
    for value, spelled in ((math.nan, "NaN"), (-math.inf, "-Infinity")):
        one = non_finite_box([common_pb2.Box(y=value)], "previews[2].boxes")
        assert one is not None
        assert one.message.startswith(f"previews[2].boxes[0].y is {spelled}:")
    # the largest 32-bit floats, summed, stay finite: no false refusal
    biggest = 3.4028234663852886e38
    assert all_finite([common_pb2.Box(score=biggest, x=biggest, y=biggest, w=biggest)] * 50)
    assert non_finite_box([]) is None


def test_boxes_json_prints_every_normal_float_as_protobuf_does() -> None:
    """Random 32-bit patterns: numpy's shortest decimal is protobuf's (box_dict's) for each
    normal float; the subnormals, where they differ, take box_dict's way (NaN and the
    infinities are refused)."""
    chosen = random.Random(19)
    for _ in range(20_000):
        [value] = struct.unpack("<f", chosen.getrandbits(32).to_bytes(4, "little"))
        box = common_pb2.Box(x=value)
        if not math.isfinite(value):  # 1 pattern in 256: refused, not written
            with pytest.raises(NonFiniteBox):
                boxes_json([box])
            continue
        expected = json.dumps([box_dict(box)])
        assert _stored(boxes_json([box])) == _stored(expected), value


def test_float_texts_are_numpys_text_for_text() -> None:
    """float_texts prints through orjson only where orjson's text is numpy's, character for
    character: random 32-bit patterns (finite ones), detector-like values, and every float
    next to a power of ten or two, one row of five at a time and as a whole batch; a row
    holding a value outside orjson's bounds sends its batch numpy's way."""
    chosen = np.random.default_rng(21)
    patterns = chosen.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    values = patterns.view(np.float32)
    values = values[np.isfinite(values)]
    near = [
        np.nextafter(np.float32(base**power), np.float32(toward))
        for base, powers in ((10.0, range(-6, 15)), (2.0, range(-20, 45)))
        for power in powers
        for toward in (0.0, np.inf, base**power)
    ]
    detector = chosen.random(100_000).astype(np.float32)
    for pool in (values, np.array(near, dtype=np.float32), detector, -detector):
        rows = pool[: len(pool) // 5 * 5].reshape(-1, 5)
        assert float_texts(rows) == rows.astype(str).tolist()
        for row in rows[:2000]:
            assert float_texts(row.reshape(1, 5)) == [row.astype(str).tolist()]


def _json_or_field(frame: Sequence[common_pb2.Box]) -> str:
    """boxes_json of the frame, or the field its refusal names."""
    try:
        return boxes_json(frame)
    except NonFiniteBox as refusal:
        return refusal.metadata["field"]


def _text_or_field(stored: str | NonFiniteBox) -> str:
    return stored.metadata["field"] if isinstance(stored, NonFiniteBox) else stored


def test_boxes_json_many_writes_each_frames_boxes_json() -> None:
    """A batch of frames (0 to 4 boxes each) is each frame's boxes_json, text for text; a
    batch holding a value boxes_json writes box_dict's way (subnormals) too, each frame
    with a NaN or infinity getting its refusal in its place, and a batch of frames
    without boxes."""
    chosen = random.Random(20)
    boxes = _boxes(20)
    plain = [
        common_pb2.Box(
            class_name=chosen.choice(["", "person", 'a "quoted" café']),
            score=chosen.random(),
            x=chosen.choice([0.0, -0.0, chosen.random()]),
            y=chosen.random(),
            w=chosen.random(),
            h=chosen.random(),
            **({"track_id": chosen.randint(-(2**63), 2**63 - 1)} if chosen.random() < 0.3 else {}),
        )
        for _ in range(3000)
    ]
    for pool in (plain, boxes):
        frames, start = [], 0
        while start < len(pool):
            count = chosen.randint(0, 4)
            frames.append(pool[start : start + count])
            start += count
        for first in range(0, len(frames), 90):  # a record batch at a time
            batch = frames[first : first + 90]
            stored = [_text_or_field(text) for text in boxes_json_many(batch)]
            assert stored == [_json_or_field(frame) for frame in batch]
    assert boxes_json_many([[], []]) == ["[]", "[]"]
    assert boxes_json_many([]) == []


def test_boxes_an_earlier_release_stored_not_finite_read_back() -> None:
    """Rows of an earlier release hold NaN and infinities as protobuf's JSON (and Postgres's,
    for a `real` in jsonb_build_object) spells them: every reader takes them."""
    stored = {"class_name": "dog", "score": "NaN", "x": "Infinity", "y": "-Infinity", "w": 0.5}
    frozen = {**stored, "h": 0.25}
    for box in (convert.boxes([stored])[0], frozen_boxes([frozen])[0]):
        assert box.class_name == "dog"
        assert math.isnan(box.score)
        assert (box.x, box.y, box.w) == (math.inf, -math.inf, 0.5)
    assert frozen_boxes([frozen])[0].h == 0.25
