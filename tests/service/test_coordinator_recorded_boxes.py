"""A full run's item takes the boxes recorded with its preview (RoutedOutput.boxes_recorded,
migration 0021), on real Postgres over gRPC.

The processor records each frame's preview with the boxes of the frame's one output
before the job completes; its Complete then names the preview as the slot's upload and
sends no boxes, and the commit copies the recorded ones. An output that claims recorded
boxes the record cannot give (a staged upload, boxes sent as well, two outputs, a test
run) is refused and commits nothing; the same result with its boxes sent commits.
"""

from __future__ import annotations

import hashlib
import math

import grpc
import pytest

from services.coordinator.leases.boxes import box_dict
from services.coordinator.leases.results import item_id
from testbed.coordinator_leases import (
    Setup,
    claimed,
    complete_request,
    create_run,
    empty_result,
    frame_result,
    leased,
    on_behalf,
    record_request,
    setup,
    stage_upload,
)
from testbed.coordinator_world import error_reason
from testbed.harness.coordinator import CoordinatorHarness
from testbed.review_world import SIGHTINGS_MISMATCHED
from testbed.session_jobs import JOB_TRANSPORTS
from workshop.kit.metrics import REGISTRY
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import publication_pb2 as pub

BOX = common_pb2.Box(class_name="person", score=0.9, x=0.1, y=0.1, w=0.2, h=0.3)


@pytest.fixture(params=JOB_TRANSPORTS)
def job_transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs twice: on JobService's unary calls and on a Session stream."""
    return str(request.param)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def recorded(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, slot: int) -> str:
    """Slot `slot`'s preview recorded (with record_request's one box); its key."""
    request = record_request(job, slot, test=False, data=b"frame-%d" % slot)
    await c.publication.RecordPreview(request, metadata=on_behalf(s))
    return request.object_key


def frame(
    job: jobs_pb2.ClaimedJob,
    result: jobs_pb2.JobResult,
    slot: int,
    key: str,
    sha256: str,
    *,
    outputs: tuple[str, ...] = ("save",),
    boxes_too: bool = False,
) -> None:
    """Slot `slot` a frame uploaded as `key`, its outputs' boxes left to the record."""
    out = result.slots[slot]
    out.outcome = common_pb2.SLOT_OUTCOME_FRAME
    out.frame_time.CopyFrom(job.input.slots[slot].start)
    for step_id in outputs:
        out.outputs.add(step_id=step_id, boxes_recorded=True, boxes=[BOX] if boxes_too else [])
    out.upload_key = key
    out.upload_sha256 = sha256


async def item_boxes(c: CoordinatorHarness) -> dict[str, object]:
    async with c.db.connection() as connection:
        rows = await connection.fetch("SELECT item_id, boxes FROM bucket_items")
    return {row["item_id"]: row["boxes"] for row in rows}


async def refused_as_invalid(
    c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, result: jobs_pb2.JobResult
) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    code, reason, _ = error_reason(caught.value)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "RESULT_INVALID")
    assert await c.count("bucket_items") == 0
    assert await c.count("receipts") == 0
    return caught.value.details() or ""


async def test_the_claim_says_recorded_boxes_are_taken(coordinator: CoordinatorHarness) -> None:
    _, job = await leased(coordinator)
    assert job.takes_recorded_boxes


async def test_an_item_takes_the_boxes_its_preview_was_recorded_with(
    coordinator: CoordinatorHarness,
) -> None:
    """Slot 0 leaves its boxes to the record, slot 1 sends them: both items hold the same
    boxes, and review groups both into sightings."""
    c = coordinator
    s, job = await leased(c)
    result = empty_result(job)
    frame(job, result, 0, await recorded(c, s, job, 0), digest(b"frame-0"))
    key = await recorded(c, s, job, 1)
    result.slots[1].CopyFrom(
        jobs_pb2.SlotResult(
            slot_index=1,
            outcome=common_pb2.SLOT_OUTCOME_FRAME,
            frame_time=job.input.slots[1].start,
            boxes=[BOX],
            outputs=[jobs_pb2.RoutedOutput(step_id="save", boxes=[BOX])],
            upload_key=key,
            upload_sha256=digest(b"frame-1"),
        )
    )
    committed = await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    assert committed.receipt.items_saved == 2

    boxes = await item_boxes(c)
    sent = [box_dict(BOX)]
    assert boxes == {item_id("r1", 0, 0, "save"): sent, item_id("r1", 0, 1, "save"): sent}
    async with c.db.connection() as connection:
        grouped = await connection.fetchval(
            "SELECT count(*) FROM bucket_items WHERE box_sightings IS NOT NULL"
        )
        mismatched = await connection.fetch(SIGHTINGS_MISMATCHED)
    assert grouped == 2  # grouped at commit, the recorded boxes too
    assert mismatched == []  # and their sightings written


async def test_recorded_boxes_of_an_upload_staged_without_a_record_are_refused(
    coordinator: CoordinatorHarness,
) -> None:
    """A staged upload has no boxes to give: refused, nothing committed; the same frame
    with its boxes sent commits."""
    c = coordinator
    s, job = await leased(c)
    key, sha256 = await stage_upload(c, s, job, 0, b"frame-0")
    result = empty_result(job)
    frame(job, result, 0, key, sha256)
    details = await refused_as_invalid(c, s, job, result)
    assert "no recorded preview" in details

    output = result.slots[0].outputs[0]
    output.boxes_recorded = False
    output.boxes.append(BOX)
    committed = await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    assert committed.receipt.items_saved == 1
    assert await item_boxes(c) == {item_id("r1", 0, 0, "save"): [box_dict(BOX)]}


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("boxes_too", "carries no boxes"),
        ("two_outputs", "one output"),
    ],
)
async def test_recorded_boxes_that_the_record_cannot_be_are_refused(
    coordinator: CoordinatorHarness, case: str, expected: str
) -> None:
    c = coordinator
    s = await setup(c, spec_kwargs={"drop_unmatched": False})  # "drop" is an output too
    await create_run(c, s)
    job = await claimed(c, s)
    result = empty_result(job)
    key = await recorded(c, s, job, 0)
    if case == "boxes_too":
        frame(job, result, 0, key, digest(b"frame-0"), boxes_too=True)
    else:
        frame(job, result, 0, key, digest(b"frame-0"), outputs=("save", "drop"))
    assert expected in await refused_as_invalid(c, s, job, result)


async def test_recorded_boxes_in_a_test_run_are_refused(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s, job = await leased(c, full=False)
    result = empty_result(job)
    slot = result.slots[0]
    slot.outcome = common_pb2.SLOT_OUTCOME_FRAME
    slot.frame_time.CopyFrom(job.input.slots[0].start)
    slot.outputs.add(step_id="save", boxes_recorded=True)
    assert "full run" in await refused_as_invalid(c, s, job, result)


async def test_a_result_with_a_box_value_not_finite_commits_nothing(
    coordinator: CoordinatorHarness,
) -> None:
    """NaN or an infinity in any box of a result (the frame's, before rules, or an
    output's) is refused INVALID_FIELD naming it and its value; nothing is committed and
    the lease holds: the same result with finite values commits."""
    c = coordinator
    s, job = await leased(c)
    result = await frame_result(c, s, job, frames=1)
    cases = [
        ("boxes", "score", math.nan, "NaN"),
        ("outputs[0].boxes", "w", math.inf, "Infinity"),
        ("outputs[0].boxes", "y", -math.inf, "-Infinity"),
    ]
    for where, name, value, spelled in cases:
        bad = jobs_pb2.JobResult()
        bad.CopyFrom(result)
        slot = bad.slots[0]
        setattr(slot.outputs[0].boxes[0] if where != "boxes" else slot.boxes[0], name, value)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await c.jobs.Complete(complete_request(job, bad), metadata=s.processor)
        field = f"result.slots[0].{where}[0].{name}"
        assert error_reason(caught.value) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            {"field": field},
        )
        assert f"{field} is {spelled}" in (caught.value.details() or "")
        assert await c.count("bucket_items") == 0
        assert await c.count("receipts") == 0
    committed = await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    assert committed.receipt.items_saved == 1


async def recorded_batch(
    c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, slots: int
) -> list[str]:
    """The first `slots` slots' previews recorded in one batch (RecordPreviews, as the
    preview service and a session record them), each with record_request's one box:
    the coordinator remembers their boxes for the commit (leases.recorded)."""
    requests = [
        record_request(job, slot, test=False, data=b"frame-%d" % slot) for slot in range(slots)
    ]
    reply = await c.publication.RecordPreviews(
        pub.RecordPreviewsRequest(previews=requests), metadata=on_behalf(s)
    )
    assert [outcome.WhichOneof("outcome") for outcome in reply.outcomes] == ["recorded"] * slots
    return [request.object_key for request in requests]


def commits_by_source() -> dict[str, float]:
    """workshop_coordinator_commit_boxes by source, in this process (the harness's
    coordinator runs here)."""
    return {
        source: REGISTRY.get_sample_value(
            "workshop_coordinator_commit_boxes_total", {"source": source}
        )
        or 0.0
        for source in ("remembered", "rows")
    }


async def committed_from(
    c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, keys: list[str]
) -> str:
    """Commits the job, slot n a frame uploaded as keys[n] with its boxes left to the
    record; where the commit's grouping read those boxes (workshop_coordinator_commit_boxes's
    source)."""
    result = empty_result(job)
    for slot, key in enumerate(keys):
        frame(job, result, slot, key, digest(b"frame-%d" % slot))
    before = commits_by_source()
    committed = await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    assert committed.receipt.items_saved == len(keys)
    after = commits_by_source()
    [source] = [name for name in after if after[name] != before[name]]
    return source


async def sightings_of(c: CoordinatorHarness) -> tuple[list[tuple[str, int]], list[object]]:
    """(class name, item count) of every sighting, and those that disagree with the boxes
    their items hold (SIGHTINGS_MISMATCHED)."""
    async with c.db.connection() as connection:
        rows = await connection.fetch(
            "SELECT class_name, item_count FROM sightings ORDER BY class_name"
        )
        mismatched = await connection.fetch(SIGHTINGS_MISMATCHED)
    return [(row["class_name"], row["item_count"]) for row in rows], list(mismatched)


async def test_a_commit_groups_the_boxes_its_coordinator_recorded(
    coordinator: CoordinatorHarness,
) -> None:
    """Three frames recorded in a batch with the same box, left to the record: one
    sighting of the three, as the items' stored boxes say."""
    c = coordinator
    s, job = await leased(c)
    keys = await recorded_batch(c, s, job, 3)
    assert await committed_from(c, s, job, keys) == "remembered"
    # the slots are over 5 s apart: a sighting each, of the recorded box's class
    assert await sightings_of(c) == ([("person", 1)] * 3, [])


async def test_a_commit_groups_the_rows_boxes_when_a_preview_was_recorded_again_since(
    coordinator: CoordinatorHarness,
) -> None:
    """The three previews' rows recorded again since (as another coordinator replica
    would write them: other boxes, another staged_at): the commit groups the boxes the
    rows hold, not those it remembers recording, so the sightings agree with the items."""
    c = coordinator
    s, job = await leased(c)
    keys = await recorded_batch(c, s, job, 3)
    async with c.db.connection() as connection:
        await connection.execute(
            """
            UPDATE staged_objects so
            SET boxes = jsonb_build_array(jsonb_build_object(
                    'class_name', u.class_name, 'score', 0.5, 'x', 0.1, 'y', 0.1, 'w', 0.2,
                    'h', 0.3)),
                staged_at = so.staged_at + interval '1 second'
            FROM unnest($1::text[], $2::text[]) AS u (object_key, class_name)
            WHERE so.object_key = u.object_key
            """,
            keys,
            ["car", "cat", "dog"],
        )
    assert await committed_from(c, s, job, keys) == "rows"
    assert await sightings_of(c) == ([("car", 1), ("cat", 1), ("dog", 1)], [])
