"""A full run's preview named as its slot's upload (job_complete, migration 0008), on real
Postgres over gRPC.

In a full run the processor writes each frame once: the preview's object, recorded with
RecordPreview, is named in Complete as the slot's upload (its key and digest) instead of
staging the same bytes again. The commit must then keep those bytes for the bucket item
(never garbage, never a preview again), and must refuse every preview that is not this
lease's live record of that very frame, exactly as it refuses an upload never staged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import grpc
import pytest

from services.coordinator.leases.maintenance import Maintenance
from services.coordinator.leases.results import item_id
from testbed.coordinator_leases import (
    Metadata,
    Setup,
    claimed,
    complete_request,
    create_run,
    empty_result,
    leased,
    on_behalf,
    record_request,
    refused,
    setup,
    stage_upload,
)
from testbed.coordinator_world import CODE, error_reason
from testbed.harness.coordinator import CoordinatorHarness
from testbed.session_jobs import JOB_TRANSPORTS
from workshop.kit.object_keys import object_key
from workshop.v1 import common_pb2, jobs_pb2, run_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

PREVIEW = common_pb2.OBJECT_KIND_PREVIEW
UPLOAD = common_pb2.OBJECT_KIND_UPLOAD
# What Complete answers for an upload no row backs (reason UPLOAD_NOT_STAGED in SQL).
NOT_STAGED = (grpc.StatusCode.INVALID_ARGUMENT, "RESULT_INVALID")
ALL_OBJECTS = "SELECT * FROM staged_objects ORDER BY object_key"


@pytest.fixture(params=JOB_TRANSPORTS)
def job_transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs twice: on JobService's unary calls and on a Session stream."""
    return str(request.param)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lease_key(job: jobs_pb2.ClaimedJob, slot: int) -> str:
    """The lease's preview key for a slot, as the preview service writes it."""
    lease = job.lease
    return object_key(
        "preview",
        lease.run_id,
        lease.job_id,
        lease.generation,
        slot,
        test=False,
        content_type="image/jpeg",
    )


def frame(
    result: jobs_pb2.JobResult, job: jobs_pb2.ClaimedJob, slot: int, key: str, sha256: str
) -> None:
    """Slot `slot` of `result` becomes a frame saved by `save`, with `key` as its upload."""
    out = result.slots[slot]
    out.outcome = common_pb2.SLOT_OUTCOME_FRAME
    out.frame_time.CopyFrom(job.input.slots[slot].start)
    box = common_pb2.Box(class_name="person", score=0.9, x=0.1, y=0.1, w=0.2, h=0.3)
    out.boxes.append(box)
    out.outputs.add(step_id="save", boxes=[box])
    out.upload_key = key
    out.upload_sha256 = sha256


def naming(job: jobs_pb2.ClaimedJob, slot: int, key: str, sha256: str) -> jobs_pb2.CompleteRequest:
    """Complete with one frame, slot `slot`, whose upload is `key` with `sha256`."""
    result = empty_result(job)
    frame(result, job, slot, key, sha256)
    return complete_request(job, result)


async def record(
    c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, slot: int, data: bytes
) -> pub.RecordPreviewResponse:
    request = record_request(job, slot, test=False, data=data)
    assert request.object_key == lease_key(job, slot)
    reply: pub.RecordPreviewResponse = await c.publication.RecordPreview(
        request, metadata=on_behalf(s)
    )
    return reply


async def row(c: CoordinatorHarness, key: str) -> dict[str, Any]:
    async with c.db.connection() as connection:
        found = await connection.fetchrow("SELECT * FROM staged_objects WHERE object_key = $1", key)
    assert found is not None, key
    return dict(found)


async def as_read(c: CoordinatorHarness, key: str) -> tuple[str, datetime, datetime | None]:
    """A published object as its readers see it (run_published_previews_v1 of its run): its
    kind, when it was published (an upload: committed) and when it became collectable."""
    async with c.db.connection() as connection:
        found = await connection.fetchrow(
            "SELECT p.kind, p.published_at, p.collectable_at FROM staged_objects so "
            "CROSS JOIN LATERAL run_published_previews_v1(so.run_id) p "
            "WHERE so.object_key = $1 AND p.object_key = $1",
            key,
        )
    assert found is not None, key
    return found["kind"], found["published_at"], found["collectable_at"]


async def collectable(
    c: CoordinatorHarness, s: Setup, kind: common_pb2.ObjectKind.ValueType
) -> list[str]:
    """The keys one cleanup pass gets for `kind` (held for that pass for 5 minutes)."""
    reply = await c.publication.ListCollectableObjects(
        pub.ListCollectableObjectsRequest(kind=kind, limit=100), metadata=s.service
    )
    return sorted(one.object_key for one in reply.objects)


def as_reader(c: CoordinatorHarness, s: Setup) -> Metadata:
    """The preview service asking for the admin (who may read every camera)."""
    return (*s.service, ("workshop-on-behalf-of", c.admin[0][1]))


async def read(c: CoordinatorHarness, s: Setup, item: str) -> pub.AuthorizeImageReadResponse:
    reply: pub.AuthorizeImageReadResponse = await c.publication.AuthorizeImageRead(
        pub.AuthorizeImageReadRequest(run_id="r1", item_id=item), metadata=as_reader(c, s)
    )
    return reply


async def run_detail(c: CoordinatorHarness) -> run_pb2.RunDetail:
    reply = await c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin)
    return reply.detail


async def nothing_committed(c: CoordinatorHarness) -> None:
    assert await c.count("bucket_items") == 0
    assert await c.count("receipts") == 0
    async with c.db.connection() as connection:
        states = await connection.fetch("SELECT DISTINCT state FROM jobs WHERE run_id = 'r1'")
    assert "completed" not in {one["state"] for one in states}


# a named preview becomes the item's upload ------------------------------------------------------


async def test_a_preview_named_as_an_upload_is_kept_for_its_item_and_stops_being_a_preview(
    coordinator: CoordinatorHarness,
) -> None:
    """Slot 0's preview is named as its upload; slot 1 has a preview and a staged upload
    (a preview service from before 0008); slot 2's preview belongs to a slot the result
    says is empty. Only slot 0's object is kept, as the upload of its item."""
    c = coordinator
    s, job = await leased(c)
    previews = [await record(c, s, job, slot, b"frame-%d" % slot) for slot in range(3)]
    named = lease_key(job, 0)
    live = await run_detail(c)
    assert live.run.counts.previews_published == 3
    # while the job is leased, its previews are the run's recent images
    assert sorted((one.source, one.item_id) for one in live.recent_images) == sorted(
        (run_pb2.IMAGE_SOURCE_PREVIEW, preview.item_id) for preview in previews
    )
    staged_key, staged_sha = await stage_upload(c, s, job, 1, b"frame-1")
    result = empty_result(job)
    frame(result, job, 0, named, digest(b"frame-0"))
    frame(result, job, 1, staged_key, staged_sha)
    c.clock.advance(timedelta(seconds=30))
    committed = await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    assert not committed.already_committed
    # the preview that became an upload still counts as published
    assert (await run_detail(c)).run.counts.previews_published == 3
    assert committed.receipt.items_saved == 2
    now = c.clock.now()

    async with c.db.connection() as connection:
        items = await connection.fetch(
            "SELECT item_id, slot_index, object_key, sha256 FROM bucket_items ORDER BY slot_index"
        )
    assert [tuple(one) for one in items] == [
        (item_id("r1", 0, 0, "save"), 0, named, digest(b"frame-0")),
        (item_id("r1", 0, 1, "save"), 1, staged_key, staged_sha),
    ]
    kept = await row(c, named)
    # the commit leaves its row as published (0019); every reader sees an upload since the
    # commit, as run_published_previews_v1 answers it
    assert (kept["kind"], kept["published_at"], kept["collectable_at"]) == (
        "preview",
        now - timedelta(seconds=30),
        None,
    )
    assert await as_read(c, named) == ("upload", now, None)
    assert (await row(c, staged_key))["collectable_at"] is None
    assert (kept["generation"], kept["slot_index"], kept["sha256"]) == (1, 0, digest(b"frame-0"))
    assert kept["item_id"] == previews[0].item_id  # its old image URL answers EXPIRED (below)

    # the item reads the preview's bytes, for good; the preview's own id has expired
    image = await read(c, s, item_id("r1", 0, 0, "save"))
    assert (image.object_key, image.sha256, image.camera_id) == (
        named,
        digest(b"frame-0"),
        "cam-a",
    )
    assert image.content_type == "image/jpeg"
    assert not image.HasField("expires_at")
    for gone in previews:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await read(c, s, gone.item_id)
        code, reason, metadata = error_reason(caught.value)
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "EXPIRED")
        assert metadata["id"] == f"r1/{gone.item_id}"

    # the run shows the items only: no preview of this job is listed any more
    detail = await run_detail(c)
    assert sorted((one.source, one.slot_index, one.item_id) for one in detail.recent_images) == [
        (run_pb2.IMAGE_SOURCE_ITEM, 0, item_id("r1", 0, 0, "save")),
        (run_pb2.IMAGE_SOURCE_ITEM, 1, item_id("r1", 0, 1, "save")),
    ]

    # the unnamed previews are garbage now, the named one never is
    unnamed = sorted([lease_key(job, 1), lease_key(job, 2)])
    assert await collectable(c, s, PREVIEW) == unnamed
    assert await collectable(c, s, UPLOAD) == []
    c.clock.advance(timedelta(days=1))
    await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
    listing = await c.publication.ListCollectableObjects(
        pub.ListCollectableObjectsRequest(kind=PREVIEW, limit=100), metadata=s.service
    )
    # the first pass's hold is over: the same garbage again, and still not the named one
    assert sorted(one.object_key for one in listing.objects) == unnamed
    assert await collectable(c, s, UPLOAD) == []
    # the job's sweep finds the kept object in S3: a row knows it, so it stays
    [sweep] = listing.sweeps
    assert sweep.prefix == "previews/r1/j0/"
    settled = await c.publication.SettleSweep(
        pub.SettleSweepRequest(
            sweep=sweep,
            objects=[pub.SweptObject(object_key=key, byte_size=7) for key in [named, *unnamed]],
            done=True,
        ),
        metadata=s.service,
    )
    assert settled.recorded == 0
    assert await row(c, named) == kept
    c.clock.advance(timedelta(days=1))
    for kind in (PREVIEW, UPLOAD):
        assert named not in await collectable(c, s, kind)
    assert (await read(c, s, item_id("r1", 0, 0, "save"))).object_key == named

    # deleting the bucket releases it like any upload: the upload cleanup deletes it
    await c.operator.DeleteBucket(op.DeleteBucketRequest(bucket_id="yard"), metadata=c.admin)
    assert await collectable(c, s, UPLOAD) == sorted([named, staged_key])
    assert named not in await collectable(c, s, PREVIEW)


# anything else named is refused, and nothing is committed ----------------------------------------

# A case sets the job up and answers (job, the refused request, what makes it right): the
# request names a preview that is not this lease's live record of that frame; once `fix`
# has run, the request `fix` answers commits.
Fix = Callable[[], Awaitable[jobs_pb2.CompleteRequest]]
Case = Callable[
    [CoordinatorHarness, Setup],
    Awaitable[tuple[jobs_pb2.ClaimedJob, jobs_pb2.CompleteRequest, Fix]],
]


async def _another_slots_preview(
    c: CoordinatorHarness, s: Setup
) -> tuple[jobs_pb2.ClaimedJob, jobs_pb2.CompleteRequest, Fix]:
    job = await claimed(c, s)
    await record(c, s, job, 0, b"frame")
    await record(c, s, job, 1, b"frame")  # the same bytes: only the slot differs

    async def fix() -> jobs_pb2.CompleteRequest:
        return naming(job, 0, lease_key(job, 0), digest(b"frame"))

    return job, naming(job, 0, lease_key(job, 1), digest(b"frame")), fix


async def _another_digest(
    c: CoordinatorHarness, s: Setup
) -> tuple[jobs_pb2.ClaimedJob, jobs_pb2.CompleteRequest, Fix]:
    job = await claimed(c, s)
    await record(c, s, job, 0, b"frame")

    async def fix() -> jobs_pb2.CompleteRequest:
        return naming(job, 0, lease_key(job, 0), digest(b"frame"))

    return job, naming(job, 0, lease_key(job, 0), digest(b"other bytes")), fix


async def _another_jobs_preview(
    c: CoordinatorHarness, s: Setup
) -> tuple[jobs_pb2.ClaimedJob, jobs_pb2.CompleteRequest, Fix]:
    job, other = await claimed(c, s), await claimed(c, s)
    assert (other.lease.job_id, other.lease.generation) == ("j1", job.lease.generation)
    await record(c, s, other, 0, b"frame")  # the same generation, slot and bytes

    async def fix() -> jobs_pb2.CompleteRequest:
        await record(c, s, job, 0, b"frame")
        return naming(job, 0, lease_key(job, 0), digest(b"frame"))

    return job, naming(job, 0, lease_key(other, 0), digest(b"frame")), fix


async def _an_earlier_leases_preview(
    c: CoordinatorHarness, s: Setup
) -> tuple[jobs_pb2.ClaimedJob, jobs_pb2.CompleteRequest, Fix]:
    first = await claimed(c, s)
    await record(c, s, first, 0, b"frame")
    c.clock.advance(timedelta(minutes=5, seconds=1))
    done = await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
    assert done.requeued == 1
    job = await claimed(c, s)
    assert (job.lease.job_id, job.lease.generation) == ("j0", 2)

    async def fix() -> jobs_pb2.CompleteRequest:
        await record(c, s, job, 0, b"frame")
        return naming(job, 0, lease_key(job, 0), digest(b"frame"))

    return job, naming(job, 0, lease_key(first, 0), digest(b"frame")), fix


async def _a_refused_record(
    c: CoordinatorHarness, s: Setup
) -> tuple[jobs_pb2.ClaimedJob, jobs_pb2.CompleteRequest, Fix]:
    """The record of this very frame was refused (another code; the lease holds), which
    leaves an unpublished, collectable row; a record with the run's code publishes it."""
    job = await claimed(c, s)
    wrong = record_request(job, 0, test=False, data=b"frame")
    wrong.code_sha256 = "e" * 64
    assert await refused(c.publication.RecordPreview(wrong, metadata=on_behalf(s))) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "CODE_MISMATCH",
    )
    assert (await row(c, lease_key(job, 0)))["collectable_at"] == c.clock.now()
    request = naming(job, 0, lease_key(job, 0), digest(b"frame"))

    async def fix() -> jobs_pb2.CompleteRequest:
        await record(c, s, job, 0, b"frame")
        return request

    return job, request, fix


async def _a_preview_handed_to_the_cleanup_loop(
    c: CoordinatorHarness, s: Setup
) -> tuple[jobs_pb2.ClaimedJob, jobs_pb2.CompleteRequest, Fix]:
    """A published preview of this lease already collectable. No call makes one while
    the lease holds (the job's end or a lapse does), so the state is set in the table:
    the commit must never keep bytes the cleanup loop may be deleting."""
    job = await claimed(c, s)
    await record(c, s, job, 0, b"frame")
    async with c.db.connection() as connection:
        await connection.execute(
            "UPDATE staged_objects SET collectable_at = $2 WHERE object_key = $1",
            lease_key(job, 0),
            c.clock.now(),
        )
    request = naming(job, 0, lease_key(job, 0), digest(b"frame"))

    async def fix() -> jobs_pb2.CompleteRequest:
        await record(c, s, job, 0, b"frame")  # a retry under the lease records it again
        return request

    return job, request, fix


async def _a_preview_staged_never_recorded(
    c: CoordinatorHarness, s: Setup
) -> tuple[jobs_pb2.ClaimedJob, jobs_pb2.CompleteRequest, Fix]:
    """StageObject(PREVIEW) named the key, but the preview was never recorded."""
    job = await claimed(c, s)
    staged = await c.publication.StageObject(
        pub.StageObjectRequest(
            lease=job.lease,
            code_sha256=CODE,
            kind=PREVIEW,
            slot_index=0,
            sha256=digest(b"frame"),
            byte_size=len(b"frame"),
            content_type="image/jpeg",
        ),
        metadata=on_behalf(s),
    )
    assert staged.object_key == lease_key(job, 0)
    request = naming(job, 0, staged.object_key, digest(b"frame"))

    async def fix() -> jobs_pb2.CompleteRequest:
        await record(c, s, job, 0, b"frame")
        return request

    return job, request, fix


CASES: dict[str, Case] = {
    "another slot's preview": _another_slots_preview,
    "another digest": _another_digest,
    "another job's preview": _another_jobs_preview,
    "an earlier lease's preview": _an_earlier_leases_preview,
    "a refused (collectable) record": _a_refused_record,
    "a preview staged, never recorded": _a_preview_staged_never_recorded,
    "a preview handed to the cleanup loop": _a_preview_handed_to_the_cleanup_loop,
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_preview_that_is_not_this_leases_record_of_the_frame_is_refused_as_an_upload(
    coordinator: CoordinatorHarness, case: str
) -> None:
    c = coordinator
    s = await setup(c)
    await create_run(c, s)
    job, request, fix = await CASES[case](c, s)
    async with c.db.connection() as connection:
        before = [dict(one) for one in await connection.fetch(ALL_OBJECTS)]
    assert await refused(c.jobs.Complete(request, metadata=s.processor)) == NOT_STAGED
    await nothing_committed(c)
    async with c.db.connection() as connection:
        after = [dict(one) for one in await connection.fetch(ALL_OBJECTS)]
    assert after == before  # no row changed kind, state or expiry
    # the same commit, once it names this lease's live record of the frame, goes through
    good = await fix()
    committed = await c.jobs.Complete(good, metadata=s.processor)
    assert committed.receipt.items_saved == 1
    [slot] = [one for one in good.result.slots if one.upload_key]
    kept = await row(c, slot.upload_key)
    assert kept["collectable_at"] is None
    if kept["published_at"] is None:  # a staged upload
        assert kept["kind"] == "upload"
    else:  # a published preview, an upload since the commit
        assert (await as_read(c, slot.upload_key))[0] == "upload"
    assert kept["generation"] == job.lease.generation
