"""What migrations 0004_frame_costs and 0006_drop_item_slot_unique changed per published
frame (docs/upgrading.md, 0004 and 0006), on real Postgres over gRPC.

The record, the commit's box read and the commit plan once per backend (a generic plan),
and a commit of a job whose previews fill the table still turns every one into its
item's upload. Without bucket_items' UNIQUE (run, job, slot, step), two items of one slot
and step are still refused: their ids are the same digest, which the primary key refuses.
"""

from __future__ import annotations

import hashlib

import asyncpg
import pytest

from services.coordinator.leases.results import item_id
from testbed.coordinator_leases import (
    claimed,
    complete_request,
    create_run,
    empty_result,
    on_behalf,
    record_request,
    setup,
)
from testbed.harness.coordinator import CoordinatorHarness
from workshop.v1 import common_pb2
from workshop.v1 import publication_pb2 as pub

PLANNED_ONCE = {
    "previews_record_v1",
    "job_commit_boxes_v1",
    "job_complete_v2",
    # the versions this coordinator calls
    "previews_record_v3",
    "job_commit_prepare_v2",
    "job_complete_v6",
}


async def test_the_per_frame_functions_plan_once_per_backend(
    coordinator: CoordinatorHarness,
) -> None:
    async with coordinator.db.connection() as connection:
        rows = await connection.fetch(
            "SELECT proname, proconfig FROM pg_proc WHERE proname = ANY ($1::text[])",
            sorted(PLANNED_ONCE),
        )
    assert {row["proname"] for row in rows} == PLANNED_ONCE
    for row in rows:
        assert row["proconfig"] == ["plan_cache_mode=force_generic_plan"], row["proname"]


async def test_a_full_jobs_previews_become_its_items_uploads_by_primary_key(
    coordinator: CoordinatorHarness,
) -> None:
    """Two full runs, each job's every slot recorded in one batch and named as its upload
    with the boxes left to the record: each commit saves every frame, its previews become
    uploads (never collectable), and the second commit's plan is the first one's."""
    c = coordinator
    s = await setup(c, spec_kwargs={"interval": 30, "window": (8, 9)})
    for run_id in ("r1", "r2"):
        await create_run(c, s, run_id)
        job = await claimed(c, s)
        assert job.lease.run_id == run_id
        requests = [
            record_request(job, slot.index, test=False, data=b"frame-%d" % slot.index)
            for slot in job.input.slots
        ]
        await c.publication.RecordPreviews(
            pub.RecordPreviewsRequest(previews=requests), metadata=on_behalf(s)
        )
        result = empty_result(job)
        for request, out in zip(requests, result.slots, strict=True):
            out.outcome = common_pb2.SLOT_OUTCOME_FRAME
            out.frame_time.CopyFrom(request.frame_time)
            out.outputs.add(step_id="save", boxes_recorded=True)
            out.upload_key = request.object_key
            out.upload_sha256 = hashlib.sha256(b"frame-%d" % request.slot_index).hexdigest()
        reply = await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
        assert reply.receipt.items_saved == len(requests)
        async with c.db.connection() as connection:
            kinds = await connection.fetch(
                "SELECT kind, collectable_at IS NULL AS kept, count(*) AS n "
                "FROM run_published_previews_v1($1) GROUP BY 1, 2",
                run_id,
            )
            boxes = await connection.fetchval(
                "SELECT count(*) FROM bucket_items WHERE run_id = $1 "
                'AND boxes = \'[{"class_name": "person", "score": 0.9, "x": 0.1, '
                '"y": 0.1, "w": 0.2, "h": 0.3}]\'::jsonb',
                run_id,
            )
        assert [(r["kind"], r["kept"], r["n"]) for r in kinds] == [("upload", True, len(requests))]
        assert boxes == len(requests)


async def test_two_items_of_one_slot_and_step_are_refused_without_the_unique(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s = await setup(c)
    await create_run(c, s, "r1")
    await claimed(c, s)
    async with c.db.connection() as connection:
        job_index = await connection.fetchval(
            "SELECT job_index FROM jobs WHERE run_id = 'r1' AND state = 'leased'"
        )
        constraints = await connection.fetchval(
            "SELECT array_agg(conname ORDER BY conname) FROM pg_constraint "
            "WHERE conrelid = 'bucket_items'::regclass AND contype IN ('u', 'p')"
        )
        assert constraints == ["bucket_items_pkey"]
        insert = (
            "INSERT INTO bucket_items (item_id, bucket_id, run_id, job_index, slot_index, "
            "step_id, camera_id, recording_id, recording_generation, frame_time, boxes, "
            "object_key, sha256, saved_at) "
            "SELECT $1, 'yard', j.run_id, j.job_index, 0, 'save', j.camera_id, "
            "j.recording_id, j.recording_generation, j.first_slot_at, '[]', $2, '', now() "
            "FROM jobs j WHERE j.run_id = 'r1' AND j.job_index = $3"
        )
        the_id = item_id("r1", job_index, 0, "save")
        await connection.execute(insert, the_id, "k1", job_index)
        with pytest.raises(asyncpg.UniqueViolationError, match="bucket_items_pkey"):
            await connection.execute(insert, the_id, "k2", job_index)


def test_an_item_id_is_a_digest_of_its_run_job_slot_and_step() -> None:
    """Items of different (run, job, slot, step) never share an id (separators included:
    ("r1", 12, 3) is not ("r11", 2, 3)); the same four values always give the same one."""
    values = [
        (run, job, slot, step)
        for run in ("r1", "r11", "r")
        for job in (1, 2, 12, 21)
        for slot in (0, 1, 3, 13)
        for step in ("save", "save2", "")
    ]
    ids = {item_id(*value) for value in values}
    assert len(ids) == len(values)
    assert item_id("r1", 12, 3, "save") == item_id("r1", 12, 3, "save")
