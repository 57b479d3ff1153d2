"""The gateway's gRPC clients, made once per process, and what their errors become.

Every call forwards the caller's own credential (the website's session secret, or an
Agent key) as bearer metadata, so the coordinator and the preview service decide who
may do what; the gateway holds no authority of its own beyond its `gateway` key (login,
and the one WatchRun stream per run that its live sockets share).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator
from typing import Any

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from workshop.kit import errors
from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.kit.status import status_of_reason
from workshop.kit.telemetry import client_interceptors
from workshop.kit.tls import ClientTls
from workshop.v1 import (
    identity_pb2_grpc,
    operator_pb2_grpc,
    preview_pb2_grpc,
    workshop_pb2_grpc,
)

Metadata = tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class UpstreamError(Exception):
    """A service refused a call: its code, ErrorInfo reason and metadata, and message."""

    code: grpc.StatusCode
    reason: str
    message: str
    metadata: dict[str, str]

    @property
    def http_status(self) -> int:
        return status_of_reason(self.reason, self.code).http_status


def upstream_error(error: grpc.aio.AioRpcError) -> UpstreamError:
    """The refusal in `error`, read from its rich status (a status without details, e.g.
    grpc's own DEADLINE_EXCEEDED or UNAVAILABLE, is named by its code)."""
    code = error.code()
    reason, metadata = code.name, {}
    status = rpc_status.from_call(error)
    if status is not None:
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                reason, metadata = info.reason, dict(info.metadata)
                break
    message = error.details() or code.name
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and not status:
        message = "A service behind the gateway cannot be reached now; ask again shortly."
    return UpstreamError(code, reason, message, metadata)


def credential_metadata(secret: str) -> Metadata:
    """Bearer metadata for `secret` ("" sends none: the service answers CREDENTIAL_MISSING)."""
    if not secret:
        return ()
    if not secret.isascii() or not secret.isprintable() or " " in secret:
        raise errors.Unauthenticated(
            "Malformed credential: expected 'Bearer <key>'.", reason="CREDENTIAL_MALFORMED"
        )
    return bearer_metadata(secret)


class Upstream:
    """Stubs of the coordinator and the preview service on channels made once."""

    def __init__(
        self,
        coordinator_target: str,
        preview_target: str,
        deadline_seconds: float,
        *,
        tls: ClientTls | None = None,
    ):
        # No automatic retries: a browser or agent retries on 503 itself, and a
        # retried write would wait out the deadline twice.
        # With tracing on, each call carries the trace context of the request it serves.
        traced = client_interceptors()
        self._coordinator, self._preview = (
            open_channel(
                target,
                deadline_seconds=deadline_seconds,
                max_attempts=1,
                tls=tls,
                interceptors=traced,
            )
            for target in (coordinator_target, preview_target)
        )
        self.workshop = workshop_pb2_grpc.WorkshopServiceStub(self._coordinator)
        self.operator = operator_pb2_grpc.OperatorServiceStub(self._coordinator)
        self.identity = identity_pb2_grpc.IdentityServiceStub(self._coordinator)
        self.preview = preview_pb2_grpc.PreviewServiceStub(self._preview)

    def method(self, service: str, name: str) -> Any:
        return getattr(getattr(self, service), name)

    async def call(self, service: str, name: str, request: Message, secret: str) -> Any:
        """One unary call with the caller's credential; UpstreamError when refused."""
        try:
            return await self.method(service, name)(request, metadata=credential_metadata(secret))
        except grpc.aio.AioRpcError as error:
            raise upstream_error(error) from None

    async def stream(
        self, service: str, name: str, request: Message, secret: str
    ) -> AsyncGenerator[Any]:
        """A server stream's messages; UpstreamError when refused (before or during)."""
        call = self.method(service, name)(request, metadata=credential_metadata(secret))
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as error:
            raise upstream_error(error) from None
        finally:
            call.cancel()

    async def close(self) -> None:
        await self._coordinator.close(None)
        await self._preview.close(None)


def problems_metadata(metadata: dict[str, str]) -> list[Any] | None:
    """The validation problems a VALIDATION_FAILED refusal carries as JSON, if any."""
    raw = metadata.get("problems")
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, list) else None
