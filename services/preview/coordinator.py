"""The preview service's calls into the coordinator, and how its errors pass through.

The service authenticates with its own `service` key; a call made for a
processor or a reader carries that caller's credential unchanged as
`workshop-on-behalf-of: Bearer <secret>` (see publication.proto). A refusal
by the coordinator reaches our caller with the same status code, message and
ErrorInfo (reason and metadata): `passed_through` turns it into the kit error
that the error-mapping interceptor answers with that code. A coordinator that did not
answer, or failed to (INTERNAL, UNKNOWN: its own trouble, never a verdict on the
request), is UNAVAILABLE to our caller, who asks again (preview.proto).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import TypeVar

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from workshop.kit import errors
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, operator_pb2_grpc, publication_pb2_grpc
from workshop.v1 import operator_pb2 as op
from workshop.v1 import publication_pb2 as pub

ON_BEHALF_OF = "workshop-on-behalf-of"
T = TypeVar("T")
STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}

# Kit classes whose status code is the coordinator's. A deadline or a cancelled call
# means the coordinator did not answer: UNAVAILABLE, safe to retry (preview.proto); so
# does any code not named here (CoordinatorUnavailable).
KIT_ERRORS: dict[grpc.StatusCode, type[errors.WorkshopError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.ABORTED: errors.Conflict,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.Unavailable,
    grpc.StatusCode.CANCELLED: errors.Unavailable,
    grpc.StatusCode.UNIMPLEMENTED: errors.NotImplementedYet,
}


class CoordinatorUnavailable(errors.Unavailable):
    """The coordinator failed to answer (INTERNAL, UNKNOWN, a malformed answer): to our
    caller that is no answer, so UNAVAILABLE, and the call may be asked again."""


def passed_through(error: grpc.aio.AioRpcError) -> errors.WorkshopError:
    """The coordinator's refusal as a kit error with its status code, message and ErrorInfo."""
    info = error_details_pb2.ErrorInfo()
    status = rpc_status.from_call(error)
    if status is not None and status.details:
        status.details[0].Unpack(info)
    return _kit_error(error.code(), error.details(), info.reason, info.metadata)


def refused(refusal: pub.Refusal) -> errors.WorkshopError:
    """One preview's refusal in a RecordPreviews answer, as passed_through makes it."""
    code = STATUS_CODES.get(refusal.code, grpc.StatusCode.UNKNOWN)
    return _kit_error(code, refusal.message, refusal.reason, refusal.metadata)


def _kit_error(
    code: grpc.StatusCode, message: str | None, reason: str, metadata: Mapping[str, str]
) -> errors.WorkshopError:
    kind = KIT_ERRORS.get(code)
    if kind is None:  # its own trouble: its reason (INTERNAL) would misname ours
        return CoordinatorUnavailable(
            f"The coordinator failed to answer ({code.name}: {message}); ask again shortly."
        )
    message = message or f"The coordinator answered {code.name}."
    return kind(message, reason=reason or None, metadata=dict(metadata))


async def _call(response: Awaitable[T]) -> T:
    try:
        return await response
    except grpc.aio.AioRpcError as error:
        raise passed_through(error) from error


def on_behalf_of(secret: str) -> tuple[str, str]:
    return (ON_BEHALF_OF, f"Bearer {secret}")


class CoordinatorClient:
    """PublicationService (and one OperatorService check) as the preview service calls them."""

    def __init__(self, channel: grpc.aio.Channel, service_key: str) -> None:
        self._publication = publication_pb2_grpc.PublicationServiceStub(channel)
        self._operator = operator_pb2_grpc.OperatorServiceStub(channel)
        self._service = bearer_metadata(service_key)

    def _for(self, secret: str) -> tuple[tuple[str, str], ...]:
        return (*self._service, on_behalf_of(secret))

    async def stage_object(
        self, request: pub.StageObjectRequest, processor: str
    ) -> pub.StageObjectResponse:
        return await _call(self._publication.StageObject(request, metadata=self._for(processor)))

    async def check_lease(
        self, request: pub.CheckLeaseRequest, processor: str
    ) -> pub.CheckLeaseResponse:
        return await _call(self._publication.CheckLease(request, metadata=self._for(processor)))

    async def record_previews(
        self, requests: Sequence[pub.RecordPreviewRequest], processor: str
    ) -> list[pub.RecordPreviewResponse | errors.WorkshopError]:
        """Records previews of one processor in one call; one outcome each, in order."""
        call = self._publication.RecordPreviews(
            pub.RecordPreviewsRequest(previews=requests), metadata=self._for(processor)
        )
        reply = await _call(call)
        return [
            outcome.recorded if outcome.HasField("recorded") else refused(outcome.refused)
            for outcome in reply.outcomes
        ]

    async def authorize_read(
        self, run_id: str, item_id: str, reader: str
    ) -> pub.AuthorizeImageReadResponse:
        request = pub.AuthorizeImageReadRequest(run_id=run_id, item_id=item_id)
        call = self._publication.AuthorizeImageRead(request, metadata=self._for(reader))
        return await _call(call)

    async def list_export_items(
        self, request: pub.ListExportItemsRequest, reader: str
    ) -> pub.ListExportItemsResponse:
        """A page of a bucket's items to export, as `reader` may list them."""
        call = self._publication.ListExportItems(request, metadata=self._for(reader))
        return await _call(call)

    async def collectable(
        self, kind: common_pb2.ObjectKind.ValueType, limit: int
    ) -> pub.ListCollectableObjectsResponse:
        """Up to `limit` collectable objects, claimed for this pass (for 5 minutes)."""
        request = pub.ListCollectableObjectsRequest(kind=kind, limit=limit)
        call = self._publication.ListCollectableObjects(request, metadata=self._service)
        return await _call(call)

    async def settle_sweep(
        self, sweep: pub.Sweep, found: Sequence[pub.SweptObject], *, done: bool
    ) -> int:
        """Records the unrecorded objects found under a sweep's prefix as collectable."""
        request = pub.SettleSweepRequest(sweep=sweep, objects=found, done=done)
        reply = await _call(self._publication.SettleSweep(request, metadata=self._service))
        return reply.recorded

    async def mark_deleted(self, keys: Sequence[str], not_deleted: Sequence[str] = ()) -> int:
        """Marks `keys` deleted and hands back `not_deleted`; how many were marked."""
        request = pub.MarkObjectsDeletedRequest(
            object_keys=list(keys), not_deleted_keys=list(not_deleted)
        )
        reply = await _call(self._publication.MarkObjectsDeleted(request, metadata=self._service))
        return reply.marked

    async def require_admin(self, secret: str) -> None:
        """UNAUTHENTICATED or PERMISSION_DENIED unless `secret` is an admin key.

        The preview service keeps no keys of its own, so it asks the coordinator with
        the caller's credential: GetClock is admin-only and reads nothing else.
        """
        await _call(self._operator.GetClock(op.GetClockRequest(), metadata=bearer_metadata(secret)))
