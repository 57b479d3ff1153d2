"""Previews recorded in one fenced step (0008), the batch RecordPreviews, and the sweeps
for bytes written but never recorded, on real Postgres over gRPC (publication.proto).

The preview service writes a preview's bytes under the lease's deterministic key
before it records them, so every refused record must leave a collectable row behind
(the cleanup loop deletes those bytes), and every malformed one must leave nothing.
Each fence is shown both ways: a record goes through while it holds, and is refused,
with its reason and a collectable row, once it does not.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_leases import (
    Metadata,
    Setup,
    claimed,
    complete_request,
    create_run,
    empty_result,
    leased,
    on_behalf,
    preview_key,
    record_request,
    refused,
    setup,
)
from testbed.coordinator_world import DAY, error_reason, put_recording
from testbed.harness.coordinator import CoordinatorHarness
from testbed.session_jobs import JOB_TRANSPORTS
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2, run_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

INVALID = (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
PREVIEW = common_pb2.OBJECT_KIND_PREVIEW


@pytest.fixture(params=JOB_TRANSPORTS)
def job_transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs twice: on JobService's unary calls and on a Session stream."""
    return str(request.param)


async def row(c: CoordinatorHarness, key: str) -> dict[str, Any] | None:
    async with c.db.connection() as connection:
        found = await connection.fetchrow("SELECT * FROM staged_objects WHERE object_key = $1", key)
    return None if found is None else dict(found)


async def object_keys(c: CoordinatorHarness) -> list[str]:
    async with c.db.connection() as connection:
        rows = await connection.fetch("SELECT object_key FROM staged_objects ORDER BY object_key")
    return [found["object_key"] for found in rows]


async def collect(c: CoordinatorHarness, s: Setup) -> pub.ListCollectableObjectsResponse:
    """One cleanup pass's ListCollectableObjects(PREVIEW)."""
    reply: pub.ListCollectableObjectsResponse = await c.publication.ListCollectableObjects(
        pub.ListCollectableObjectsRequest(kind=PREVIEW, limit=100), metadata=s.service
    )
    return reply


async def sweeps(c: CoordinatorHarness, s: Setup) -> list[tuple[str, int, str]]:
    return [(one.run_id, one.job_index, one.prefix) for one in (await collect(c, s)).sweeps]


def changed(request: pub.RecordPreviewRequest, **fields: Any) -> pub.RecordPreviewRequest:
    """A copy of `request` with `fields` replaced."""
    copy = pub.RecordPreviewRequest()
    copy.CopyFrom(request)
    for name, value in fields.items():
        if name == "frame_time":
            copy.ClearField("frame_time")
            if value is not None:
                copy.frame_time.CopyFrom(value)
        else:
            setattr(copy, name, value)
    return copy


def with_box(request: pub.RecordPreviewRequest, **values: float) -> pub.RecordPreviewRequest:
    """A copy of `request` whose first box has `values` (NaN, an infinity) set."""
    copy = changed(request)
    for name, value in values.items():
        setattr(copy.boxes[0], name, value)
    return copy


def as_reader(c: CoordinatorHarness, s: Setup) -> Metadata:
    """The preview service asking for the admin (who may read every camera)."""
    return (*s.service, ("workshop-on-behalf-of", c.admin[0][1]))


async def record(
    c: CoordinatorHarness, s: Setup, request: pub.RecordPreviewRequest
) -> pub.RecordPreviewResponse:
    reply: pub.RecordPreviewResponse = await c.publication.RecordPreview(
        request, metadata=on_behalf(s)
    )
    return reply


async def assert_garbage_now(c: CoordinatorHarness, key: str) -> None:
    """A refused record's bytes: an unpublished row, collectable now, for the next pass."""
    found = await row(c, key)
    assert found is not None, key
    assert (found["kind"], found["published_at"], found["item_id"]) == ("preview", None, None)
    assert found["collectable_at"] == c.clock.now()
    assert (found["deleted_at"], found["gc_claimed_until"]) == (None, None)


async def listed(c: CoordinatorHarness, s: Setup) -> list[str]:
    """The keys one cleanup pass gets (and holds for 5 minutes)."""
    return [one.object_key for one in (await collect(c, s)).objects]


# one call records and publishes ----------------------------------------------------------------


async def test_a_preview_is_recorded_and_published_without_staging(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c, full=False)
    first = record_request(job, 0, test=True, data=b"first")
    published = await record(c, s, first)
    assert published.item_id
    assert published.expires_at == job.input.expires_at  # the test's hour
    stored = await row(c, first.object_key)
    assert stored is not None
    assert (stored["published_at"], stored["collectable_at"]) == (
        c.clock.now(),
        job.input.expires_at.ToDatetime(tzinfo=UTC),
    )
    assert (stored["sha256"], stored["byte_size"], stored["content_type"]) == (
        first.sha256,
        5,
        "image/jpeg",
    )
    assert (stored["generation"], stored["slot_index"], stored["item_id"]) == (
        1,
        0,
        published.item_id,
    )
    image = await c.publication.AuthorizeImageRead(
        pub.AuthorizeImageReadRequest(run_id="r1", item_id=published.item_id),
        metadata=as_reader(c, s),
    )
    assert (image.object_key, image.sha256, image.camera_id) == (
        first.object_key,
        first.sha256,
        "cam-a",
    )
    assert list(image.boxes) == list(first.boxes)
    assert image.expires_at == job.input.expires_at

    # the same slot again (a retry with other bytes) replaces it under the same key
    c.clock.advance(timedelta(seconds=1))
    again = changed(
        record_request(job, 0, test=True, data=b"second frame"),
        frame_time=job.input.slots[0].end,
    )
    again.boxes.add(class_name="vehicle", score=0.8, x=0.5, y=0.5, w=0.1, h=0.1)
    replaced = await record(c, s, again)
    assert replaced.item_id == published.item_id
    assert await object_keys(c) == [first.object_key]
    image = await c.publication.AuthorizeImageRead(
        pub.AuthorizeImageReadRequest(run_id="r1", item_id=published.item_id),
        metadata=as_reader(c, s),
    )
    assert (image.sha256, image.frame_time, len(image.boxes)) == (
        again.sha256,
        again.frame_time,
        2,
    )
    recent = (await c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin)).detail
    assert [(one.item_id, one.source, len(one.boxes)) for one in recent.recent_images] == [
        (published.item_id, run_pb2.IMAGE_SOURCE_PREVIEW, 2)
    ]
    assert await listed(c, s) == []  # a live preview is not garbage


async def test_a_key_or_field_the_lease_does_not_name_is_refused_and_recorded_nowhere(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c, full=False)
    base = record_request(job, 0, test=True)
    cases = {
        "another slot's key": changed(base, object_key=preview_key(job, 1, test=True)),
        "another generation's key": changed(
            base, object_key=preview_key(job, 0, test=True, generation=2)
        ),
        "another job's key": changed(base, object_key="workshop-tests/previews/r1/j1/1/0.jpg"),
        "an upload's key": changed(base, object_key="workshop-tests/uploads/r1/j0/1/0.jpg"),
        "an extension not its content type's": changed(
            base, object_key=preview_key(job, 0, test=True, ext="png")
        ),
        "a content type not its extension's": changed(base, content_type="image/png"),
        "no test prefix in a test run": changed(base, object_key=preview_key(job, 0, test=False)),
        "no key": changed(base, object_key=""),
        "an unknown content type": changed(base, content_type="image/gif"),
        "no content type, a key of no known type": changed(
            base, content_type="", object_key=preview_key(job, 0, test=True, ext="gif")
        ),
        "a short digest": changed(base, sha256="abc"),
        "an upper-case digest": changed(base, sha256=base.sha256.upper()),
        "no size": changed(base, byte_size=0),
        "a negative size": changed(base, byte_size=-1),
        "no frame time": changed(base, frame_time=None),
    }
    for name, request in cases.items():
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await c.publication.RecordPreview(request, metadata=on_behalf(s))
        assert error_reason(caught.value)[:2] == INVALID, name
    assert await object_keys(c) == []
    # each case differs from a valid record only by what it names
    await record(c, s, base)
    png = changed(
        record_request(job, 1, test=True),
        object_key=preview_key(job, 1, test=True, ext="png"),
        content_type="image/png",
    )
    await record(c, s, png)
    # a preview service from before content_type sends none: the key's extension names it
    untyped = changed(record_request(job, 2, test=True), content_type="")
    await record(c, s, untyped)
    assert await object_keys(c) == [base.object_key, png.object_key, untyped.object_key]
    stored = await row(c, untyped.object_key)
    assert stored is not None
    assert stored["content_type"] == "image/jpeg"


# every fence, both ways, leaves refused bytes collectable ----------------------------------------

Breaker = Callable[[CoordinatorHarness, Setup, jobs_pb2.ClaimedJob], Awaitable[Metadata | None]]


async def _lapse(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob) -> None:
    c.clock.advance(timedelta(minutes=5, seconds=1))  # lapsed, not yet rescued


async def _cancel(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob) -> None:
    await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)


async def _finish(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob) -> None:
    await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)


async def _replace_source(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob) -> None:
    await put_recording(c, "cam-a-0", "cam-a", DAY + timedelta(hours=8))


async def _raise_policy(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob) -> None:
    await c.operator.RaisePolicyRevision(op.RaisePolicyRevisionRequest(), metadata=c.admin)


async def _revoke_creator(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob) -> None:
    async with c.db.connection() as connection:
        key_id = await connection.fetchval("SELECT key_id FROM keys WHERE name = 'agent'")
    await c.operator.RevokeKey(op.RevokeKeyRequest(key_id=key_id), metadata=c.admin)


async def _other_device(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob) -> Metadata:
    """The preview service forwarding a key for another device than the runtime's."""
    await c.operator.RegisterDevice(op.RegisterDeviceRequest(device_id="other"), metadata=c.admin)
    other = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="other"), name="other")
    return (*s.service, ("workshop-on-behalf-of", f"Bearer {other}"))


async def _other_code(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob) -> None:
    return None  # the request itself names other code (see below)


FENCES: dict[str, tuple[Breaker, str]] = {
    "lapse": (_lapse, "LEASE_MISMATCH"),
    "cancel": (_cancel, "JOB_CANCELLED"),
    "finish": (_finish, "JOB_FINISHED"),
    "source": (_replace_source, "SOURCE_CHANGED"),
    "policy": (_raise_policy, "POLICY_CHANGED"),
    "creator": (_revoke_creator, "AUTHORITY_REVOKED"),
    "reporter": (_other_device, "REPORTER_NOT_AUTHORIZED"),
    "code": (_other_code, "CODE_MISMATCH"),
}


@pytest.mark.parametrize("fence", list(FENCES))
async def test_a_fence_refuses_the_record_and_leaves_its_bytes_collectable(
    coordinator: CoordinatorHarness, fence: str
) -> None:
    c = coordinator
    s = await setup(c)
    agent = await c.key(Grant(ScopeName.WORKSHOP), name="agent")  # the run's creator
    await c.workshop.CreateRun(
        ws.CreateRunRequest(
            run_id="r1",
            workflow_id="yard",
            runtime_id=s.world.tracking_runtime,
            revision=1,
            mode=common_pb2.RUN_MODE_FULL,
        ),
        metadata=bearer_metadata(agent),
    )
    job = await claimed(c, s)
    holding = await record(c, s, record_request(job, 0, test=False))
    assert holding.item_id
    assert not holding.HasField("expires_at")  # a full run's preview lasts until its job ends
    breaker, reason = FENCES[fence]
    metadata = await breaker(c, s, job) or on_behalf(s)
    late = record_request(job, 1, test=False)
    if fence == "code":
        late.code_sha256 = "e" * 64
    assert await refused(c.publication.RecordPreview(late, metadata=metadata)) == (
        FAILED_PRECONDITION,
        reason,
    )
    await assert_garbage_now(c, late.object_key)
    # a full run's ended job's previews too: a cancel or a finish ended it before, and a
    # refusal that can never pass (source, policy, creator) ended it in the refusing call
    ending = ("cancel", "finish", "source", "policy", "creator")
    ended = [preview_key(job, 0, test=False)] if fence in ending else []
    assert await listed(c, s) == [*ended, late.object_key]
    stored = await row(c, late.object_key)
    assert stored is not None
    assert (stored["generation"], stored["slot_index"], stored["sha256"]) == (
        1,
        1,
        late.sha256,
    )


async def test_previews_of_an_attempt_are_recorded_in_slot_order_within_its_slots(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    await record(c, s, record_request(job, 0, test=False))
    await record(c, s, record_request(job, 2, test=False))
    behind = record_request(job, 1, test=False)
    assert await refused(c.publication.RecordPreview(behind, metadata=on_behalf(s))) == INVALID
    await assert_garbage_now(c, behind.object_key)
    retried = await record(c, s, record_request(job, 2, test=False, data=b"again"))
    assert retried.item_id  # the same slot again is a retry, not out of order
    beyond = len(job.input.slots)
    outside = changed(
        record_request(job, 0, test=False),
        slot_index=beyond,
        object_key=preview_key(job, beyond, test=False),
    )
    assert await refused(c.publication.RecordPreview(outside, metadata=on_behalf(s))) == INVALID
    await assert_garbage_now(c, outside.object_key)
    assert sorted(await listed(c, s)) == sorted([behind.object_key, outside.object_key])
    # a new lease starts its own order
    await c.jobs.Release(jobs_pb2.ReleaseRequest(lease=job.lease), metadata=s.processor)
    again = await claimed(c, s)
    assert (again.lease.job_id, again.lease.generation) == ("j0", 2)
    await record(c, s, record_request(again, 0, test=False))


async def test_a_repeated_record_of_an_earlier_slot_answers_as_the_first(
    coordinator: CoordinatorHarness,
) -> None:
    """A record whose answer was lost is asked again after a later slot of the lease was
    recorded (the chaos soak met it: a batch of slots committed, its answer lost while a
    coordinator was killed). The same key with the same digest under the same lease is a
    retry, answered as the first time and the row left published; the same key with other
    bytes is still out of order."""
    c = coordinator
    s, job = await leased(c)
    first = await record(c, s, record_request(job, 0, test=False))
    await record(c, s, record_request(job, 2, test=False))
    before = await row(c, preview_key(job, 0, test=False))
    again = await record(c, s, record_request(job, 0, test=False))
    assert (again.item_id, again.expires_at) == (first.item_id, first.expires_at)
    assert await row(c, preview_key(job, 0, test=False)) == before  # untouched
    assert await listed(c, s) == []
    other_bytes = record_request(job, 0, test=False, data=b"other bytes")
    assert await refused(c.publication.RecordPreview(other_bytes, metadata=on_behalf(s))) == (
        INVALID
    )
    # a later lease of the job does not inherit the earlier lease's records
    await c.jobs.Release(jobs_pb2.ReleaseRequest(lease=job.lease), metadata=s.processor)
    second = await claimed(c, s)
    await record(c, s, record_request(second, 1, test=False))
    stale = record_request(job, 0, test=False)
    assert (await refused(c.publication.RecordPreview(stale, metadata=on_behalf(s))))[0] == (
        FAILED_PRECONDITION
    )


async def test_a_refused_retry_of_a_published_preview_leaves_it_live(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c, full=False)
    published = await record(c, s, record_request(job, 0, test=True))
    before = await row(c, preview_key(job, 0, test=True))
    await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)
    c.clock.advance(timedelta(minutes=1))
    retry = record_request(job, 0, test=True, data=b"rewritten")
    assert await refused(c.publication.RecordPreview(retry, metadata=on_behalf(s))) == (
        FAILED_PRECONDITION,
        "JOB_CANCELLED",
    )
    assert await row(c, retry.object_key) == before  # still live until the test's hour
    image = await c.publication.AuthorizeImageRead(
        pub.AuthorizeImageReadRequest(run_id="r1", item_id=published.item_id),
        metadata=as_reader(c, s),
    )
    assert image.object_key == retry.object_key
    # the same refusal for bytes no row holds does record them as garbage
    fresh = record_request(job, 1, test=True)
    assert (await refused(c.publication.RecordPreview(fresh, metadata=on_behalf(s))))[1] == (
        "JOB_CANCELLED"
    )
    assert await listed(c, s) == [fresh.object_key]


async def test_a_refused_record_of_bytes_already_deleted_records_them_again(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    c.clock.advance(timedelta(minutes=5, seconds=1))
    late = record_request(job, 0, test=False)
    assert (await refused(c.publication.RecordPreview(late, metadata=on_behalf(s))))[1] == (
        "LEASE_MISMATCH"
    )
    first_refusal = c.clock.now()
    c.clock.advance(timedelta(minutes=1))
    assert (await refused(c.publication.RecordPreview(late, metadata=on_behalf(s))))[1] == (
        "LEASE_MISMATCH"
    )
    stored = await row(c, late.object_key)
    assert stored is not None
    assert stored["collectable_at"] == first_refusal  # a row that is still garbage stays as is
    marked = await c.publication.MarkObjectsDeleted(
        pub.MarkObjectsDeletedRequest(object_keys=[late.object_key]), metadata=s.service
    )
    assert marked.marked == 1
    assert await listed(c, s) == []
    c.clock.advance(timedelta(minutes=1))
    # a processor retrying writes the bytes again before it is refused again
    assert (await refused(c.publication.RecordPreview(late, metadata=on_behalf(s))))[1] == (
        "LEASE_MISMATCH"
    )
    await assert_garbage_now(c, late.object_key)
    assert await listed(c, s) == [late.object_key]


# RecordPreviews: one outcome per preview, in request order --------------------------------------


async def test_a_batch_answers_each_preview_as_a_single_call_would(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s = await setup(c)
    await create_run(c, s)
    job, stale = await claimed(c, s), await claimed(c, s)
    await c.jobs.Release(jobs_pb2.ReleaseRequest(lease=stale.lease), metadata=s.processor)
    other = await claimed(c, s)
    assert (other.lease.job_id, other.lease.generation) == ("j1", 2)
    await record(c, s, record_request(job, 3, test=False))
    previews = [
        record_request(job, 4, test=False),
        record_request(stale, 0, test=False),
        changed(record_request(job, 5, test=False), object_key=preview_key(job, 6, test=False)),
        record_request(job, 1, test=False),  # behind slot 3
        changed(record_request(job, 6, test=False), frame_time=None),
        changed(
            record_request(job, 7, test=False),
            object_key="workshop-tests/" + preview_key(job, 7, test=False),
        ),
        record_request(other, 0, test=False),
        with_box(record_request(other, 1, test=False), score=math.nan),
    ]
    reply = await c.publication.RecordPreviews(
        pub.RecordPreviewsRequest(previews=previews), metadata=on_behalf(s)
    )
    kinds = [outcome.WhichOneof("outcome") for outcome in reply.outcomes]
    assert kinds == [
        "recorded",
        "refused",
        "refused",
        "refused",
        "refused",
        "refused",
        "recorded",
        "refused",
    ]
    refusals = {
        index: (outcome.refused.code, outcome.refused.reason)
        for index, outcome in enumerate(reply.outcomes)
        if outcome.HasField("refused")
    }
    invalid = (grpc.StatusCode.INVALID_ARGUMENT.value[0], "INVALID_FIELD")
    assert refusals == {
        1: (FAILED_PRECONDITION.value[0], "LEASE_MISMATCH"),
        2: invalid,
        3: invalid,
        4: invalid,
        5: invalid,
        7: invalid,
    }
    assert reply.outcomes[7].refused.metadata == {"field": "boxes[0].score"}
    assert reply.outcomes[7].refused.message.startswith("boxes[0].score is NaN:")
    for index in refusals:  # the single call answers the same status
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await record(c, s, previews[index])
        code, reason, metadata = error_reason(caught.value)
        refusal = reply.outcomes[index].refused
        assert (code.value[0], reason, caught.value.details(), metadata) == (
            refusal.code,
            refusal.reason,
            refusal.message,
            dict(refusal.metadata),
        ), index
    for index in (0, 6):
        stored = await row(c, previews[index].object_key)
        assert stored is not None
        assert stored["item_id"] == reply.outcomes[index].recorded.item_id
        assert stored["published_at"] == c.clock.now()
        assert not reply.outcomes[index].recorded.HasField("expires_at")
    garbage = [previews[index].object_key for index in (1, 3)]  # fenced, out of order
    for key in garbage:
        await assert_garbage_now(c, key)
    assert sorted(await listed(c, s)) == sorted(garbage)
    for key in (preview_key(job, 5, test=False), preview_key(job, 6, test=False)):
        assert await row(c, key) is None  # malformed: nothing recorded
    assert await row(c, previews[5].object_key) is None
    assert await row(c, previews[7].object_key) is None  # a NaN box: nothing recorded


async def test_a_batch_holds_one_to_256_previews(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s, job = await leased(c)
    one = record_request(job, 0, test=False)
    for count in (0, 257):
        call = c.publication.RecordPreviews(
            pub.RecordPreviewsRequest(previews=[one] * count), metadata=on_behalf(s)
        )
        assert await refused(call) == INVALID, count
    assert await object_keys(c) == []
    reply = await c.publication.RecordPreviews(
        pub.RecordPreviewsRequest(previews=[one] * 256), metadata=on_behalf(s)
    )
    assert [outcome.WhichOneof("outcome") for outcome in reply.outcomes] == ["recorded"] * 256
    assert await object_keys(c) == [one.object_key]


async def test_a_service_key_revoked_elsewhere_records_no_batch(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    first = record_request(job, 0, test=False)
    reply = await c.publication.RecordPreviews(  # the service's principal is now cached
        pub.RecordPreviewsRequest(previews=[first]), metadata=on_behalf(s)
    )
    assert reply.outcomes[0].HasField("recorded")
    async with c.db.connection() as connection:  # as a revocation through another replica
        revoked = await connection.execute(
            "UPDATE keys SET revoked_at = $1 WHERE name = 'preview-service'", c.clock.now()
        )
    assert revoked == "UPDATE 1"
    later = [record_request(job, 1, test=False), record_request(job, 2, test=False)]
    reply = await c.publication.RecordPreviews(
        pub.RecordPreviewsRequest(previews=later), metadata=on_behalf(s)
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await record(c, s, later[0])
    code, reason, _ = error_reason(caught.value)
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_REJECTED")
    assert [
        (outcome.refused.code, outcome.refused.reason, outcome.refused.message)
        for outcome in reply.outcomes
    ] == [(code.value[0], reason, caught.value.details())] * 2
    assert await object_keys(c) == [first.object_key]


# sweeps: bytes written but never recorded ---------------------------------------------------------


async def test_a_full_runs_jobs_are_swept_ten_minutes_after_they_ended_once_per_pass(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
    await claimed(c, s)  # j1 is leased: not ended, never swept
    c.clock.advance(timedelta(minutes=3))
    await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)
    assert await sweeps(c, s) == []
    c.clock.advance(timedelta(minutes=7) - timedelta(seconds=1))
    assert await sweeps(c, s) == []
    c.clock.advance(timedelta(seconds=1))  # j0 ended 10 minutes ago
    assert await sweeps(c, s) == [("r1", 0, "previews/r1/j0/")]
    assert await sweeps(c, s) == []  # held for that pass
    c.clock.advance(timedelta(minutes=3))  # j1 was cancelled 10 minutes ago
    assert await sweeps(c, s) == [("r1", 1, "previews/r1/j1/")]
    c.clock.advance(timedelta(minutes=2) - timedelta(seconds=1))
    assert await sweeps(c, s) == []
    c.clock.advance(timedelta(seconds=1))  # the first pass's hold is over
    assert await sweeps(c, s) == [("r1", 0, "previews/r1/j0/")]


async def test_a_test_runs_jobs_are_swept_once_the_run_expired(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c, full=False)
    await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
    c.clock.advance(timedelta(minutes=10))
    assert await sweeps(c, s) == []  # its previews are readable until the run expires
    async with c.db.connection() as connection:
        expires_at: datetime = await connection.fetchval(
            "SELECT expires_at FROM runs WHERE run_id = 'r1'"
        )
    c.clock.advance(expires_at - c.clock.now() - timedelta(seconds=1))
    assert await sweeps(c, s) == []
    c.clock.advance(timedelta(seconds=1))
    assert await sweeps(c, s) == [("r1", 0, "workshop-tests/previews/r1/j0/")]


async def test_settling_a_sweep_records_what_no_row_knows(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s, job = await leased(c)
    live = record_request(job, 0, test=False)
    gone = record_request(job, 1, test=False)
    for request in (live, gone):
        await record(c, s, request)
    await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
    ended = c.clock.now()  # a full run's previews became garbage with their job
    assert await listed(c, s) == [live.object_key, gone.object_key]
    await c.publication.MarkObjectsDeleted(
        pub.MarkObjectsDeletedRequest(object_keys=[gone.object_key]), metadata=s.service
    )
    c.clock.advance(timedelta(minutes=10))
    [offered] = (await collect(c, s)).sweeps
    sweep = pub.Sweep(run_id=offered.run_id, job_index=offered.job_index, prefix=offered.prefix)
    prefix = "previews/r1/j0/"
    unknown = {f"{prefix}1/2.jpg": 20, f"{prefix}2/0.png": 21}
    malformed = {f"{prefix}notes.txt": 30, f"{prefix}1/3.gif": 31, f"{prefix}x/0.jpg": 32}
    found = {live.object_key: 10, gone.object_key: 11, **unknown, **malformed}

    def settle(
        objects: dict[str, int], *, done: bool = False, of: pub.Sweep = sweep
    ) -> Awaitable[pub.SettleSweepResponse]:
        request = pub.SettleSweepRequest(
            sweep=of,
            objects=[pub.SweptObject(object_key=k, byte_size=n) for k, n in objects.items()],
            done=done,
        )
        answer: Awaitable[pub.SettleSweepResponse] = c.publication.SettleSweep(
            request, metadata=s.service
        )
        return answer

    outside = [
        "previews/r1/j1/1/0.jpg",  # another job's
        "workshop-tests/" + f"{prefix}1/9.jpg",  # a test prefix on a full run
        "previews/r1/j01/1/9.jpg",
    ]
    for key in outside:
        assert await refused(settle({f"{prefix}1/8.jpg": 1, key: 1})) == INVALID, key
    assert await row(c, f"{prefix}1/8.jpg") is None
    wrong_prefix = pub.Sweep(run_id="r1", job_index=0, prefix="previews/r1/j1/")
    assert await refused(settle(unknown, of=wrong_prefix)) == INVALID
    assert await refused(settle({f"{prefix}1/{n}.jpg": 1 for n in range(1001)})) == INVALID
    for nowhere in (
        pub.Sweep(run_id="r1", job_index=99, prefix="previews/r1/j99/"),
        pub.Sweep(run_id="nope", job_index=0, prefix="previews/nope/j0/"),
    ):
        under = {f"{nowhere.prefix}1/2.jpg": 1}
        assert (await refused(settle(under, of=nowhere)))[0] == grpc.StatusCode.NOT_FOUND
    assert len(await object_keys(c)) == 2  # no refused call recorded anything

    c.clock.advance(timedelta(seconds=1))
    settled = await settle(found)
    assert settled.recorded == len(unknown) + len(malformed) + 1  # and the deleted one
    kept = await row(c, live.object_key)
    assert kept is not None  # a known live row is untouched
    assert (kept["collectable_at"], kept["byte_size"], kept["sha256"]) == (
        ended,
        len(b"preview"),
        live.sha256,
    )
    revived = await row(c, gone.object_key)
    assert revived is not None
    assert (revived["deleted_at"], revived["collectable_at"]) == (None, c.clock.now())
    for key, size in unknown.items():
        stored = await row(c, key)
        assert stored is not None, key
        generation, slot = key.removeprefix(prefix).split("/")
        assert (
            stored["kind"],
            stored["generation"],
            stored["slot_index"],
            stored["content_type"],
            stored["byte_size"],
            stored["collectable_at"],
            stored["published_at"],
        ) == (
            "preview",
            int(generation),
            int(slot.split(".")[0]),
            "image/png" if key.endswith(".png") else "image/jpeg",
            size,
            c.clock.now(),
            None,
        )
    for key, size in malformed.items():
        stored = await row(c, key)
        assert stored is not None, key
        assert (stored["generation"], stored["slot_index"], stored["byte_size"]) == (-1, -1, size)
        assert stored["content_type"] == "application/octet-stream"
    # the live row's own bytes are still held by the pass that got the sweep
    assert set(await listed(c, s)) == {gone.object_key, *unknown, *malformed}
    assert (await settle(found)).recorded == 0  # now every one is known

    c.clock.advance(timedelta(minutes=5))
    assert await sweeps(c, s) == [("r1", 0, prefix)]  # not done: listed for the next pass
    assert (await settle({}, done=True)).recorded == 0
    async with c.db.connection() as connection:
        swept_at = await connection.fetchval(
            "SELECT previews_swept_at FROM jobs WHERE run_id = 'r1' AND job_index = 0"
        )
    assert swept_at == c.clock.now()
    c.clock.advance(timedelta(hours=1))
    assert await sweeps(c, s) == []  # done: never listed again
