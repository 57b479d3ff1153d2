"""record_previews on a processor's Session (jobs.proto): the records of the previews a
processor wrote itself, on real Postgres over gRPC.

Each is recorded as PublicationService.RecordPreviews records the preview service's
(tests/service/test_coordinator_previews.py), with the stream's key as fence 4's
reporter: one outcome per preview in order, each fence shown both ways (a record goes
through while it holds, and is refused with its reason and a collectable row once it
does not), a malformed record refused with the field it names and recorded nowhere
(never INTERNAL), a batch of 0 or 257 refused as a whole while the stream goes on, and
every message counted as `JobService/Session/RecordPreviews`.
"""

from __future__ import annotations

import math
from typing import Any

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_leases import (
    Metadata,
    Setup,
    claimed,
    create_run,
    leased,
    on_behalf,
    preview_key,
    record_request,
    setup,
)
from testbed.coordinator_world import error_reason
from testbed.harness.coordinator import CoordinatorHarness
from testbed.session_jobs import SessionCallError, SessionStream
from tests.service.test_coordinator_previews import FENCES as UNARY_FENCES
from tests.service.test_coordinator_previews import (
    assert_garbage_now,
    changed,
    listed,
    object_keys,
    row,
    with_box,
)
from tests.service.test_coordinator_sessions import counted
from workshop.kit.auth import bearer_metadata
from workshop.kit.written_previews import MAX_IMAGE_BYTES
from workshop.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from workshop.v1 import operator_pb2 as op
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]
ON_STREAM = "workshop.v1.JobService/Session/RecordPreviews"


def stream(c: CoordinatorHarness, metadata: Metadata) -> SessionStream:
    return SessionStream(jobs_pb2_grpc.JobServiceStub(c.channel), metadata)


async def record_on(
    session: SessionStream, *previews: pub.RecordPreviewRequest
) -> list[pub.RecordPreviewOutcome]:
    """The outcomes of one record_previews message; fails on an `error` answer."""
    answer = await session.ask("record_previews", pub.RecordPreviewsRequest(previews=previews))
    assert answer.WhichOneof("answer") == "record_previews", answer
    assert len(answer.record_previews.outcomes) == len(previews)
    return list(answer.record_previews.outcomes)


def refusal(outcome: pub.RecordPreviewOutcome) -> tuple[int, str, dict[str, str]]:
    assert outcome.WhichOneof("outcome") == "refused", outcome
    return outcome.refused.code, outcome.refused.reason, dict(outcome.refused.metadata)


# what each preview answers -------------------------------------------------------------------


async def test_records_on_the_session_answer_as_the_preview_services_records(
    coordinator: CoordinatorHarness,
) -> None:
    """The batch of test_a_batch_answers_each_preview_as_a_single_call_would, sent by the
    processor on its stream: the same outcomes, statuses and rows as the preview service's
    RecordPreviews for it; counted as a Session call of its own, never as a unary one."""
    c = coordinator
    s = await setup(c)
    await create_run(c, s)
    job, stale = await claimed(c, s), await claimed(c, s)
    await c.jobs.Release(jobs_pb2.ReleaseRequest(lease=stale.lease), metadata=s.processor)
    other = await claimed(c, s)
    assert (other.lease.job_id, other.lease.generation) == ("j1", 2)
    session = stream(c, s.processor)
    before = (
        counted("workshop_rpc_requests_total", ON_STREAM, code="OK"),
        counted(
            "workshop_rpc_requests_total",
            "workshop.v1.PublicationService/RecordPreviews",
            code="OK",
        ),
    )
    try:
        [first] = await record_on(session, record_request(job, 3, test=False))
        assert first.recorded.item_id
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
        ]
        outcomes = await record_on(session, *previews)
        assert session.ended is None
    finally:
        await session.close()
    kinds = [outcome.WhichOneof("outcome") for outcome in outcomes]
    assert kinds == ["recorded", "refused", "refused", "refused", "refused", "refused", "recorded"]
    refusals = {
        index: refusal(outcome)[:2]
        for index, outcome in enumerate(outcomes)
        if outcome.HasField("refused")
    }
    invalid = (INVALID_ARGUMENT, "INVALID_FIELD")
    assert refusals == {
        1: (FAILED_PRECONDITION, "LEASE_MISMATCH"),
        2: invalid,
        3: invalid,
        4: invalid,
        5: invalid,
    }
    for index in (0, 6):
        stored = await row(c, previews[index].object_key)
        assert stored is not None
        assert stored["item_id"] == outcomes[index].recorded.item_id
        assert stored["published_at"] == c.clock.now()
        assert not outcomes[index].recorded.HasField("expires_at")  # a full run's
    garbage = [previews[index].object_key for index in (1, 3)]  # fenced, out of order
    for key in garbage:
        await assert_garbage_now(c, key)
    assert sorted(await listed(c, s)) == sorted(garbage)
    assert await row(c, preview_key(job, 5, test=False)) is None  # malformed: nowhere
    assert await row(c, previews[5].object_key) is None
    # the same previews again through the preview service's path: the same answers
    # (the recorded ones are retries now, answered as the first time)
    again = await c.publication.RecordPreviews(
        pub.RecordPreviewsRequest(previews=previews), metadata=on_behalf(s)
    )
    for index, (mine, theirs) in enumerate(zip(outcomes, again.outcomes, strict=True)):
        if index == 4:  # the session also names the field its own check refused
            assert refusal(mine)[2] == {"field": "frame_time"}
            mine.refused.ClearField("metadata")
        assert mine == theirs, index
    after = (
        counted("workshop_rpc_requests_total", ON_STREAM, code="OK"),
        counted(
            "workshop_rpc_requests_total",
            "workshop.v1.PublicationService/RecordPreviews",
            code="OK",
        ),
    )
    assert [b - a for a, b in zip(before, after, strict=True)] == [2, 1]


async def test_a_malformed_record_is_refused_with_its_field_and_recorded_nowhere(
    coordinator: CoordinatorHarness,
) -> None:
    """What the preview service checks of a written preview, the session checks the same:
    each refusal INVALID_ARGUMENT INVALID_FIELD in its outcome (never INTERNAL), the others
    of the message recorded; a batch of 0 or 257 is refused whole, and the stream goes on."""
    c = coordinator
    s, job = await leased(c, full=False)
    base = record_request(job, 0, test=True)
    bad_lease = changed(base)
    bad_lease.lease.token = "not-a-uuid"
    cases: dict[str, tuple[pub.RecordPreviewRequest, str | None]] = {
        "no content type": (changed(base, content_type=""), "content_type"),
        "an unknown content type": (changed(base, content_type="image/gif"), "content_type"),
        "a content type not its key's": (changed(base, content_type="image/png"), None),
        "no size": (changed(base, byte_size=0), "byte_size"),
        "a negative size": (changed(base, byte_size=-1), "byte_size"),
        "a size over the largest image": (
            changed(base, byte_size=MAX_IMAGE_BYTES + 1),
            "byte_size",
        ),
        "a short digest": (changed(base, sha256="abc"), "sha256"),
        "an upper-case digest": (changed(base, sha256=base.sha256.upper()), "sha256"),
        "no frame time": (changed(base, frame_time=None), "frame_time"),
        "another slot's key": (changed(base, object_key=preview_key(job, 1, test=True)), None),
        "another generation's key": (
            changed(base, object_key=preview_key(job, 0, test=True, generation=2)),
            None,
        ),
        "an upload's key": (
            changed(base, object_key="workshop-tests/uploads/r1/j0/1/0.jpg"),
            None,
        ),
        "no test prefix in a test run": (
            changed(base, object_key=preview_key(job, 0, test=False)),
            None,
        ),
        "no key": (changed(base, object_key=""), None),
        "a malformed lease": (bad_lease, None),
        "a NaN score": (with_box(base, score=math.nan), "boxes[0].score"),
        "an infinite width": (with_box(base, w=math.inf), "boxes[0].w"),
    }
    session = stream(c, s.processor)
    try:
        names = list(cases)
        outcomes = await record_on(session, *(cases[name][0] for name in names))
        for name, outcome in zip(names, outcomes, strict=True):
            code, reason, metadata = refusal(outcome)
            assert (code, reason) == (INVALID_ARGUMENT, "INVALID_FIELD"), name
            field = cases[name][1]
            if field is not None:
                assert metadata == {"field": field}, name
        assert await object_keys(c) == []
        for count in (0, 257):
            answer = await session.ask(
                "record_previews", pub.RecordPreviewsRequest(previews=[base] * count)
            )
            assert answer.WhichOneof("answer") == "error", count
            error = SessionCallError(answer.error)
            assert error_reason(error) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_FIELD",
                {"field": "previews"},
            ), count
        assert await object_keys(c) == []
        # each case differs from a valid record only by what it names; the largest size
        # passes; a malformed record does not hold back the others of its message
        largest = changed(base, byte_size=MAX_IMAGE_BYTES)
        png = changed(
            record_request(job, 1, test=True),
            object_key=preview_key(job, 1, test=True, ext="png"),
            content_type="image/png",
        )
        outcomes = await record_on(session, largest, cases["no frame time"][0], png)
        assert [outcome.WhichOneof("outcome") for outcome in outcomes] == [
            "recorded",
            "refused",
            "recorded",
        ]
        assert outcomes[0].recorded.expires_at == job.input.expires_at  # the test's hour
        assert session.ended is None
    finally:
        await session.close()
    assert await object_keys(c) == [base.object_key, png.object_key]
    stored = await row(c, base.object_key)
    assert stored is not None
    assert stored["byte_size"] == MAX_IMAGE_BYTES


# every fence, both ways, on the session ------------------------------------------------------


async def _nothing(c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob) -> None:
    return None  # the stream (another device's key) or the request (other code) differs


Breaker = Any
# The job's fences broken as for RecordPreviews (test_coordinator_previews); the reporter
# and code fences differ by the stream's key or the request, not by a change made here.
FENCES: dict[str, tuple[Breaker, str]] = {
    **{
        name: UNARY_FENCES[name]
        for name in ("lapse", "cancel", "finish", "source", "policy", "creator")
    },
    "reporter": (_nothing, "REPORTER_NOT_AUTHORIZED"),  # a stream of another device's key
    "code": (_nothing, "CODE_MISMATCH"),
}


@pytest.mark.parametrize("fence", list(FENCES))
async def test_a_fence_refuses_the_record_on_the_session_and_leaves_its_bytes_collectable(
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
    session = stream(c, s.processor)
    late = record_request(job, 1, test=False)
    try:
        [holding] = await record_on(session, record_request(job, 0, test=False))
        assert holding.recorded.item_id  # the fence holds: recorded
        breaker, reason = FENCES[fence]
        await breaker(c, s, job)
        if fence == "reporter":  # the same lease on a stream of another device's key
            await session.close()
            await c.operator.RegisterDevice(
                op.RegisterDeviceRequest(device_id="other"), metadata=c.admin
            )
            other = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="other"), name="other")
            session = stream(c, bearer_metadata(other))
        if fence == "code":
            late.code_sha256 = "e" * 64
        [outcome] = await record_on(session, late)
        assert session.ended is None
    finally:
        await session.close()
    assert refusal(outcome)[:2] == (FAILED_PRECONDITION, reason)
    await assert_garbage_now(c, late.object_key)
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


async def test_the_streams_key_revoked_refuses_its_records_as_fence_4(
    coordinator: CoordinatorHarness,
) -> None:
    """The stream authenticated once, when it opened: its key revoked meanwhile (through
    another replica: no cache of this one is emptied) reaches the statement, which refuses
    every preview of the message as fence 4 refuses the key's Heartbeat; none is recorded
    (the job's sweep finds their bytes once the job ends). A key that holds records."""
    c = coordinator
    s, job = await leased(c)
    session = stream(c, s.processor)
    try:
        [first] = await record_on(session, record_request(job, 0, test=False))
        assert first.HasField("recorded")
        async with c.db.connection() as connection:
            revoked = await connection.execute(
                "UPDATE keys SET revoked_at = $1 WHERE name = 'processor'", c.clock.now()
            )
        assert revoked == "UPDATE 1"
        later = [record_request(job, 1, test=False), record_request(job, 2, test=False)]
        outcomes = await record_on(session, *later)
        heartbeat = await session.ask("heartbeat", jobs_pb2.HeartbeatRequest(lease=job.lease))
    finally:
        await session.close()
    assert [refusal(outcome)[:2] for outcome in outcomes] == [
        (FAILED_PRECONDITION, "REPORTER_NOT_AUTHORIZED")
    ] * 2
    assert heartbeat.error.reason == "REPORTER_NOT_AUTHORIZED"
    assert await object_keys(c) == [preview_key(job, 0, test=False)]


async def test_a_session_without_a_run_key_records_nothing(
    coordinator: CoordinatorHarness,
) -> None:
    """A key that is no workshop:run key is refused when the stream opens, before any
    record (the authorization table's Session row)."""
    c = coordinator
    _, job = await leased(c)
    agent = await c.key(Grant(ScopeName.WORKSHOP), name="agent")
    session = stream(c, bearer_metadata(agent))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await record_on(session, record_request(job, 0, test=False))
    finally:
        await session.close()
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert await object_keys(c) == []
