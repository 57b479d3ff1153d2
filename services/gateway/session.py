"""Website login: `POST /api/session` signs in, `GET /api/session` tells the page who it is
(and its CSRF token), `DELETE /api/session` signs out.

`GET /api/session` answers 200 whether or not the browser is signed in: `signed_in`, and
when it is not, `ended`, whether its cookie names a session that ended (expired, signed
out, revoked, or of a disabled user) rather than none at all. A page learns so without a
failed request (a browser logs every 401 in its console), and tells a first visit apart
from a session that ended. Only a cookie that is no credential at all (malformed, or
over the bound of workshop.kit.auth) is refused, 401 CREDENTIAL_MALFORMED.

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

from services.gateway.dispatch import SESSION_COOKIE, parse_json, read_body, session_secret
from services.gateway.guard import check_csrf, check_origin, csrf_token
from services.gateway.upstream import Upstream, UpstreamError
from workshop.kit import errors, jsonmap
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
        if not secret:
            return _signed_out(ended=False)
        try:
            who = await self.upstream.call(
                "identity", "WhoAmI", identity_pb2.WhoAmIRequest(), secret
            )
        except UpstreamError as refused:
            if refused.reason == "CREDENTIAL_REJECTED":
                return _signed_out(ended=True)
            raise
        if who.session_id == "":  # a key in the cookie: it was never a session
            return _signed_out(ended=False)
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
            "signed_in": True,
            "user_id": user_id,
            "expires_at": expires_at.isoformat().replace("+00:00", "Z"),
            "csrf_token": csrf_token(secret),
        }


def _signed_out(*, ended: bool) -> JSONResponse:
    return JSONResponse({"signed_in": False, "ended": ended}, headers={"Cache-Control": "no-store"})
