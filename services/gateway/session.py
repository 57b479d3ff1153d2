"""Website login: `POST /api/session` signs in, `GET /api/session` tells the page who it is
(and its CSRF token), `DELETE /api/session` signs out.

The session secret lives only in an HttpOnly cookie (Secure unless
GATEWAY_COOKIE_SECURE=0 for plain local HTTP; SameSite=Lax; Path=/), so page JavaScript
never holds it. The coordinator checks the password (argon2id) and throttles failed
logins per user and per client address, for every gateway replica at once; the gateway
passes the client's address with its own `gateway` key.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from services.gateway import jsonmap
from services.gateway.dispatch import SESSION_COOKIE, parse_json, read_body, session_secret
from services.gateway.guard import check_csrf, check_origin, csrf_token
from services.gateway.upstream import Upstream
from workshop.kit import errors
from workshop.v1 import identity_pb2


class GatewayKeyMissing(errors.Unavailable):
    """The gateway has no `gateway` key configured, so it cannot sign anyone in."""


@dataclasses.dataclass(frozen=True)
class SessionRoutes:
    upstream: Upstream
    gateway_key: str
    allowed_origins: frozenset[str]
    cookie_secure: bool
    max_body_bytes: int

    async def login(self, request: Request) -> Response:
        check_origin(request.headers, self.allowed_origins)
        body = parse_json(
            await read_body(request, self.max_body_bytes), request.headers.get("content-type")
        )
        login = jsonmap.from_json(body, identity_pb2.LoginRequest, exclude=("client_address",))
        if not self.gateway_key:
            raise GatewayKeyMissing("Login is not configured on this gateway (GATEWAY_KEY).")
        login.client_address = request.client.host if request.client else "unknown"
        answer = await self.upstream.call("identity", "Login", login, self.gateway_key)
        session = answer.session
        expires_at = session.expires_at.ToDatetime(tzinfo=UTC)
        # The lifetime by the coordinator's clock (which may not be the gateway's).
        lifetime = expires_at - session.created_at.ToDatetime(tzinfo=UTC)
        response = JSONResponse(self._described(answer.secret, session.user_id, expires_at))
        response.set_cookie(
            SESSION_COOKIE,
            answer.secret,
            max_age=max(0, int(lifetime.total_seconds())),
            path="/",
            secure=self.cookie_secure,
            httponly=True,
            samesite="lax",
        )
        response.headers["Cache-Control"] = "no-store"
        return response

    async def current(self, request: Request) -> Response:
        secret = session_secret(request)
        who = await self.upstream.call("identity", "WhoAmI", identity_pb2.WhoAmIRequest(), secret)
        if who.session_id == "":
            raise errors.Unauthenticated("Sign in first.", reason="CREDENTIAL_MISSING")
        body = self._described(secret, who.user_id, who.expires_at.ToDatetime(tzinfo=UTC))
        body["display_name"] = who.display_name
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    async def logout(self, request: Request) -> Response:
        check_origin(request.headers, self.allowed_origins)
        secret = session_secret(request)
        if secret:
            check_csrf(request.headers, secret)
        await self.upstream.call("identity", "Logout", identity_pb2.LogoutRequest(), secret)
        response = Response(status_code=204, headers={"Cache-Control": "no-store"})
        response.delete_cookie(
            SESSION_COOKIE, path="/", secure=self.cookie_secure, httponly=True, samesite="lax"
        )
        return response

    @staticmethod
    def _described(secret: str, user_id: str, expires_at: datetime) -> dict[str, Any]:
        return {
            "user_id": user_id,
            "expires_at": expires_at.isoformat().replace("+00:00", "Z"),
            "csrf_token": csrf_token(secret),
        }
