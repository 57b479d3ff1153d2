"""What turning a frame's boxes into the JSON text Postgres stores costs the coordinator.

Every recorded preview, and every item whose boxes a Complete sends, reaches the
database as JSON text. `leases.boxes.boxes_json` writes it in one pass (numpy prints the
32-bit floats the shortest way); the baseline is the way it replaced and still takes for
NaN, infinities and subnormals: a dict per box (`leases.boxes.box_dict`, protobuf's shortest
float search in Python) and `json.dumps`. Both write the same values (checked here, and
for every kind of value in tests/unit/test_coordinator_box_dict.py).

Pure CPU in this process, no servers: `.venv/bin/python -m bench.boxes_json` (about
10 s). Frames of `--boxes` detector-like boxes (a class, a score and four coordinates,
no track). The two sides alternate, best of three rounds each. Also timed: a record
batch's way, `boxes_json_many` of the 64 frames at once (the same texts, checked), whose
floats orjson prints. Last line: `RESULT boxes_json_us=<x> box_dict_json_us=<y>
ratio=<x/y> many_us=<m>`, per frame.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
from collections.abc import Callable
from decimal import Decimal

from bench.request_decoding import per_call_seconds
from services.coordinator.leases.boxes import box_dict, boxes_json, boxes_json_many
from workshop.v1 import common_pb2

FRAMES = 64  # different frames, so no float is printed from a warm cache only


def frames(boxes: int, seed: int = 1) -> list[list[common_pb2.Box]]:
    chosen = random.Random(seed)
    return [
        [
            common_pb2.Box(
                class_name=chosen.choice(["person", "car", "bicycle"]),
                score=chosen.uniform(0.3, 1.0),
                x=chosen.random(),
                y=chosen.random(),
                w=chosen.uniform(0.01, 0.3),
                h=chosen.uniform(0.01, 0.3),
            )
            for _ in range(boxes)
        ]
        for _ in range(FRAMES)
    ]


def box_dict_json(boxes: list[common_pb2.Box]) -> str:
    return json.dumps([box_dict(box) for box in boxes])


def _write_all(
    write: Callable[[list[common_pb2.Box]], str], batch: list[list[common_pb2.Box]]
) -> None:
    for boxes in batch:
        write(boxes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", type=int, default=3, help="boxes per frame")
    parser.add_argument("--seconds", type=float, default=1.5, help="time budget per round")
    args = parser.parse_args()
    batch = frames(args.boxes)
    for boxes in batch:
        same = json.loads(boxes_json(boxes), parse_float=Decimal)
        assert same == json.loads(box_dict_json(boxes), parse_float=Decimal)
    assert boxes_json_many(batch) == [boxes_json(boxes) for boxes in batch]
    best = {"boxes_json": float("inf"), "box_dict_json": float("inf"), "many": float("inf")}
    for _ in range(3):
        for name, write in (("boxes_json", boxes_json), ("box_dict_json", box_dict_json)):
            seconds = per_call_seconds(functools.partial(_write_all, write, batch), args.seconds)
            best[name] = min(best[name], seconds / FRAMES)
        seconds = per_call_seconds(functools.partial(boxes_json_many, batch), args.seconds)
        best["many"] = min(best["many"], seconds / FRAMES)
    new, old = best["boxes_json"] * 1e6, best["box_dict_json"] * 1e6
    many = best["many"] * 1e6
    print(f"{args.boxes} boxes per frame, {FRAMES} frames, best of 3 alternating rounds:")
    print(f"  leases.boxes.boxes_json            {new:8.1f} us per frame")
    print(f"  json.dumps of leases.boxes.box_dict {old:8.1f} us per frame")
    print(f"  leases.boxes.boxes_json_many        {many:8.1f} us per frame (the {FRAMES} at once)")
    print(
        f"RESULT boxes_json_us={new:.1f} box_dict_json_us={old:.1f} ratio={new / old:.2f} "
        f"many_us={many:.1f}"
    )


if __name__ == "__main__":
    main()
