"""The processor's RPCs about a job, how they travel, and what their answers mean
(docs/runs-and-jobs.md).

Owns the one rule every part of the processor shares: an answer is a success, a
definite refusal (a fence: `LeaseLost`; the request or the service's own reasons:
`Refused`) or none. A service that gives no answer (the coordinator or preview service
restarting, its database or object storage down) is not the job's fault: UNAVAILABLE,
a deadline, and also INTERNAL or UNKNOWN, the words of a service that failed rather
than refused, count as none, and the call is asked again with backoff for up to
`retry_seconds`, which is safe because every write is idempotent under its lease (the
same preview, progress or result again is accepted; a Claim asked again carries the
same request id). When that outlasts the wait, the call raises `ServiceUnavailable`
and the job is handed back. Also the exceptions a job ends with (`JobFailed`).

And the transport of the JobService calls (`job_transport`, chosen once at start-up from
`PROCESSOR_JOB_TRANSPORT`): a unary RPC each (the stub itself), or, by default, messages
on one `Session` stream per processor (`SessionJobs`, docs/leases-and-fences.md#sessions).
Both look the same to the rest of the processor: a method per call that answers or
raises `grpc.aio.AioRpcError`; an `error` answer on the stream is raised as the error
the unary RPC would have raised (its code, message and ErrorInfo), so `outcome` sorts
both the same way; a call whose stream broke before its answer raises UNAVAILABLE, as a
unary call whose answer was lost, and is asked again (on a new stream). A coordinator
without `Session` (release 0.1) answers it UNIMPLEMENTED: logged once, and the calls go
unary for the rest of the processor's life.

The session also carries the records of the previews the processor wrote itself
(`SessionJobs.RecordPreviews`, the message `record_previews`; no unary JobService RPC). A
coordinator that does not take it raises `RecordsNotServed`, and the records go to the
preview service's RecordWrittenPreviews instead (direct_writes.py), for the rest of the
processor's life: one of release 0.1 (no Session: the calls go unary), or one from
before the message, which reads it as a request without a call and ends the stream
INVALID_ARGUMENT with ErrorInfo metadata field "call" (its other calls in flight then
are asked again on a new stream, as after any broken stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Literal, Protocol

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from workshop.kit.channels import DEFAULT_DEADLINE_SECONDS
from workshop.kit.interceptors import ERROR_DOMAIN
from workshop.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, publication_pb2

log = logging.getLogger(__name__)

Metadata = tuple[tuple[str, str], ...]
Transport = Literal["unary", "session"]
TRANSPORTS: tuple[Transport, ...] = ("session", "unary")

# Definite refusals: the service heard the call and said no. Every other code means no
# answer that can be trusted (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, and INTERNAL,
# UNKNOWN, DATA_LOSS of a service that failed): the call may not have reached it, or did
# its work and the answer was lost, so it is asked again.
REFUSALS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)
# Refusals that say the lease no longer holds (a fence; the run or job is gone).
FENCED = frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND})
# Refusals of the request itself: what this processor sent about the job is wrong.
INVALID = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE})
RETRY_FIRST_PAUSE_SECONDS = 0.5
RETRY_MAX_PAUSE_SECONDS = 5.0
_CODES = {code.value[0]: code for code in grpc.StatusCode}


class LeaseLost(Exception):
    """The coordinator refused a write under this lease: stop the job."""


class JobFailed(Exception):
    """A processor error: the job fails with processor_failed and this message."""


class ServiceUnavailable(Exception):
    """A service the job needs did not answer in time: the job is handed back."""


class Refused(Exception):
    """A service refused a call about the job for a reason other than its fences."""

    def __init__(self, what: str, error: grpc.aio.AioRpcError) -> None:
        super().__init__(f"{what} refused: {error.code().name} {error.details()}")
        self.code = error.code()
        self.reason = error_reason(error)


def error_reason(error: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a failed call; empty when it has none."""
    return str(error_info(error).reason)


def error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo of a failed call; an empty one when it has none."""
    info = error_details_pb2.ErrorInfo()
    with contextlib.suppress(ValueError):
        status = rpc_status.from_call(error)
        if status is not None and status.details and status.details[0].Unpack(info):
            return info
    return error_details_pb2.ErrorInfo()


def outcome(what: str, error: grpc.aio.AioRpcError) -> Exception | None:
    """What a failed call means, whichever way it travelled: LeaseLost (a fence), Refused
    (any other refusal), or None (no answer: ask again)."""
    code = error.code()
    if code in FENCED:
        return LeaseLost(error.details())
    if code in REFUSALS:
        return Refused(what, error)
    return None


def call_error(
    code: grpc.StatusCode | int,
    message: str,
    reason: str = "",
    metadata: Mapping[str, str] | None = None,
) -> grpc.aio.AioRpcError:
    """The error a unary RPC raises with this status and ErrorInfo (its rich status in
    the trailing metadata, as the services' error mapper sends it)."""
    if isinstance(code, int):
        code = _CODES.get(code, grpc.StatusCode.UNKNOWN)
    trailing = grpc.aio.Metadata()
    if reason:
        detail = any_pb2.Any()
        detail.Pack(
            error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN, metadata=metadata)
        )
        status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
        trailing = grpc.aio.Metadata(
            (rpc_status.GRPC_DETAILS_METADATA_KEY, status.SerializeToString())
        )
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, message)


class Caller:
    """Makes the RPCs about jobs with this processor's credentials (see the module)."""

    def __init__(self, credentials: Metadata, retry_seconds: float) -> None:
        self.credentials = credentials
        self.retry_seconds = retry_seconds
        # Set by a stop: a call without an answer is then not asked again.
        self.stopping = asyncio.Event()

    async def __call__(
        self, method: Any, request: Any, *, retry: bool = True, deadline: float | None = None
    ) -> Any:
        """One RPC about a job. A fence refusal becomes LeaseLost, any other refusal
        Refused; no answer (see REFUSALS) is asked again with backoff for up to
        `retry_seconds` (unless `retry` is False), then becomes ServiceUnavailable.
        `deadline`: seconds each try may take (none by default)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + (self.retry_seconds if retry else 0.0)
        pause = RETRY_FIRST_PAUSE_SECONDS
        what = type(request).__name__.removesuffix("Request")
        while True:
            try:
                if deadline is None:
                    return await method(request, metadata=self.credentials)
                return await method(request, metadata=self.credentials, timeout=deadline)
            except grpc.aio.AioRpcError as error:
                refusal = outcome(what, error)
                if refusal is not None:
                    raise refusal from None
                code = error.code()
                if not retry or loop.time() + pause > give_up or self.stopping.is_set():
                    raise ServiceUnavailable(
                        f"{what} got no answer for {self.retry_seconds:g} s: "
                        f"{code.name} {error.details()}"
                    ) from None
                log.warning("%s: %s; asking again in %.1f s", what, code.name, pause)
            await asyncio.sleep(pause)
            pause = min(RETRY_MAX_PAUSE_SECONDS, 2 * pause)


def refusal_error(refusal: publication_pb2.Refusal) -> Exception:
    """One preview's refusal in a records answer (the session's record_previews or the
    preview service's RecordWrittenPreviews), as Caller would raise it."""
    error = call_error(refusal.code, refusal.message, refusal.reason)
    found = outcome("RecordPreviews", error)
    if found is not None:
        return found
    return ServiceUnavailable(f"RecordPreviews: {error.code().name} {refusal.message}")


# --- The transport of the JobService calls ------------------------------------------

# A call as the stub has it: request, metadata= and timeout= in; its answer out.
Call = Callable[..., Awaitable[Any]]


class JobCalls(Protocol):
    """The JobService calls about jobs, as the stub has them (a stub is one)."""

    @property
    def Claim(self) -> Call: ...
    @property
    def Heartbeat(self) -> Call: ...
    @property
    def ReportProgress(self) -> Call: ...
    @property
    def Complete(self) -> Call: ...
    @property
    def Fail(self) -> Call: ...
    @property
    def Release(self) -> Call: ...


# Each call: its RPC's name and its field in SessionRequest / SessionResponse.
SESSION_CALLS = {
    "Claim": "claim",
    "Heartbeat": "heartbeat",
    "ReportProgress": "report_progress",
    "Complete": "complete",
    "Fail": "fail",
    "Release": "release",
}
MAX_IN_FLIGHT = 64  # the coordinator's bound per stream (more: RESOURCE_EXHAUSTED)
# Refusals that end a stream when it opens: they concern every call on it, as each unary
# call would be refused for its credential.
STREAM_REFUSALS = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
UNWRITTEN_TRIES = 4  # streams a call is asked on at once when each ends unwritten
RECORDS = "record_previews"  # the records of written previews: a session call only
ABANDONED_RELEASE_SECONDS = 5.0  # the deadline of the Release of an abandoned call's lease


class _Stream:
    """One open Session stream: its call, the calls waiting for answers, its writes."""

    def __init__(self, stub: jobs_pb2_grpc.JobServiceAsyncStub, metadata: Any) -> None:
        self.metadata = metadata
        self.outbox: asyncio.Queue[jobs_pb2.SessionRequest | None] = asyncio.Queue()
        self.waiting: dict[int, asyncio.Future[jobs_pb2.SessionResponse]] = {}
        self.abandoned: set[int] = set()  # calls cancelled by their caller, answer unread
        self.records: set[int] = set()  # the record_previews calls sent on it
        self.answered = False  # whether any answer came on it
        self.call = stub.Session(self._requests(), metadata=metadata)

    async def _requests(self) -> AsyncIterator[jobs_pb2.SessionRequest]:
        while (request := await self.outbox.get()) is not None:
            yield request


class _Unsupported(Exception):
    """The coordinator has no Session (UNIMPLEMENTED), or no record_previews on it: ask
    the call unary (records: RecordsNotServed)."""


class RecordsNotServed(Exception):
    """The coordinator takes no record_previews on the session (see the module): record
    the previews through the preview service."""


def _unknown_call(error: grpc.aio.AioRpcError) -> bool:
    """Whether a stream ended as a coordinator ends it for a request without a call it
    knows: INVALID_ARGUMENT INVALID_FIELD, ErrorInfo metadata field "call"."""
    if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
        return False
    info = error_info(error)
    return bool(info.reason == "INVALID_FIELD" and info.metadata.get("field") == "call")


class _Unwritten(Exception):
    """The stream ended INTERNAL before any answer: gRPC's own word when the stream had
    ended before the client could write to it (the status it ended with, such as a 0.1
    coordinator's UNIMPLEMENTED, is lost in that race). Asked again on a new stream at
    once, a few times, before it counts as no answer."""

    def __init__(self, error: grpc.aio.AioRpcError) -> None:
        super().__init__(error.details())
        self.error = error


class SessionJobs:
    """The JobService calls as messages on one Session stream (see the module): the
    stream opens on the first call with that call's metadata (the processor's
    credentials), and answers are matched to calls by request id. A stream that breaks
    fails the calls waiting on it with its error (UNAVAILABLE when it ended without one,
    or with a refusal that is one call's while several waited), so the Caller asks them
    again, on a new stream; a credential refused when the stream opens (UNAUTHENTICATED,
    PERMISSION_DENIED) refuses every call on it, as it would refuse each unary call. A
    call cancelled by its caller may still be answered: leases such an answer hands out
    (a Claim, a Complete's next job) are released at once, as nobody will work under
    them; a waiting Claim given up ends its stream, so that it stops waiting at the
    coordinator, and the next call opens a new one. `close()` ends the stream."""

    def __init__(self, stub: jobs_pb2_grpc.JobServiceAsyncStub) -> None:
        self._stub = stub
        self._stream: _Stream | None = None
        self._reader: asyncio.Task[None] | None = None
        self._next_id = 0
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._background: set[asyncio.Task[Any]] = set()
        self.unary = False  # True once the coordinator refused Session: calls go unary
        self.records = True  # False once the coordinator refused record_previews
        self.streams_opened = 0
        self.Claim: Call = self._over_session("Claim")
        self.Heartbeat: Call = self._over_session("Heartbeat")
        self.ReportProgress: Call = self._over_session("ReportProgress")
        self.Complete: Call = self._over_session("Complete")
        self.Fail: Call = self._over_session("Fail")
        self.Release: Call = self._over_session("Release")
        # the records of written previews: no unary RPC of the coordinator's to fall back on
        self.RecordPreviews: Call = self._over_session("RecordPreviews", RECORDS, _not_served)

    def _over_session(self, method: str, field: str = "", unary: Call | None = None) -> Call:
        field = field or SESSION_CALLS[method]

        async def call(
            request: Any,
            *,
            metadata: Any = None,
            timeout: float | None = None,  # noqa: ASYNC109 - as the stub's methods take it
        ) -> Any:
            for _ in range(UNWRITTEN_TRIES - 1):
                try:
                    return await self._ask(field, request, metadata, timeout)
                except _Unsupported:  # the stream was refused: this call goes unary
                    fallback: Call = unary or getattr(self._stub, method)
                    return await fallback(request, metadata=metadata, timeout=timeout)
                except _Unwritten:
                    continue
            try:
                return await self._ask(field, request, metadata, timeout)
            except _Unwritten as unwritten:
                raise unwritten.error from None

        return call

    def _open(self, metadata: Any) -> _Stream:
        stream = self._stream
        if stream is None:
            stream = self._stream = _Stream(self._stub, metadata)
            self.streams_opened += 1
            self._reader = asyncio.create_task(self._read(stream), name="session-reader")
        return stream

    async def _ask(self, field: str, request: Any, metadata: Any, seconds: float | None) -> Any:
        async with self._slots:
            if self.unary or (field == RECORDS and not self.records):
                raise _Unsupported
            stream = self._open(metadata)
            self._next_id += 1
            request_id = self._next_id
            answered = asyncio.get_running_loop().create_future()
            stream.waiting[request_id] = answered
            if field == RECORDS:
                stream.records.add(request_id)
            stream.outbox.put_nowait(
                jobs_pb2.SessionRequest(request_id=request_id, **{field: request})
            )
            # a deadline as the channel gives a unary call, so a hung call is asked again
            try:
                response = await asyncio.wait_for(
                    answered, DEFAULT_DEADLINE_SECONDS if seconds is None else seconds
                )
            except TimeoutError:  # as a unary call's deadline: its answer is lost
                stream.waiting.pop(request_id, None)
                raise call_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            except asyncio.CancelledError:  # its answer, if it comes, has no reader
                if stream.waiting.pop(request_id, None) is not None:
                    stream.abandoned.add(request_id)
                    if field == "claim" and request.wait_seconds:
                        # a Claim waiting at the coordinator (a drain gave it up) would
                        # lease a job queued later, even one this processor hands back
                        # while it stops: as a unary Claim's cancel ends it there, the
                        # stream ends (the calls on it are asked again on a new one)
                        stream.call.cancel()
                        # The next call opens that new one at once: the Claim asked again
                        # with this request id (to release what it leased) would otherwise
                        # go on this ended stream before its reader has let it go.
                        if self._stream is stream:
                            self._stream = None
                            self._keep_reader_until_done()
                raise
        kind = response.WhichOneof("answer")
        if kind == "error":
            error = response.error
            raise call_error(error.code, error.message, error.reason, error.metadata)
        if kind != field:
            raise call_error(
                grpc.StatusCode.INTERNAL, f"the session answered {kind} to a call of {field}"
            )
        return getattr(response, field)

    def _keep_reader_until_done(self) -> None:
        """The reader of a stream let go finishes on its own (its call ended): held, so
        that it is not collected mid-way, and awaited by `close()`."""
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            self._background.add(reader)
            reader.add_done_callback(self._background.discard)

    async def _read(self, stream: _Stream) -> None:
        """Hands each answer to its call until the stream ends; then fails the calls
        still waiting with the stream's end."""
        ended: BaseException = call_error(
            grpc.StatusCode.UNAVAILABLE, "the coordinator ended the session stream"
        )
        records_ended: BaseException | None = None  # how the records waiting end, if not so
        try:
            async for response in stream.call:
                stream.answered = True
                answered = stream.waiting.pop(response.request_id, None)
                if answered is not None:
                    if not answered.done():
                        answered.set_result(response)
                elif response.request_id in stream.abandoned:
                    stream.abandoned.discard(response.request_id)
                    self._release_abandoned(response, stream.metadata)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._fall_back(error)
                ended = _Unsupported()
            elif _unknown_call(error) and stream.records.intersection(stream.waiting):
                # a coordinator from before record_previews: the records go through the
                # preview service, every other call on a new stream
                self._records_not_served(error)
                records_ended = _Unsupported()
                ended = call_error(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the session stream ended {error.code().name}: {error.details()}",
                )
            elif error.code() == grpc.StatusCode.INTERNAL and not stream.answered:
                ended = _Unwritten(error)
            elif (
                error.code() in REFUSALS
                and error.code() not in STREAM_REFUSALS
                and len(stream.waiting) > 1
            ):
                # a refusal that ends the stream (a request it could not take) is one
                # call's, but which one is unknown: none of them is answered
                log.warning(
                    "the session stream ended %s %s with %d calls on it; they are asked again",
                    error.code().name,
                    error.details(),
                    len(stream.waiting),
                )
                ended = call_error(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the session stream ended {error.code().name}: {error.details()}",
                )
            else:
                log.warning(
                    "the session stream broke: %s %s; its calls are asked again",
                    error.code().name,
                    error.details(),
                )
                ended = error
        except asyncio.CancelledError:
            ended = call_error(grpc.StatusCode.CANCELLED, "the session stream was closed")
            raise
        finally:
            if self._stream is stream:
                self._stream = None
            stream.outbox.put_nowait(None)
            for request_id, answered in stream.waiting.items():
                if not answered.done():
                    if records_ended is not None and request_id in stream.records:
                        answered.set_exception(records_ended)
                    else:
                        answered.set_exception(ended)
            stream.waiting.clear()

    def _fall_back(self, error: grpc.aio.AioRpcError) -> None:
        """The coordinator has no Session: the calls go unary from now on."""
        if self.unary:
            return
        self.unary = True
        log.warning(
            "the coordinator does not serve JobService.Session (%s): calls about jobs "
            "go as unary RPCs from now on",
            error.details(),
        )
        for method in SESSION_CALLS:
            setattr(self, method, getattr(self._stub, method))

    def _records_not_served(self, error: grpc.aio.AioRpcError) -> None:
        """The coordinator takes no record_previews: records go elsewhere from now on."""
        if not self.records:
            return
        self.records = False
        log.warning(
            "the coordinator does not take record_previews on the session (%s %s): previews "
            "are recorded through the preview service from now on",
            error.code().name,
            error.details(),
        )

    def _release_abandoned(self, response: jobs_pb2.SessionResponse, metadata: Any) -> None:
        """Releases the leases an answer nobody reads hands out (no attempt spent)."""
        kind = response.WhichOneof("answer")
        claimed = jobs_pb2.ClaimResponse()
        if kind == "claim":
            claimed = response.claim
        elif kind == "complete" and response.complete.HasField("claimed"):
            claimed = response.complete.claimed
        leases = [
            job.lease
            for job in ([claimed.job, *claimed.more_jobs] if claimed.HasField("job") else [])
        ]
        for lease in leases:
            task = asyncio.create_task(self._release(lease, metadata))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _release(self, lease: common_pb2.LeaseRef, metadata: Any) -> None:
        try:
            await self.Release(
                jobs_pb2.ReleaseRequest(lease=lease),
                metadata=metadata,
                timeout=ABANDONED_RELEASE_SECONDS,
            )
        except grpc.aio.AioRpcError as error:
            log.warning(
                "the lease of %s/%s an abandoned call took could not be released (it lapses): %s",
                lease.run_id,
                lease.job_id,
                error.code().name,
            )
        else:
            log.info("released %s/%s, leased by an abandoned call", lease.run_id, lease.job_id)

    async def close(self) -> None:
        """Ends the stream (after the releases of abandoned calls' leases)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        stream, reader = self._stream, self._reader
        self._stream = self._reader = None
        if stream is not None:
            stream.call.cancel()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def _not_served(
    request: Any,
    *,
    metadata: Any = None,
    timeout: float | None = None,  # noqa: ASYNC109 - as the stub's methods take it
) -> Any:
    """record_previews where the coordinator takes none: the caller records elsewhere."""
    raise RecordsNotServed


class UnaryJobs:
    """The JobService calls as unary RPCs: the stub's own methods."""

    def __init__(self, stub: jobs_pb2_grpc.JobServiceAsyncStub) -> None:
        self.Claim: Call = stub.Claim
        self.Heartbeat: Call = stub.Heartbeat
        self.ReportProgress: Call = stub.ReportProgress
        self.Complete: Call = stub.Complete
        self.Fail: Call = stub.Fail
        self.Release: Call = stub.Release

    async def close(self) -> None:
        """Nothing to end: each call ended with its answer."""


def job_transport(
    kind: Transport, stub: jobs_pb2_grpc.JobServiceAsyncStub
) -> SessionJobs | UnaryJobs:
    """The JobService calls over the transport `kind` names (PROCESSOR_JOB_TRANSPORT)."""
    return SessionJobs(stub) if kind == "session" else UnaryJobs(stub)
