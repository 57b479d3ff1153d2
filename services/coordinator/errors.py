"""The coordinator's errors: kit classes with the reasons of `workshop.v1.ErrorReason`.

Each class fixes the reason a client reads from the status details, so callers
branch on `reason`, never on message text. Messages are for people.
"""

from __future__ import annotations

from workshop.kit import errors


class CredentialRejected(errors.Unauthenticated):
    """Unknown, revoked or expired key or session, or a disabled user."""

    reason = "CREDENTIAL_REJECTED"


class ScopeMissing(errors.PermissionDenied):
    reason = "SCOPE_MISSING"


class InvalidField(errors.InvalidArgument):
    reason = "INVALID_FIELD"


class WorkflowInvalid(errors.ValidationFailed):
    reason = "VALIDATION_FAILED"


class NoMedia(errors.ValidationFailed):
    reason = "NO_MEDIA"


class NeedsTracking(errors.ValidationFailed):
    reason = "NEEDS_TRACKING"


class TooManyJobs(errors.ValidationFailed):
    reason = "TOO_MANY_JOBS"


class TooManySlots(errors.ValidationFailed):
    reason = "TOO_MANY_SLOTS"


class NotFound(errors.NotFound):
    """A named resource does not exist; metadata "kind" and "id" name it for programs."""

    reason = "NOT_FOUND"

    def __init__(self, kind: str, identifier: str, message: str) -> None:
        super().__init__(message, metadata={"kind": kind, "id": identifier})


class StaleRevision(errors.Conflict):
    reason = "STALE_REVISION"


class IdConflict(errors.Conflict):
    reason = "ID_CONFLICT"


class AtCapacity(errors.ResourceExhausted):
    reason = "CAPACITY"


class ClockNotManual(errors.FailedPrecondition):
    reason = "CLOCK_NOT_MANUAL"


class NoRuntime(errors.FailedPrecondition):
    reason = "NO_RUNTIME"


# The exact words of SPEC §4.
NO_MEDIA_MESSAGE = "The selected input has no available media."
NEEDS_TRACKING_MESSAGE = (
    "Update the Workshop processor: this workflow keeps frames by change or routes on motion."
)
