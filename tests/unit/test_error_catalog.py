"""The error catalog (`workshop.kit.status.REASONS`) names every reason a service can send,
and each row agrees with the kind of error that sends it."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator

import grpc
import pytest

import services
from workshop.kit import errors
from workshop.kit.status import REASONS, status_for, status_of_reason
from workshop.v1 import common_pb2

# The kit's own classes, each the kind its subclasses are.
KINDS = [
    errors.PayloadTooLarge,
    errors.ValidationFailed,
    errors.InvalidArgument,
    errors.Unauthenticated,
    errors.PermissionDenied,
    errors.NotFound,
    errors.AlreadyExists,
    errors.Conflict,
    errors.FailedPrecondition,
    errors.ResourceExhausted,
    errors.Unavailable,
    errors.DataLoss,
    errors.NotImplementedYet,
]
# What a client may be answered for bad input (anything else is a fault of ours).
CLIENT_STATUSES = {400, 401, 403, 404, 405, 409, 413, 416, 421, 422, 426, 429, 503}


def _error_classes() -> Iterator[type[errors.WorkshopError]]:
    for module in pkgutil.walk_packages(services.__path__, "services."):
        if module.name.endswith(("__main__", ".migrate")):
            continue
        importlib.import_module(module.name)
    seen: set[type[errors.WorkshopError]] = set()
    pending: list[type[errors.WorkshopError]] = [errors.WorkshopError]
    while pending:
        cls = pending.pop()
        if cls not in seen:
            seen.add(cls)
            pending.extend(cls.__subclasses__())
    yield from sorted(seen, key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


ERROR_CLASSES = list(_error_classes())


def test_every_error_reason_of_the_contract_has_a_row() -> None:
    names = [
        name.removeprefix("ERROR_REASON_")
        for name in common_pb2.ErrorReason.DESCRIPTOR.values_by_name
        if name != "ERROR_REASON_UNSPECIFIED"
    ]
    assert [name for name in names if name not in REASONS] == []


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__qualname__)
def test_every_error_class_has_a_row_of_its_kind(cls: type[errors.WorkshopError]) -> None:
    assert cls.reason in REASONS, f"{cls.__qualname__}: reason {cls.reason} has no row"
    kind = next((kind for kind in KINDS if issubclass(cls, kind)), None)
    if kind is None:
        return  # a bare WorkshopError: a fault of ours (INTERNAL), e.g. IMAGE_CORRUPTED
    assert REASONS[cls.reason].grpc_code == REASONS[kind.reason].grpc_code
    if kind not in (errors.InvalidArgument,):
        assert REASONS[cls.reason].http_status == REASONS[kind.reason].http_status


def test_statuses_a_client_can_be_answered() -> None:
    faults = {reason for reason, status in REASONS.items() if status.http_status >= 500}
    assert faults == {
        "WORKSHOP_ERROR",
        "INTERNAL",
        "DATA_LOSS",
        "IMAGE_CHANGED",
        "IMAGE_CORRUPTED",
        "NOT_IMPLEMENTED",
        "UNAVAILABLE",
    }
    others = {s.http_status for r, s in REASONS.items() if r not in faults}
    assert others <= CLIENT_STATUSES


def test_lookups() -> None:
    assert status_of_reason("STALE_REVISION").http_status == 409
    assert status_of_reason("SOMETHING_NEW", grpc.StatusCode.NOT_FOUND).http_status == 404
    assert status_of_reason("SOMETHING_NEW").http_status == 500
    # A reason set at raise time that the catalog lacks falls back to its class's.
    assert status_for(errors.Conflict("x", reason="NEWER")).http_status == 409
    assert status_for(ConnectionResetError()).http_status == 503
    assert status_for(ValueError()).http_status == 500
