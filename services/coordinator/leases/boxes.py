"""A box as the coordinator stores it (jsonb in bucket items and previews): what the
leases room writes for a committed item and the previews room for a recorded preview.

The stored form is exactly what `json_format.MessageToDict(box,
preserving_proto_field_name=True)` answers; `boxes_json` writes it as JSON text in one
pass. Reading it back into a message is the servicers' (`convert.boxes`, `fill_box`).
A box with a NaN or infinite value is never stored: `boxes_json` and `boxes_json_many`
refuse it (NonFiniteBox, workshop.kit.box_values) once the finiteness check they make
anyway fails, so finite values pay nothing more. Rows of earlier releases may still
hold one, as protobuf's JSON writes it ("NaN", "Infinity"; `convert.fill_box` reads it).
"""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from google.protobuf import json_format

from workshop.kit.box_values import BOX_FLOATS, FLOATS_OF, NonFiniteBox, refuse_non_finite
from workshop.v1 import common_pb2

_FLOAT32 = struct.Struct("<f")

# A box as bucket_item_boxes_of_v1 reads one (box_index, class_name and BOX_FLOATS' values
# as 32-bit floats); an item without boxes reads as one pseudo-box of index -1.
# A frame's boxes so read are a tuple: tuples of numbers and strings only, which Python's
# garbage collector stops tracking, where the coordinator keeps thousands for their commits.
StoredBox = tuple[int, str, float, float, float, float, float]
FrameBoxes = tuple[StoredBox, ...]
NO_BOXES: FrameBoxes = ((-1, "", 0.0, 0.0, 0.0, 0.0, 0.0),)


def box_dict(box: common_pb2.Box) -> dict[str, Any]:
    """A box as stored: exactly what `json_format.MessageToDict(box,
    preserving_proto_field_name=True)` answers (fields left at their default omitted,
    each float the shortest decimal that reads back as the same 32-bit float, the int64
    track id as a string), at about a third of its cost: a frame's few boxes were the
    largest part of the coordinator's Python per recorded preview. (NaN and infinities as
    protobuf writes them too, though `boxes_json` refuses to store them.)"""
    value: dict[str, Any] = {}
    if box.class_name:
        value["class_name"] = box.class_name
    for name in BOX_FLOATS:
        number = getattr(box, name)
        if number or math.copysign(1.0, number) < 0:  # -0.0 is set, as protobuf sees it
            if not math.isfinite(number):  # "NaN", "Infinity": json_format's own way
                return json_format.MessageToDict(box, preserving_proto_field_name=True)
            value[name] = _shortest_float(number)
    if box.HasField("track_id"):
        value["track_id"] = str(box.track_id)
    return value


# The smallest normal 32-bit float. Below it numpy's shortest form has fewer than the 6
# digits protobuf's always keeps, so a box with such a value takes box_dict's way.
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def boxes_json(boxes: Sequence[common_pb2.Box]) -> str:
    """The boxes as stored, as JSON text: the values of `json.dumps([box_dict(box) for box in
    boxes])`, each number the same decimal, at under half its cost (the largest part of
    the coordinator's Python per recorded preview). numpy prints a 32-bit float the
    shortest way that reads back the same, which is protobuf's own for every normal one
    (tests/unit/test_coordinator_box_dict.py); subnormals go through box_dict. NaN or an
    infinity raises NonFiniteBox (INVALID_FIELD, naming `boxes[i].<field>`)."""
    if not boxes:
        return "[]"
    values = [getattr(box, name) for box in boxes for name in BOX_FLOATS]
    if not all(map(math.isfinite, values)) or any(
        number and abs(number) < _FLOAT32_TINY for number in values
    ):
        refuse_non_finite(boxes)
        return json.dumps([box_dict(box) for box in boxes])
    texts = float_texts(np.array([values], dtype=np.float32))[0]
    parts = []
    for position, box in enumerate(boxes):
        start = position * len(BOX_FLOATS)
        fields = []
        if box.class_name:
            fields.append(f'"class_name": {encode_basestring_ascii(box.class_name)}')
        for offset, name in enumerate(BOX_FLOATS, start=start):
            number = values[offset]
            if number or math.copysign(1.0, number) < 0:  # -0.0 is set, as in box_dict
                fields.append(f'"{name}": {texts[offset]}')
        if box.HasField("track_id"):
            fields.append(f'"track_id": "{box.track_id}"')
        parts.append("{" + ", ".join(fields) + "}")
    return "[" + ", ".join(parts) + "]"


# orjson prints a 32-bit float the shortest way that reads back the same, as numpy does,
# in the same text for every magnitude between these bounds (checked on 1.7 million values,
# every float next to a power of ten or two among them: tests/unit/test_coordinator_box_dict.py);
# outside them the two differ in form only ("1e-04" against "0.0001", "22370016000000.0"
# against "2.2370016e+13"), so a value there takes numpy's way and the stored text stays
# what it was.
_ORJSON_ABOVE = np.float32(1e-4)
_ORJSON_BELOW = np.float32(1e13)


def float_texts(values: npt.NDArray[np.float32]) -> list[list[str]]:
    """Each row of a 2-D float32 array as the shortest texts that read back the same (what
    `str` of each value answers): through orjson, about 11x faster than numpy's
    `astype(str)` (1,350 values: 33 against 378 us), when every value is 0 or of a
    magnitude both print alike; else numpy's."""
    magnitude = np.abs(values)
    if not (((magnitude > _ORJSON_ABOVE) & (magnitude < _ORJSON_BELOW)) | (values == 0)).all():
        texts: list[list[str]] = values.astype(str).tolist()
        return texts
    width = values.shape[1]
    flat = orjson.dumps(np.ascontiguousarray(values).ravel(), option=orjson.OPT_SERIALIZE_NUMPY)
    every = flat[1:-1].decode().split(",")
    return [every[start : start + width] for start in range(0, len(every), width)]


@functools.cache
def _template(written: int, named: bool, tracked: bool) -> str:
    """A box's stored text with `%s` for its values, for the fields it writes: the class
    name (`named`), the floats set (bit i of `written`: BOX_FLOATS[i]), the track id."""
    fields = ['"class_name": %s'] if named else []
    fields.extend(f'"{name}": %s' for bit, name in enumerate(BOX_FLOATS) if written >> bit & 1)
    if tracked:
        fields.append('"track_id": "%s"')
    return "{" + ", ".join(fields) + "}"


_ALL_FLOATS = (1 << len(BOX_FLOATS)) - 1


def boxes_json_many(frames: Sequence[Sequence[common_pb2.Box]]) -> list[str | NonFiniteBox]:
    """`boxes_json` of each frame's boxes (the same text), for a batch of frames at once
    (`boxes_json_and_read_many`, without the boxes as read)."""
    return boxes_json_and_read_many(frames)[0]


def boxes_json_and_read_many(
    frames: Sequence[Sequence[common_pb2.Box]],
) -> tuple[list[str | NonFiniteBox], list[FrameBoxes | None]]:
    """`boxes_json` of each frame's boxes (the same text), for a batch of frames at once: a
    record batch's previews (90 frames of 3 boxes in bench.processor_throughput). The whole
    batch's floats are printed in one call (`float_texts`: the shortest form, as `str` of
    each 32-bit float, through orjson or numpy), and the checks that send a
    value to box_dict's way run once per batch; a batch with such a value takes
    `boxes_json` frame by frame, and a frame holding NaN or an infinity gets its refusal
    in place of its text (the other frames of the batch are stored).

    Beside the texts, each frame's boxes as Postgres reads the stored text
    (`stored_boxes`'s form: the values the 32-bit floats printed), which a commit groups
    its items from (leases.recorded); None for every frame of a batch that took
    `boxes_json`'s way."""
    boxes = [box for frame in frames for box in frame]
    if not boxes:
        return ["[]" for _ in frames], [NO_BOXES for _ in frames]
    values = np.array([FLOATS_OF(box) for box in boxes], dtype=np.float32)
    magnitude = np.abs(values)
    if not np.isfinite(values).all() or ((magnitude < _FLOAT32_TINY) & (values != 0)).any():
        return [_json_or_refusal(frame) for frame in frames], [None for _ in frames]
    texts = float_texts(values)
    floats = values.tolist()
    # a field is written when set: not 0, or -0.0 (as in box_dict); bit i: BOX_FLOATS[i]
    written = (((values != 0) | np.signbit(values)) @ (1 << np.arange(len(BOX_FLOATS)))).tolist()
    parts: list[str] = []
    read_boxes: list[StoredBox] = []
    positions = [index for frame in frames for index in range(len(frame))]
    for box, box_texts, box_written, box_floats, position in zip(
        boxes, texts, written, floats, positions, strict=True
    ):
        named = box.class_name
        read_boxes.append((position, named, *box_floats))
        tracked = box.HasField("track_id")
        shown: Sequence[str | int] = (
            box_texts
            if box_written == _ALL_FLOATS
            else [text for bit, text in enumerate(box_texts) if box_written >> bit & 1]
        )
        if named:
            shown = [encode_basestring_ascii(named), *shown]
        if tracked:
            shown = [*shown, box.track_id]
        parts.append(_template(box_written, bool(named), tracked) % tuple(shown))
    stored: list[str | NonFiniteBox] = []
    read: list[FrameBoxes | None] = []
    start = 0
    for frame in frames:
        end = start + len(frame)
        stored.append("[" + ", ".join(parts[start:end]) + "]")
        read.append(tuple(read_boxes[start:end]) if frame else NO_BOXES)
        start = end
    return stored, read


def _json_or_refusal(boxes: Sequence[common_pb2.Box]) -> str | NonFiniteBox:
    try:
        return boxes_json(boxes)
    except NonFiniteBox as refusal:
        return refusal


def _shortest_float(number: float) -> float:
    """protobuf's ToShortestFloat (what MessageToDict prints a float field with): the
    fewest significant digits, from 6, that read back as the same 32-bit float.

    The search starts at 7 and goes down to 6 or up to 8 and 9 (enough for every 32-bit
    float): two tries for most detector outputs, which need 7 or 8, instead of up to four
    from 6. A 6-digit decimal is also a 7-digit one, so when 6 digits read back, 7 do;
    the answers equal the search from 6 for a million random 32-bit floats and every
    power of two and its neighbours (checked when this was written)."""
    pack, unpack = _FLOAT32.pack, _FLOAT32.unpack
    seven = float(f"{number:.7g}")
    if unpack(pack(seven))[0] == number:
        six = float(f"{number:.6g}")
        return six if unpack(pack(six))[0] == number else seven
    precision = 8
    while True:
        rounded = float(f"{number:.{precision}g}")
        if unpack(pack(rounded))[0] == number:
            return rounded
        precision += 1


def stored_boxes(texts: Sequence[str]) -> list[FrameBoxes]:
    """Each stored boxes text (a JSON array, as `boxes_json` writes it or an earlier release
    wrote it) read as Postgres' bucket_item_boxes_of_v1 reads it: each box's index, its
    class name ('' when absent) and its floats in BOX_FLOATS order (0 when absent or null,
    "NaN" and "Infinity" as protobuf writes them), each rounded to a 32-bit float as the
    SQL's `::real` casts it; [-1, '', 0...] for an empty array. A commit groups from these
    the boxes sent with its result, and those of previews it does not remember recording
    (leases.recorded), read as text by job_commit_prepare: Postgres splitting every box
    into values was three quarters of that statement's time."""
    parsed = [orjson.loads(text) for text in texts]
    values: list[Any] = [
        box.get(name, 0) for boxes in parsed for box in boxes for name in BOX_FLOATS
    ]
    rounded: list[float] = np.array(values, dtype=np.float32).tolist()
    if any(map(math.isnan, rounded)):  # "NaN", or a null (which the SQL reads as 0)
        rounded = [0.0 if value is None else float(np.float32(value)) for value in values]
    width = len(BOX_FLOATS)
    read: list[FrameBoxes] = []
    at = 0
    for boxes in parsed:
        if not boxes:
            read.append(NO_BOXES)
            continue
        item: list[StoredBox] = []
        for index, box in enumerate(boxes):
            score, x, y, w, h = rounded[at : at + width]
            item.append((index, box.get("class_name") or "", score, x, y, w, h))
            at += width
        read.append(tuple(item))
    return read
