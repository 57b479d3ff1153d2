"""Cross-site protection for the website's routes (`/api`): Fetch Metadata, Origin, and a
CSRF token.

A state-changing `/api` request must come from the website's own pages:
- `Sec-Fetch-Site` (sent by every current browser) must be `same-origin` or `none`, or the
  request's `Origin` must be one of the configured allowed origins;
- without `Sec-Fetch-Site`, an `Origin` must name this host (or an allowed origin); a
  request with neither header comes from no browser, so it cannot be a cross-site forgery;
- with a session cookie, the `X-CSRF-Token` header must hold the session's token, which
  the page reads from `GET /api/session` (a hash of the session secret: any gateway
  replica can check it, and it tells nothing about the secret).
A WebSocket handshake is checked by its `Origin` the same way (a cross-site page can open
a WebSocket with the user's cookies: only the Origin check stops that). `/v1` routes read
no cookie, so they need none of this.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Collection
from urllib.parse import urlsplit

from starlette.datastructures import Headers

from workshop.kit import errors

CSRF_HEADER = "x-csrf-token"
_SAME_SITE_VALUES = ("same-origin", "none")


class CrossSiteRefused(errors.PermissionDenied):
    reason = "CROSS_SITE"


class CsrfTokenRefused(errors.PermissionDenied):
    reason = "CSRF_TOKEN"


def csrf_token(session_secret: str) -> str:
    digest = hashlib.sha256(b"workshop-csrf\0" + session_secret.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def check_origin(headers: Headers, allowed_origins: Collection[str]) -> None:
    """CrossSiteRefused unless the request comes from this site (or an allowed origin)."""
    origin = headers.get("origin")
    if origin is not None and origin in allowed_origins:
        return
    site = headers.get("sec-fetch-site")
    if site is not None:
        if site in _SAME_SITE_VALUES:
            return
        raise CrossSiteRefused(
            f"Cross-site request refused (Sec-Fetch-Site: {site[:40]}); use the website or "
            "the /v1 API with an Agent key."
        )
    if origin is None or _same_host(origin, headers.get("host", "")):
        return
    raise CrossSiteRefused(
        f"Cross-site request refused: origin {origin[:100]!r} is not this site or an allowed "
        "origin (GATEWAY_ALLOWED_ORIGINS)."
    )


def check_csrf(headers: Headers, session_secret: str) -> None:
    """CsrfTokenRefused unless the header holds the session's CSRF token."""
    given = headers.get(CSRF_HEADER, "")
    if not hmac.compare_digest(given.encode(), csrf_token(session_secret).encode()):
        raise CsrfTokenRefused(
            "Missing or wrong X-CSRF-Token header: send the csrf_token of GET /api/session."
        )


def _same_host(origin: str, host: str) -> bool:
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        return False
    return bool(netloc) and netloc.lower() == host.lower()
