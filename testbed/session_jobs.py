"""JobService's unary surface over Session streams, so that a test runs on either path.

`SessionJobs(channel)` has the stub's job calls (Claim, Heartbeat, ReportProgress,
Complete, Fail, Release), each `await`ed with `metadata=` (and optionally `timeout=`) as
the stub's are, but sent as a message on a `JobService.Session` stream: one stream per
credential (its metadata), opened by that credential's first call and kept open, so every
call after it runs on a stream that authenticated once. An `error` answer is raised as
`SessionCallError`, a `grpc.aio.AioRpcError` with the unary call's code, details and
trailing ErrorInfo (`grpc-status-details-bin`), so `error_reason` and
`rpc_status.from_call` read it as they read the unary call's error. A stream that ends
with an error (UNAUTHENTICATED when it opens, say) fails every call waiting on it with that
error, and the credential's next call opens a new stream.

A call with a `timeout` gets a stream of its own with that deadline (a Session's deadline is
the stream's, not a message's: a waiting Claim answers a second before it, as a unary
Claim does before its own), closed once answered.

`JOB_TRANSPORTS` names the two paths; a test module that runs on both overrides the
harness's `job_transport` fixture with them (`testbed.harness.coordinator`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from workshop.kit.interceptors import ERROR_DOMAIN
from workshop.v1 import jobs_pb2, jobs_pb2_grpc

JOB_TRANSPORTS = ("unary", "session")
STATUS_DETAILS_KEY = "grpc-status-details-bin"

Metadata = tuple[tuple[str, str], ...]
R = TypeVar("R", bound=Message)

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class SessionCallError(grpc.aio.AioRpcError):
    """A Session call's `error` answer, as the unary call raises it."""

    def __init__(self, error: jobs_pb2.CallError) -> None:
        info = error_details_pb2.ErrorInfo(
            reason=error.reason, domain=ERROR_DOMAIN, metadata=dict(error.metadata)
        )
        detail = any_pb2.Any()
        detail.Pack(info)
        status = status_pb2.Status(code=error.code, message=error.message, details=[detail])
        super().__init__(
            _CODES.get(error.code, grpc.StatusCode.UNKNOWN),
            grpc.aio.Metadata(),
            grpc.aio.Metadata((STATUS_DETAILS_KEY, status.SerializeToString())),
            error.message,
        )
        self.call_error = error


class SessionStream:
    """One open Session: sends calls on it and hands each answer to its caller.

    Writes take turns (a gRPC stream has one write in flight at a time); one task reads the
    answers, in the order the coordinator finishes the calls, and resolves each call's
    future by its request_id."""

    def __init__(
        self,
        stub: jobs_pb2_grpc.JobServiceAsyncStub,
        metadata: Metadata,
        timeout: float | None = None,
    ) -> None:
        self.call: Any = stub.Session(metadata=metadata, timeout=timeout)
        self._writing = asyncio.Lock()
        self._waiting: dict[int, asyncio.Future[jobs_pb2.SessionResponse]] = {}
        self._ids = itertools.count(1)
        self.ended: BaseException | None = None  # why the stream ended, once it has
        self._reader = asyncio.create_task(self._read())

    async def send(self, message: jobs_pb2.SessionRequest) -> None:
        """Writes one request as it is (its request_id included): for tests of the stream."""
        async with self._writing:
            await self.call.write(message)

    async def ask(self, kind: str, request: Message) -> jobs_pb2.SessionResponse:
        """Sends `request` as the call `kind` (a SessionRequest field) and waits for its answer."""
        if self.ended is not None:
            raise self.ended
        request_id = next(self._ids)
        answer: asyncio.Future[jobs_pb2.SessionResponse] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiting[request_id] = answer
        message = jobs_pb2.SessionRequest(request_id=request_id)
        getattr(message, kind).CopyFrom(request)
        # a stream that ended refuses the write: the reader fails the answer with the reason
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self.send(message)
        try:
            return await answer
        finally:
            self._waiting.pop(request_id, None)

    async def _read(self) -> None:
        ended: BaseException
        try:
            while True:
                answer = await self.call.read()
                if answer is grpc.aio.EOF:
                    ended = grpc.aio.AioRpcError(
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.aio.Metadata(),
                        grpc.aio.Metadata(),
                        "the Session stream ended",
                    )
                    break
                waiting = self._waiting.get(answer.request_id)
                if waiting is not None and not waiting.done():
                    waiting.set_result(answer)
        except grpc.aio.AioRpcError as error:
            ended = error
        except asyncio.CancelledError:
            self._end(
                grpc.aio.AioRpcError(
                    grpc.StatusCode.CANCELLED,
                    grpc.aio.Metadata(),
                    grpc.aio.Metadata(),
                    "the Session stream was closed",
                )
            )
            raise
        self._end(ended)

    def _end(self, why: BaseException) -> None:
        self.ended = why
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(why)

    async def close(self) -> None:
        """Cancels the stream (and with it whatever is still in flight on it)."""
        self.call.cancel()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


class SessionJobs:
    """The job calls of `JobServiceStub`, each a message on a Session stream of its caller's
    credential (see the module docstring). Each returns the call's coroutine, to `await` as
    the stub's call is; `timeout` is the stub's argument."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.stub = jobs_pb2_grpc.JobServiceStub(channel)
        self._streams: dict[Metadata, SessionStream] = {}
        self.streams_opened = 0

    def Claim(
        self,
        request: jobs_pb2.ClaimRequest,
        *,
        metadata: Sequence[tuple[str, str]] | None = None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, jobs_pb2.ClaimResponse]:
        return self._call("claim", request, metadata, timeout, jobs_pb2.ClaimResponse)

    def Heartbeat(
        self,
        request: jobs_pb2.HeartbeatRequest,
        *,
        metadata: Sequence[tuple[str, str]] | None = None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, jobs_pb2.HeartbeatResponse]:
        return self._call("heartbeat", request, metadata, timeout, jobs_pb2.HeartbeatResponse)

    def ReportProgress(
        self,
        request: jobs_pb2.ReportProgressRequest,
        *,
        metadata: Sequence[tuple[str, str]] | None = None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, jobs_pb2.ReportProgressResponse]:
        return self._call(
            "report_progress", request, metadata, timeout, jobs_pb2.ReportProgressResponse
        )

    def Complete(
        self,
        request: jobs_pb2.CompleteRequest,
        *,
        metadata: Sequence[tuple[str, str]] | None = None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, jobs_pb2.CompleteResponse]:
        return self._call("complete", request, metadata, timeout, jobs_pb2.CompleteResponse)

    def Fail(
        self,
        request: jobs_pb2.FailRequest,
        *,
        metadata: Sequence[tuple[str, str]] | None = None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, jobs_pb2.FailResponse]:
        return self._call("fail", request, metadata, timeout, jobs_pb2.FailResponse)

    def Release(
        self,
        request: jobs_pb2.ReleaseRequest,
        *,
        metadata: Sequence[tuple[str, str]] | None = None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, jobs_pb2.ReleaseResponse]:
        return self._call("release", request, metadata, timeout, jobs_pb2.ReleaseResponse)

    def stream(self, metadata: Sequence[tuple[str, str]] | None) -> SessionStream:
        """The open stream of this credential, opened now if it has none (or it ended)."""
        key = tuple(metadata or ())
        stream = self._streams.get(key)
        if stream is None or stream.ended is not None:
            stream = self._streams[key] = SessionStream(self.stub, key)
            self.streams_opened += 1
        return stream

    async def _call(
        self,
        kind: str,
        request: Message,
        metadata: Sequence[tuple[str, str]] | None,
        deadline: float | None,
        answer_type: type[R],
    ) -> R:
        if deadline is None:
            answer = await self.stream(metadata).ask(kind, request)
        else:  # a deadline is a stream's: this call gets a stream of its own
            own = SessionStream(self.stub, tuple(metadata or ()), deadline)
            try:
                answer = await own.ask(kind, request)
            finally:
                await own.close()
        if answer.HasField("error"):
            raise SessionCallError(answer.error)
        reply = getattr(answer, kind)
        assert isinstance(reply, answer_type)
        return reply

    async def close(self) -> None:
        streams = list(self._streams.values())
        self._streams.clear()
        for stream in streams:
            await stream.close()
