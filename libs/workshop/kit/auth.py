"""Bearer credentials in gRPC metadata: `authorization: Bearer <secret>`."""

from __future__ import annotations

from collections.abc import Iterable

from workshop.kit.errors import Unauthenticated

AUTHORIZATION_KEY = "authorization"
_SCHEME = "bearer"

Metadata = Iterable[tuple[str, str | bytes]]


def bearer_metadata(secret: str) -> tuple[tuple[str, str]]:
    """Metadata that carries `secret` as a bearer credential."""
    if not secret or any(ch.isspace() for ch in secret):
        raise ValueError("a bearer secret must be non-empty and contain no whitespace")
    return ((AUTHORIZATION_KEY, f"Bearer {secret}"),)


def bearer_secret(metadata: Metadata | None) -> str:
    """The bearer secret in `metadata`; Unauthenticated when absent or malformed."""
    values = [value for key, value in (metadata or ()) if key.lower() == AUTHORIZATION_KEY]
    if not values:
        raise Unauthenticated(
            "Missing credential: send metadata 'authorization: Bearer <key>'.",
            reason="CREDENTIAL_MISSING",
        )
    if len(values) > 1:
        raise Unauthenticated(
            "Send exactly one 'authorization' metadata entry.", reason="CREDENTIAL_MALFORMED"
        )
    raw = values[0]
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    scheme, _, secret = text.strip().partition(" ")
    secret = secret.strip()
    if scheme.lower() != _SCHEME or not secret or " " in secret:
        raise Unauthenticated(
            "Malformed credential: expected 'Bearer <key>'.", reason="CREDENTIAL_MALFORMED"
        )
    return secret
