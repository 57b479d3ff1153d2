"""The one table that maps error classes to gRPC status codes and HTTP statuses.

Lookup walks the exception's MRO, so a service's own subclass inherits the
mapping of the kit class it derives from unless the table names it.

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


STATUS_TABLE: dict[type[BaseException], Status] = {
    errors.PayloadTooLarge: Status(grpc.StatusCode.INVALID_ARGUMENT, 413),
    errors.ValidationFailed: Status(grpc.StatusCode.INVALID_ARGUMENT, 422),
    errors.InvalidArgument: Status(grpc.StatusCode.INVALID_ARGUMENT, 400),
    errors.Unauthenticated: Status(grpc.StatusCode.UNAUTHENTICATED, 401),
    errors.PermissionDenied: Status(grpc.StatusCode.PERMISSION_DENIED, 403),
    errors.NotFound: Status(grpc.StatusCode.NOT_FOUND, 404),
    errors.AlreadyExists: Status(grpc.StatusCode.ALREADY_EXISTS, 409),
    errors.Conflict: Status(grpc.StatusCode.ABORTED, 409),
    errors.FailedPrecondition: Status(grpc.StatusCode.FAILED_PRECONDITION, 409),
    errors.ResourceExhausted: Status(grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    errors.Unavailable: Status(grpc.StatusCode.UNAVAILABLE, 503),
    ConnectionError: Status(grpc.StatusCode.UNAVAILABLE, 503),
    TimeoutError: Status(grpc.StatusCode.UNAVAILABLE, 503),
    errors.NotImplementedYet: Status(grpc.StatusCode.UNIMPLEMENTED, 501),
    errors.DataLoss: Status(grpc.StatusCode.DATA_LOSS, 500),
}

INTERNAL = Status(grpc.StatusCode.INTERNAL, 500)


def status_for(error: BaseException) -> Status:
    """The status of the nearest class in `error`'s MRO that the table names, else INTERNAL."""
    for cls in type(error).__mro__:
        status = STATUS_TABLE.get(cls)
        if status is not None:
            return status
    return INTERNAL
