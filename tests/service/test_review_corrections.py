"""Box corrections and single-item decisions (docs/review.md, "Corrections", "Item
decisions"): what they change in GetReview, GetSummary's counters, ListBucketItems and
the export listing, that the detected boxes stay, undo, and bad input changing nothing.

Real coordinator and Postgres (testbed/review_world.py builds the runs). The counters are
reconciled with a reference computed here, in Python, from the items' raw columns.
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from typing import Any

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_world import error_reason
from testbed.harness.coordinator import CoordinatorHarness
from testbed.review_world import Frame, box, commit, review_world, start_run
from tests.cli_runner import workshop
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, run_pb2
from workshop.v1 import publication_pb2 as pub
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


def edit(
    source: int, class_name: str, x: float, y: float, w: float, h: float
) -> ws.BoxCorrectionInput:
    return ws.BoxCorrectionInput(source_box_index=source, class_name=class_name, x=x, y=y, w=w, h=h)


def reference_boxes(row: Any) -> list[tuple[str, str]]:
    """(class after review, review state) of an item's boxes, from its raw columns, as
    docs/review.md defines them (independent of bucket_item_reviewed_boxes)."""
    detected = row["boxes"] or []
    states = row["box_states"] or []
    relabels = row["box_relabels"] or []
    item_state, item_relabel = row["item_state"], row["item_relabel"]

    def state_of(position: int) -> str:
        if item_state is not None:
            return str(item_state)
        found = states[position] if position < len(states) else None
        return found or "pending"

    def relabel_of(position: int) -> str | None:
        if item_state is not None:
            return item_relabel  # type: ignore[no-any-return]
        return relabels[position] if position < len(relabels) else None

    if row["corrected_boxes"] is None:
        return [(relabel_of(n) or b["class_name"], state_of(n)) for n, b in enumerate(detected)]
    found = []
    for b in row["corrected_boxes"]:
        source = b["source"]
        if source < 0:
            found.append((b["class_name"], item_state or "accepted"))
            continue
        kept = detected[source]["class_name"] == b["class_name"]
        found.append(
            ((relabel_of(source) or b["class_name"]) if kept else b["class_name"], state_of(source))
        )
    return found


async def check_counts(c: CoordinatorHarness) -> None:
    """GetSummary's class counts, bucket counts and ListRuns' review counts equal what the
    items themselves say."""
    async with c.db.connection() as connection:
        rows = await connection.fetch(
            """SELECT bi.*, r.workflow_id FROM bucket_items bi JOIN runs r USING (run_id)"""
        )
    classes: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    buckets: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for row in rows:
        for name, state in reference_boxes(row):
            d, k = classes[row["workflow_id"]].get(name, (0, 0))
            classes[row["workflow_id"]][name] = (d + 1, k + (state == "accepted"))
        counts = buckets[row["bucket_id"]]
        counts[0] += 1
        counts[("accepted", "rejected", "pending").index(row["review_state"]) + 1] += 1
        # the item's own state: its item decision's, else its boxes'
        if row["item_state"] is not None:
            assert row["review_state"] == row["item_state"]
    summary = await c.workshop.GetSummary(ws.GetSummaryRequest(), metadata=c.admin)
    for workflow in summary.workflows:
        assert {
            count.class_name: (count.detections, count.confirmations) for count in workflow.classes
        } == {k: v for k, v in classes.get(workflow.workflow_id, {}).items() if v[0]}
    assert {
        b.bucket_id: [b.images, b.accepted, b.rejected, b.pending]
        for b in summary.buckets
        if b.images
    } == dict(buckets)
    listed = await c.workshop.ListRuns(ws.ListRunsRequest(workflow_id="watch"), metadata=c.admin)
    by_run: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for row in rows:
        by_run[row["run_id"]][("pending", "accepted", "rejected").index(row["review_state"])] += 1
    for entry in listed.runs:
        listed_counts = entry.review_counts
        assert [
            listed_counts.pending,
            listed_counts.accepted,
            listed_counts.rejected,
        ] == by_run.get(entry.run.run_id, [0, 0, 0])


async def review_items(c: CoordinatorHarness, run_id: str = "r1") -> ws.GetReviewResponse:
    page: ws.GetReviewResponse = await c.workshop.GetReview(
        ws.GetReviewRequest(run_id=run_id), metadata=c.admin
    )
    return page


async def item_of(c: CoordinatorHarness, item_id: str) -> run_pb2.BucketItem:
    for entry in (await review_items(c)).items:
        if entry.item.item_id == item_id:
            return entry.item
    raise AssertionError(item_id)


def reviewed(item: run_pb2.BucketItem) -> list[tuple[int, str, int, tuple[float, ...]]]:
    return [
        (
            b.source_box_index,
            b.box.class_name,
            b.review_state,
            tuple(round(v, 5) for v in (b.box.x, b.box.y, b.box.w, b.box.h)),
        )
        for b in item.reviewed_boxes
    ]


async def export_boxes(c: CoordinatorHarness, s: Any, bucket: str) -> dict[str, list[str]]:
    """The export listing's boxes (every review state) by item: their classes."""
    secret = await c.key(Grant(ScopeName.WORKSHOP), name="exporter")
    page = await c.publication.ListExportItems(
        pub.ListExportItemsRequest(bucket_id=bucket),
        metadata=(*s.service, ("workshop-on-behalf-of", f"Bearer {secret}")),
    )
    return {item.item_id: [b.class_name for b in item.boxes] for item in page.items}


async def image_boxes(
    c: CoordinatorHarness, s: Any, item_id: str
) -> list[tuple[str, tuple[float, ...]]]:
    """The boxes an image read of the item answers (AuthorizeImageRead, as the preview
    service asks it for a reader): class and rounded x, y, w, h."""
    secret = await c.key(Grant(ScopeName.WORKSHOP), name="reader")
    answer = await c.publication.AuthorizeImageRead(
        pub.AuthorizeImageReadRequest(run_id="r1", item_id=item_id),
        metadata=(*s.service, ("workshop-on-behalf-of", f"Bearer {secret}")),
    )
    return [(b.class_name, tuple(round(v, 4) for v in (b.x, b.y, b.w, b.h))) for b in answer.boxes]


async def world_with_items(c: CoordinatorHarness) -> tuple[Any, list[str]]:
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    frames = [
        Frame(n, "save", (box("person", 0.1, 0.1, 0.1), box("vehicle", 0.6, 0.5, 0.2)))
        for n in range(4)
    ]
    await commit(c, s, jobs[0], frames)
    items = [entry.item.item_id for entry in (await review_items(c)).items]
    assert len(items) == 4
    return s, items


async def test_corrections_change_reads_counts_and_exports_and_keep_the_detected_boxes(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, items = await world_with_items(c)
    target = items[1]
    detected = list((await item_of(c, target)).boxes)
    # move and resize the person, delete the vehicle, add a missing person
    corrected = await c.workshop.CorrectItemBoxes(
        ws.CorrectItemBoxesRequest(
            item_id=target,
            boxes=[edit(0, "person", 0.15, 0.12, 0.2, 0.3), edit(-1, "person", 0.7, 0.7, 0.1, 0.1)],
            expected_revision=0,
        ),
        metadata=c.admin,
    )
    item = corrected.item
    assert item.revision == 1
    assert list(item.boxes) == detected  # the processor's result stays
    assert [b.source_box_index for b in item.correction.boxes] == [0, -1]
    assert item.correction.corrected_by.display_name == "admin"
    assert reviewed(item) == [
        (0, "person", PENDING, (0.15, 0.12, 0.2, 0.3)),
        (-1, "person", ACCEPTED, (0.7, 0.7, 0.1, 0.1)),
    ]
    assert reviewed(await item_of(c, target)) == reviewed(item)
    await check_counts(c)
    summary = await c.workshop.GetSummary(ws.GetSummaryRequest(), metadata=c.admin)
    (workflow,) = [w for w in summary.workflows if w.workflow_id == "watch"]
    assert {k.class_name: (k.detections, k.confirmations) for k in workflow.classes} == {
        "person": (5, 1),
        "vehicle": (3, 0),
    }

    # ListBucketItems: the class filter follows the correction
    listed = await c.workshop.ListBucketItems(
        ws.ListBucketItemsRequest(
            bucket_id="yard", filter=run_pb2.BucketItemFilter(class_name="vehicle")
        ),
        metadata=c.admin,
    )
    assert target not in [i.item_id for i in listed.items]
    assert len(listed.items) == 3
    exported = await export_boxes(c, s, "yard")
    assert exported[target] == ["person", "person"]
    assert exported[items[0]] == ["person", "vehicle"]
    # reading the item's image answers its boxes after review too (0013)
    assert await image_boxes(c, s, target) == [
        ("person", (0.15, 0.12, 0.2, 0.3)),
        ("person", (0.7, 0.7, 0.1, 0.1)),
    ]

    # a class change moves the counts; a stale revision changes nothing
    second = await c.workshop.CorrectItemBoxes(
        ws.CorrectItemBoxesRequest(
            item_id=target,
            boxes=[edit(0, "vehicle", 0.15, 0.12, 0.2, 0.3)],
            expected_revision=1,
        ),
        metadata=c.admin,
    )
    assert second.item.revision == 2
    assert reviewed(second.item) == [(0, "vehicle", PENDING, (0.15, 0.12, 0.2, 0.3))]
    await check_counts(c)
    with pytest.raises(grpc.aio.AioRpcError) as stale:
        await c.workshop.CorrectItemBoxes(
            ws.CorrectItemBoxesRequest(item_id=target, boxes=[], expected_revision=1),
            metadata=c.admin,
        )
    code, reason, metadata = error_reason(stale.value)
    assert (code, reason, metadata["current_revision"]) == (
        grpc.StatusCode.ABORTED,
        "STALE_REVISION",
        "2",
    )
    assert reviewed(await item_of(c, target)) == reviewed(second.item)

    # a sighting decision after a correction: the corrected class keeps, counts stay exact
    page = await review_items(c)
    (entry,) = [e for e in page.items if e.item.item_id == target]
    await c.workshop.DecideSighting(
        ws.DecideSightingRequest(
            run_id="r1", sighting_id=entry.sighting_ids[0], decision=RELABEL, class_name="worker"
        ),
        metadata=c.admin,
    )
    await check_counts(c)
    assert reviewed(await item_of(c, target))[0][1:3] == ("vehicle", ACCEPTED)
    exported = await export_boxes(c, s, "yard")
    assert exported[items[0]] == ["worker", "vehicle"]
    assert exported[target] == ["vehicle"]

    # undo: back to the first correction, then to as detected, then nothing to undo
    undone = await c.workshop.UndoItemCorrection(
        ws.UndoItemCorrectionRequest(item_id=target, expected_revision=2), metadata=c.admin
    )
    assert undone.item.revision == 3
    assert [b.source_box_index for b in undone.item.correction.boxes] == [0, -1]
    assert reviewed(undone.item)[0][1] == "worker"  # its detected class: the relabel applies
    await check_counts(c)
    back = await c.workshop.UndoItemCorrection(
        ws.UndoItemCorrectionRequest(item_id=target), metadata=c.admin
    )
    assert not back.item.HasField("correction")
    assert [b.box.class_name for b in back.item.reviewed_boxes] == ["worker", "vehicle"]
    await check_counts(c)
    with pytest.raises(grpc.aio.AioRpcError) as nothing:
        await c.workshop.UndoItemCorrection(
            ws.UndoItemCorrectionRequest(item_id=target), metadata=c.admin
        )
    assert error_reason(nothing.value)[:2] == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "NOTHING_TO_UNDO",
    )
    async with c.db.connection() as connection:
        logged = await connection.fetch(
            "SELECT revision, previous IS NULL AS first, undone_at IS NOT NULL AS undone "
            "FROM box_corrections WHERE item_id = $1 ORDER BY revision",
            target,
        )
    assert [tuple(r) for r in logged] == [(1, True, True), (2, False, True)]


async def test_an_item_decision_overrides_its_sighting_and_both_show(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, items = await world_with_items(c)
    page = await review_items(c)
    person = page.items[0].sighting_ids[0]
    await c.workshop.DecideSighting(
        ws.DecideSightingRequest(run_id="r1", sighting_id=person, decision=CONFIRM),
        metadata=c.admin,
    )
    target = items[2]
    decided = await c.workshop.DecideItem(
        ws.DecideItemRequest(item_id=target, decision=NONE, expected_revision=0),
        metadata=c.admin,
    )
    item = decided.item
    assert item.revision == 1
    assert item.review_state == REJECTED
    assert item.item_decision.review_state == REJECTED
    assert item.item_decision.decided_by.display_name == "admin"
    # the sighting's decision still shows per box
    assert [r.review_state for r in item.box_reviews] == [ACCEPTED, PENDING]
    assert [b.review_state for b in item.reviewed_boxes] == [REJECTED, REJECTED]
    await check_counts(c)

    # a later sighting decision does not override the item's
    await c.workshop.DecideSighting(
        ws.DecideSightingRequest(
            run_id="r1", sighting_id=person, decision=RELABEL, class_name="worker"
        ),
        metadata=c.admin,
    )
    now = await item_of(c, target)
    assert now.review_state == REJECTED
    assert [r.relabel_class for r in now.box_reviews][:1] == ["worker"]
    assert [b.box.class_name for b in now.reviewed_boxes] == ["person", "vehicle"]
    await check_counts(c)
    sightings = {x.sighting_id: x for x in (await review_items(c)).sightings}
    assert sightings[person].review_state == ACCEPTED  # the sighting's own state
    exported = await export_boxes(c, s, "yard")
    assert exported[target] == []  # rejected boxes are not exported

    relabelled = await c.workshop.DecideItem(
        ws.DecideItemRequest(item_id=target, decision=RELABEL, class_name="cyclist"),
        metadata=c.admin,
    )
    assert relabelled.item.review_state == ACCEPTED
    assert [b.box.class_name for b in relabelled.item.reviewed_boxes] == ["cyclist", "cyclist"]
    await check_counts(c)

    # clearing: the item follows its sightings again
    cleared = await c.workshop.ClearItemDecision(
        ws.ClearItemDecisionRequest(item_id=target, expected_revision=2), metadata=c.admin
    )
    assert not cleared.item.HasField("item_decision")
    assert cleared.item.review_state == PENDING  # the vehicle's sighting is undecided
    assert [b.box.class_name for b in cleared.item.reviewed_boxes] == ["worker", "vehicle"]
    await check_counts(c)
    with pytest.raises(grpc.aio.AioRpcError) as nothing:
        await c.workshop.ClearItemDecision(
            ws.ClearItemDecisionRequest(item_id=target), metadata=c.admin
        )
    assert error_reason(nothing.value)[:2] == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "NOTHING_TO_UNDO",
    )
    async with c.db.connection() as connection:
        logged = await connection.fetch(
            "SELECT review_state FROM item_decisions WHERE item_id = $1 ORDER BY revision", target
        )
    assert [r["review_state"] for r in logged] == ["rejected", "accepted", None]

    # its history in one call: the detections, the decisions on it alone (the clear too),
    # its sightings' decisions with who and when
    history = await c.workshop.GetBucketItem(
        ws.GetBucketItemRequest(item_id=target), metadata=c.admin
    )
    assert history.item == await item_of(c, target)
    assert [
        (d.revision, d.review_state, d.relabel_class, d.decided_by.display_name)
        for d in history.item_decisions
    ] == [(1, REJECTED, "", "admin"), (2, ACCEPTED, "cyclist", "admin"), (3, 0, "", "admin")]
    assert not history.item_decisions[0].HasField("relabel_class")
    assert list(history.corrections) == []
    assert [x.sighting_id for x in history.sightings] == [
        r.sighting_id for r in history.item.box_reviews
    ]
    person_now = history.sightings[0]
    assert (person_now.review_state, person_now.relabel_class) == (ACCEPTED, "worker")
    assert person_now.decided_by.display_name == "admin"
    assert person_now.HasField("decided_at")
    assert history.sightings[1].review_state == PENDING
    assert not history.sightings[1].HasField("decided_by")


async def test_every_review_page_item_is_what_get_bucket_item_answers(
    coordinator: CoordinatorHarness,
) -> None:
    """GetReview reads the boxes after review of its corrected items only and derives the
    others' from the boxes it read (reviews.review_as_detected); GetBucketItem reads every
    item's (bucket_item_reviewed_boxes_v1). Each item of every page (4 items a page, so
    pages end inside sightings) is the same message, and its sighting ids are its boxes':
    sightings confirmed, relabelled and rejected, item decisions with and without a
    relabel, corrections (a class kept, one changed, a box added, every box deleted),
    items without boxes, a tracked box, and a NaN score an earlier release stored."""
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    pair = [
        Frame(n, "save", (box("person", 0.1 + 0.01 * n, 0.1, 0.1), box("vehicle", 0.6, 0.5, 0.2)))
        for n in range(6)
    ]
    tracked = common_pb2.Box(class_name="dog", score=0.5, x=0.3, y=0.3, w=0.1, h=0.1, track_id=7)
    await commit(c, s, jobs[0], [*pair, Frame(6, "save", ()), Frame(7, "save", ())])
    await commit(c, s, jobs[3], [*pair[:3], Frame(3, "save", (tracked,))])  # cam-b
    first = await review_items(c)
    ids = [entry.item.item_id for entry in first.items]
    assert len(ids) == 12
    assert not first.has_more
    async with c.db.connection() as connection:
        await connection.execute(
            "UPDATE bucket_items SET boxes = jsonb_set(boxes, '{1,score}', to_jsonb('NaN'::text))"
            " WHERE item_id = $1",
            ids[0],
        )
    by_class: dict[tuple[str, str], str] = {}
    for x in first.sightings:
        by_class.setdefault((x.camera_id, x.class_name), x.sighting_id)
    for (camera, name), decision, relabel in [
        (("cam-a", "person"), CONFIRM, ""),
        (("cam-b", "vehicle"), RELABEL, "truck"),
        (("cam-b", "person"), NONE, ""),
        (("cam-a", ""), NONE, ""),
    ]:
        await c.workshop.DecideSighting(
            ws.DecideSightingRequest(
                run_id="r1",
                sighting_id=by_class[(camera, name)],
                decision=decision,
                class_name=relabel,
            ),
            metadata=c.admin,
        )
    with_boxes = [e.item.item_id for e in first.items if len(e.item.boxes) == 2]
    await c.workshop.DecideItem(
        ws.DecideItemRequest(item_id=with_boxes[1], decision=NONE), metadata=c.admin
    )
    await c.workshop.DecideItem(
        ws.DecideItemRequest(item_id=with_boxes[2], decision=RELABEL, class_name="worker"),
        metadata=c.admin,
    )
    await c.workshop.CorrectItemBoxes(
        ws.CorrectItemBoxesRequest(
            item_id=with_boxes[3],
            boxes=[
                edit(0, "person", 0.15, 0.12, 0.2, 0.3),  # the class kept
                edit(1, "person", 0.6, 0.5, 0.2, 0.1),  # the class changed
                edit(-1, "vehicle", 0.7, 0.7, 0.1, 0.1),  # a box added
            ],
        ),
        metadata=c.admin,
    )
    for item_id in (with_boxes[4], with_boxes[1]):
        await c.workshop.CorrectItemBoxes(
            ws.CorrectItemBoxesRequest(item_id=item_id, boxes=[]), metadata=c.admin
        )

    entries: list[run_pb2.ReviewItem] = []
    token = ""
    while True:
        page = await c.workshop.GetReview(
            ws.GetReviewRequest(run_id="r1", page_size=4, page_token=token), metadata=c.admin
        )
        entries.extend(page.items)
        if not page.has_more:
            break
        token = page.next_page_token
    assert [entry.item.item_id for entry in entries] == ids
    for entry in entries:
        alone = await c.workshop.GetBucketItem(
            ws.GetBucketItemRequest(item_id=entry.item.item_id), metadata=c.admin
        )
        # bytes, not ==: a NaN score equals nothing
        assert entry.item.SerializeToString(deterministic=True) == alone.item.SerializeToString(
            deterministic=True
        ), entry.item.item_id
        assert list(entry.sighting_ids) == [r.sighting_id for r in entry.item.box_reviews]
    # the cases named are there
    items = [entry.item for entry in entries]
    reviewed_boxes = [b for item in items for b in item.reviewed_boxes]
    assert math.isnan(items[0].reviewed_boxes[1].box.score)
    assert [b.box.track_id for b in reviewed_boxes if b.box.HasField("track_id")] == [7]
    assert {b.box.class_name for b in reviewed_boxes} >= {"person", "truck", "worker"}
    assert {b.review_state for b in reviewed_boxes} == {PENDING, ACCEPTED, REJECTED}
    assert sum(item.HasField("correction") for item in items) == 3
    assert sum(item.HasField("item_decision") for item in items) == 2
    assert sum(not item.boxes for item in items) == 2


async def snapshot(c: CoordinatorHarness) -> tuple[Any, ...]:
    async with c.db.connection() as connection:
        return (
            await connection.fetch("SELECT * FROM bucket_items ORDER BY item_id"),
            await connection.fetch("SELECT * FROM workflow_class_counts ORDER BY 1, 2, 3"),
            await connection.fetch("SELECT * FROM bucket_counts ORDER BY 1, 2, 3"),
            await connection.fetch("SELECT * FROM box_corrections"),
            await connection.fetch("SELECT * FROM item_decisions"),
        )


async def test_bad_input_is_refused_precisely_and_changes_nothing(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    _, items = await world_with_items(c)
    target = items[0]
    await c.workshop.CorrectItemBoxes(
        ws.CorrectItemBoxesRequest(item_id=target, boxes=[edit(1, "vehicle", 0.5, 0.5, 0.2, 0.2)]),
        metadata=c.admin,
    )
    before = await snapshot(c)
    other_camera = bearer_metadata(
        await c.key(Grant(ScopeName.WORKSHOP, camera_ids=("cam-b",)), name="b")
    )
    footage = bearer_metadata(
        await c.key(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-a",)), name="f")
    )
    good = edit(0, "person", 0.1, 0.1, 0.1, 0.1)
    Correct = ws.CorrectItemBoxesRequest
    cases: list[tuple[str, Any, Any, grpc.StatusCode, str]] = [
        (
            "outside x",
            "CorrectItemBoxes",
            Correct(item_id=target, boxes=[edit(0, "person", -0.1, 0.1, 0.1, 0.1)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "boxes[0]",
        ),
        (
            "past the right edge",
            "CorrectItemBoxes",
            Correct(item_id=target, boxes=[good, edit(-1, "person", 0.95, 0.1, 0.1, 0.1)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "boxes[1]",
        ),
        (
            "empty box",
            "CorrectItemBoxes",
            Correct(item_id=target, boxes=[edit(0, "person", 0.1, 0.1, 0, 0.1)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "boxes[0]",
        ),
        (
            "not a number",
            "CorrectItemBoxes",
            Correct(item_id=target, boxes=[edit(0, "person", math.nan, 0.1, 0.1, 0.1)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "boxes[0]",
        ),
        (
            "source out of range",
            "CorrectItemBoxes",
            Correct(item_id=target, boxes=[edit(2, "person", 0.1, 0.1, 0.1, 0.1)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "boxes[0].source_box_index",
        ),
        (
            "source below -1",
            "CorrectItemBoxes",
            Correct(item_id=target, boxes=[edit(-2, "person", 0.1, 0.1, 0.1, 0.1)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "boxes[0].source_box_index",
        ),
        (
            "source twice",
            "CorrectItemBoxes",
            Correct(item_id=target, boxes=[good, good]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "boxes[1].source_box_index",
        ),
        (
            "unknown class",
            "CorrectItemBoxes",
            Correct(item_id=target, boxes=[edit(0, "unicorn", 0.1, 0.1, 0.1, 0.1)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "boxes[0].class_name",
        ),
        (
            "empty class",
            "CorrectItemBoxes",
            Correct(item_id=target, boxes=[edit(0, "", 0.1, 0.1, 0.1, 0.1)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "boxes[0].class_name",
        ),
        (
            "no item id",
            "CorrectItemBoxes",
            Correct(boxes=[good]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "item_id",
        ),
        (
            "unknown item",
            "CorrectItemBoxes",
            Correct(item_id="nope", boxes=[good]),
            grpc.StatusCode.NOT_FOUND,
            "",
        ),
        (
            "stale",
            "CorrectItemBoxes",
            Correct(item_id=target, boxes=[good], expected_revision=0),
            grpc.StatusCode.ABORTED,
            "",
        ),
        (
            "stale undo",
            "UndoItemCorrection",
            ws.UndoItemCorrectionRequest(item_id=target, expected_revision=5),
            grpc.StatusCode.ABORTED,
            "",
        ),
        (
            "undo unknown item",
            "UndoItemCorrection",
            ws.UndoItemCorrectionRequest(item_id="nope"),
            grpc.StatusCode.NOT_FOUND,
            "",
        ),
        (
            "nothing to clear",
            "ClearItemDecision",
            ws.ClearItemDecisionRequest(item_id=target),
            grpc.StatusCode.FAILED_PRECONDITION,
            "",
        ),
        (
            "decision unset",
            "DecideItem",
            ws.DecideItemRequest(item_id=target),
            grpc.StatusCode.INVALID_ARGUMENT,
            "decision",
        ),
        (
            "relabel without class",
            "DecideItem",
            ws.DecideItemRequest(item_id=target, decision=RELABEL),
            grpc.StatusCode.INVALID_ARGUMENT,
            "class_name",
        ),
        (
            "class for confirm",
            "DecideItem",
            ws.DecideItemRequest(item_id=target, decision=CONFIRM, class_name="x"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "class_name",
        ),
        (
            "stale decision",
            "DecideItem",
            ws.DecideItemRequest(item_id=target, decision=CONFIRM, expected_revision=0),
            grpc.StatusCode.ABORTED,
            "",
        ),
    ]
    for what, item_id in (("no item id", ""), ("not an id", "it x/../y"), ("long", "i" * 129)):
        cases.append(
            (
                what,
                "GetBucketItem",
                ws.GetBucketItemRequest(item_id=item_id),
                grpc.StatusCode.INVALID_ARGUMENT,
                "item_id",
            )
        )
    for what, rpc, request, code, field in cases:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await getattr(c.workshop, rpc)(request, metadata=c.admin)
        found, reason, info = error_reason(caught.value)
        assert found == code, (what, caught.value.details())
        if field:
            assert (reason, info.get("field")) == ("INVALID_FIELD", field), what
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.GetBucketItem(ws.GetBucketItemRequest(item_id="nope"), metadata=c.admin)
    assert error_reason(caught.value)[:2] == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    assert "'nope'" in (caught.value.details() or "")
    # reading: a key of another camera may not, a footage:read key of its camera may
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.GetBucketItem(
            ws.GetBucketItemRequest(item_id=target), metadata=other_camera
        )
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    seen = await c.workshop.GetBucketItem(ws.GetBucketItemRequest(item_id=target), metadata=footage)
    assert [x.revision for x in seen.corrections] == [1]
    for metadata in (other_camera, footage):
        for rpc, request in (
            ("CorrectItemBoxes", Correct(item_id=target, boxes=[good])),
            ("UndoItemCorrection", ws.UndoItemCorrectionRequest(item_id=target)),
            ("DecideItem", ws.DecideItemRequest(item_id=target, decision=NONE)),
            ("ClearItemDecision", ws.ClearItemDecisionRequest(item_id=target)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await getattr(c.workshop, rpc)(request, metadata=metadata)
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, rpc
    assert await snapshot(c) == before
    # a camera-bound key of the item's camera may
    own = bearer_metadata(await c.key(Grant(ScopeName.WORKSHOP, camera_ids=("cam-a",)), name="a"))
    done = await c.workshop.DecideItem(
        ws.DecideItemRequest(item_id=target, decision=NONE), metadata=own
    )
    assert done.item.review_state == REJECTED
    await check_counts(c)


async def test_the_cli_corrects_undoes_decides_and_clears(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    _, items = await world_with_items(c)
    target = items[3]
    corrected = await workshop(
        c,
        "-o",
        "json",
        "buckets",
        "correct",
        target,
        "--box",
        "0:person:0.2,0.2,0.1,0.1",
        "--box",
        "-1:vehicle:0.5,0.5,0.2,0.2",
        "--expected-revision",
        "0",
    )
    assert corrected.code == 0, corrected.err
    answer = corrected.json()
    assert answer["revision"] == 1
    assert [b["source_box_index"] for b in answer["correction"]["boxes"]] == [0, -1]
    stale, bad, unknown = await asyncio.gather(
        workshop(c, "buckets", "correct", target, "--expected-revision", "0"),
        workshop(c, "buckets", "correct", target, "--box", "0:person:2,0,0.1,0.1"),
        workshop(c, "buckets", "correct", target, "--box", "nonsense"),
    )
    assert stale.code == 1
    assert stale.err.startswith("workshop: STALE_REVISION: "), stale.err
    assert "current_revision: 1" in stale.err
    assert bad.code == 1
    assert "INVALID_FIELD" in bad.err, bad.err
    assert unknown.code != 0
    assert "SOURCE:CLASS:X,Y,W,H" in unknown.err
    decided = await workshop(
        c, "-o", "json", "buckets", "decide", target, "relabel", "--class", "cyclist"
    )
    assert decided.code == 0, decided.err
    assert decided.json()["item_decision"]["relabel_class"] == "cyclist"
    cleared = await workshop(c, "-o", "json", "buckets", "clear-decision", target)
    assert cleared.code == 0, cleared.err
    assert "item_decision" not in cleared.json()
    undone = await workshop(c, "-o", "json", "buckets", "undo-correction", target)
    assert undone.code == 0, undone.err
    assert "correction" not in undone.json()
    again = await workshop(c, "buckets", "undo-correction", target)
    assert again.code == 1
    assert again.err.startswith("workshop: NOTHING_TO_UNDO: "), again.err
    # the listing's run and score filters (every box of this world scores 0.9)
    for flags, count in ((("--run", "r1", "--min-score", "0.5"), 4), (("--max-score", "0.5"), 0)):
        listed = await workshop(c, "-o", "json", "buckets", "items", "yard", *flags)
        assert listed.code == 0, listed.err
        assert len(listed.json()) == count, flags
    # the item with its history: the correction (undone), the decision and its clear
    shown = await workshop(c, "-o", "json", "buckets", "item", target)
    assert shown.code == 0, shown.err
    history = shown.json()
    assert history["item"]["item_id"] == target
    [correction] = history["corrections"]
    assert correction["revision"] == 1
    assert correction["undone_by"]["display_name"]
    assert correction["undone_at"]
    assert [d["review_state"] for d in history["item_decisions"]] == ["accepted", "unspecified"]
    assert len(history["sightings"]) == 2
    text = await workshop(c, "buckets", "item", target)
    assert text.code == 0, text.err
    assert "undone" in text.out, text.out
    assert "cyclist" in text.out, text.out
    missing = await workshop(c, "buckets", "item", "nope")
    assert missing.code == 1
    assert missing.err.startswith("workshop: NOT_FOUND: "), missing.err
    await check_counts(c)


async def test_concurrent_reviewers_never_overwrite_each_other_and_counts_stay_exact(
    coordinator: CoordinatorHarness,
) -> None:
    """Reviewers who pass the revision they saw: of those who saw the same one, exactly one
    wins and the others are ABORTED; corrections, item decisions and sighting decisions
    racing on one timeline leave the counters exact (and deadlock nothing)."""
    c = coordinator
    _, items = await world_with_items(c)
    target = items[0]

    async def attempt(n: int) -> str:
        try:
            await c.workshop.CorrectItemBoxes(
                ws.CorrectItemBoxesRequest(
                    item_id=target,
                    boxes=[edit(0, "person", 0.01 * (n + 1), 0.1, 0.1, 0.1)],
                    expected_revision=0,
                ),
                metadata=c.admin,
            )
        except grpc.aio.AioRpcError as error:
            return error_reason(error)[1]
        return "won"

    outcomes = await asyncio.gather(*(attempt(n) for n in range(6)))
    assert sorted(outcomes) == ["STALE_REVISION"] * 5 + ["won"]
    assert (await item_of(c, target)).revision == 1

    sightings = [x.sighting_id for x in (await review_items(c)).sightings]
    choices: list[Any] = [
        lambda n: c.workshop.CorrectItemBoxes(
            ws.CorrectItemBoxesRequest(
                item_id=items[n % 4],
                boxes=[edit(-1, ("person", "vehicle")[n % 2], 0.2, 0.2, 0.1, 0.1)],
            ),
            metadata=c.admin,
        ),
        lambda n: c.workshop.DecideItem(
            ws.DecideItemRequest(item_id=items[(n + 1) % 4], decision=(CONFIRM, NONE)[n % 2]),
            metadata=c.admin,
        ),
        lambda n: c.workshop.DecideSighting(
            ws.DecideSightingRequest(
                run_id="r1",
                sighting_id=sightings[n % len(sightings)],
                decision=RELABEL,
                class_name=f"class-{n % 3}",
            ),
            metadata=c.admin,
        ),
    ]
    await asyncio.gather(*(choices[n % 3](n) for n in range(24)))
    await check_counts(c)
