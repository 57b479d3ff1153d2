"""Decisions on sightings, the summary's counters, who may see what, and bad input.

Real coordinator and Postgres (testbed/review_world.py builds the runs). The counters
are reconciled with raw counts taken by SQL from the items and boxes themselves.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter, defaultdict
from collections.abc import Awaitable, Sequence
from datetime import timedelta
from zoneinfo import ZoneInfo

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.platform.db import Connection
from services.coordinator.review import listing, reviews
from testbed.coordinator_leases import Setup, on_behalf, record_request, refused
from testbed.coordinator_world import CODE, DAY, put_recording, run_request
from testbed.harness.coordinator import CoordinatorHarness
from testbed.review_world import (
    BOXES,
    SIGHTINGS_MISMATCHED,
    Frame,
    box,
    commit,
    review_world,
    start_run,
)
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2, run_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

CONFIRM, NONE, RELABEL = (
    ws.REVIEW_DECISION_CONFIRM,
    ws.REVIEW_DECISION_NONE,
    ws.REVIEW_DECISION_RELABEL,
)


def two_objects(slots: range) -> list[Frame]:
    """Frames with two people far apart (two sightings over the same items), and every
    third frame a vehicle too."""
    frames = []
    for slot in slots:
        boxes = [box("person", 0.1, 0.1, 0.05), box("person", 0.7, 0.5, 0.05)]
        if slot % 3 == 0:
            boxes.append(box("vehicle", 0.4, 0.4, 0.1))
        frames.append(Frame(slot, "save", tuple(boxes)))
    return frames


async def all_sightings(c: CoordinatorHarness, run_id: str) -> dict[str, run_pb2.Sighting]:
    found: dict[str, run_pb2.Sighting] = {}
    token = ""
    while True:
        page = await c.workshop.GetReview(
            ws.GetReviewRequest(run_id=run_id, page_token=token), metadata=c.admin
        )
        found.update({sighting.sighting_id: sighting for sighting in page.sightings})
        if not page.has_more:
            return found
        token = page.next_page_token


async def decide(
    c: CoordinatorHarness,
    run_id: str,
    sighting_id: str,
    decision: ws.ReviewDecision.ValueType,
    class_name: str = "",
    metadata: tuple[tuple[str, str], ...] | None = None,
) -> ws.DecideSightingResponse:
    response: ws.DecideSightingResponse = await c.workshop.DecideSighting(
        ws.DecideSightingRequest(
            run_id=run_id, sighting_id=sighting_id, decision=decision, class_name=class_name
        ),
        metadata=metadata or c.admin,
    )
    return response


async def check_uniform_and_derived(c: CoordinatorHarness) -> None:
    """Every sighting's boxes share one review; every item's state follows its boxes; the
    sightings rows agree with the items."""
    async with c.db.connection() as connection:
        mixed = await connection.fetch(
            f"""SELECT sighting_id FROM {BOXES} sb GROUP BY sighting_id
               HAVING count(DISTINCT (review_state, coalesce(relabel_class, ''))) > 1"""
        )
        wrong = await connection.fetch(
            f"""SELECT bi.item_id FROM bucket_items bi
               JOIN (SELECT item_id,
                            CASE WHEN bool_or(review_state = 'pending') THEN 'pending'
                                 WHEN bool_or(review_state = 'accepted') THEN 'accepted'
                                 ELSE 'rejected' END AS state
                     FROM {BOXES} sb GROUP BY item_id) b USING (item_id)
               WHERE bi.review_state <> b.state"""
        )
        unmatched = await connection.fetch(SIGHTINGS_MISMATCHED)
    assert mixed == []
    assert wrong == []
    assert unmatched == []


async def raw_summary(
    c: CoordinatorHarness, zone: str, days: int
) -> tuple[
    dict[str, tuple[int, ...]], dict[str, dict[str, tuple[int, int]]], dict[str, Counter[str]]
]:
    """What GetSummary must say, counted from the items and boxes themselves."""
    async with c.db.connection() as connection:
        buckets = await connection.fetch(
            """SELECT b.bucket_id, count(bi.item_id) AS images,
                      count(*) FILTER (WHERE bi.review_state = 'accepted') AS accepted,
                      count(*) FILTER (WHERE bi.review_state = 'rejected') AS rejected,
                      count(*) FILTER (WHERE bi.review_state = 'pending') AS pending,
                      count(*) FILTER (WHERE bi.output_current) AS saved
               FROM buckets b LEFT JOIN bucket_items_current bi ON bi.bucket_id = b.bucket_id
               WHERE b.deleted_at IS NULL GROUP BY b.bucket_id"""
        )
        boxes = await connection.fetch(
            f"""SELECT r.workflow_id, coalesce(sb.relabel_class, sb.class_name) AS class_name,
                      sb.review_state
               FROM {BOXES} sb JOIN runs r ON r.run_id = sb.run_id
               WHERE sb.box_index >= 0"""
        )
        items = await connection.fetch(
            """SELECT r.workflow_id, bi.saved_at FROM bucket_items bi
               JOIN runs r ON r.run_id = bi.run_id"""
        )
    per_bucket: dict[str, tuple[int, ...]] = {
        row["bucket_id"]: tuple(
            row[name] for name in ("images", "accepted", "rejected", "pending", "saved")
        )
        for row in buckets
    }
    classes: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    for row in boxes:
        detections, confirmations = classes[row["workflow_id"]].get(row["class_name"], (0, 0))
        classes[row["workflow_id"]][row["class_name"]] = (
            detections + 1,
            confirmations + (row["review_state"] == "accepted"),
        )
    per_day: dict[str, Counter[str]] = defaultdict(Counter)
    local_today = c.clock.now().astimezone(ZoneInfo(zone)).date()
    for row in items:
        day = row["saved_at"].astimezone(ZoneInfo(zone)).date()
        if local_today - timedelta(days=days - 1) <= day <= local_today:
            per_day[row["workflow_id"]][day.isoformat()] += 1
    return per_bucket, classes, per_day


async def check_summary(c: CoordinatorHarness, zone: str = "Asia/Kathmandu", days: int = 3) -> None:
    summary = await c.workshop.GetSummary(
        ws.GetSummaryRequest(time_zone=zone, days=days), metadata=c.admin
    )
    per_bucket, classes, per_day = await raw_summary(c, zone, days)
    listed = await c.workshop.ListRuns(ws.ListRunsRequest(workflow_id="watch"), metadata=c.admin)
    async with c.db.connection() as connection:
        by_run = {
            row["run_id"]: (row["pending"], row["accepted"], row["rejected"])
            for row in await connection.fetch(
                """SELECT run_id, count(*) FILTER (WHERE review_state = 'pending') AS pending,
                          count(*) FILTER (WHERE review_state = 'accepted') AS accepted,
                          count(*) FILTER (WHERE review_state = 'rejected') AS rejected
                   FROM bucket_items GROUP BY run_id"""
            )
        }
    for entry in listed.runs:
        counts = entry.review_counts
        assert (counts.pending, counts.accepted, counts.rejected) == by_run.get(
            entry.run.run_id, (0, 0, 0)
        )
    assert {
        b.bucket_id: (b.images, b.accepted, b.rejected, b.pending, b.saved) for b in summary.buckets
    } == per_bucket
    for workflow in summary.workflows:
        assert {
            count.class_name: (count.detections, count.confirmations) for count in workflow.classes
        } == classes.get(workflow.workflow_id, {})
        assert len(workflow.images_per_day) == days
        assert {
            f"{d.date.year:04d}-{d.date.month:02d}-{d.date.day:02d}": d.images
            for d in workflow.images_per_day
            if d.images
        } == dict(per_day.get(workflow.workflow_id, {}))


async def test_concurrent_decisions_leave_every_sighting_uniform(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    await commit(c, s, jobs[0], two_objects(range(0, 30)))
    await commit(c, s, jobs[3], two_objects(range(10, 20)))
    sightings = await all_sightings(c, "r1")
    assert len(sightings) >= 6  # two people and a vehicle on each camera
    ids = sorted(sightings)
    choices = [(CONFIRM, ""), (NONE, ""), (RELABEL, "worker"), (RELABEL, "visitor")]

    async def reviewer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(12):
            decision, label = rng.choice(choices)
            await decide(c, "r1", rng.choice(ids), decision, label)

    await asyncio.gather(*(reviewer(seed) for seed in range(8)))
    await check_uniform_and_derived(c)
    await check_summary(c)
    for sighting in (await all_sightings(c, "r1")).values():
        assert sighting.pending_items == 0
        assert sighting.review_state != common_pb2.REVIEW_STATE_PENDING


@pytest.mark.parametrize("seed", [1, 2])
async def test_counters_reconcile_after_random_changes(
    coordinator: CoordinatorHarness, seed: int
) -> None:
    """Completions, decisions and a recording replacement in a random order, then a day
    later a second run, more decisions and the deletion of a bucket; after each step,
    GetSummary equals the raw counts."""
    c = coordinator
    rng = random.Random(seed)
    s = await review_world(c)

    async def some_decision(run_id: str) -> None:
        sightings = await all_sightings(c, run_id)
        if not sightings:
            return
        sid = rng.choice(sorted(sightings))
        choices = [(CONFIRM, ""), (NONE, "")] + ([] if sid.endswith("~-1") else [(RELABEL, "dog")])
        await decide(c, run_id, sid, *rng.choice(choices))

    async def some_frames(job: jobs_pb2.ClaimedJob) -> None:
        start = rng.randrange(0, 40)
        frames = two_objects(range(start, start + rng.randrange(1, 15)))
        frames += [Frame(slot, "keep", ()) for slot in range(50, 50 + rng.randrange(0, 4))]
        await commit(c, s, job, frames)

    jobs = await start_run(c, s, "r1")
    steps = [
        *(("complete", n) for n in range(6)),
        *(("decide", 0) for _ in range(6)),
        ("replace", 0),
    ]
    rng.shuffle(steps)
    replaced = False
    for step, index in steps:
        if step == "complete" and replaced and index == 0:
            # the replaced recording's job can no longer commit (SOURCE_CHANGED)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await some_frames(jobs[index])
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        elif step == "complete":
            await some_frames(jobs[index])
        elif step == "decide":
            await some_decision("r1")
        else:
            # cam-a's first recording again: items made from it are no longer current
            await put_recording(
                c, "cam-a-0", "cam-a", DAY + timedelta(hours=8), timedelta(minutes=1)
            )
            replaced = True
        await check_summary(c)

    c.clock.advance(timedelta(hours=20))  # another local day in Kathmandu
    later = await start_run(c, s, "r2")
    for job in rng.sample(later, 3):
        await some_frames(job)
        await some_decision(rng.choice(("r1", "r2")))
        await check_summary(c)
    await c.operator.DeleteBucket(op.DeleteBucketRequest(bucket_id="lot"), metadata=c.admin)
    await check_summary(c)
    for _ in range(3):
        await some_decision(rng.choice(("r1", "r2")))
        await check_summary(c)
    await check_uniform_and_derived(c)


async def test_decisions_are_idempotent_and_recorded(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    await commit(
        c, s, jobs[0], [Frame(n, "save", (box("person", 0.2, 0.2, 0.1),)) for n in range(4)]
    )
    (sid,) = await all_sightings(c, "r1")
    first = await decide(c, "r1", sid, RELABEL, "worker")
    again = await decide(c, "r1", sid, RELABEL, "worker")
    assert (first.items_updated, again.items_updated) == (4, 0)
    assert again.sighting.review_state == common_pb2.REVIEW_STATE_ACCEPTED
    assert again.sighting.relabel_class == "worker"
    assert again.sighting.decided_by.display_name == "admin"
    confirmed = await decide(c, "r1", sid, CONFIRM)
    assert confirmed.items_updated == 4
    assert not confirmed.sighting.HasField("relabel_class")
    async with c.db.connection() as connection:
        logged = await connection.fetchval("SELECT count(*) FROM sighting_decisions")
    assert logged == 3


async def test_items_saved_before_sightings_are_grouped_by_maintenance(
    coordinator: CoordinatorHarness,
) -> None:
    """Items left ungrouped (box_sightings NULL, as items inserted by anything but a
    commit) are grouped by the maintenance pass exactly as a commit groups them."""
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    await commit(c, s, jobs[0], two_objects(range(0, 12)))
    before = await all_sightings(c, "r1")
    async with c.db.connection() as connection:
        await connection.execute("UPDATE bucket_items SET box_sightings = NULL")
        await connection.execute("DELETE FROM sightings")
    assert await reviews.group_backlog(c.db) == 1
    assert await all_sightings(c, "r1") == before
    await check_uniform_and_derived(c)


async def test_a_test_run_reviews_its_previews_within_its_hour(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s = await review_world(c)
    await c.workshop.CreateRun(
        run_request("t1", "watch", s.world.tracking_runtime, mode=common_pb2.RUN_MODE_TEST),
        metadata=c.admin,
    )
    job = (
        await c.jobs.Claim(
            jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE),
            metadata=s.processor,
        )
    ).job
    await c.publication.RecordPreview(record_request(job, 0, test=True), metadata=on_behalf(s))
    page = await c.workshop.GetReview(ws.GetReviewRequest(run_id="t1"), metadata=c.admin)
    assert [item.item.bucket_id for item in page.items] == [""]
    assert page.sightings == []
    assert page.recordings
    code, reason = await refused(decide(c, "t1", f"{page.items[0].item.item_id}~0", CONFIRM))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "TEST_RUN")
    c.clock.advance(timedelta(hours=1, seconds=1))
    page = await c.workshop.GetReview(ws.GetReviewRequest(run_id="t1"), metadata=c.admin)
    assert list(page.items) == []
    assert not page.has_more


async def test_a_footage_key_sees_only_its_camera_and_cannot_decide(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    await commit(c, s, jobs[0], two_objects(range(0, 4)))  # cam-a
    await commit(c, s, jobs[3], two_objects(range(0, 4)))  # cam-b
    footage = bearer_metadata(await c.key(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-b",))))
    page = await c.workshop.GetReview(ws.GetReviewRequest(run_id="r1"), metadata=footage)
    assert {item.item.camera_id for item in page.items} == {"cam-b"}
    assert {sighting.camera_id for sighting in page.sightings} == {"cam-b"}
    assert {recording.camera_id for recording in page.recordings} == {"cam-b"}
    listed = await c.workshop.ListBucketItems(
        ws.ListBucketItemsRequest(bucket_id="yard"), metadata=footage
    )
    assert {item.camera_id for item in listed.items} == {"cam-b"}
    sid = page.sightings[0].sighting_id
    code, _ = await refused(decide(c, "r1", sid, CONFIRM, metadata=footage))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    code, _ = await refused(c.workshop.GetSummary(ws.GetSummaryRequest(), metadata=footage))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    # a workshop key bound to cam-a decides there only
    bound = bearer_metadata(await c.key(Grant(ScopeName.WORKSHOP, camera_ids=("cam-a",))))
    code, _ = await refused(decide(c, "r1", sid, CONFIRM, metadata=bound))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    sightings = await all_sightings(c, "r1")
    assert all(s.review_state == common_pb2.REVIEW_STATE_PENDING for s in sightings.values())


async def test_bad_input_is_a_precise_error_and_changes_nothing(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s: Setup = await review_world(c)
    jobs = await start_run(c, s, "r1")
    await commit(c, s, jobs[0], two_objects(range(0, 3)))
    other = await start_run_after(c, s, jobs)
    sid = sorted(await all_sightings(c, "r1"))[0]
    page = await c.workshop.GetReview(
        ws.GetReviewRequest(run_id="r1", page_size=1), metadata=c.admin
    )
    invalid, not_found = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    cases: list[tuple[Awaitable[object], grpc.StatusCode, str]] = [
        (decide(c, "nope", sid, CONFIRM), not_found, "NOT_FOUND"),
        (decide(c, "r1", "it_unknown~0", CONFIRM), not_found, "NOT_FOUND"),
        (decide(c, "r1", "not-a-sighting", CONFIRM), invalid, "INVALID_FIELD"),
        (decide(c, other, sid, CONFIRM), not_found, "NOT_FOUND"),
        (decide(c, "r1", sid, ws.REVIEW_DECISION_UNSPECIFIED), invalid, "INVALID_FIELD"),
        (decide(c, "r1", sid, RELABEL), invalid, "INVALID_FIELD"),
        (decide(c, "r1", sid, RELABEL, "x" * 201), invalid, "INVALID_FIELD"),
        (decide(c, "r1", sid, RELABEL, "bad\nname"), invalid, "INVALID_FIELD"),
        (decide(c, "r1", sid, CONFIRM, "person"), invalid, "INVALID_FIELD"),
        (
            c.workshop.GetReview(
                ws.GetReviewRequest(run_id=other, page_token=page.next_page_token),
                metadata=c.admin,
            ),
            invalid,
            "INVALID_FIELD",
        ),
        (
            c.workshop.GetReview(
                ws.GetReviewRequest(run_id="r1", page_token="x|y"), metadata=c.admin
            ),
            invalid,
            "INVALID_FIELD",
        ),
        (
            c.workshop.GetReview(
                ws.GetReviewRequest(run_id="r1", page_size=1001), metadata=c.admin
            ),
            invalid,
            "INVALID_FIELD",
        ),
        (
            c.workshop.GetReview(ws.GetReviewRequest(run_id="nope"), metadata=c.admin),
            not_found,
            "NOT_FOUND",
        ),
        (
            c.workshop.GetSummary(ws.GetSummaryRequest(time_zone="Mars/Olympus"), metadata=c.admin),
            invalid,
            "INVALID_FIELD",
        ),
        (
            c.workshop.GetSummary(ws.GetSummaryRequest(days=367), metadata=c.admin),
            invalid,
            "INVALID_FIELD",
        ),
        (
            c.workshop.ListBucketItems(
                ws.ListBucketItemsRequest(bucket_id="nope"), metadata=c.admin
            ),
            not_found,
            "NOT_FOUND",
        ),
        (
            c.workshop.ListBucketItems(
                ws.ListBucketItemsRequest(
                    bucket_id="lot",
                    page_token=(
                        await c.workshop.ListBucketItems(
                            ws.ListBucketItemsRequest(bucket_id="yard", page_size=1),
                            metadata=c.admin,
                        )
                    ).next_page_token,
                ),
                metadata=c.admin,
            ),
            invalid,
            "INVALID_FIELD",
        ),
        (
            c.workshop.ListBucketItems(
                ws.ListBucketItemsRequest(
                    bucket_id="yard",
                    filter=run_pb2.BucketItemFilter(
                        review_states=[common_pb2.ReviewState.ValueType(7)]
                    ),
                ),
                metadata=c.admin,
            ),
            invalid,
            "INVALID_FIELD",
        ),
        *(
            (
                c.workshop.ListBucketItems(
                    ws.ListBucketItemsRequest(bucket_id="yard", filter=wrong), metadata=c.admin
                ),
                invalid,
                "INVALID_FIELD",
            )
            for wrong in (
                run_pb2.BucketItemFilter(min_score=0.8, max_score=0.2),
                run_pb2.BucketItemFilter(min_score=math.nan),
                run_pb2.BucketItemFilter(max_score=math.inf),
                run_pb2.BucketItemFilter(run_id="r" * 201),
            )
        ),
    ]
    before = await snapshot_of_review(c)
    for call, code, reason in cases:
        assert await refused(call) == (code, reason)
    assert await snapshot_of_review(c) == before


async def start_run_after(
    c: CoordinatorHarness, s: Setup, jobs: Sequence[jobs_pb2.ClaimedJob]
) -> str:
    """Finishes r1 (its other jobs commit nothing) and starts r2."""
    for job in jobs[1:]:
        await commit(c, s, job, [])
    await start_run(c, s, "r2")
    return "r2"


async def snapshot_of_review(c: CoordinatorHarness) -> list[object]:
    async with c.db.connection() as connection:
        return [
            await connection.fetch(f"SELECT * FROM {table} ORDER BY 1, 2")
            for table in (BOXES + " sb", "sightings", "bucket_counts", "workflow_class_counts")
        ] + [await connection.fetchval("SELECT count(*) FROM sighting_decisions")]


async def test_bucket_items_filter_and_page(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    await commit(c, s, jobs[0], two_objects(range(0, 9)))
    await commit(c, s, jobs[3], two_objects(range(0, 3)))
    vehicle = next(
        sid
        for sid, sighting in (await all_sightings(c, "r1")).items()
        if sighting.class_name == "vehicle" and sighting.camera_id == "cam-a"
    )
    await decide(c, "r1", vehicle, RELABEL, "truck")

    async def listed(**filters: object) -> list[run_pb2.BucketItem]:
        return await listed_items(c, **filters)

    everything = await listed()
    assert len(everything) == 12
    times = [(item.frame_time.ToDatetime(), item.item_id) for item in everything]
    assert times == sorted(times)
    assert len(await listed(class_name="truck")) == 3  # cam-a slots 0, 3, 6
    assert len(await listed(class_name="vehicle")) == 1  # cam-b slot 0
    assert len(await listed(camera_id="cam-b")) == 3
    assert await listed(review_states=[common_pb2.REVIEW_STATE_ACCEPTED]) == []
    start = everything[2].frame_time
    end = everything[5].frame_time
    window = await listed(frame_time_from=start, frame_time_to=end)
    assert all(start.ToDatetime() <= i.frame_time.ToDatetime() < end.ToDatetime() for i in window)
    assert window

    # score: the highest detected score of an item's boxes (0 without boxes)
    unsure = common_pb2.Box(class_name="person", score=0.3, x=0.1, y=0.1, w=0.1, h=0.1)
    await commit(c, s, jobs[1], [Frame(0, "save", (unsure,)), Frame(1, "save", ())])
    assert len(await listed(min_score=0.5)) == 12  # every box of two_objects scores 0.9
    low = await listed(max_score=0.5)
    assert sorted(len(i.boxes) for i in low) == [0, 1]
    assert [i.boxes[0].score for i in await listed(min_score=0.2, max_score=0.4)] == [
        pytest.approx(0.3)
    ]
    assert len(await listed(min_score=0.0, max_score=0.0)) == 1
    assert len(await listed(min_score=0.85, camera_id="cam-b")) == 3
    # run: a second run's items of the same bucket
    for job in (jobs[2], jobs[4], jobs[5]):
        await commit(c, s, job, [])
    second = await start_run(c, s, "r2")
    await commit(c, s, second[0], two_objects(range(0, 2)))
    theirs = await listed(run_id="r2")
    assert len(theirs) == 2
    assert {i.run_id for i in theirs} == {"r2"}
    assert len(await listed(run_id="r1")) == 14
    assert len(await listed(run_id="r2", max_score=0.5)) == 0
    assert await listed(run_id="nope") == []
    # a page token is bound to its filter, the new fields included
    first = await c.workshop.ListBucketItems(
        ws.ListBucketItemsRequest(
            bucket_id="yard", filter=run_pb2.BucketItemFilter(run_id="r1"), page_size=1
        ),
        metadata=c.admin,
    )
    for other in (
        run_pb2.BucketItemFilter(run_id="r2"),
        run_pb2.BucketItemFilter(run_id="r1", min_score=0.1),
        run_pb2.BucketItemFilter(),
    ):
        assert await refused(
            c.workshop.ListBucketItems(
                ws.ListBucketItemsRequest(
                    bucket_id="yard", filter=other, page_token=first.next_page_token
                ),
                metadata=c.admin,
            )
        ) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")


async def test_bucket_items_every_page_path_lists_the_same(
    coordinator: CoordinatorHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ListBucketItems finds a page with one of three statements (review/listing.py): the
    bucket in frame order, a page per timeline (camera, run), or the items a class, score
    floor or decided states may match, found through the sightings and the items with an
    item decision, a correction or no grouping yet. Each filter lists the same items,
    page after page, whichever is taken."""
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    await commit(c, s, jobs[0], two_objects(range(0, 9)))
    await commit(c, s, jobs[3], two_objects(range(0, 3)))
    found = await all_sightings(c, "r1")
    # cam-a's vehicle relabelled; cam-b's sightings decided, one of its people rejected
    for sid, sighting in found.items():
        if sighting.camera_id == "cam-a" and sighting.class_name == "vehicle":
            await decide(c, "r1", sid, RELABEL, "truck")
        elif sighting.camera_id == "cam-b":
            first_person = sighting.class_name == "person" and sid.endswith("~0")
            await decide(c, "r1", sid, NONE if first_person else CONFIRM)
    by_slot = {(i.camera_id, i.slot_index): i.item_id for i in await listed_items(c)}
    # item decisions relabel a cam-b frame to "bus" and reject a cam-a frame; a correction
    # leaves a cam-a frame a vehicle alone, where it had people
    await c.workshop.DecideItem(
        ws.DecideItemRequest(
            item_id=by_slot["cam-b", 1], decision=RELABEL, class_name="bus", expected_revision=0
        ),
        metadata=c.admin,
    )
    await c.workshop.CorrectItemBoxes(
        ws.CorrectItemBoxesRequest(
            item_id=by_slot["cam-a", 4],
            boxes=[
                ws.BoxCorrectionInput(
                    source_box_index=-1, class_name="vehicle", x=0.5, y=0.5, w=0.1, h=0.1
                )
            ],
            expected_revision=0,
        ),
        metadata=c.admin,
    )
    await c.workshop.DecideItem(
        ws.DecideItemRequest(item_id=by_slot["cam-a", 2], decision=NONE, expected_revision=0),
        metadata=c.admin,
    )
    async with c.db.connection() as connection:  # items no grouping reached yet
        assert len(await connection.fetch(COPY_ITEMS)) == 12
    for job in (jobs[1], jobs[2], jobs[4], jobs[5]):
        await commit(c, s, job, [])
    # r2: an unsure person beside a sure vehicle (their own sightings), then a sure person
    unsure = common_pb2.Box(class_name="person", score=0.3, x=0.1, y=0.1, w=0.1, h=0.1)
    sure = box("vehicle", 0.6, 0.6, 0.1)
    frames = [Frame(0, "save", (unsure, sure)), *two_objects(range(1, 2))]
    await commit(c, s, (await start_run(c, s, "r2"))[0], frames)
    everything = await listed_items(c)
    start, end = everything[3].frame_time, everything[20].frame_time
    accepted, rejected_state, pending = (
        common_pb2.REVIEW_STATE_ACCEPTED,
        common_pb2.REVIEW_STATE_REJECTED,
        common_pb2.REVIEW_STATE_PENDING,
    )
    filters: list[dict[str, object]] = [
        {},
        {"class_name": "person"},
        {"class_name": "vehicle"},
        {"class_name": "truck"},
        {"class_name": "bus"},
        {"class_name": "cat"},
        {"class_name": "truck", "camera_id": "cam-a"},
        {"camera_id": "cam-b"},
        {"run_id": "r1"},
        {"run_id": "r2"},
        {"run_id": "nope"},
        {"review_states": [accepted]},
        {"review_states": [rejected_state]},
        {"review_states": [accepted, rejected_state]},
        {"review_states": [pending]},
        {"min_score": 0.5},
        {"min_score": 0.95},
        {"max_score": 0.5},
        {"min_score": 0.5, "review_states": [rejected_state], "camera_id": "cam-b"},
        # each condition met by another box (sighting) of the item
        {"class_name": "person", "min_score": 0.5, "run_id": "r2"},
        {"class_name": "person", "review_states": [pending]},
        {"class_name": "truck", "review_states": [pending]},
        {"min_score": 0.5, "review_states": [accepted]},
        {"frame_time_from": start, "frame_time_to": end, "class_name": "person"},
    ]
    chosen = [[i.item_id for i in await listed_items(c, **f)] for f in filters]
    monkeypatch.setattr(listing, "SPARSE_MOST", -1)  # never through the sightings
    by_timeline = [[i.item_id for i in await listed_items(c, **f)] for f in filters]
    monkeypatch.setattr(listing, "TIMELINES_MOST", -1)  # the bucket in frame order only
    scanned = [[i.item_id for i in await listed_items(c, **f)] for f in filters]
    assert chosen == by_timeline == scanned
    counts = dict(zip((str(f) for f in filters), (len(ids) for ids in scanned), strict=True))
    assert counts[str({"class_name": "truck"})] == 3  # cam-a slots 0, 3, 6 (not the copies)
    assert counts[str({"class_name": "bus"})] == 1
    # cam-b slot 0, its copy and r2's; cam-a's copies of slots 0, 3, 6; the box added
    assert counts[str({"class_name": "vehicle"})] == 7
    assert counts[str({"class_name": "cat"})] == 0
    assert counts[str({"review_states": [accepted]})] == 3  # cam-b's, the bus's by itself
    assert counts[str({"review_states": [rejected_state]})] == 1  # the item decided NONE
    assert counts[str({"run_id": "r2"})] == 2
    assert counts[str({"class_name": "person", "min_score": 0.5, "run_id": "r2"})] == 2
    assert counts[str({"class_name": "truck", "review_states": [pending]})] == 3
    # a page token is bound to its filter
    monkeypatch.undo()
    first = await c.workshop.ListBucketItems(
        ws.ListBucketItemsRequest(
            bucket_id="yard", filter=run_pb2.BucketItemFilter(class_name="truck"), page_size=1
        ),
        metadata=c.admin,
    )
    assert await refused(
        c.workshop.ListBucketItems(
            ws.ListBucketItemsRequest(
                bucket_id="yard",
                filter=run_pb2.BucketItemFilter(class_name="bus"),
                page_token=first.next_page_token,
            ),
            metadata=c.admin,
        )
    ) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")


async def listed_items(c: CoordinatorHarness, **filters: object) -> list[run_pb2.BucketItem]:
    """Every item of bucket yard the filter keeps, two a page."""
    wanted = run_pb2.BucketItemFilter(**filters)  # type: ignore[arg-type]
    items: list[run_pb2.BucketItem] = []
    token = ""
    while True:
        page = await c.workshop.ListBucketItems(
            ws.ListBucketItemsRequest(
                bucket_id="yard", filter=wanted, page_size=2, page_token=token
            ),
            metadata=c.admin,
        )
        items.extend(page.items)
        if not page.next_page_token:
            return items
        token = page.next_page_token


async def test_an_image_read_shows_its_boxes_after_relabels(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    await commit(c, s, jobs[0], two_objects(range(0, 3)))
    sightings = await all_sightings(c, "r1")
    vehicle = next(sid for sid, found in sightings.items() if found.class_name == "vehicle")
    await decide(c, "r1", vehicle, RELABEL, "truck")
    item_id = sightings[vehicle].item_ids[0]
    reader = (*s.service, ("workshop-on-behalf-of", c.admin[0][1]))
    image = await c.publication.AuthorizeImageRead(
        pub.AuthorizeImageReadRequest(run_id="r1", item_id=item_id), metadata=reader
    )
    assert [box.class_name for box in image.boxes] == ["person", "person", "truck"]


COPY_ITEMS = """
INSERT INTO bucket_items (item_id, bucket_id, run_id, job_index, slot_index, step_id, camera_id,
                          recording_id, recording_generation, frame_time, boxes, object_key,
                          sha256, saved_at)
SELECT item_id || '-later', bucket_id, run_id, job_index, slot_index, step_id || '-later',
       camera_id, recording_id, recording_generation, frame_time + interval '1 hour', boxes,
       object_key, sha256, saved_at
FROM bucket_items WHERE run_id = 'r1'
RETURNING item_id
"""
LATER_ITEMS = """
SELECT bi.item_id || '-later' AS item_id, bi.bucket_id, bi.camera_id,
       bi.frame_time + interval '1 hour' AS frame_time,
       array_agg(b.box_index ORDER BY b.box_index) AS box_indices,
       array_agg(b.class_name ORDER BY b.box_index) AS classes,
       array_agg(array[b.x, b.y, b.w, b.h] ORDER BY b.box_index) AS geometry
FROM bucket_items bi CROSS JOIN LATERAL bucket_item_boxes_of_v1(bi.boxes) b
WHERE bi.run_id = 'r1'
GROUP BY bi.item_id
"""
# COPY_ITEMS with each item's box sightings ($1: item ids, $2: their array literals)
COPY_GROUPED = """
INSERT INTO bucket_items (item_id, bucket_id, run_id, job_index, slot_index, step_id, camera_id,
                          recording_id, recording_generation, frame_time, boxes, box_sightings,
                          object_key, sha256, saved_at)
SELECT bi.item_id || '-later', bi.bucket_id, bi.run_id, bi.job_index, bi.slot_index,
       bi.step_id || '-later', bi.camera_id, bi.recording_id, bi.recording_generation,
       bi.frame_time + interval '1 hour', bi.boxes, u.sightings::text[], bi.object_key,
       bi.sha256, bi.saved_at
FROM bucket_items bi
JOIN unnest($1::text[], $2::text[]) AS u (item_id, sightings)
    ON u.item_id = bi.item_id || '-later'
WHERE bi.run_id = 'r1'
"""
WRITES = (
    "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_xact_user_tables "
    "WHERE relname IN ('bucket_items', 'sightings')"
)


async def writes(connection: Connection) -> dict[str, tuple[int, int, int]]:
    """This backend's row writes in its transaction so far, per table."""
    return {row[0]: (row[1], row[2], row[3]) for row in await connection.fetch(WRITES)}


async def test_a_commit_writes_each_item_once_and_other_inserts_are_grouped_later(
    coordinator: CoordinatorHarness,
) -> None:
    """A commit's items are grouped before they are written, so each is one inserted row
    with its box sightings (nothing updated), and the sightings it touches are a few rows
    (reviews.group_items and Grouping.apply, as JobsApi's commit runs them around
    job_complete's insert); items inserted by anything else stay ungrouped
    (box_sightings NULL) until maintenance groups them as a commit would have."""
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    await commit(c, s, jobs[0], two_objects(range(0, 12)))
    committed = await all_sightings(c, "r1")
    async with c.db.transaction() as connection:
        items = await connection.fetch(LATER_ITEMS)
        assert len(items) == 12
        before = await writes(connection)
        camera = items[0]["camera_id"]
        grouping = await reviews.group_items(
            connection,
            "r1",
            camera,
            [
                reviews.NewItem(
                    row["item_id"],
                    row["bucket_id"],
                    row["frame_time"],
                    [
                        reviews.Detection(row["item_id"], index, row["frame_time"], name, *geometry)
                        for index, name, geometry in zip(
                            row["box_indices"], row["classes"], row["geometry"], strict=True
                        )
                    ],
                )
                for row in items
            ],
        )
        ids = [row["item_id"] for row in items]
        await connection.execute(COPY_GROUPED, ids, [grouping.literal(i) for i in ids])
        await grouping.apply(connection)
        after = await writes(connection)
    inserted, updated, _ = (
        a - b
        for a, b in zip(after["bucket_items"], before.get("bucket_items", (0, 0, 0)), strict=True)
    )
    assert (inserted, updated) == (12, 0)  # each item once, grouped
    sighting_writes = sum(after["sightings"]) - sum(before.get("sightings", (0, 0, 0)))
    # one row per new sighting and its review columns' refresh (migration 0010: the
    # queue's), none per frame
    assert sighting_writes == 2 * len(committed)
    later = await all_sightings(c, "r1")
    assert len(later) == 2 * len(committed)
    await check_uniform_and_derived(c)

    async with c.db.transaction() as connection:  # not grouped: as another writer
        await connection.execute("DELETE FROM bucket_items WHERE item_id LIKE '%-later'")
        await connection.execute("DELETE FROM sightings WHERE sighting_id LIKE '%-later~%'")
        added = [row["item_id"] for row in await connection.fetch(COPY_ITEMS)]
        assert len(added) == 12
    async with c.db.connection() as connection:
        ungrouped = await connection.fetchval(
            "SELECT count(*) FROM bucket_items WHERE box_sightings IS NULL"
        )
    assert ungrouped == 12
    assert await reviews.group_backlog(c.db) == 1
    assert await all_sightings(c, "r1") == later
    await check_uniform_and_derived(c)
