"""The gateway's gRPC clients, made once per process, and what their errors become.

Every call forwards the caller's own credential (the website's session secret, or an
Agent key) as bearer metadata, so the coordinator and the preview service decide who
may do what; the gateway holds no authority of its own beyond its `gateway` key (login,
and the one WatchRun stream per run that its live sockets share).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from workshop.kit import errors
from workshop.kit.auth import bearer_metadata, check_secret_length
from workshop.kit.channels import open_channel
from workshop.kit.status import status_of_reason, status_of_transport
from workshop.kit.telemetry import client_interceptors
from workshop.kit.tls import ClientTls
from workshop.v1 import (
    dataset_pb2_grpc,
    identity_pb2_grpc,
    operator_pb2_grpc,
    preview_pb2_grpc,
    workshop_pb2_grpc,
)

Metadata = tuple[tuple[str, str], ...]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class UpstreamError(Exception):
    """A call that did not succeed: a service's refusal (its code, ErrorInfo reason and
    metadata, and message), or, with `transport`, a status gRPC made itself on the way
    (no ErrorInfo), named by its code and answered by what it means
    (`workshop.kit.status.TRANSPORT_STATUSES`)."""

    code: grpc.StatusCode
    reason: str
    message: str
    metadata: dict[str, str]
    transport: bool = False

    @property
    def http_status(self) -> int:
        if self.transport:
            return status_of_transport(self.code).http_status
        return status_of_reason(self.reason, self.code).http_status


# What the caller of the gateway is told of a transport status, by its reason; the
# details (addresses, sizes) go to the gateway's log only.
_TRANSPORT_MESSAGES = {
    "UNAVAILABLE": "A service behind the gateway cannot be reached now; ask again shortly.",
    "DEADLINE_EXCEEDED": "A service behind the gateway did not answer in time; ask again "
    "shortly (every write is idempotent: asking again is safe).",
}


def upstream_error(error: grpc.aio.AioRpcError) -> UpstreamError:
    """The refusal in `error`, read from its rich status; a status without ErrorInfo is
    the transport's (see UpstreamError)."""
    code = error.code()
    status = rpc_status.from_call(error)
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return UpstreamError(
                code, info.reason, error.details() or code.name, dict(info.metadata)
            )
    return transport_error(code, error.details() or "")


def transport_error(code: grpc.StatusCode, details: str) -> UpstreamError:
    reason = status_of_transport(code).reason
    log.warning("a call behind the gateway ended with gRPC %s: %s", code.name, details[:500])
    message = _TRANSPORT_MESSAGES.get(reason) or (
        f"A service behind the gateway failed to answer (gRPC {code.name} on the way, not a "
        "refusal of this request); the gateway's log has the details."
    )
    return UpstreamError(code, reason, message, {}, transport=True)


def _answered(message: Any) -> Any:
    """`message`, or BAD_GATEWAY when grpc.aio could not parse it (it gives None then)."""
    if message is None:
        raise transport_error(grpc.StatusCode.INTERNAL, "a response that does not parse")
    return message


def credential_metadata(secret: str) -> Metadata:
    """Bearer metadata for `secret` ("" sends none: the service answers CREDENTIAL_MISSING).
    Every credential the gateway forwards comes through here, so this is where one is
    bounded (workshop.kit.auth): an oversized one never meets gRPC's metadata limit."""
    if not secret:
        return ()
    check_secret_length(secret)
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
        self.datasets = dataset_pb2_grpc.DatasetServiceStub(self._coordinator)

    def method(self, service: str, name: str) -> Any:
        return getattr(getattr(self, service), name)

    async def call(self, service: str, name: str, request: Message, secret: str) -> Any:
        """One unary call with the caller's credential; UpstreamError when refused."""
        try:
            answer = await self.method(service, name)(request, metadata=credential_metadata(secret))
        except grpc.aio.AioRpcError as error:
            raise upstream_error(error) from None
        return _answered(answer)

    async def stream(
        self, service: str, name: str, request: Message, secret: str
    ) -> AsyncGenerator[Any]:
        """A server stream's messages; UpstreamError when refused (before or during)."""
        call = self.method(service, name)(request, metadata=credential_metadata(secret))
        try:
            async for message in call:
                yield _answered(message)
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
