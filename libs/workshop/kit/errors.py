"""The error hierarchy every service builds on.

Domain code raises these (or its own subclasses); it never imports grpc or an
HTTP framework. `workshop.kit.status` is the one place that turns them into
gRPC status codes and HTTP statuses.
"""

from __future__ import annotations

from collections.abc import Mapping


class WorkshopError(Exception):
    """An error a caller can act on: its message is shown to them as is.

    `reason` is a stable UPPER_SNAKE identifier for programs; `metadata` holds
    facts the caller needs to recover (for example the current revision).
    """

    reason = "WORKSHOP_ERROR"

    def __init__(
        self, message: str, *, reason: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        self.metadata: dict[str, str] = dict(metadata or {})


class InvalidArgument(WorkshopError):
    """The request is malformed or out of range (gRPC INVALID_ARGUMENT, HTTP 400)."""

    reason = "INVALID_ARGUMENT"


class ValidationFailed(InvalidArgument):
    """A well-formed document breaks the rules (INVALID_ARGUMENT, HTTP 422)."""

    reason = "VALIDATION_FAILED"


class PayloadTooLarge(InvalidArgument):
    """The request body is over its limit (INVALID_ARGUMENT, HTTP 413)."""

    reason = "PAYLOAD_TOO_LARGE"


class Unauthenticated(WorkshopError):
    """No credential, or one that is unknown, revoked or expired (HTTP 401)."""

    reason = "UNAUTHENTICATED"


class PermissionDenied(WorkshopError):
    """The credential is valid but lacks the scope for this call (HTTP 403)."""

    reason = "PERMISSION_DENIED"


class NotFound(WorkshopError):
    """The named resource does not exist or is no longer readable (HTTP 404)."""

    reason = "NOT_FOUND"


class AlreadyExists(WorkshopError):
    """Creating something whose identity is taken (HTTP 409)."""

    reason = "ALREADY_EXISTS"


class Conflict(WorkshopError):
    """A write lost a race: stale revision, id reused with another body (ABORTED, HTTP 409)."""

    reason = "CONFLICT"


class FailedPrecondition(WorkshopError):
    """The system is not in a state that allows this call, e.g. a fenced lease (HTTP 409)."""

    reason = "FAILED_PRECONDITION"


class ResourceExhausted(WorkshopError):
    """A capacity limit refuses new work (HTTP 429)."""

    reason = "RESOURCE_EXHAUSTED"


class Unavailable(WorkshopError):
    """A dependency (database, object store) cannot be reached now; retry later (HTTP 503)."""

    reason = "UNAVAILABLE"


class DataLoss(WorkshopError):
    """Stored data is gone or no longer what was recorded, e.g. an image whose bytes differ
    from their digest (DATA_LOSS, HTTP 500): asking again does not help."""

    reason = "DATA_LOSS"


class NotImplementedYet(WorkshopError):
    """An RPC of the contract that is not implemented yet (UNIMPLEMENTED, HTTP 501)."""

    reason = "NOT_IMPLEMENTED"
