"""A service checks its own coordinator key when it starts (IdentityService.WhoAmI).

A key the coordinator refuses, or one without the scope the service needs, would
otherwise let the service report SERVING and then fail every call it makes; the
caller exits with code 2 and this message instead. A coordinator that cannot be
reached yet (it starts later, or is down) is no reason not to start: the key is
then proved by its first use, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, identity_pb2, identity_pb2_grpc

log = logging.getLogger(__name__)

CHECK_TIMEOUT_SECONDS = 5.0
# The coordinator could not answer now; the key is not known to be wrong.
_NO_VERDICT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED}
)

Requirement = Callable[[identity_pb2.WhoAmIResponse], str | None]


class KeyRefused(Exception):
    """The coordinator refuses the key, or it cannot do what the service needs."""


def has_scope(scope: common_pb2.Scope.ValueType, *, device_id: str = "") -> Requirement:
    """The key must hold `scope` (bound to `device_id` when one is given)."""
    name = common_pb2.Scope.Name(scope)

    def check(reply: identity_pb2.WhoAmIResponse) -> str | None:
        if any(
            held.scope == scope and (not device_id or held.device_id == device_id)
            for held in reply.scopes
        ):
            return None
        bound = f" bound to device {device_id!r}" if device_id else ""
        return f"key {reply.key_id or reply.session_id} has no scope {name}{bound}"

    return check


async def check_own_key(
    channel: grpc.aio.Channel,
    secret: str,
    *,
    variable: str,
    target: str,
    requirement: Requirement,
) -> bool:
    """True when the coordinator at `target` accepts `secret` and it meets `requirement`;
    False when the coordinator gave no verdict; raises KeyRefused (naming `variable`)."""
    stub = identity_pb2_grpc.IdentityServiceStub(channel)
    try:
        reply = await stub.WhoAmI(
            identity_pb2.WhoAmIRequest(),
            metadata=bearer_metadata(secret),
            timeout=CHECK_TIMEOUT_SECONDS,
        )
    except grpc.aio.AioRpcError as error:
        if error.code() in _NO_VERDICT:
            log.warning(
                "could not check %s with the coordinator at %s (%s); starting anyway",
                variable,
                target,
                error.code().name,
            )
            return False
        raise KeyRefused(
            f"{variable}: the coordinator at {target} refuses this key: {error.details()}"
        ) from None
    problem = requirement(reply)
    if problem is not None:
        raise KeyRefused(f"{variable}: {problem}")
    return True
