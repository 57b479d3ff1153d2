"""A dataset version's archive layout, kept in object storage (docs/datasets.md).

A version is immutable, so the layout of its archive in a format is too: each image's
byte size, width and height (in the version's order) and the archive's total size. The
first export that works it out (a whole export, or a `with_size` or `offset` request that
had to read every image's header) stores it as one small object,
`exports/layouts/<version id>/<format>.json.gz`; a resume reads it back instead of
reading the headers of every image again, so it starts at once.

The object is gzip'd JSON (gzip's CRC catches a torn or flipped object) and names what
it is the layout of; `decode` refuses one of another version or format, another item
count or a malformed body, and the export then lays the archive out again and stores it
anew. The export still checks every image it reads whole against its digest, and that
the archive it wrote is as long as the layout said (`LayoutMismatch` otherwise, after
the object is deleted).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import zlib
from array import array

from services.preview.export import ImageFacts

LAYOUT_PREFIX = "exports/layouts/"
LAYOUT_FORMAT = "workshop-export-layout 1"
CONTENT_TYPE = "application/gzip"


def layout_key(version_id: str, suffix: str) -> str:
    """The layout object of version `version_id`'s archive in format `suffix` (coco, yolo)."""
    return f"{LAYOUT_PREFIX}{version_id}/{suffix}.json.gz"


@dataclasses.dataclass
class Layout:
    """Every image's facts, in the version's order (flat: size, width, height per item),
    and the archive's size."""

    version_id: str
    suffix: str
    total_bytes: int
    facts: array[int] = dataclasses.field(default_factory=lambda: array("q"))

    @property
    def items(self) -> int:
        return len(self.facts) // 3

    def append(self, one: ImageFacts) -> None:
        self.facts.extend((one.size, one.width, one.height))

    def at(self, index: int) -> ImageFacts:
        start = 3 * index
        size, width, height = self.facts[start : start + 3]
        return ImageFacts(size, width, height)


class BadLayout(ValueError):
    """A layout object that is not the layout asked for (corrupt, or of something else)."""


def encode(layout: Layout) -> bytes:
    body = {
        "layout": LAYOUT_FORMAT,
        "version_id": layout.version_id,
        "format": layout.suffix,
        "items": layout.items,
        "total_bytes": layout.total_bytes,
        "facts": layout.facts.tolist(),
    }
    text = json.dumps(body, separators=(",", ":")).encode()
    return gzip.compress(text, compresslevel=6, mtime=0)


def decode(data: bytes, version_id: str, suffix: str, items: int) -> Layout:
    """The layout in `data` if it is the one of `version_id` in `suffix` with `items` items;
    BadLayout otherwise."""
    try:
        body = json.loads(gzip.decompress(data))
    except (OSError, EOFError, zlib.error, ValueError) as error:
        raise BadLayout(f"not a layout object: {error}") from None
    if not isinstance(body, dict) or body.get("layout") != LAYOUT_FORMAT:
        raise BadLayout("not a layout object")
    if (body.get("version_id"), body.get("format")) != (version_id, suffix):
        raise BadLayout(
            f"the layout of {body.get('version_id')!r} in {body.get('format')!r}, "
            f"not of {version_id!r} in {suffix!r}"
        )
    facts, total = body.get("facts"), body.get("total_bytes")
    if body.get("items") != items or not isinstance(facts, list) or len(facts) != 3 * items:
        raise BadLayout(f"not {items} items")
    if not isinstance(total, int) or total <= 0:
        raise BadLayout("no archive size")
    if not all(type(n) is int and 0 <= n < 2**62 for n in facts):
        raise BadLayout("facts that are not sizes")
    return Layout(version_id, suffix, total, array("q", facts))
