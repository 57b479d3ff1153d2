"""A bucket's review queue across runs and bulk decisions (docs/review.md, "Review queue"
and "Bulk decisions"): each order and filter against a reference computed here from
GetReview's sightings and items, keyset paging, who decided and when; a bulk decision's
preview, its apply, its undo (back to pending), the refusal of a changed selection, bad
input and cameras, the CLI.

Real coordinator and Postgres (testbed/review_world.py builds the runs).
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_world import DAY, error_reason
from testbed.harness.coordinator import CoordinatorHarness
from testbed.review_world import Frame, commit, review_world, start_run
from tests.cli_runner import workshop
from tests.service.test_review_corrections import check_counts
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2
from workshop.v1 import workshop_pb2 as ws

CONFIRM, NONE, RELABEL = (
    ws.REVIEW_DECISION_CONFIRM,
    ws.REVIEW_DECISION_NONE,
    ws.REVIEW_DECISION_RELABEL,
)
PENDING, ACCEPTED, REJECTED = (
    common_pb2.REVIEW_STATE_PENDING,
    common_pb2.REVIEW_STATE_ACCEPTED,
    common_pb2.REVIEW_STATE_REJECTED,
)
OLDEST, LOWEST, CAMERA = (
    ws.QUEUE_ORDER_OLDEST,
    ws.QUEUE_ORDER_LOWEST_SCORE,
    ws.QUEUE_ORDER_CAMERA,
)


def sbox(class_name: str, x: float, score: float) -> common_pb2.Box:
    return common_pb2.Box(class_name=class_name, score=score, x=x, y=0.2, w=0.1, h=0.1)


async def queue_world(c: CoordinatorHarness) -> Any:
    """Two runs over cam-a and cam-b saving into yard: r1 has a person (0.95) and a vehicle
    (0.6) in cam-a's slots 0-3, a vehicle (0.92) in cam-b's 5-6 and a person (0.3) in
    cam-b's 20-21; r2 a vehicle (0.97, 0.4) in cam-a's 2-3 and a person (0.5) in cam-b's 30.
    The runs read the same recordings, so their frame times coincide."""
    s = await review_world(c)
    r1 = await start_run(c, s, "r1")
    await commit(
        c,
        s,
        r1[0],
        [
            Frame(n, "save", (sbox("person", 0.1, 0.95), sbox("vehicle", 0.6, 0.6)))
            for n in range(4)
        ],
    )
    await commit(
        c,
        s,
        r1[3],
        [Frame(n, "save", (sbox("vehicle", 0.5, 0.92),)) for n in (5, 6)]
        + [Frame(n, "save", (sbox("person", 0.2, 0.3),)) for n in (20, 21)],
    )
    for job in (r1[1], r1[2], r1[4], r1[5]):  # the runtime's next run waits for this one
        await commit(c, s, job, [])
    r2 = await start_run(c, s, "r2")
    await commit(
        c,
        s,
        r2[0],
        [
            Frame(2, "save", (sbox("vehicle", 0.3, 0.97),)),
            Frame(3, "save", (sbox("vehicle", 0.3, 0.4),)),
        ],
    )
    await commit(c, s, r2[3], [Frame(30, "save", (sbox("person", 0.7, 0.5),))])
    return s


async def reference(c: CoordinatorHarness) -> list[dict[str, Any]]:
    """Every sighting of both runs, from GetReview: run, id, camera, class, first frame
    time, state, score (the highest score of its boxes)."""
    found = []
    for run_id in ("r1", "r2"):
        page = await c.workshop.GetReview(ws.GetReviewRequest(run_id=run_id), metadata=c.admin)
        scores: dict[str, float] = {}
        for entry in page.items:
            for review in entry.item.box_reviews:
                score = entry.item.boxes[review.box_index].score
                scores[review.sighting_id] = max(scores.get(review.sighting_id, 0.0), score)
        for sighting in page.sightings:
            found.append(
                {
                    "run": run_id,
                    "id": sighting.sighting_id,
                    "camera": sighting.camera_id,
                    "class": sighting.class_name,
                    "first": sighting.first_frame_time.ToDatetime(),
                    "state": sighting.review_state,
                    "score": scores[sighting.sighting_id],
                }
            )
    return found


async def queue(c: CoordinatorHarness, metadata: Any = None, **kw: Any) -> list[tuple[str, str]]:
    """The whole queue, one sighting a page (keyset paging all the way)."""
    order = kw.pop("order", OLDEST)
    wanted = ws.SightingFilter(**kw)
    found: list[tuple[str, str]] = []
    token = ""
    while True:
        page = await c.workshop.GetReviewQueue(
            ws.GetReviewQueueRequest(
                bucket_id="yard", filter=wanted, order=order, page_size=1, page_token=token
            ),
            metadata=metadata or c.admin,
        )
        found.extend((q.run_id, q.sighting.sighting_id) for q in page.sightings)
        token = page.next_page_token
        if not token:
            return found


def keys(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(row["run"], row["id"]) for row in rows]


def oldest(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["first"], row["run"], row["id"])


async def test_the_queue_orders_and_filters_across_runs_and_pages_by_key(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    await queue_world(c)
    rows = await reference(c)
    assert len(rows) == 6
    assert {round(row["score"], 2) for row in rows} == {0.95, 0.6, 0.92, 0.3, 0.97, 0.5}

    # the three orders, every sighting pending
    assert await queue(c) == keys(sorted(rows, key=oldest))
    by_score = sorted(rows, key=lambda r: (r["score"], *oldest(r)))
    assert await queue(c, order=LOWEST) == keys(by_score)
    assert await queue(c, order=CAMERA) == keys(
        sorted(rows, key=lambda r: (r["camera"], *oldest(r)))
    )
    # a page of all answers the same as pages of one, with the sightings complete
    page = await c.workshop.GetReviewQueue(
        ws.GetReviewQueueRequest(bucket_id="yard", order=LOWEST, page_size=100), metadata=c.admin
    )
    assert [(q.run_id, q.sighting.sighting_id) for q in page.sightings] == keys(by_score)
    assert page.next_page_token == ""
    assert [round(q.score, 2) for q in page.sightings] == [0.3, 0.5, 0.6, 0.92, 0.95, 0.97]
    assert all(q.sighting.item_ids and q.sighting.review_state == PENDING for q in page.sightings)

    # filters: class, camera, run, time range, score
    assert await queue(c, class_name="vehicle") == keys(
        sorted((r for r in rows if r["class"] == "vehicle"), key=oldest)
    )
    assert await queue(c, camera_id="cam-b", order=LOWEST) == keys(
        sorted((r for r in rows if r["camera"] == "cam-b"), key=lambda r: (r["score"], *oldest(r)))
    )
    assert await queue(c, run_id="r2") == keys(
        sorted((r for r in rows if r["run"] == "r2"), key=oldest)
    )
    start = DAY + timedelta(hours=8, seconds=2)
    end = DAY + timedelta(hours=8, seconds=21)
    assert await queue(
        c,
        frame_time_from=Timestamp(seconds=int(start.timestamp())),
        frame_time_to=Timestamp(seconds=int(end.timestamp())),
    ) == keys(
        sorted(
            (
                r
                for r in rows
                if start.replace(tzinfo=None) <= r["first"] < end.replace(tzinfo=None)
            ),
            key=oldest,
        )
    )
    assert await queue(c, min_score=0.9, class_name="vehicle") == keys(
        sorted((r for r in rows if r["score"] >= 0.9 and r["class"] == "vehicle"), key=oldest)
    )
    assert await queue(c, max_score=0.5) == keys(
        sorted((r for r in rows if r["score"] <= 0.5 + 1e-6), key=oldest)
    )

    # state: a decision takes a sighting out of the pending queue; the decided queue shows
    # who decided it and when; items that join it later bring it back
    first = sorted(rows, key=oldest)[0]
    await c.workshop.DecideSighting(
        ws.DecideSightingRequest(run_id=first["run"], sighting_id=first["id"], decision=NONE),
        metadata=c.admin,
    )
    pending = await queue(c)
    assert (first["run"], first["id"]) not in pending
    assert len(pending) == 5
    decided = await c.workshop.GetReviewQueue(
        ws.GetReviewQueueRequest(
            bucket_id="yard",
            filter=ws.SightingFilter(review_states=[ACCEPTED, REJECTED]),
        ),
        metadata=c.admin,
    )
    (only,) = decided.sightings
    assert (only.run_id, only.sighting.sighting_id) == (first["run"], first["id"])
    assert only.sighting.review_state == REJECTED
    assert only.sighting.decided_by.display_name == "admin"
    assert only.sighting.HasField("decided_at")
    every = await queue(c, review_states=[PENDING, ACCEPTED, REJECTED])
    assert every == keys(sorted(rows, key=oldest))
    # undo as today: decide it back (CONFIRM), it stays decided
    await c.workshop.DecideSighting(
        ws.DecideSightingRequest(run_id=first["run"], sighting_id=first["id"], decision=CONFIRM),
        metadata=c.admin,
    )
    assert await queue(c, review_states=[ACCEPTED]) == [(first["run"], first["id"])]

    # the queue's stored state agrees with every sighting's state as GetReview computes it
    now = await reference(c)
    assert sorted(await queue(c)) == sorted(keys([r for r in now if r["state"] == PENDING]))


# A class's boxes scored `$2` ('NaN', 'Infinity'), as protobuf's JSON wrote such a score.
SCORED_AS_EARLIER_RELEASES = """
UPDATE bucket_items
   SET boxes = (SELECT jsonb_agg(CASE WHEN b ->> 'class_name' = $1
                                      THEN jsonb_set(b, '{score}', to_jsonb($2::text))
                                      ELSE b END ORDER BY n)
                  FROM jsonb_array_elements(boxes) WITH ORDINALITY AS e(b, n))
"""


async def test_a_sighting_scored_nan_pages_in_every_order(
    coordinator: CoordinatorHarness,
) -> None:
    """A detector's NaN or infinite score, which an earlier release stored as protobuf's
    JSON writes it (requests refuse it now), put in directly: the queue pages past such a
    sighting, as Postgres orders NaN above every number, and the next page's token
    carries it. (It answered "page_token is malformed" before.)"""
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    stored = {"person": "NaN", "vehicle": "Infinity", "bike": "-Infinity"}
    classes = [*stored, "dog"]
    await commit(
        c,
        s,
        jobs[0],
        [Frame(n, "save", tuple(sbox(name, 0.1, 0.4) for name in classes)) for n in (0, 1)],
    )
    async with c.db.connection() as connection:
        for name, score in stored.items():
            await connection.execute(SCORED_AS_EARLIER_RELEASES, name, score)
            await connection.execute(
                "UPDATE sightings SET score = $2::text::real WHERE class_name = $1", name, score
            )
    for order in (OLDEST, LOWEST, CAMERA):
        assert len(set(await queue(c, order=order))) == len(classes)
    lowest = await c.workshop.GetReviewQueue(
        ws.GetReviewQueueRequest(bucket_id="yard", order=LOWEST), metadata=c.admin
    )
    scores = [entry.score for entry in lowest.sightings]
    assert [round(score, 2) for score in scores[:3]] == [-math.inf, 0.4, math.inf]
    assert math.isnan(scores[3])


async def test_a_commit_brings_a_decided_sighting_back_to_the_queue(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    # cam-a's second recording first, then its first: the late commit extends the sighting
    await commit(c, s, jobs[1], [Frame(n, "save", (sbox("person", 0.1, 0.8),)) for n in range(3)])
    (sighting,) = await queue(c)
    await c.workshop.DecideSighting(
        ws.DecideSightingRequest(run_id="r1", sighting_id=sighting[1], decision=CONFIRM),
        metadata=c.admin,
    )
    assert await queue(c) == []
    await commit(
        c, s, jobs[0], [Frame(n, "save", (sbox("person", 0.1, 0.2),)) for n in (57, 58, 59)]
    )
    back = await c.workshop.GetReviewQueue(
        ws.GetReviewQueueRequest(bucket_id="yard"), metadata=c.admin
    )
    (entry,) = back.sightings
    assert entry.sighting.review_state == PENDING
    assert entry.sighting.pending_items == 3
    assert len(entry.sighting.item_ids) == 6
    assert round(entry.score, 2) == 0.8


# Each sighting whose stored review columns differ from what all its items say
# (sighting_review_v1, the full recomputation), with both: none when the columns are exact.
QUEUE_COLUMNS_MISMATCHED = """
SELECT s.run_id, s.sighting_id,
       (s.review_state, s.pending_items, s.relabel_class, s.score, s.decided_by, s.decided_at)
           AS stored,
       (r.review_state, r.pending_items, r.relabel_class, r.score, r.decided_by, r.decided_at)
           AS computed
FROM sightings s
CROSS JOIN LATERAL sighting_review_v1(s.run_id, s.sighting_id, s.bucket_id, s.camera_id,
                                      s.first_frame_time, s.last_frame_time) r
WHERE (s.review_state, s.pending_items, s.relabel_class, s.score, s.decided_by, s.decided_at)
      IS DISTINCT FROM
      (r.review_state, r.pending_items, r.relabel_class, r.score, r.decided_by, r.decided_at)
"""


async def check_queue_columns(c: CoordinatorHarness) -> int:
    """The stored queue columns of every sighting equal a full recomputation from its
    items; answers how many sightings there are."""
    async with c.db.connection() as connection:
        assert [tuple(r) for r in await connection.fetch(QUEUE_COLUMNS_MISMATCHED)] == []
        count: int = await connection.fetchval("SELECT count(*) FROM sightings")
    return count


async def test_commits_keep_the_queue_columns_as_a_full_recomputation_would(
    coordinator: CoordinatorHarness,
) -> None:
    """A commit sets the columns of a sighting it makes from its own items itself when
    their highest score is above 0 (job_complete_v4), refreshes one it only extends from
    its stored columns and the added boxes (sightings_refresh_v2), and one it regroups or
    makes without a score above 0 from all its items: after every step of commits across
    jobs (in and out of order), sighting and item decisions and a bulk decision with its
    undo, the columns are what recomputing them from the items gives."""
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    # a person; in its last two frames a vehicle without a score (0 is not stored) and a
    # bike (an item with boxes of two sightings the commit sets); a dog scored below 0,
    # then without a score (its highest score is below 0, where the commit reads 0)
    person, vehicle = sbox("person", 0.1, 0.5), sbox("vehicle", 0.6, 0.0)
    bike = sbox("bike", 0.35, 0.7)
    await commit(
        c,
        s,
        jobs[0],
        [
            Frame(56, "save", (person, sbox("dog", 0.85, -0.5))),
            Frame(57, "save", (person, sbox("dog", 0.85, 0.0))),
        ]
        + [Frame(n, "save", (person, vehicle, bike)) for n in (58, 59)],
    )
    assert await check_queue_columns(c) == 4
    (first,) = await queue(c, class_name="person")
    await c.workshop.DecideSighting(
        ws.DecideSightingRequest(run_id="r1", sighting_id=first[1], decision=CONFIRM),
        metadata=c.admin,
    )
    await check_queue_columns(c)
    # the next minute extends the decided person, and the vehicle with a score below 0
    person, vehicle = sbox("person", 0.1, 0.9), sbox("vehicle", 0.6, -0.5)
    await commit(
        c,
        s,
        jobs[1],
        [Frame(n, "save", (person, vehicle)) for n in (0, 1)]
        + [Frame(2, "save", (person,))]
        + [Frame(n, "save", (sbox("person", 0.5, 0.7),)) for n in (58, 59)],
    )
    assert await check_queue_columns(c) == 5
    rows = await c.workshop.GetReviewQueue(
        ws.GetReviewQueueRequest(bucket_id="yard", filter=ws.SightingFilter(class_name="person")),
        metadata=c.admin,
    )
    extended = [q for q in rows.sightings if q.sighting.sighting_id == first[1]]
    assert [
        (q.sighting.review_state, q.sighting.pending_items, round(q.score, 2)) for q in extended
    ] == [(PENDING, 3, 0.9)]
    page = await c.workshop.GetReview(ws.GetReviewRequest(run_id="r1"), metadata=c.admin)
    await c.workshop.DecideItem(
        ws.DecideItemRequest(item_id=page.items[-1].item.item_id, decision=NONE),
        metadata=c.admin,
    )
    await check_queue_columns(c)
    # cam-b out of order: its second minute first, then its first, which regroups the
    # second minute's items into the sighting the first starts
    await commit(c, s, jobs[4], [Frame(n, "save", (sbox("person", 0.3, 0.6),)) for n in (0, 1)])
    await check_queue_columns(c)
    await commit(c, s, jobs[3], [Frame(n, "save", (sbox("person", 0.3, 0.4),)) for n in (58, 59)])
    assert await check_queue_columns(c) == 6
    # the third minute extends the person of 08:01:58 once more
    await commit(c, s, jobs[2], [Frame(n, "save", (sbox("person", 0.5, 0.8),)) for n in (0, 1)])
    await check_queue_columns(c)
    bulk = await c.workshop.BulkDecideSightings(
        ws.BulkDecideSightingsRequest(
            bucket_id="yard", filter=ws.SightingFilter(class_name="person"), decision=NONE
        ),
        metadata=c.admin,
    )
    await check_queue_columns(c)
    await c.workshop.UndoBulkDecision(
        ws.UndoBulkDecisionRequest(action_id=bulk.action.action_id), metadata=c.admin
    )
    await check_queue_columns(c)
    await check_counts(c)


async def snapshot(c: CoordinatorHarness) -> list[Any]:
    async with c.db.connection() as connection:
        items = await connection.fetch(
            "SELECT item_id, review_state, relabel_class, box_states, box_relabels, "
            "box_decided_at FROM bucket_items ORDER BY item_id"
        )
        sightings = await connection.fetch(
            "SELECT run_id, sighting_id, review_state, pending_items, relabel_class, decided_at "
            "FROM sightings ORDER BY 1, 2"
        )
    return [tuple(r) for r in items] + [tuple(r) for r in sightings]


async def test_a_bulk_decision_previews_applies_and_undoes_as_one(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    await queue_world(c)
    rows = await reference(c)
    before = await snapshot(c)
    vehicles = ws.SightingFilter(class_name="vehicle", min_score=0.9)
    preview = await c.workshop.BulkDecideSightings(
        ws.BulkDecideSightingsRequest(
            bucket_id="yard", filter=vehicles, decision=RELABEL, class_name="truck", dry_run=True
        ),
        metadata=c.admin,
    )
    wanted = [r for r in rows if r["class"] == "vehicle" and r["score"] >= 0.9]
    assert len(wanted) == 2
    # r1's cam-b vehicle (2 items), r2's cam-a vehicle (2 items)
    assert (preview.sightings_selected, preview.sightings_changed, preview.items_changed) == (
        2,
        2,
        4,
    )
    assert not preview.HasField("action")
    assert await snapshot(c) == before

    applied = await c.workshop.BulkDecideSightings(
        ws.BulkDecideSightingsRequest(
            bucket_id="yard",
            filter=vehicles,
            decision=RELABEL,
            class_name="truck",
            expected_selection_revision=preview.selection_revision,
        ),
        metadata=c.admin,
    )
    assert (applied.sightings_changed, applied.items_changed) == (2, 4)
    action = applied.action
    assert action.action_id
    assert (action.sightings_selected, action.sightings_changed, action.items_changed) == (2, 2, 4)
    assert action.review_state == ACCEPTED
    assert action.relabel_class == "truck"
    assert action.decided_by.display_name == "admin"
    now = await reference(c)
    assert {(r["run"], r["id"]) for r in now if r["state"] == ACCEPTED} == set(keys(wanted))
    assert set(keys(wanted)).isdisjoint(await queue(c))
    decided = await c.workshop.GetReviewQueue(
        ws.GetReviewQueueRequest(
            bucket_id="yard", filter=ws.SightingFilter(review_states=[ACCEPTED])
        ),
        metadata=c.admin,
    )
    assert {q.sighting.relabel_class for q in decided.sightings} == {"truck"}
    assert {q.sighting.decided_at.ToDatetime() for q in decided.sightings} == {
        action.decided_at.ToDatetime()
    }
    await check_counts(c)
    # the same again selects nothing pending
    again = await c.workshop.BulkDecideSightings(
        ws.BulkDecideSightingsRequest(
            bucket_id="yard", filter=vehicles, decision=RELABEL, class_name="truck", dry_run=True
        ),
        metadata=c.admin,
    )
    assert (again.sightings_selected, again.items_changed) == (0, 0)

    # one undo for the whole action: back to pending, counters as before
    undone = await c.workshop.UndoBulkDecision(
        ws.UndoBulkDecisionRequest(action_id=action.action_id), metadata=c.admin
    )
    assert undone.action.undone_by.display_name == "admin"
    assert undone.action.HasField("undone_at")
    assert await snapshot(c) == before
    await check_counts(c)
    assert sorted(await queue(c)) == sorted(keys(rows))
    with pytest.raises(grpc.aio.AioRpcError) as twice:
        await c.workshop.UndoBulkDecision(
            ws.UndoBulkDecisionRequest(action_id=action.action_id), metadata=c.admin
        )
    assert error_reason(twice.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "NOTHING_TO_UNDO")

    # a bulk NONE over everything pending of cam-a, undone: every item as before
    cam_a = ws.SightingFilter(camera_id="cam-a")
    none = await c.workshop.BulkDecideSightings(
        ws.BulkDecideSightingsRequest(bucket_id="yard", filter=cam_a, decision=NONE),
        metadata=c.admin,
    )
    assert none.sightings_changed == 3
    assert none.items_changed == 6  # r1: 4 items (two sightings each), r2: 2
    await check_counts(c)
    await c.workshop.UndoBulkDecision(
        ws.UndoBulkDecisionRequest(action_id=none.action.action_id), metadata=c.admin
    )
    assert await snapshot(c) == before
    await check_counts(c)


async def test_a_bulk_decision_on_a_changed_selection_is_refused(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    await queue_world(c)
    rows = sorted(await reference(c), key=oldest)
    everything = ws.SightingFilter()
    preview = await c.workshop.BulkDecideSightings(
        ws.BulkDecideSightingsRequest(
            bucket_id="yard", filter=everything, decision=CONFIRM, dry_run=True
        ),
        metadata=c.admin,
    )
    assert preview.sightings_selected == 6
    # another reviewer decides one of them
    await c.workshop.DecideSighting(
        ws.DecideSightingRequest(run_id=rows[0]["run"], sighting_id=rows[0]["id"], decision=NONE),
        metadata=c.admin,
    )
    before = await snapshot(c)
    with pytest.raises(grpc.aio.AioRpcError) as stale:
        await c.workshop.BulkDecideSightings(
            ws.BulkDecideSightingsRequest(
                bucket_id="yard",
                filter=everything,
                decision=CONFIRM,
                expected_selection_revision=preview.selection_revision,
            ),
            metadata=c.admin,
        )
    code, reason, info = error_reason(stale.value)
    assert (code, reason) == (grpc.StatusCode.ABORTED, "STALE_REVISION")
    assert info["sightings_selected"] == "5"
    assert info["current_revision"] != preview.selection_revision
    assert "changed since its preview" in (stale.value.details() or "")
    assert await snapshot(c) == before
    # the same decision with a fresh preview goes through
    fresh = await c.workshop.BulkDecideSightings(
        ws.BulkDecideSightingsRequest(
            bucket_id="yard", filter=everything, decision=CONFIRM, dry_run=True
        ),
        metadata=c.admin,
    )
    done = await c.workshop.BulkDecideSightings(
        ws.BulkDecideSightingsRequest(
            bucket_id="yard",
            filter=everything,
            decision=CONFIRM,
            expected_selection_revision=fresh.selection_revision,
        ),
        metadata=c.admin,
    )
    assert done.sightings_changed == 5
    # a sighting decided again after the action: its undo would overwrite that, refused
    await c.workshop.DecideSighting(
        ws.DecideSightingRequest(run_id=rows[1]["run"], sighting_id=rows[1]["id"], decision=NONE),
        metadata=c.admin,
    )
    before = await snapshot(c)
    with pytest.raises(grpc.aio.AioRpcError) as changed:
        await c.workshop.UndoBulkDecision(
            ws.UndoBulkDecisionRequest(action_id=done.action.action_id), metadata=c.admin
        )
    code, reason, info = error_reason(changed.value)
    assert (code, reason) == (grpc.StatusCode.ABORTED, "STALE_REVISION")
    assert int(info["changed_since"]) >= 1
    assert await snapshot(c) == before
    await check_counts(c)


async def test_bad_input_and_cameras(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    await queue_world(c)
    before = await snapshot(c)
    queue_cases = [
        ("page size", ws.GetReviewQueueRequest(bucket_id="yard", page_size=101), "page_size"),
        ("token", ws.GetReviewQueueRequest(bucket_id="yard", page_token="nonsense"), "page_token"),
        (
            "time range",
            ws.GetReviewQueueRequest(
                bucket_id="yard",
                filter=ws.SightingFilter(
                    frame_time_from=Timestamp(seconds=2_000_000_000),
                    frame_time_to=Timestamp(seconds=1_000_000_000),
                ),
            ),
            "filter.frame_time_to",
        ),
        (
            "scores",
            ws.GetReviewQueueRequest(
                bucket_id="yard", filter=ws.SightingFilter(min_score=0.9, max_score=0.1)
            ),
            "filter.max_score",
        ),
        (
            "state",
            ws.GetReviewQueueRequest(
                bucket_id="yard",
                filter=ws.SightingFilter(review_states=[common_pb2.ReviewState.ValueType(9)]),
            ),
            "filter.review_states[0]",
        ),
        (
            "order",
            ws.GetReviewQueueRequest(bucket_id="yard", order=ws.QueueOrder.ValueType(7)),
            "order",
        ),
        ("bucket", ws.GetReviewQueueRequest(), "bucket_id"),
    ]
    for what, request, field in queue_cases:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await c.workshop.GetReviewQueue(request, metadata=c.admin)
        code, reason, info = error_reason(caught.value)
        assert (code, reason, info.get("field")) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            field,
        ), what
    # another queue's token
    page = await c.workshop.GetReviewQueue(
        ws.GetReviewQueueRequest(bucket_id="yard", page_size=1), metadata=c.admin
    )
    with pytest.raises(grpc.aio.AioRpcError) as other:
        await c.workshop.GetReviewQueue(
            ws.GetReviewQueueRequest(
                bucket_id="yard", order=LOWEST, page_size=1, page_token=page.next_page_token
            ),
            metadata=c.admin,
        )
    assert error_reason(other.value)[2]["field"] == "page_token"
    workshop_rpcs: Any = c.workshop
    for rpc_name, missing_request in (
        ("GetReviewQueue", ws.GetReviewQueueRequest(bucket_id="nope")),
        (
            "BulkDecideSightings",
            ws.BulkDecideSightingsRequest(bucket_id="nope", decision=CONFIRM, dry_run=True),
        ),
        ("UndoBulkDecision", ws.UndoBulkDecisionRequest(action_id="bulk-nope")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await getattr(workshop_rpcs, rpc_name)(missing_request, metadata=c.admin)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND, rpc_name
    bulk_cases: list[tuple[str, Any, str]] = [
        ("decision unset", ws.BulkDecideSightingsRequest(bucket_id="yard"), "decision"),
        (
            "relabel without class",
            ws.BulkDecideSightingsRequest(bucket_id="yard", decision=RELABEL),
            "class_name",
        ),
        (
            "class for confirm",
            ws.BulkDecideSightingsRequest(bucket_id="yard", decision=CONFIRM, class_name="x"),
            "class_name",
        ),
        ("no action", ws.UndoBulkDecisionRequest(), "action_id"),
    ]
    for what, bad, field in bulk_cases:
        name = (
            "UndoBulkDecision"
            if isinstance(bad, ws.UndoBulkDecisionRequest)
            else "BulkDecideSightings"
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await getattr(workshop_rpcs, name)(bad, metadata=c.admin)
        code, reason, info = error_reason(caught.value)
        assert (code, reason, info.get("field")) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            field,
        ), what

    # cameras: a footage:read key reads its cameras' queue and decides nothing; a
    # camera-bound workshop key decides its cameras' sightings only
    footage = bearer_metadata(
        await c.key(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-b",)), name="f")
    )
    assert {run for run, _ in await queue(c, footage)} == {"r1", "r2"}
    listed = await c.workshop.GetReviewQueue(
        ws.GetReviewQueueRequest(bucket_id="yard", page_size=100), metadata=footage
    )
    assert {q.sighting.camera_id for q in listed.sightings} == {"cam-b"}
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await c.workshop.BulkDecideSightings(
            ws.BulkDecideSightingsRequest(bucket_id="yard", decision=CONFIRM, dry_run=True),
            metadata=footage,
        )
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert await snapshot(c) == before
    own = bearer_metadata(await c.key(Grant(ScopeName.WORKSHOP, camera_ids=("cam-a",)), name="a"))
    done = await c.workshop.BulkDecideSightings(
        ws.BulkDecideSightingsRequest(bucket_id="yard", decision=NONE), metadata=own
    )
    assert done.sightings_changed == 3  # cam-a's only
    assert {
        q.sighting.camera_id
        for q in (
            await c.workshop.GetReviewQueue(
                ws.GetReviewQueueRequest(bucket_id="yard", page_size=100), metadata=c.admin
            )
        ).sightings
    } == {"cam-b"}
    # an action over cam-a undone by a key of cam-b only: refused
    cam_b = bearer_metadata(await c.key(Grant(ScopeName.WORKSHOP, camera_ids=("cam-b",)), name="b"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await c.workshop.UndoBulkDecision(
            ws.UndoBulkDecisionRequest(action_id=done.action.action_id), metadata=cam_b
        )
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    await c.workshop.UndoBulkDecision(
        ws.UndoBulkDecisionRequest(action_id=done.action.action_id), metadata=own
    )
    assert await snapshot(c) == before


async def test_the_cli_lists_the_queue_and_bulk_decides_with_a_dry_run(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    await queue_world(c)
    listed = await workshop(c, "-o", "json", "buckets", "queue", "yard", "--order", "lowest-score")
    assert listed.code == 0, listed.err
    scores = [round(q["score"], 2) for q in listed.json()]
    assert scores == sorted(scores)
    assert len(scores) == 6
    table = await workshop(c, "buckets", "queue", "yard", "--class", "vehicle", "--camera", "cam-b")
    assert table.code == 0, table.err
    assert "cam-b" in table.out
    assert "cam-a" not in table.out
    preview = await workshop(
        c,
        "-o",
        "json",
        "buckets",
        "bulk-decide",
        "yard",
        "confirm",
        "--class",
        "vehicle",
        "--min-score",
        "0.9",
        "--dry-run",
    )
    assert preview.code == 0, preview.err
    shown = preview.json()
    assert (shown["sightings_selected"], shown["items_changed"]) == (2, 4)
    assert "action" not in shown
    applied = await workshop(
        c,
        "-o",
        "json",
        "buckets",
        "bulk-decide",
        "yard",
        "confirm",
        "--class",
        "vehicle",
        "--min-score",
        "0.9",
        "--expect",
        shown["selection_revision"],
    )
    assert applied.code == 0, applied.err
    action_id = applied.json()["action"]["action_id"]
    stale, bad = await asyncio.gather(
        workshop(
            c,
            "buckets",
            "bulk-decide",
            "yard",
            "none",
            "--expect",
            shown["selection_revision"],
        ),
        workshop(c, "buckets", "bulk-decide", "yard", "maybe"),
    )
    assert stale.code == 1
    assert stale.err.startswith("workshop: STALE_REVISION: "), stale.err
    assert bad.code != 0
    undone = await workshop(c, "-o", "json", "buckets", "undo-bulk", action_id)
    assert undone.code == 0, undone.err
    assert undone.json()["action"]["undone_by"]["display_name"] == "admin"
    again = await workshop(c, "buckets", "undo-bulk", action_id)
    assert again.code == 1
    assert again.err.startswith("workshop: NOTHING_TO_UNDO: "), again.err
    await check_counts(c)
