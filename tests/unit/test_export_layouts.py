"""A dataset version's stored archive layout (services/preview/layouts.py, docs/datasets.md):
what is written reads back, and anything else is refused rather than used."""

from __future__ import annotations

import gzip
import json

import pytest

from services.preview.export import ImageFacts
from services.preview.layouts import BadLayout, Layout, decode, encode, layout_key

VERSION = "dv_" + "ab" * 32


def layout() -> Layout:
    made = Layout(VERSION, "yolo", 123_456)
    for n in range(3):
        made.append(ImageFacts(3000 + n, 64, 48))
    return made


def test_a_layout_reads_back_as_written() -> None:
    back = decode(encode(layout()), VERSION, "yolo", 3)
    assert (back.total_bytes, back.items) == (123_456, 3)
    assert [back.at(n) for n in range(3)] == [ImageFacts(3000 + n, 64, 48) for n in range(3)]
    assert encode(layout()) == encode(layout())  # the same bytes every time
    assert layout_key(VERSION, "coco") == f"exports/layouts/{VERSION}/coco.json.gz"


def test_anything_else_is_refused() -> None:
    data = encode(layout())
    for version, suffix, items in (
        (VERSION[:-1] + "c", "yolo", 3),
        (VERSION, "coco", 3),
        (VERSION, "yolo", 4),
    ):
        with pytest.raises(BadLayout):
            decode(data, version, suffix, items)
    with pytest.raises(BadLayout):
        decode(data[:-9] + b"x" * 9, VERSION, "yolo", 3)  # gzip's CRC
    with pytest.raises(BadLayout):
        decode(b"not gzip", VERSION, "yolo", 3)
    body = json.loads(gzip.decompress(data))
    for key, value in (
        ("facts", [1, 2, -3, 4, 5, 6, 7, 8, 9]),
        ("total_bytes", 0),
        ("layout", "x"),
    ):
        bad = gzip.compress(json.dumps({**body, key: value}).encode())
        with pytest.raises(BadLayout):
            decode(bad, VERSION, "yolo", 3)
