"""Sightings grouped by the coordinator equal a brute-force grouping (hypothesis).

Each example is a full run of `watch` (testbed/review_world.py) whose six jobs commit
random frames in a random order; after every commit the run's review, read in pages of
a random size, must group every box exactly as `reference_grouping` does over all the
items committed so far, a sighting must be the same on every page that shows it, and,
when jobs commit in time order, no sighting id seen earlier may disappear.

Hypothesis is synchronous and the harness is asyncio: examples run in a worker thread
and schedule their calls on the test's loop (as tests/service/test_coordinator_lease_model.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import defaultdict
from collections.abc import Coroutine
from datetime import datetime, timedelta
from typing import Any, TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.coordinator_leases import Setup
from testbed.harness.coordinator import CoordinatorHarness
from testbed.review_world import (
    CLASSES,
    SIGHTINGS_MISMATCHED,
    SLOTS_PER_JOB,
    Frame,
    box,
    commit,
    review_world,
    start_run,
)
from workshop.v1 import run_pb2
from workshop.v1 import workshop_pb2 as ws

T = TypeVar("T")
GAP = timedelta(seconds=5)
# Slots near both ends of a job, so sightings cross from one job into the next.
SLOTS = [*range(0, 8), *range(SLOTS_PER_JOB - 8, SLOTS_PER_JOB)]
XS = (0.1, 0.15, 0.2, 0.3, 0.5)
WIDTHS = (0.02, 0.05, 0.1)


@dataclasses.dataclass(frozen=True)
class Seen:
    """An item as the review showed it."""

    item_id: str
    bucket_id: str
    camera_id: str
    frame_time: datetime
    boxes: tuple[tuple[str, float, float, float, float], ...]  # class, x, y, w, h


def reference_grouping(items: list[Seen]) -> dict[tuple[str, int], str]:
    """The sighting of every box, by the rule in docs/review.md, over the whole run at once:
    every earlier sighting of the timeline is a candidate (no pruning, no state carried
    between commits)."""
    grouped: dict[tuple[str, int], str] = {}
    timelines: dict[tuple[str, str], list[Seen]] = defaultdict(list)
    for item in items:
        timelines[(item.bucket_id, item.camera_id)].append(item)
    for timeline in timelines.values():
        timeline.sort(key=lambda item: (item.frame_time, item.item_id))
        # sighting id -> (class, time, box index, box) of its last box
        last: dict[str, tuple[str, datetime, int, tuple[float, ...] | None]] = {}
        for item in timeline:
            boxes: list[tuple[int, str, tuple[float, ...] | None]] = [
                (index, b[0], b[1:]) for index, b in enumerate(item.boxes)
            ] or [(-1, "", None)]
            pairs = []
            for index, class_name, geometry in boxes:
                for sid, (last_class, last_time, _, last_geometry) in last.items():
                    gap = item.frame_time - last_time
                    if last_class != class_name or not timedelta(0) < gap <= GAP:
                        continue
                    if geometry is None or last_geometry is None:
                        if geometry is None and last_geometry is None:
                            pairs.append((0.0, index, sid))
                        continue
                    x, y, w, h = geometry
                    lx, ly, lw, lh = last_geometry
                    moved = math.hypot((x + w / 2) - (lx + lw / 2), (y + h / 2) - (ly + lh / 2))
                    if moved <= 3.0 * w:
                        pairs.append((moved, index, sid))
            used_boxes: set[int] = set()
            used_sightings: set[str] = set()
            for _, index, sid in sorted(pairs):
                if index in used_boxes or sid in used_sightings:
                    continue
                used_boxes.add(index)
                used_sightings.add(sid)
                grouped[(item.item_id, index)] = sid
            for index, class_name, geometry in boxes:
                if index not in used_boxes:
                    grouped[(item.item_id, index)] = f"{item.item_id}~{index}"
                sid = grouped[(item.item_id, index)]
                last[sid] = (class_name, item.frame_time, index, geometry)
    return grouped


@dataclasses.dataclass(frozen=True)
class Example:
    order: list[int]  # the order the six jobs commit in
    frames: list[list[Frame]]  # per job


def frames_of_job() -> st.SearchStrategy[list[Frame]]:
    a_box = st.builds(
        box,
        st.sampled_from(CLASSES),
        st.sampled_from(XS),
        st.sampled_from((0.1, 0.2)),
        st.sampled_from(WIDTHS),
    )
    frame = st.builds(
        Frame,
        st.sampled_from(SLOTS),
        st.sampled_from(("save", "keep")),
        st.lists(a_box, max_size=3).map(tuple),
    )
    return st.lists(frame, max_size=10, unique_by=lambda f: (f.slot, f.step))


examples = st.builds(
    Example,
    st.permutations(range(6)).map(list),
    st.lists(frames_of_job(), min_size=6, max_size=6),
)


class Runner:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def __call__(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(120)


async def review_pages(
    c: CoordinatorHarness, run_id: str, page_size: int
) -> tuple[list[run_pb2.ReviewItem], list[list[run_pb2.Sighting]]]:
    items: list[run_pb2.ReviewItem] = []
    pages: list[list[run_pb2.Sighting]] = []
    token = ""
    while True:
        page = await c.workshop.GetReview(
            ws.GetReviewRequest(run_id=run_id, page_size=page_size, page_token=token),
            metadata=c.admin,
        )
        items.extend(page.items)
        pages.append(list(page.sightings))
        assert page.has_more == bool(page.next_page_token)
        if not page.has_more:
            return items, pages
        token = page.next_page_token


async def sightings_mismatched(c: CoordinatorHarness) -> list[str]:
    """The sightings whose stored row disagrees with the items (docs/review.md, "Storage")."""
    async with c.db.connection() as connection:
        return [row[0] for row in await connection.fetch(SIGHTINGS_MISMATCHED)]


def seen(item: run_pb2.ReviewItem) -> Seen:
    i = item.item
    return Seen(
        i.item_id,
        i.bucket_id,
        i.camera_id,
        i.frame_time.ToDatetime().replace(tzinfo=None),
        tuple((b.class_name, b.x, b.y, b.w, b.h) for b in i.boxes),
    )


def check_review(
    items: list[run_pb2.ReviewItem], pages: list[list[run_pb2.Sighting]]
) -> dict[str, run_pb2.Sighting]:
    """The service's grouping equals the reference; sightings agree across pages."""
    expected = reference_grouping([seen(item) for item in items])
    got = {
        (item.item.item_id, box.box_index): box.sighting_id
        for item in items
        for box in item.item.box_reviews
    }
    assert got == expected
    for item in items:
        assert list(item.sighting_ids) == [b.sighting_id for b in item.item.box_reviews]
    members: dict[str, list[str]] = defaultdict(list)
    times = {
        item.item.item_id: (item.item.frame_time.ToDatetime(), item.item.item_id) for item in items
    }
    for (item_id, _), sid in expected.items():
        members[sid].append(item_id)
    sightings: dict[str, run_pb2.Sighting] = {}
    for page in pages:
        for sighting in page:
            if sighting.sighting_id in sightings:
                assert sighting == sightings[sighting.sighting_id], "same on every page"
            sightings[sighting.sighting_id] = sighting
    assert set(sightings) == set(members)
    for sid, sighting in sightings.items():
        assert list(sighting.item_ids) == sorted(members[sid], key=times.__getitem__)
    return sightings


async def test_sightings_equal_the_reference_grouping(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s: Setup = await review_world(c)
    run = Runner(asyncio.get_running_loop())
    counter = iter(range(10_000))

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(examples, st.sampled_from((1, 3, 7, 1000)))
    def example(case: Example, page_size: int) -> None:
        run_id = f"p{next(counter)}"
        jobs = run(start_run(c, s, run_id))
        in_time_order = case.order == sorted(case.order)
        known: set[str] = set()
        for index in case.order:
            run(commit(c, s, jobs[index], case.frames[index]))
            items, pages = run(review_pages(c, run_id, page_size))
            sightings = check_review(items, pages)
            assert run(sightings_mismatched(c)) == [], "the sightings rows are exact"
            if in_time_order:
                assert known <= set(sightings), "ids survive later commits"
            known = set(sightings)

    await asyncio.to_thread(example)


async def test_time_ordered_commits_keep_every_sighting_id(coordinator: CoordinatorHarness) -> None:
    """A sighting extended by the next job keeps its id; one extended backwards by an
    earlier job is still decided through its old id."""
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    tail = [Frame(slot, "save", (box("person", 0.1, 0.1, 0.1),)) for slot in (57, 58, 59)]
    head = [Frame(slot, "save", (box("person", 0.1, 0.1, 0.1),)) for slot in (0, 1)]
    await commit(c, s, jobs[1], head)  # 08:01:00-08:01:01
    page = await c.workshop.GetReview(ws.GetReviewRequest(run_id="r1"), metadata=c.admin)
    (later,) = page.sightings
    await commit(c, s, jobs[0], tail)  # 08:00:57-08:00:59: joins before it
    page = await c.workshop.GetReview(ws.GetReviewRequest(run_id="r1"), metadata=c.admin)
    (merged,) = page.sightings
    assert merged.sighting_id != later.sighting_id
    assert len(merged.item_ids) == 5
    decided = await c.workshop.DecideSighting(
        ws.DecideSightingRequest(
            run_id="r1",
            sighting_id=later.sighting_id,
            decision=ws.REVIEW_DECISION_CONFIRM,
            seen_item_count=len(later.item_ids),
        ),
        metadata=c.admin,
    )
    assert decided.sighting.sighting_id == merged.sighting_id
    assert (decided.items_updated, decided.items_joined) == (5, 3)
    await commit(c, s, jobs[2], [])
