"""The coordinator's errors: kit classes with the reasons of `workshop.v1.ErrorReason`.

Each class fixes the reason a client reads from the status details, so callers
branch on `reason`, never on message text. Messages are for people.
"""

from __future__ import annotations

from services.coordinator.platform.metrics import FENCE_REFUSALS
from workshop.kit import errors


class CredentialRejected(errors.Unauthenticated):
    """Unknown, revoked or expired key or session, or a disabled user."""

    reason = "CREDENTIAL_REJECTED"


class ScopeMissing(errors.PermissionDenied):
    reason = "SCOPE_MISSING"


# The one answer to a wrong password, an unknown user and a user without a password, so
# a caller cannot tell which (docs/concepts.md#signing-in).
LOGIN_FAILED_MESSAGE = "Wrong user id or password."


class LoginFailed(errors.Unauthenticated):
    reason = "LOGIN_FAILED"

    def __init__(self) -> None:
        super().__init__(LOGIN_FAILED_MESSAGE)


class LoginThrottled(errors.ResourceExhausted):
    """The user or the client address is at its limit of failed logins in the window;
    metadata "retry_after_seconds"."""

    reason = "LOGIN_THROTTLED"

    def __init__(self, retry_after_seconds: int) -> None:
        super().__init__(
            "Too many failed logins for this user or from this address; try again in "
            f"{retry_after_seconds} seconds.",
            metadata={"retry_after_seconds": str(retry_after_seconds)},
        )


class NotASession(errors.FailedPrecondition):
    """Logout with a key: only a website session signs out."""

    reason = "NOT_A_SESSION"


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


class DatabaseUnavailable(errors.Unavailable):
    """The database cannot be reached now (down, restarting, a dropped connection)."""


class ClockNotManual(errors.FailedPrecondition):
    reason = "CLOCK_NOT_MANUAL"


class NoRuntime(errors.FailedPrecondition):
    reason = "NO_RUNTIME"


class TestRunNotReviewable(errors.FailedPrecondition):
    """A test run saves no bucket items, so there is nothing to decide."""

    reason = "TEST_RUN"


# The exact words users read (docs/runs-and-jobs.md).
NO_MEDIA_MESSAGE = "The selected input has no available media."
NEEDS_TRACKING_MESSAGE = (
    "Update the Workshop processor: this workflow keeps frames by change or routes on motion."
)


class ResultInvalid(errors.ValidationFailed):
    """A result that does not account for its slots, or names objects not staged."""

    reason = "RESULT_INVALID"


class ResultConflict(errors.Conflict):
    reason = "RESULT_CONFLICT"


class Fenced(errors.FailedPrecondition):
    """A lease or fence no longer holds (docs/leases-and-fences.md); the processor stops the job."""


# What each fence reason means to the processor that hears it.
FENCE_MESSAGES = {
    "LEASE_MISMATCH": "This lease is no longer the job's lease (it lapsed or the job was "
    "claimed again); stop working on the job.",
    "JOB_CANCELLED": "The job was cancelled; stop working on it.",
    "JOB_FINISHED": "The job has already ended; stop working on it.",
    "SOURCE_CHANGED": "The job's recording was replaced or deleted since the run was created; "
    "its results would be stale.",
    "AUTHORITY_REVOKED": "The run's creator lost their authority (key or session revoked, user "
    "disabled); the run may not publish anything more.",
    "POLICY_CHANGED": "The policy revision was raised since the run was created; the run may "
    "not publish anything more.",
    "REPORTER_NOT_AUTHORIZED": "The calling key is no longer a workshop:run key for this "
    "runtime's device.",
    "CODE_MISMATCH": "The processor's code_sha256 differs from the run's snapshot; only the "
    "runtime the run was created for may report on it.",
}


def fenced(reason: str) -> Fenced:
    FENCE_REFUSALS.labels(reason).inc()
    return Fenced(FENCE_MESSAGES[reason], reason=reason)


class Expired(errors.NotFound):
    """The resource existed but its time is up (a preview, a test result after its hour)."""

    reason = "EXPIRED"


class NothingToUndo(errors.FailedPrecondition):
    """An undo with nothing to undo: no correction in force, or no item decision."""

    reason = "NOTHING_TO_UNDO"
