"""IdentityService: who a credential is (checked at every service's start), website sign-in
and sign-out, and a user's own keys; translates the contract to IdentityApi and back."""

from __future__ import annotations

from services.coordinator import convert
from services.coordinator.identity.auth import PRINCIPAL_KINDS, Principal
from services.coordinator.identity.signin import IdentityApi
from services.coordinator.platform.fields import page_size
from services.coordinator.servicers.common import (
    Authenticator,
    Context,
    next_token,
    time_and_id_token,
)
from workshop.kit.auth import bearer_secret
from workshop.v1 import common_pb2, identity_pb2, identity_pb2_grpc


class IdentityServicer(identity_pb2_grpc.IdentityServiceServicer):
    def __init__(self, authenticate: Authenticator, api: IdentityApi) -> None:
        self._authenticate = authenticate
        self.api = api

    async def WhoAmI(
        self, request: identity_pb2.WhoAmIRequest, context: Context
    ) -> identity_pb2.WhoAmIResponse:
        return who_am_i(await self._authenticate(context))

    async def Login(
        self, request: identity_pb2.LoginRequest, context: Context
    ) -> identity_pb2.LoginResponse:
        row, secret = await self.api.login(
            await self._authenticate(context),
            request.user_id,
            request.password,
            request.client_address,
        )
        return identity_pb2.LoginResponse(
            session=convert.session(row), secret=secret, expires_at=convert.ts(row.expires_at)
        )

    async def Logout(
        self, request: identity_pb2.LogoutRequest, context: Context
    ) -> identity_pb2.LogoutResponse:
        row = await self.api.logout(bearer_secret(context.invocation_metadata()))
        self._authenticate.forget()  # a cached principal of this session
        return identity_pb2.LogoutResponse(session=convert.session(row))

    async def CreateOwnKey(
        self, request: identity_pb2.CreateOwnKeyRequest, context: Context
    ) -> identity_pb2.CreateOwnKeyResponse:
        row, secret = await self.api.create_own_key(
            await self._authenticate(context),
            name=request.name,
            grants=[convert.grant_from_proto(scope) for scope in request.scopes],
            ttl=convert.from_duration(request.ttl),
        )
        return identity_pb2.CreateOwnKeyResponse(key=convert.key(row), secret=secret)

    async def ListOwnKeys(
        self, request: identity_pb2.ListOwnKeysRequest, context: Context
    ) -> identity_pb2.ListOwnKeysResponse:
        who = await self._authenticate(context)
        limit = page_size(request.page_size)
        rows = await self.api.list_own_keys(
            who, request.include_revoked, time_and_id_token(request.page_token), limit
        )
        return identity_pb2.ListOwnKeysResponse(
            keys=[convert.key(row) for row in rows],
            next_page_token=next_token(rows, limit, lambda row: (row.created_at, row.key_id)),
        )

    async def RevokeOwnKey(
        self, request: identity_pb2.RevokeOwnKeyRequest, context: Context
    ) -> identity_pb2.RevokeOwnKeyResponse:
        row = await self.api.revoke_own_key(await self._authenticate(context), request.key_id)
        self._authenticate.forget()
        return identity_pb2.RevokeOwnKeyResponse(key=convert.key(row))


def who_am_i(principal: Principal) -> identity_pb2.WhoAmIResponse:
    reply = identity_pb2.WhoAmIResponse(
        kind=PRINCIPAL_KINDS.get(principal.kind, common_pb2.PRINCIPAL_KIND_UNSPECIFIED),
        user_id=principal.user_id,
        key_id=principal.key_id,
        session_id=principal.session_id,
        display_name=principal.display_name,
        scopes=[convert.grant(grant) for grant in principal.grants],
    )
    if principal.expires_at is not None:
        reply.expires_at.FromDatetime(principal.expires_at)
    return reply
