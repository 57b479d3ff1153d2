"""JobService: translates the contract to JobsApi calls and back."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from datetime import timedelta
from functools import lru_cache, partial
from typing import Any, Protocol

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message

from services.coordinator import convert
from services.coordinator.identity.auth import Principal
from services.coordinator.leases.jobs import (
    HEARTBEAT_INTERVAL,
    PHASES,
    ClaimAsk,
    Claimed,
    JobsApi,
    job_id,
    reporter,
)
from services.coordinator.platform.errors import InvalidField
from services.coordinator.previews.publication import (
    MAX_RECORD_BATCH,
    PreviewRecord,
    PublicationApi,
)
from services.coordinator.runs.events import RunEvents
from services.coordinator.servicers.common import Authenticator, Context
from services.coordinator.servicers.lease_attestation import LeaseAttester
from services.coordinator.servicers.views import (
    PreviewBoxes,
    lease,
    leases,
    preview_record,
    previews_boxes,
    previews_response,
    snapshot_recording,
)
from workshop.kit.auth import bearer_secret
from workshop.kit.errors import ResourceExhausted, WorkshopError
from workshop.kit.interceptors import error_status
from workshop.kit.lease_attestation import credential_sha256
from workshop.kit.rpc_metrics import observe_call
from workshop.kit.written_previews import MAX_IMAGE_BYTES, check_written_preview
from workshop.v1 import common_pb2, jobs_pb2_grpc
from workshop.v1 import jobs_pb2 as pb
from workshop.v1 import publication_pb2 as pub

NO_JOB_RETRY_AFTER = timedelta(seconds=2)
MAX_CLAIM_WAIT_SECONDS = 60
# A waiting Claim answers this long before the call's deadline, so the answer arrives.
DEADLINE_MARGIN_SECONDS = 1.0
# Calls in flight on one Session stream; one more is answered RESOURCE_EXHAUSTED.
MAX_SESSION_CALLS = 64

# A claimed job's signed lease attestation, given the job and its lease.
Attest = Callable[[Claimed, common_pb2.LeaseRef], pub.LeaseAttestation]


def duration(value: timedelta) -> Duration:
    out = Duration()
    out.FromTimedelta(value)
    return out


@lru_cache(maxsize=1024)
def _slots_wire(first_us: int, count: int, interval_us: int, window_end_us: int) -> bytes:
    """A job's slots as the wire bytes of a JobInput holding only them, in integer
    microseconds (about 20x cheaper than a datetime and a Timestamp.FromDatetime per
    bound), shared by every job on the same slot grid. A claim merges them into its
    answer: one parse in C, where copying 60 Slot messages into a repeated field took
    five times as long (18 us of a short job's claim, measured)."""
    given = pb.JobInput()
    for index in range(count):
        start = first_us + index * interval_us
        end = min(start + interval_us, window_end_us)
        given.slots.add(index=index, start=convert.stamp(start), end=convert.stamp(end))
    return given.SerializeToString()


def claimed_job(
    claimed: Claimed,
    interval: timedelta = HEARTBEAT_INTERVAL,
    attest: Attest | None = None,
    *,
    into: pb.ClaimedJob | None = None,
) -> pb.ClaimedJob:
    """The job as a ClaimResponse carries it, written into `into` (a field of the answer
    being built: each message built elsewhere is copied again when set) or a new one."""
    job, frozen = claimed.job, claimed.frozen
    out = pb.ClaimedJob() if into is None else into
    lease = out.lease
    lease.run_id = job.run_id
    lease.job_id = job_id(job.job_index)
    lease.generation = job.generation
    lease.token = str(job.lease_token)
    convert.set_ts(out.lease_expires_at, job.lease_expires_at)
    out.heartbeat_interval.FromTimedelta(interval)
    given = out.input
    given.MergeFromString(
        _slots_wire(
            convert.micros(job.facts.first_slot_at),
            job.facts.slot_count,
            job.facts.interval_ms * 1_000,
            convert.micros(frozen.window_end),
        )
    )
    given.job_id = lease.job_id
    given.job_index = job.job_index
    given.recording.CopyFrom(snapshot_recording(job.recording()))
    convert.set_ts(given.expires_at, job.expires_at)
    out.snapshot.CopyFrom(frozen.snapshot)
    out.takes_recorded_boxes = True  # every coordinator of release 0.1 on takes them
    if attest is not None:
        out.lease_attestation.CopyFrom(attest(claimed, lease))
    return out


def claim_response(
    claimed: list[Claimed],
    interval: timedelta = HEARTBEAT_INTERVAL,
    attest: Attest | None = None,
) -> pb.ClaimResponse:
    response = pb.ClaimResponse()
    claimed_job(claimed[0], interval, attest, into=response.job)
    for one in claimed[1:]:
        claimed_job(one, interval, attest, into=response.more_jobs.add())
    return response


class Caller(Protocol):
    """Who is calling, and how long the call may still take: a unary call's context, or a
    session stream's (whose credential was authenticated once, when it opened)."""

    async def principal(self) -> Principal: ...

    def time_remaining(self) -> float | None: ...

    def credential_sha256(self) -> str: ...


@dataclasses.dataclass(frozen=True, slots=True)
class UnaryCaller:
    """A unary call: its credential authenticated through the principal cache, when the
    handler asks for it (some check fields first), and its deadline."""

    who: Authenticator
    context: Context

    async def principal(self) -> Principal:
        return await self.who.cached(self.context)

    def time_remaining(self) -> float | None:
        return self.context.time_remaining()

    def credential_sha256(self) -> str:
        return credential_sha256(bearer_secret(self.context.invocation_metadata()))


@dataclasses.dataclass(frozen=True, slots=True)
class SessionCaller:
    """A call on a session stream: the principal the stream authenticated when it opened,
    and the stream's deadline (None without one)."""

    who: Principal
    context: Context

    async def principal(self) -> Principal:
        return self.who

    def time_remaining(self) -> float | None:
        return self.context.time_remaining()

    def credential_sha256(self) -> str:
        return credential_sha256(bearer_secret(self.context.invocation_metadata()))


class JobServicer(jobs_pb2_grpc.JobServiceServicer):
    def __init__(
        self,
        api: JobsApi,
        authenticate: Authenticator,
        events: RunEvents,
        publication: PublicationApi,
        *,
        max_image_bytes: int = MAX_IMAGE_BYTES,
        attester: LeaseAttester | None = None,
    ) -> None:
        self.api = api
        self.attester = attester  # None: claims carry no lease attestation
        self.who = authenticate
        self.events = events
        self.publication = publication  # a Session's record_previews
        self.max_image_bytes = max_image_bytes

    # Every unary call authenticates through the principal cache, and a Session once, when
    # it opens: job_claim checks the claiming key and every fenced write the reporting key
    # again, in SQL. Each RPC is one function of (caller, request), which the unary method
    # and the Session's message of that call both run, so they answer alike.

    async def Claim(self, request: pb.ClaimRequest, context: Context) -> pb.ClaimResponse:
        return await self.claim(UnaryCaller(self.who, context), request)

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: Context
    ) -> pb.HeartbeatResponse:
        return await self.heartbeat(UnaryCaller(self.who, context), request)

    async def ReportProgress(
        self, request: pb.ReportProgressRequest, context: Context
    ) -> pb.ReportProgressResponse:
        return await self.report_progress(UnaryCaller(self.who, context), request)

    async def Complete(self, request: pb.CompleteRequest, context: Context) -> pb.CompleteResponse:
        return await self.complete(UnaryCaller(self.who, context), request)

    async def Fail(self, request: pb.FailRequest, context: Context) -> pb.FailResponse:
        return await self.fail(UnaryCaller(self.who, context), request)

    async def Release(self, request: pb.ReleaseRequest, context: Context) -> pb.ReleaseResponse:
        return await self.release(UnaryCaller(self.who, context), request)

    async def Session(
        self, request_iterator: AsyncIterator[pb.SessionRequest], context: Context
    ) -> AsyncIterator[pb.SessionResponse]:
        """A processor's session (jobs.proto; docs/leases-and-fences.md#sessions)."""
        who = await self.who.cached(context)
        reporter(who)  # what every call on it needs: a workshop:run (or admin) key
        session = _Session(self, SessionCaller(who, context))
        async with aclosing(session.answers(request_iterator)) as answers:
            async for answer in answers:
                yield answer

    # The calls, each as its unary RPC answers it.

    async def claim(self, caller: Caller, request: pb.ClaimRequest) -> pb.ClaimResponse:
        if request.wait_seconds > MAX_CLAIM_WAIT_SECONDS:
            raise InvalidField(f"wait_seconds must be 0..{MAX_CLAIM_WAIT_SECONDS}.")
        who = await caller.principal()
        wait = float(request.wait_seconds)
        remaining = caller.time_remaining()
        if remaining is not None:
            wait = min(wait, remaining - DEADLINE_MARGIN_SECONDS)
        claimed = await self.api.claim_waiting(
            who,
            ClaimAsk(request.runtime_id, request.code_sha256, request.request_id, request.max_jobs),
            wait,
            self.events,
        )
        if claimed:
            return self._claim_response(caller, claimed)
        # after a wait, the next Claim may come at once: it waits in turn
        retry_after = timedelta(0) if request.wait_seconds else NO_JOB_RETRY_AFTER
        return pb.ClaimResponse(retry_after=duration(retry_after))

    async def heartbeat(self, caller: Caller, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        if not request.leases:  # one lease: a refusal is the call's error
            renewed = await self.api.heartbeat(await caller.principal(), lease(request.lease))
            return pb.HeartbeatResponse(lease_expires_at=convert.ts(renewed))
        if request.HasField("lease"):
            raise InvalidField("Send lease or leases, not both.")
        answers = await self.api.heartbeat_many(await caller.principal(), leases(request.leases))
        return pb.HeartbeatResponse(
            renewals=[
                pb.LeaseRenewal(
                    lease=ref,
                    renewed=not reason,
                    lease_expires_at=convert.ts(expires) if expires is not None else None,
                    reason=reason,
                )
                for ref, (reason, expires) in zip(request.leases, answers, strict=True)
            ]
        )

    async def report_progress(
        self, caller: Caller, request: pb.ReportProgressRequest
    ) -> pb.ReportProgressResponse:
        phase = None
        if request.HasField("phase"):
            if request.phase == common_pb2.JOB_PHASE_UNSPECIFIED:
                raise InvalidField("phase, when given, must be a real phase.")
            phase = common_pb2.JobPhase.Name(request.phase).removeprefix("JOB_PHASE_").lower()
            assert phase in PHASES
        percent, persisted, renewed = await self.api.progress(
            await caller.principal(), lease(request.lease), request.percent, phase
        )
        return pb.ReportProgressResponse(
            percent=percent, persisted=persisted, lease_expires_at=convert.ts(renewed)
        )

    async def complete(self, caller: Caller, request: pb.CompleteRequest) -> pb.CompleteResponse:
        who = await caller.principal()
        then = None
        if request.HasField("then_claim"):
            ask = request.then_claim
            if ask.wait_seconds:
                raise InvalidField("then_claim.wait_seconds must be 0: Complete does not wait.")
            then = ClaimAsk(ask.runtime_id, ask.code_sha256, ask.request_id, ask.max_jobs)
        receipt, already, claimed = await self.api.complete_then_claim(
            who,
            lease(request.lease),
            code_sha256=request.code_sha256,
            result=request.result,
            result_sha256=request.result_sha256,
            decoder=request.decoder,
            then=then,
        )
        return pb.CompleteResponse(
            receipt=pb.Receipt(
                run_id=receipt.run_id,
                job_id=job_id(receipt.job_index),
                generation=receipt.generation,
                result_sha256=receipt.result_sha256,
                committed_at=convert.ts(receipt.committed_at),
                items_saved=receipt.items_saved,
            ),
            already_committed=already,
            claimed=None if claimed is None else self._claimed(caller, claimed),
        )

    def _claimed(self, caller: Caller, claimed: list[Claimed]) -> pb.ClaimResponse:
        """Complete's next claim: its jobs, or when none was queued when to ask again."""
        if not claimed:
            return pb.ClaimResponse(retry_after=duration(NO_JOB_RETRY_AFTER))
        return self._claim_response(caller, claimed)

    def _claim_response(self, caller: Caller, claimed: list[Claimed]) -> pb.ClaimResponse:
        """The jobs claimed, each with its lease attested to the claiming key when this
        coordinator has an attestation key."""
        attest: Attest | None = None
        if self.attester is not None:
            attest = partial(self.attester.attest, credential_sha256=caller.credential_sha256())
        return claim_response(claimed, self.api.heartbeat_interval, attest)

    async def fail(self, caller: Caller, request: pb.FailRequest) -> pb.FailResponse:
        who = await caller.principal()  # the credential before the request's fields
        if request.reason != common_pb2.FAILURE_REASON_PROCESSOR_FAILED:
            raise InvalidField("reason must be PROCESSOR_FAILED; lapses are the coordinator's.")
        await self.api.fail(who, lease(request.lease), request.message)
        return pb.FailResponse(state=common_pb2.JOB_STATE_FAILED)

    async def release(self, caller: Caller, request: pb.ReleaseRequest) -> pb.ReleaseResponse:
        await self.api.release(await caller.principal(), lease(request.lease))
        return pb.ReleaseResponse(state=common_pb2.JOB_STATE_QUEUED)

    async def record_previews(
        self, caller: Caller, request: pub.RecordPreviewsRequest
    ) -> pub.RecordPreviewsResponse:
        """A Session's only call without a unary RPC of its own: the processor's records of
        the previews it wrote with the preview service's grants, each checked as the preview
        service checks them (RecordWrittenPreviews) and recorded as PublicationService's
        RecordPreviews records them, in one fenced statement (jobs.proto, Session)."""
        who = await caller.principal()
        if not 1 <= len(request.previews) <= MAX_RECORD_BATCH:
            raise InvalidField(
                f"Give 1..{MAX_RECORD_BATCH} previews per call.", metadata={"field": "previews"}
            )
        previews: list[PreviewRecord | WorkshopError] = []
        boxes = previews_boxes(request.previews)
        for one, one_boxes in zip(request.previews, boxes, strict=True):
            try:
                previews.append(self._written(one, one_boxes))
            except WorkshopError as error:
                previews.append(error)
        valid = [preview for preview in previews if isinstance(preview, PreviewRecord)]
        answers = iter(await self.publication.record_own_previews(who, valid) if valid else [])
        return previews_response(
            preview if isinstance(preview, WorkshopError) else next(answers) for preview in previews
        )

    def _written(self, preview: pub.RecordPreviewRequest, boxes: PreviewBoxes) -> PreviewRecord:
        """A written preview's record, checked as the preview service checks it (its bytes
        never passed a service: the grant bound their key, type and size at the store)."""
        check_written_preview(preview, self.max_image_bytes)
        return preview_record(preview, boxes)


# A Session's calls: the SessionRequest field of each (also its SessionResponse field), its
# unary RPC, and the JobServicer function that answers both.
SessionCall = Callable[[JobServicer, Caller, Any], Awaitable[Message]]
SESSION_CALLS: dict[str, tuple[str, SessionCall]] = {
    "claim": ("Claim", JobServicer.claim),
    "heartbeat": ("Heartbeat", JobServicer.heartbeat),
    "report_progress": ("ReportProgress", JobServicer.report_progress),
    "complete": ("Complete", JobServicer.complete),
    "fail": ("Fail", JobServicer.fail),
    "release": ("Release", JobServicer.release),
    # no unary JobService RPC: counted as PublicationService.RecordPreviews' twin
    "record_previews": ("RecordPreviews", JobServicer.record_previews),
}
SESSION_METHOD = "workshop.v1.JobService/Session"
# The method each call on a Session is counted under (workshop.kit.rpc_metrics.observe_call).
SESSION_CALL_METHODS = {kind: f"{SESSION_METHOD}/{rpc}" for kind, (rpc, _) in SESSION_CALLS.items()}


class _Session:
    """One Session stream: reads its requests, runs each call as a task of its own (at most
    MAX_SESSION_CALLS at once), and answers each as it finishes.

    The answers are queued (at most MAX_SESSION_CALLS waiting), so a client that reads none
    stops the reading of its requests rather than filling memory. When the client
    half-closes, the calls in flight finish and the stream ends; when the stream ends any
    other way (cancelled, broken, or ended by a request it refuses), the calls in flight are
    cancelled: each is a unary call's code path, whose transaction commits or rolls back as
    a cancelled unary call's does."""

    def __init__(self, servicer: JobServicer, caller: SessionCaller) -> None:
        self._servicer = servicer
        self._caller = caller
        self._in_flight: dict[int, asyncio.Task[None]] = {}
        # an answer; an error that ends the stream; None: the end, every call answered
        self._out: asyncio.Queue[pb.SessionResponse | Exception | None] = asyncio.Queue(
            MAX_SESSION_CALLS
        )

    async def answers(
        self, requests: AsyncIterator[pb.SessionRequest]
    ) -> AsyncGenerator[pb.SessionResponse, None]:
        reader = asyncio.create_task(self._read(requests))
        try:
            while True:
                out = await self._out.get()
                if out is None:
                    return
                if isinstance(out, Exception):
                    raise out
                yield out
        finally:
            pending = [reader, *self._in_flight.values()]
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)

    async def _read(self, requests: AsyncIterator[pb.SessionRequest]) -> None:
        try:
            async for request in requests:
                await self._start(request)
            while self._in_flight:  # half-closed: the calls in flight finish
                await asyncio.wait(list(self._in_flight.values()))
        except Exception as error:  # a request refused (INVALID_ARGUMENT) ends the stream
            await self._out.put(error)
            return
        await self._out.put(None)

    async def _start(self, request: pb.SessionRequest) -> None:
        kind = request.WhichOneof("call")
        if kind is None:
            raise InvalidField(
                "A SessionRequest needs a call (claim, heartbeat, report_progress, complete, "
                "fail, release or record_previews).",
                metadata={"field": "call"},
            )
        request_id = request.request_id
        if request_id in self._in_flight:
            raise InvalidField(
                f"request_id {request_id} is in flight on this stream: choose one that is not.",
                metadata={"field": "request_id"},
            )
        if len(self._in_flight) >= MAX_SESSION_CALLS:
            error = ResourceExhausted(
                f"At most {MAX_SESSION_CALLS} calls may be in flight on one Session; send this "
                "one again once an answer has come.",
                metadata={"limit": str(MAX_SESSION_CALLS)},
            )
            started = time.perf_counter()
            await self._out.put(_error_answer(request_id, kind, error, started))
            return
        self._in_flight[request_id] = asyncio.create_task(self._call(request, kind))

    async def _call(self, request: pb.SessionRequest, kind: str) -> None:
        started = time.perf_counter()
        try:
            try:
                reply = await SESSION_CALLS[kind][1](
                    self._servicer, self._caller, getattr(request, kind)
                )
            except Exception as error:
                answer = _error_answer(request.request_id, kind, error, started)
            else:
                answer = pb.SessionResponse(request_id=request.request_id)
                getattr(answer, kind).CopyFrom(reply)
                observe_call(SESSION_CALL_METHODS[kind], started, grpc.StatusCode.OK)
            await self._out.put(answer)
        finally:
            del self._in_flight[request.request_id]


def _error_answer(
    request_id: int, kind: str, error: Exception, started: float
) -> pb.SessionResponse:
    """The error the unary RPC would have been answered with, as its answer on the stream
    (counted as that call's refusal)."""
    method = SESSION_CALL_METHODS[kind]
    code, message, info = error_status(error, method)
    observe_call(method, started, code, info.reason)
    return pb.SessionResponse(
        request_id=request_id,
        error=pb.CallError(
            code=code.value[0], message=message, reason=info.reason, metadata=info.metadata
        ),
    )
