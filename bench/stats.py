"""The statistics every benchmark reports with, so that one figure means the same in each.

One median rule (the true median: the middle value, or the mean of the two middle ones of
an even count) and one percentile rule (nearest rank: the smallest value with at least
that share of the samples at or below it). A median that picked one of two middle passes
would always pick the slower or the faster one, and so flatter one side of a ratio.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def median(values: Iterable[float]) -> float:
    """The true median; ValueError when there are no values (never NaN)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("the median of no values")
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    return (ordered[middle - 1] + ordered[middle]) / 2


def percentile(values: Iterable[float], share: float) -> float:
    """Nearest-rank percentile (`share` in (0, 1]: 0.99 for p99); ValueError when there are
    no values. The p99 of 100 samples is their second largest, of 99 or fewer the largest."""
    if not 0 < share <= 1:
        raise ValueError(f"a percentile's share is in (0, 1], not {share}")
    ordered = sorted(values)
    if not ordered:
        raise ValueError("the percentile of no values")
    # The rank is rounded up; the small tolerance keeps 0.99 * 100 at 99, not 100.
    rank = max(1, math.ceil(share * len(ordered) - 1e-9))
    return float(ordered[rank - 1])
