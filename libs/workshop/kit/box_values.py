"""The numbers of a `workshop.v1.Box` that no service takes: NaN and the infinities.

A detector may put out such a score or coordinate, but nothing can show it: JSON has no
number for it (the HTTP API's pages held it as a 500). So every request that carries
boxes (JobService.Complete, the preview records, PublishPreview) refuses one, INVALID_ARGUMENT
reason INVALID_FIELD naming the field and the value, and stores nothing of what it
refused. The coordinator and the preview service both refuse it, so the check lives here.

The common case, every value finite, is one pass in C (`all_finite`); only a batch that
fails it is searched value by value for what to name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from math import isfinite, isnan
from operator import attrgetter

from workshop.kit.errors import InvalidArgument
from workshop.v1 import common_pb2

BOX_FLOATS = ("score", "x", "y", "w", "h")
# A box's floats, in BOX_FLOATS order, as one tuple (one C call a box).
FLOATS_OF = attrgetter(*BOX_FLOATS)


class NonFiniteBox(InvalidArgument):
    """A box value that is NaN or infinite; metadata "field" names it, as
    `boxes[2].score` below `where` (the path of the boxes in the request)."""

    reason = "INVALID_FIELD"

    def __init__(self, where: str, position: int, name: str, value: float) -> None:
        field = f"{where}[{position}].{name}"
        super().__init__(
            f"{field} is {_spelled(value)}: a box's score, x, y, w and h must be finite numbers.",
            metadata={"field": field},
        )


def all_finite(boxes: Iterable[common_pb2.Box]) -> bool:
    """Whether every float of `boxes` is finite, in C: their sum is finite exactly when
    each is (NaN spreads, +inf and -inf make NaN, and 32-bit floats summed as doubles
    cannot overflow)."""
    return isfinite(sum(map(sum, map(FLOATS_OF, boxes))))


def non_finite_box(boxes: Sequence[common_pb2.Box], where: str = "boxes") -> NonFiniteBox | None:
    """The refusal of the first value of `boxes` (box by box, in BOX_FLOATS order) that is
    not finite; None when every one is."""
    if all_finite(boxes):
        return None
    for position, box in enumerate(boxes):
        for name, value in zip(BOX_FLOATS, FLOATS_OF(box), strict=True):
            if not isfinite(value):
                return NonFiniteBox(where, position, name, value)
    raise AssertionError("all_finite found a value that is not finite")  # pragma: no cover


def refuse_non_finite(boxes: Sequence[common_pb2.Box], where: str = "boxes") -> None:
    """Raises `non_finite_box`'s refusal, if any."""
    refusal = non_finite_box(boxes, where)
    if refusal is not None:
        raise refusal


def _spelled(value: float) -> str:
    """A non-finite value as protobuf's JSON (and a JavaScript client) spells it."""
    if isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"
