"""The path a page of a bucket's items takes (ListBucketItems; review.sql, bucket_items_page).

Reading the bucket in frame order until a page is full costs what the filter skips: a
class, a score floor or a camera that few of a million items match read all of them. So
three statements find a page (review.sql, bucket_items_page*), and this module picks one
from two cheap counts (bucket_items_path_sizes) before each page:

- bucket_items_page_sparse when a class, a score floor above 0, decided states only
  (ACCEPTED and/or REJECTED) or PENDING alone is asked and the items that may match (those
  of the sightings that may hold one, and the few items with an item decision, a
  correction or no grouping yet) are at most SPARSE_MOST: those are read, filtered and
  sorted;
- else bucket_items_page_timelines when a camera or a run is asked, or the reader sees some
  cameras only, and at most TIMELINES_MOST of the bucket's timelines (run, camera) hold
  them: a page from each, merged;
- else bucket_items_page: the bucket in frame order, where the filter keeps enough items
  to fill a page soon.

Every statement returns the same items (the same filter: bucket_item_listed_v1 and the class
test); only how many rows it reads differs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from services.coordinator.platform.db import Connection, Row, bind, fetch_one
from services.coordinator.review.review_params import (
    BucketItemsPage,
    BucketItemsPageSparse,
    BucketItemsPageTimelines,
    BucketItemsPathSizes,
)

if TYPE_CHECKING:
    from services.coordinator.review.reviews import ItemFilter

# Items the sparse path reads at most: each is checked with the class function (a few
# microseconds), so 5,000 stay well under the page's 50 ms.
SPARSE_MOST = 5_000
# Timelines the timeline path merges at most: it reads up to a page from each.
TIMELINES_MOST = 64


@dataclasses.dataclass(frozen=True, slots=True)
class PathSizes(Row):
    sparse_items: int
    timelines: int


def sighting_state(wanted: ItemFilter) -> str | None:
    """What a sighting of an item of the filter's review states has: 'decided' (a
    decision) for ACCEPTED and/or REJECTED, 'pending' for PENDING alone, else None."""
    if not wanted.review_states:
        return None
    if "pending" not in wanted.review_states:
        return "decided"
    return "pending" if wanted.review_states == ("pending",) else None


def sparse_driver(wanted: ItemFilter) -> str | None:
    """The condition of the filter whose sightings hold the items it may keep
    (bucket_sightings_wanted_v1: one condition, the first of class, score floor and
    state), else None."""
    if wanted.class_name:
        return "class"
    if wanted.min_score is not None and wanted.min_score > 0:
        return "score"
    return sighting_state(wanted)


PageStatement = BucketItemsPage | BucketItemsPageTimelines | BucketItemsPageSparse


async def page_statement(
    connection: Connection,
    bucket_id: str,
    wanted: ItemFilter,
    cameras: Sequence[str] | None,
    after_frame_time: datetime,
    after_item_id: str,
    limit: int,
) -> PageStatement:
    """The bound page statement of the path that reads the fewest rows."""
    driver = sparse_driver(wanted)
    sighting_min_score = (
        wanted.min_score if wanted.min_score is not None and wanted.min_score > 0 else None
    )
    sizes = PathSizes(sparse_items=SPARSE_MOST + 1, timelines=TIMELINES_MOST + 1)
    by_timeline = bool(wanted.camera_id or wanted.run_id) or cameras is not None
    if driver is not None or by_timeline:
        counted = await fetch_one(
            connection,
            PathSizes,
            *bind(
                BucketItemsPathSizes(
                    driver=driver,
                    bucket_id=bucket_id,
                    class_name=wanted.class_name or None,
                    sighting_min_score=sighting_min_score,
                    after_frame_time=after_frame_time,
                    camera_id=wanted.camera_id or None,
                    cameras=cameras,
                    run_id=wanted.run_id or None,
                )
            ),
        )
        assert counted is not None  # aggregates: always one row
        sizes = counted
    common: dict[str, Any] = {
        "bucket_id": bucket_id,
        "after_frame_time": after_frame_time,
        "after_item_id": after_item_id,
        "review_states": list(wanted.review_states) or None,
        "class_name": wanted.class_name or None,
        "camera_id": wanted.camera_id or None,
        "cameras": cameras,
        "run_id": wanted.run_id or None,
        "frame_time_from": wanted.frame_time_from,
        "frame_time_to": wanted.frame_time_to,
        "min_score": wanted.min_score,
        "max_score": wanted.max_score,
        "limit": limit,
    }
    if driver is not None and sizes.sparse_items <= SPARSE_MOST:
        return BucketItemsPageSparse(driver=driver, sighting_min_score=sighting_min_score, **common)
    if by_timeline and sizes.timelines <= TIMELINES_MOST:
        return BucketItemsPageTimelines(**common)
    return BucketItemsPage(**common)
