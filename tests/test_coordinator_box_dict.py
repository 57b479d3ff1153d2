"""convert.box_dict stores a box exactly as json_format.MessageToDict did."""

from __future__ import annotations

import random

from google.protobuf import json_format

from services.coordinator import convert
from workshop.v1 import common_pb2


def _message_to_dict(box: common_pb2.Box) -> dict[str, object]:
    return json_format.MessageToDict(box, preserving_proto_field_name=True)


def test_box_dict_is_message_to_dict_for_every_kind_of_value() -> None:
    chosen = random.Random(17)
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
    for box in boxes:
        assert convert.box_dict(box) == _message_to_dict(box), box
    # the same JSON text too (key order included), as the rows store it
    assert [list(convert.box_dict(b)) for b in boxes] == [list(_message_to_dict(b)) for b in boxes]
