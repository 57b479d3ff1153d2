"""Which sightings a commit's grouping sets the review columns of itself (pure:
services/coordinator/review/reviews.py, `plan_grouping`, `Grouping.new_reviews`; the
columns against sighting_review_v1 on real Postgres are test_review_queue.py's).

A sighting made from the added items alone has a review the commit knows when its boxes'
highest score is above 0; every other sighting made or changed is left to the refresh:
one extended from a written box, one a written box joins, one whose highest score is 0
(maybe below 0 as written) or NaN.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from services.coordinator.review import reviews

T0 = datetime(2026, 5, 4, 8, 0, tzinfo=UTC)


def box(
    item: str, index: int, second: int, class_name: str, x: float, score: float
) -> reviews.Detection:
    return reviews.Detection(
        item, index, T0 + timedelta(seconds=second), class_name, x, 0.2, 0.1, 0.1, score
    )


def added(item: str, second: int, *boxes: tuple[str, float, float]) -> reviews.NewItem:
    """An item being added with boxes (class, x, score), at T0 + `second`."""
    return reviews.NewItem(
        item,
        "yard",
        T0 + timedelta(seconds=second),
        [box(item, n, second, *b) for n, b in enumerate(boxes)],
    )


def written(item: str, second: int, class_name: str, x: float, sighting: str) -> reviews.ContextBox:
    """A box of a written item as timeline_context reads it: fixed with its sighting's
    first frame and count when grouped ("": not grouped yet, so regrouped)."""
    frame_time = T0 + timedelta(seconds=second)
    return reviews.ContextBox(
        "yard",
        item,
        0,
        frame_time,
        class_name,
        x,
        0.2,
        0.1,
        0.1,
        sighting,
        bool(sighting),
        frame_time if sighting else None,
        1 if sighting else None,
    )


def test_a_sighting_of_added_items_alone_scored_above_0_is_set_by_the_commit() -> None:
    items = [
        added("i1", 0, ("person", 0.1, 0.5), ("bike", 0.4, 0.7), ("car", 0.7, 0.0)),
        added("i2", 1, ("person", 0.1, 0.8), ("bike", 0.4, 0.6), ("car", 0.7, 0.0)),
        added("i3", 2, ("dog", 0.9, math.nan)),
        added("i4", 3, ("dog", 0.9, 0.9)),
    ]
    grouping = reviews.plan_grouping("r1", "cam-a", items, [], ["yard"])
    assert grouping.new_reviews() == {
        "new_sightings": ["i1~0", "i1~1"],
        "new_pending": [2, 2],
        "new_scores": [0.8, 0.7],
    }
    # the car's highest score read is 0, the dog's NaN: the refresh's
    assert grouping.refreshed() == ([], ["i1~2", "i3~0"])


def test_a_sighting_with_a_written_box_is_left_to_the_refresh() -> None:
    context = [
        written("w1", 0, "person", 0.1, "w1~0"),  # extended: appended to
        written("w2", 0, "bike", 0.5, ""),  # not grouped yet: joins the added bike
    ]
    items = [added("i1", 1, ("person", 0.1, 0.9), ("bike", 0.5, 0.9))]
    grouping = reviews.plan_grouping("r1", "cam-a", items, context, ["yard"])
    assert grouping.new_reviews() == {"new_sightings": [], "new_pending": [], "new_scores": []}
    assert grouping.refreshed() == (["w2~0"], ["w1~0"])
