"""The error catalog: the one table that maps every error reason to a gRPC status code and
an HTTP status.

A `WorkshopError` carries a stable `reason` (the ErrorInfo reason clients read); its
class only chooses which reason it sends. The services answer gRPC with the code of
their error's reason, and the gateway answers HTTP with the status of the reason it
reads back from the ErrorInfo, so a reason means the same on both sides by
construction. `tests/unit/test_error_catalog.py` checks that every reason of
`workshop.v1.ErrorReason` and of every error class has its row, and that each row
agrees with the kind of error its classes are (a subclass of `errors.Conflict` is 409).

Every error that means "a dependency cannot be reached now" is UNAVAILABLE (503, safe
to ask again), never INTERNAL: the kit's `Unavailable` (what each service raises for
its database, object store or peer service; the coordinator's database layer turns
asyncpg's connection errors into it), and the standard library's own connection errors
and timeouts, should one reach a servicer without a kit class.
"""

from __future__ import annotations

from typing import NamedTuple

import grpc

from workshop.kit import errors


class Status(NamedTuple):
    grpc_code: grpc.StatusCode
    http_status: int


_C = grpc.StatusCode
INTERNAL = Status(_C.INTERNAL, 500)

_BAD_REQUEST = Status(_C.INVALID_ARGUMENT, 400)
_TOO_LARGE = Status(_C.INVALID_ARGUMENT, 413)
_UNPROCESSABLE = Status(_C.INVALID_ARGUMENT, 422)
_UNAUTHENTICATED = Status(_C.UNAUTHENTICATED, 401)
_FORBIDDEN = Status(_C.PERMISSION_DENIED, 403)
_NOT_FOUND = Status(_C.NOT_FOUND, 404)
_CONFLICT = Status(_C.ABORTED, 409)
_PRECONDITION = Status(_C.FAILED_PRECONDITION, 409)
_EXHAUSTED = Status(_C.RESOURCE_EXHAUSTED, 429)
_UNAVAILABLE = Status(_C.UNAVAILABLE, 503)

# Reason -> status. The generic reasons (a kit class's own) come first, then the
# reasons of workshop.v1.ErrorReason, then the services' and the gateway's own.
REASONS: dict[str, Status] = {
    # the kit's classes
    "WORKSHOP_ERROR": INTERNAL,
    "INVALID_ARGUMENT": _BAD_REQUEST,
    "UNAUTHENTICATED": _UNAUTHENTICATED,
    "PERMISSION_DENIED": _FORBIDDEN,
    "NOT_FOUND": _NOT_FOUND,
    "ALREADY_EXISTS": Status(_C.ALREADY_EXISTS, 409),
    "CONFLICT": _CONFLICT,
    "FAILED_PRECONDITION": _PRECONDITION,
    "RESOURCE_EXHAUSTED": _EXHAUSTED,
    "UNAVAILABLE": _UNAVAILABLE,
    "DATA_LOSS": Status(_C.DATA_LOSS, 500),
    "NOT_IMPLEMENTED": Status(_C.UNIMPLEMENTED, 501),
    "INTERNAL": INTERNAL,
    # workshop.v1.ErrorReason
    "CREDENTIAL_MISSING": _UNAUTHENTICATED,
    "CREDENTIAL_MALFORMED": _UNAUTHENTICATED,
    "CREDENTIAL_REJECTED": _UNAUTHENTICATED,
    "SCOPE_MISSING": _FORBIDDEN,
    "INVALID_FIELD": _BAD_REQUEST,
    "PAYLOAD_TOO_LARGE": _TOO_LARGE,
    "VALIDATION_FAILED": _UNPROCESSABLE,
    "NO_MEDIA": _UNPROCESSABLE,
    "NEEDS_TRACKING": _UNPROCESSABLE,
    "TOO_MANY_JOBS": _UNPROCESSABLE,
    "TOO_MANY_SLOTS": _UNPROCESSABLE,
    "RESULT_INVALID": _UNPROCESSABLE,
    "EXPIRED": _NOT_FOUND,
    "STALE_REVISION": _CONFLICT,
    "ID_CONFLICT": _CONFLICT,
    "RESULT_CONFLICT": _CONFLICT,
    "CAPACITY": _EXHAUSTED,
    "LEASE_MISMATCH": _PRECONDITION,
    "JOB_CANCELLED": _PRECONDITION,
    "JOB_FINISHED": _PRECONDITION,
    "SOURCE_CHANGED": _PRECONDITION,
    "AUTHORITY_REVOKED": _PRECONDITION,
    "POLICY_CHANGED": _PRECONDITION,
    "REPORTER_NOT_AUTHORIZED": _PRECONDITION,
    "CODE_MISMATCH": _PRECONDITION,
    "CLOCK_NOT_MANUAL": _PRECONDITION,
    "NO_RUNTIME": _PRECONDITION,
    "MALFORMED_REQUEST": _BAD_REQUEST,
    "TEST_RUN": _PRECONDITION,
    "LOGIN_FAILED": _UNAUTHENTICATED,
    "LOGIN_THROTTLED": _EXHAUSTED,
    "NOT_A_SESSION": _PRECONDITION,
    "NOTHING_TO_UNDO": _PRECONDITION,
    # the preview service's
    "IMAGE_CORRUPTED": INTERNAL,
    "IMAGE_CHANGED": Status(_C.DATA_LOSS, 500),
    "IMAGE_NOT_JPEG": _PRECONDITION,
    "NOT_RESUMABLE": _PRECONDITION,
    "OFFSET_PAST_END": Status(_C.INVALID_ARGUMENT, 416),
    # the gateway's (HTTP only; docs/http-api.md)
    "MALFORMED_JSON": _BAD_REQUEST,
    "UNSUPPORTED_MEDIA_TYPE": _BAD_REQUEST,
    "CROSS_SITE": _FORBIDDEN,
    "CSRF_TOKEN": _FORBIDDEN,
    "ROUTE_NOT_FOUND": _NOT_FOUND,
    "METHOD_NOT_ALLOWED": Status(_C.UNIMPLEMENTED, 405),
    "UPGRADE_REQUIRED": Status(_C.INVALID_ARGUMENT, 426),
    "HOST_NOT_ALLOWED": Status(_C.INVALID_ARGUMENT, 421),
}

# The standard library's own "cannot reach it now" errors (no reason of their own).
_UNREACHABLE: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)

# The HTTP status of a gRPC code whose reason the catalog does not know (a reason from a
# newer service). A status without ErrorInfo is gRPC's own: TRANSPORT_STATUSES below.
HTTP_FOR_CODE: dict[grpc.StatusCode, int] = {
    _C.INVALID_ARGUMENT: 400,
    _C.OUT_OF_RANGE: 400,
    _C.UNAUTHENTICATED: 401,
    _C.PERMISSION_DENIED: 403,
    _C.NOT_FOUND: 404,
    _C.ALREADY_EXISTS: 409,
    _C.ABORTED: 409,
    _C.FAILED_PRECONDITION: 409,
    _C.RESOURCE_EXHAUSTED: 429,
    _C.CANCELLED: 503,
    _C.UNAVAILABLE: 503,
    _C.DEADLINE_EXCEEDED: 503,
    _C.UNIMPLEMENTED: 501,
    _C.DATA_LOSS: 500,
}


class TransportStatus(NamedTuple):
    reason: str
    http_status: int


_BAD_GATEWAY = TransportStatus("BAD_GATEWAY", 502)

# What a status without ErrorInfo means to an HTTP caller. Every refusal of a Workshop
# service carries an ErrorInfo (workshop.kit.interceptors), so a status without one was
# made by gRPC itself, at the client or at the server: its code says what broke on the
# way, not what a service decided, and the HTTP answer says that instead of the code's
# usual status. These are the codes gRPC makes (grpc.io/docs/guides/status-codes); it
# never makes the others (INVALID_ARGUMENT, NOT_FOUND, ...).
TRANSPORT_STATUSES: dict[grpc.StatusCode, TransportStatus] = {
    # Not reached, the connection lost, a keepalive unanswered, the server stopping:
    # asking again shortly is the remedy.
    _C.UNAVAILABLE: TransportStatus("UNAVAILABLE", 503),
    _C.CANCELLED: TransportStatus("UNAVAILABLE", 503),
    # No answer in time (a write may have been done: every write is idempotent, so asking
    # again is safe).
    _C.DEADLINE_EXCEEDED: TransportStatus("DEADLINE_EXCEEDED", 503),
    # A message or metadata size limit, or a transport out of memory: never the rate or
    # capacity limit of a service (429, "retry later"); asking again does not help.
    _C.RESOURCE_EXHAUSTED: _BAD_GATEWAY,
    # The server's handler failed outside the kit, or the status did not parse.
    _C.UNKNOWN: _BAD_GATEWAY,
    # An answer that does not parse, a protocol error.
    _C.INTERNAL: _BAD_GATEWAY,
    # No such method at that address: a wrong target, or an older service.
    _C.UNIMPLEMENTED: _BAD_GATEWAY,
    # The channel's own credentials (TLS, authority) failed, not the caller's.
    _C.UNAUTHENTICATED: _BAD_GATEWAY,
}


def status_of_transport(code: grpc.StatusCode) -> TransportStatus:
    """The reason and HTTP status of a status without ErrorInfo (TRANSPORT_STATUSES; a
    code gRPC never makes is named by itself, with the status HTTP_FOR_CODE gives it)."""
    known = TRANSPORT_STATUSES.get(code)
    if known is not None:
        return known
    return TransportStatus(code.name, HTTP_FOR_CODE.get(code, 500))


def status_of_reason(reason: str, code: grpc.StatusCode | None = None) -> Status:
    """The catalog's status of `reason`; for a reason it does not name, the status that
    `code` implies (INTERNAL when neither is known)."""
    status = REASONS.get(reason)
    if status is not None:
        return status
    if code is not None:
        return Status(code, HTTP_FOR_CODE.get(code, 500))
    return INTERNAL


def status_for(error: BaseException) -> Status:
    """The status `error` is answered with: its reason's row (a reason the catalog lacks
    falls back to the reason of the nearest class that has a row), else UNAVAILABLE for a
    connection error or timeout, else INTERNAL (a bug)."""
    if isinstance(error, errors.WorkshopError):
        for reason in (error.reason, *(c.__dict__.get("reason") for c in type(error).__mro__)):
            if isinstance(reason, str) and reason in REASONS:
                return REASONS[reason]
        return INTERNAL
    if isinstance(error, _UNREACHABLE):
        return _UNAVAILABLE
    return INTERNAL
