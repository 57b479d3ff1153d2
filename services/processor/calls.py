"""The processor's RPCs about a job and what their answers mean (docs/runs-and-jobs.md).

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
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from workshop.v1 import publication_pb2

log = logging.getLogger(__name__)

Metadata = tuple[tuple[str, str], ...]

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
                code = error.code()
                if code in FENCED:
                    raise LeaseLost(error.details()) from None
                if code in REFUSALS:
                    raise Refused(what, error) from None
                if not retry or loop.time() + pause > give_up or self.stopping.is_set():
                    raise ServiceUnavailable(
                        f"{what} got no answer for {self.retry_seconds:g} s: "
                        f"{code.name} {error.details()}"
                    ) from None
                log.warning("%s: %s; asking again in %.1f s", what, code.name, pause)
            await asyncio.sleep(pause)
            pause = min(RETRY_MAX_PAUSE_SECONDS, 2 * pause)


def refusal_error(refusal: publication_pb2.Refusal) -> Exception:
    """One preview's refusal in a RecordWrittenPreviews answer, as Caller would raise it."""
    code = next((c for c in grpc.StatusCode if c.value[0] == refusal.code), grpc.StatusCode.UNKNOWN)
    if code in FENCED:
        return LeaseLost(refusal.message)
    error = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), refusal.message)
    if code in REFUSALS:
        return Refused("RecordWrittenPreviews", error)
    return ServiceUnavailable(f"RecordWrittenPreviews: {code.name} {refusal.message}")
