"""IdentityService: a credential asks who it is (checked at every service's start)."""

from __future__ import annotations

from services.coordinator import convert
from services.coordinator.auth import Principal
from services.coordinator.servicers.common import Authenticator, Context
from workshop.v1 import common_pb2, identity_pb2, identity_pb2_grpc


class IdentityServicer(identity_pb2_grpc.IdentityServiceServicer):
    def __init__(self, authenticate: Authenticator) -> None:
        self._authenticate = authenticate

    async def WhoAmI(
        self, request: identity_pb2.WhoAmIRequest, context: Context
    ) -> identity_pb2.WhoAmIResponse:
        return who_am_i(await self._authenticate(context))


def who_am_i(principal: Principal) -> identity_pb2.WhoAmIResponse:
    reply = identity_pb2.WhoAmIResponse(
        kind=convert.PRINCIPAL_KINDS.get(principal.kind, common_pb2.PRINCIPAL_KIND_UNSPECIFIED),
        user_id=principal.user_id,
        key_id=principal.key_id,
        session_id=principal.session_id,
        display_name=principal.display_name,
        scopes=[convert.grant(grant) for grant in principal.grants],
    )
    if principal.expires_at is not None:
        reply.expires_at.FromDatetime(principal.expires_at)
    return reply
