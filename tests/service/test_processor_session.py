"""The processor's transport of its JobService calls (services/processor/calls.py) against
a scripted JobService on a real gRPC server: on one Session stream, answers matched to
calls by request id, an `error` answer sorted as the unary RPC's error is, a broken
stream's calls asked again on a new one, a coordinator without Session (UNIMPLEMENTED)
answered unary for good, a cancelled call's leases released; the records of written
previews on the stream, and, where the coordinator does not take them (release 0.1, or
one from before record_previews), through the preview service for good. The processor
against the real coordinator: tests/system/test_processor_session.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.processor.calls import (
    SESSION_CALLS,
    UNWRITTEN_TRIES,
    Caller,
    LeaseLost,
    RecordsNotServed,
    Refused,
    ServiceUnavailable,
    SessionJobs,
    Transport,
    job_transport,
    refusal_error,
)
from services.processor.direct_writes import DirectPreviews
from workshop.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, preview_pb2
from workshop.v1 import publication_pb2 as pub

CREDENTIALS = (("authorization", "Bearer test"),)
LEASE = common_pb2.LeaseRef(run_id="r1", job_id="j1", generation=1, token="t")
NEXT = common_pb2.LeaseRef(run_id="r1", job_id="j2", generation=1, token="u")
CALLS = ("Claim", "Heartbeat", "ReportProgress", "Complete", "Fail", "Release")
ANSWERS: dict[str, Any] = {
    "Claim": jobs_pb2.ClaimResponse,
    "Heartbeat": jobs_pb2.HeartbeatResponse,
    "ReportProgress": jobs_pb2.ReportProgressResponse,
    "Complete": jobs_pb2.CompleteResponse,
    "Fail": jobs_pb2.FailResponse,
    "Release": jobs_pb2.ReleaseResponse,
    "RecordPreviews": pub.RecordPreviewsResponse,
}
# Each SessionRequest field's method, the records of written previews included.
METHODS = {field: method for method, field in SESSION_CALLS.items()}
METHODS["record_previews"] = "RecordPreviews"

# What the scripted service does with a call: answer it (a message), refuse it
# (code, reason), or None: the default answer.
Script = Callable[[str, Any], Any]


class Refusal(Exception):
    def __init__(self, code: grpc.StatusCode, reason: str, message: str = "no") -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def _unary(method: str) -> Any:
    """A unary method of Scripted: logged, answered as its script says."""

    async def handle(self: Scripted, request: Any, context: Any) -> Any:
        return await self.unary(method, request, context)

    return handle


class Scripted(jobs_pb2_grpc.JobServiceServicer):
    """A JobService that logs each call with how it came (unary or session) and answers
    as `script` says; `gate` holds the calls `hold` names; `break_on` ends the stream
    (UNAVAILABLE) when that call arrives on it."""

    def __init__(self, *, session: bool = True) -> None:
        self.session = session
        self.log: list[tuple[str, str]] = []  # (how, method)
        self.streams = 0
        self.ended = 0  # streams ended
        self.internal_first = 0  # streams refused INTERNAL at once, before any answer
        self.script: Script = lambda _method, _request: None
        self.hold: set[str] = set()
        self.gate = asyncio.Event()
        self.waiting = 0  # calls held at the gate now
        self.all_held = asyncio.Event()  # set when every method in `hold` waits at the gate
        self.break_on: set[str] = set()
        self.refuse_stream_on: set[str] = set()  # ends the stream INVALID_ARGUMENT
        # calls it does not know (SessionRequest fields): read as a request without a call,
        # ending the stream as the coordinator does (INVALID_FIELD, field "call")
        self.unknown: set[str] = set()

    async def _answer(self, method: str, request: Any) -> Any:
        if method in self.hold:
            self.waiting += 1
            if self.waiting == len(self.hold):
                self.all_held.set()
            await self.gate.wait()
        answer = self.script(method, request)
        if isinstance(answer, Refusal):
            raise answer
        return ANSWERS[method]() if answer is None else answer

    async def unary(self, method: str, request: Any, context: Any) -> Any:
        self.log.append(("unary", method))
        try:
            return await self._answer(method, request)
        except Refusal as refusal:
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.ErrorInfo(reason=refusal.reason, domain="workshop"))
            status = rpc_status.to_status(
                status_pb2.Status(
                    code=refusal.code.value[0], message=refusal.message, details=[detail]
                )
            )
            await context.abort(status.code, status.details, status.trailing_metadata)

    Claim = _unary("Claim")
    Heartbeat = _unary("Heartbeat")
    ReportProgress = _unary("ReportProgress")
    Complete = _unary("Complete")
    Fail = _unary("Fail")
    Release = _unary("Release")

    async def Session(
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[jobs_pb2.SessionResponse]:
        if not self.session:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        if self.internal_first:
            self.internal_first -= 1
            await context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
        self.streams += 1
        answers: asyncio.Queue[jobs_pb2.SessionResponse | BaseException] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def one(request: jobs_pb2.SessionRequest) -> None:
            field = request.WhichOneof("call")
            assert field is not None
            method = METHODS[field]
            self.log.append(("session", method))
            if field in self.unknown:
                await answers.put(LookupError())
                return
            if method in self.break_on:
                self.break_on.discard(method)
                await answers.put(ConnectionResetError())
                return
            if method in self.refuse_stream_on:  # a request the stream cannot take
                await answers.put(ValueError())
                return
            response = jobs_pb2.SessionResponse(request_id=request.request_id)
            try:
                getattr(response, field).CopyFrom(
                    await self._answer(method, getattr(request, field))
                )
            except Refusal as refusal:
                response.error.CopyFrom(
                    jobs_pb2.CallError(
                        code=refusal.code.value[0], message=refusal.message, reason=refusal.reason
                    )
                )
            await answers.put(response)

        async def read() -> None:
            async for request in request_iterator:
                task = asyncio.create_task(one(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        reading = asyncio.create_task(read())
        try:
            while True:
                answer = await answers.get()
                if isinstance(answer, jobs_pb2.SessionResponse):
                    yield answer
                elif isinstance(answer, ValueError):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a bad request")
                elif isinstance(answer, LookupError):
                    detail = any_pb2.Any()
                    detail.Pack(
                        error_details_pb2.ErrorInfo(
                            reason="INVALID_FIELD", domain="workshop", metadata={"field": "call"}
                        )
                    )
                    status = rpc_status.to_status(
                        status_pb2.Status(
                            code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                            message="A SessionRequest needs a call.",
                            details=[detail],
                        )
                    )
                    await context.abort(status.code, status.details, status.trailing_metadata)
                else:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "the stream broke")
        finally:
            self.ended += 1
            reading.cancel()
            for task in list(tasks):
                task.cancel()


@asynccontextmanager
async def serving(servicer: Scripted) -> AsyncIterator[jobs_pb2_grpc.JobServiceAsyncStub]:
    server = grpc.aio.server()
    jobs_pb2_grpc.add_JobServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield jobs_pb2_grpc.JobServiceStub(channel)
    finally:
        await channel.close()
        await server.stop(None)


def heartbeat() -> jobs_pb2.HeartbeatRequest:
    return jobs_pb2.HeartbeatRequest(leases=[LEASE])


def complete() -> jobs_pb2.CompleteRequest:
    return jobs_pb2.CompleteRequest(lease=LEASE, result_sha256="x")


async def test_every_call_goes_on_one_stream_and_answers_are_matched_by_request_id() -> None:
    service = Scripted()
    service.hold = {"Claim"}  # a Claim waiting for a job holds back nothing else
    service.script = lambda method, _request: (
        jobs_pb2.ClaimResponse(job=jobs_pb2.ClaimedJob(lease=LEASE)) if method == "Claim" else None
    )
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        call = Caller(CREDENTIALS, retry_seconds=5)
        claim = asyncio.ensure_future(jobs.Claim(jobs_pb2.ClaimRequest(), metadata=CREDENTIALS))
        await call(jobs.Heartbeat, heartbeat())
        await call(jobs.ReportProgress, jobs_pb2.ReportProgressRequest(lease=LEASE, percent=5))
        assert not claim.done()
        service.gate.set()
        assert (await claim).job.lease == LEASE
        await call(jobs.Complete, complete())
        await call(jobs.Fail, jobs_pb2.FailRequest(lease=LEASE))
        await call(jobs.Release, jobs_pb2.ReleaseRequest(lease=LEASE))
        await jobs.close()
    assert service.streams == 1
    assert jobs.streams_opened == 1
    assert sorted(service.log) == sorted(("session", method) for method in CALLS)


@pytest.mark.parametrize("transport", ["session", "unary"])
@pytest.mark.parametrize(
    ("code", "reason", "raised"),
    [
        (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_MISMATCH", LeaseLost),
        (grpc.StatusCode.NOT_FOUND, "NOT_FOUND", LeaseLost),
        (grpc.StatusCode.INVALID_ARGUMENT, "RESULT_INVALID", Refused),
        (grpc.StatusCode.PERMISSION_DENIED, "SCOPE_MISSING", Refused),
        (grpc.StatusCode.UNIMPLEMENTED, "NOT_IMPLEMENTED", Refused),
        (grpc.StatusCode.INTERNAL, "INTERNAL", ServiceUnavailable),
        (grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE", ServiceUnavailable),
    ],
)
async def test_an_error_answer_is_sorted_as_the_unary_rpcs_error(
    transport: Transport, code: grpc.StatusCode, reason: str, raised: type[Exception]
) -> None:
    """One mapping: the refusal, fence or no-answer a call ends with is the same whether
    the error came as the unary RPC's status or as a CallError on the stream."""
    service = Scripted()
    service.script = lambda method, _request: (
        Refusal(code, reason, "refused here") if method == "Complete" else None
    )
    async with serving(service) as stub:
        jobs = job_transport(transport, stub)
        call = Caller(CREDENTIALS, retry_seconds=0.1)
        with pytest.raises(raised) as caught:
            await call(jobs.Complete, complete())
        await jobs.close()
    if isinstance(caught.value, Refused):
        assert (caught.value.code, caught.value.reason) == (code, reason)
    if isinstance(caught.value, LeaseLost):
        assert str(caught.value) == "refused here"
    assert {how for how, _ in service.log} == {transport}


async def test_a_call_on_a_broken_stream_is_asked_again_on_a_new_one() -> None:
    """The stream breaks while a Complete waits for its answer: the Complete is asked again
    (the same request: Complete is idempotent), on a new stream; nothing goes unary."""
    service = Scripted()
    service.break_on = {"Complete"}
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        call = Caller(CREDENTIALS, retry_seconds=10)
        await call(jobs.Heartbeat, heartbeat())
        reply = await call(jobs.Complete, complete())
        assert isinstance(reply, jobs_pb2.CompleteResponse)
        await call(jobs.Heartbeat, heartbeat())
        await jobs.close()
    assert jobs.streams_opened == service.streams == 2
    assert service.log == [
        ("session", "Heartbeat"),
        ("session", "Complete"),
        ("session", "Complete"),
        ("session", "Heartbeat"),
    ]


async def test_without_session_the_calls_go_unary_for_good(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A coordinator of release 0.1 has no Session: UNIMPLEMENTED on the stream is logged
    once, the calls waiting on it are asked unary, and every later call goes unary."""
    service = Scripted(session=False)
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        call = Caller(CREDENTIALS, retry_seconds=5)
        with caplog.at_level(logging.WARNING, "services.processor.calls"):
            first = await asyncio.gather(
                call(jobs.Heartbeat, heartbeat()), call(jobs.Complete, complete())
            )
            for _ in range(3):
                await call(jobs.ReportProgress, jobs_pb2.ReportProgressRequest(lease=LEASE))
        await jobs.close()
    assert [type(answer) for answer in first] == [
        jobs_pb2.HeartbeatResponse,
        jobs_pb2.CompleteResponse,
    ]
    assert jobs.unary
    # One stream, or a few when gRPC ended one INTERNAL before it could write to it (the
    # coordinator's UNIMPLEMENTED lost in that race: calls._Unwritten asks each of the two
    # calls again on a new one, up to UNWRITTEN_TRIES times).
    assert 1 <= jobs.streams_opened <= 2 * UNWRITTEN_TRIES
    assert sorted(service.log[:2]) == [("unary", "Complete"), ("unary", "Heartbeat")]
    assert service.log[2:] == [("unary", "ReportProgress")] * 3
    fallbacks = [r for r in caplog.records if "does not serve JobService.Session" in r.message]
    assert len(fallbacks) == 1


async def test_a_calls_deadline_ends_it_as_a_unary_calls_does() -> None:
    service = Scripted()
    service.hold = {"Release"}
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await jobs.Release(
                jobs_pb2.ReleaseRequest(lease=LEASE), metadata=CREDENTIALS, timeout=0.2
            )
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        service.gate.set()
        await jobs.Heartbeat(heartbeat(), metadata=CREDENTIALS)  # the stream goes on
        await jobs.close()
    assert service.streams == 1


async def test_the_leases_of_a_cancelled_claims_late_answer_are_released() -> None:
    """A Claim given up by its caller (a drain) is still answered on the stream; nobody
    works under the leases it hands out, so they are released at once (no attempt
    spent), as the unary Claim's cancel would have ended it at the coordinator."""
    service = Scripted()
    service.hold = {"Claim", "Complete"}
    service.script = lambda method, _request: {
        "Claim": jobs_pb2.ClaimResponse(job=jobs_pb2.ClaimedJob(lease=LEASE)),
        "Complete": jobs_pb2.CompleteResponse(
            claimed=jobs_pb2.ClaimResponse(job=jobs_pb2.ClaimedJob(lease=NEXT))
        ),
    }.get(method)
    released: list[common_pb2.LeaseRef] = []
    plain = service.script

    def script(method: str, request: Any) -> Any:
        if method == "Release":
            released.append(request.lease)
        return plain(method, request)

    service.script = script
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        claim = asyncio.ensure_future(jobs.Claim(jobs_pb2.ClaimRequest(), metadata=CREDENTIALS))
        done = asyncio.ensure_future(jobs.Complete(complete(), metadata=CREDENTIALS))
        await asyncio.wait_for(service.all_held.wait(), 10)
        claim.cancel()
        done.cancel()
        await asyncio.gather(claim, done, return_exceptions=True)
        service.gate.set()
        for _ in range(200):
            if len(released) == 2:
                break
            await asyncio.sleep(0.01)
        await jobs.close()
    assert sorted(lease.job_id for lease in released) == ["j1", "j2"]


async def test_a_waiting_claim_given_up_ends_its_stream() -> None:
    """A Claim waiting at the coordinator for a job, given up by its caller (a drain):
    as a unary Claim's cancel ends it at the coordinator, its stream ends, so it cannot
    lease a job queued later (one the stopping processor hands back, say); the next call
    opens a new stream."""
    service = Scripted()
    service.hold = {"Claim"}
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        waiting = asyncio.ensure_future(
            jobs.Claim(jobs_pb2.ClaimRequest(wait_seconds=20), metadata=CREDENTIALS, timeout=30)
        )
        await asyncio.wait_for(service.all_held.wait(), 10)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        for _ in range(200):
            if service.ended:
                break
            await asyncio.sleep(0.01)
        assert service.ended == 1
        await Caller(CREDENTIALS, retry_seconds=5)(jobs.Heartbeat, heartbeat())
        await jobs.close()
    assert jobs.streams_opened == service.streams == 2


@pytest.mark.parametrize("refused", [3, 4])
async def test_a_stream_that_ends_internal_before_any_answer_is_opened_again_at_once(
    refused: int,
) -> None:
    """gRPC ends a stream INTERNAL when it had ended before the client could write (the
    status it ended with lost: a 0.1 coordinator's UNIMPLEMENTED races so): the call is
    asked on a new stream at once, up to four streams; then its INTERNAL is no answer."""
    service = Scripted()
    service.internal_first = refused
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        if refused < 4:
            await jobs.Heartbeat(heartbeat(), metadata=CREDENTIALS)
            assert service.log == [("session", "Heartbeat")]
        else:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await jobs.Heartbeat(heartbeat(), metadata=CREDENTIALS)
            assert caught.value.code() == grpc.StatusCode.INTERNAL
        await jobs.close()
    assert jobs.streams_opened == min(refused + 1, 4)


@pytest.mark.parametrize("others", [0, 1])
async def test_a_refusal_that_ends_the_stream_answers_only_a_call_alone_on_it(
    others: int,
) -> None:
    """A request the stream cannot take ends it INVALID_ARGUMENT. Alone on the stream, the
    call gets that refusal, as its unary call would; with other calls in flight, which
    one it was is unknown, so none is answered (UNAVAILABLE: asked again) rather than
    every job with a call in flight being failed for one bad request."""
    service = Scripted()
    service.hold = {"Complete"}
    service.refuse_stream_on = {"Fail"}
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        waiting = [
            asyncio.ensure_future(jobs.Complete(complete(), metadata=CREDENTIALS))
            for _ in range(others)
        ]
        if others:
            await asyncio.wait_for(service.all_held.wait(), 10)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await jobs.Fail(jobs_pb2.FailRequest(lease=LEASE), metadata=CREDENTIALS)
        expected = grpc.StatusCode.UNAVAILABLE if others else grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.code() == expected
        for each in waiting:
            with pytest.raises(grpc.aio.AioRpcError) as broken:
                await each
            assert broken.value.code() == grpc.StatusCode.UNAVAILABLE
        await jobs.close()


# the records of written previews --------------------------------------------------------


def records(count: int) -> pub.RecordPreviewsRequest:
    return pub.RecordPreviewsRequest(
        previews=[pub.RecordPreviewRequest(lease=LEASE, slot_index=slot) for slot in range(count)]
    )


def recorded_all(method: str, request: Any) -> Any:
    """A script that records every preview of a record_previews."""
    if method != "RecordPreviews":
        return None
    return pub.RecordPreviewsResponse(
        outcomes=[
            pub.RecordPreviewOutcome(recorded=pub.RecordPreviewResponse(item_id=f"pv_{one}"))
            for one in range(len(request.previews))
        ]
    )


async def test_records_go_on_the_session() -> None:
    service = Scripted()
    service.script = recorded_all
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        call = Caller(CREDENTIALS, retry_seconds=5)
        reply = await call(jobs.RecordPreviews, records(3))
        await call(jobs.Heartbeat, heartbeat())
        await jobs.close()
    assert [outcome.recorded.item_id for outcome in reply.outcomes] == ["pv_0", "pv_1", "pv_2"]
    assert service.log == [("session", "RecordPreviews"), ("session", "Heartbeat")]
    assert service.streams == 1
    assert jobs.records


async def test_a_coordinator_without_record_previews_is_not_asked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A coordinator from before record_previews ends the stream on it (a request without a
    call it knows): the records raise RecordsNotServed, logged once, and are never sent on
    a stream again; a Claim that waited on that stream is asked again on a new one."""
    service = Scripted()
    service.unknown = {"record_previews"}
    service.hold = {"Claim"}
    service.script = lambda method, _request: (
        jobs_pb2.ClaimResponse(job=jobs_pb2.ClaimedJob(lease=LEASE)) if method == "Claim" else None
    )
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        call = Caller(CREDENTIALS, retry_seconds=10)
        with caplog.at_level(logging.WARNING, "services.processor.calls"):
            claim = asyncio.ensure_future(call(jobs.Claim, jobs_pb2.ClaimRequest()))
            await asyncio.wait_for(service.all_held.wait(), 10)
            for _ in range(3):
                with pytest.raises(RecordsNotServed):
                    await call(jobs.RecordPreviews, records(2))
            service.gate.set()
            assert (await claim).job.lease == LEASE
            await call(jobs.Heartbeat, heartbeat())
        await jobs.close()
    assert not jobs.records
    assert not jobs.unary
    assert [method for _, method in service.log].count("RecordPreviews") == 1
    assert [method for _, method in service.log].count("Claim") == 2  # asked again
    assert {how for how, _ in service.log} == {"session"}
    assert jobs.streams_opened == service.streams == 2
    notes = [r for r in caplog.records if "does not take record_previews" in r.message]
    assert len(notes) == 1


async def test_without_session_the_records_are_not_served() -> None:
    service = Scripted(session=False)
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        call = Caller(CREDENTIALS, retry_seconds=5)
        with pytest.raises(RecordsNotServed):
            await call(jobs.RecordPreviews, records(1))
        await call(jobs.Heartbeat, heartbeat())
        await jobs.close()
    assert jobs.unary
    assert service.log == [("unary", "Heartbeat")]


class FakePreviews:
    """The preview service's grants and RecordWrittenPreviews, each recording its batches."""

    def __init__(self) -> None:
        self.recorded: list[int] = []  # previews per RecordWrittenPreviews

    async def GrantPreviewWrites(self, request: Any, **_: Any) -> Any:
        expires = Timestamp(seconds=int(asyncio.get_running_loop().time()) + 10**9)
        return preview_pb2.GrantPreviewWritesResponse(
            grants=[
                preview_pb2.PreviewWriteGrant(
                    slot_index=slot, object_key=f"k/{slot}.jpg", expires_at=expires
                )
                for slot in request.slot_indices
            ]
        )

    async def RecordWrittenPreviews(self, request: Any, **_: Any) -> Any:
        self.recorded.append(len(request.previews))
        return preview_pb2.RecordWrittenPreviewsResponse(
            outcomes=[
                preview_pb2.WrittenPreviewOutcome(
                    recorded=preview_pb2.PublishPreviewResponse(item_id="pv")
                )
                for _ in request.previews
            ]
        )


class Unstored(DirectPreviews):
    """Direct writes whose bytes go nowhere: the records are what is tested."""

    def _post(self, grant: Any, image: bytes, content_type: str) -> None:
        return None


JOB = jobs_pb2.ClaimedJob(
    lease=LEASE, input=jobs_pb2.JobInput(slots=[jobs_pb2.Slot(index=i) for i in range(10)])
)


async def publish(direct: DirectPreviews, slots: range) -> None:
    for slot in slots:
        await direct.publish(JOB, slot, Timestamp(seconds=1), b"jpeg", "image/jpeg", [], "d")
    await direct.settle(LEASE)


@pytest.mark.parametrize("takes_records", [True, False])
async def test_direct_writes_record_on_the_session_or_else_through_the_preview_service(
    takes_records: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """DirectPreviews sends its batches on the session; against a coordinator that does
    not take them, the first batch goes to the preview service instead, and so does every
    later one (the session is not asked again); no record is lost either way."""
    service = Scripted()
    service.script = recorded_all
    if not takes_records:
        service.unknown = {"record_previews"}
    previews = FakePreviews()
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        call = Caller(CREDENTIALS, retry_seconds=5)
        direct = Unstored(
            cast_stub(previews),
            call,
            refusal_error,
            "c" * 64,
            records=jobs.RecordPreviews,
            linger_seconds=0.05,
        )
        with caplog.at_level(logging.INFO):
            await publish(direct, range(3))
            await publish(direct, range(3, 6))
        direct.close()
        await jobs.close()
    sent = [method for _, method in service.log].count("RecordPreviews")
    if takes_records:
        assert (sent, previews.recorded) == (2, [])
    else:
        assert (sent, previews.recorded) == (1, [3, 3])
        for logger in ("services.processor.calls", "services.processor.direct_writes"):
            notes = [r for r in caplog.records if r.name == logger]
            assert len(notes) == 1, logger
    assert direct.batches == [3, 3]


async def test_a_refused_record_on_the_session_stops_its_job() -> None:
    service = Scripted()
    service.script = lambda method, request: (
        pub.RecordPreviewsResponse(
            outcomes=[
                pub.RecordPreviewOutcome(
                    refused=pub.Refusal(
                        code=grpc.StatusCode.FAILED_PRECONDITION.value[0],
                        message="lease lapsed",
                        reason="LEASE_MISMATCH",
                    )
                )
                for _ in request.previews
            ]
        )
        if method == "RecordPreviews"
        else None
    )
    async with serving(service) as stub:
        jobs = SessionJobs(stub)
        direct = Unstored(
            cast_stub(FakePreviews()),
            Caller(CREDENTIALS, retry_seconds=5),
            refusal_error,
            "c" * 64,
            records=jobs.RecordPreviews,
            linger_seconds=0.05,
        )
        with pytest.raises(LeaseLost, match="lease lapsed"):
            await publish(direct, range(2))
        direct.close()
        await jobs.close()


def cast_stub(previews: FakePreviews) -> Any:
    return previews
