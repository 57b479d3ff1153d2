"""Bearer credentials in gRPC metadata: `authorization: Bearer <secret>`, and the bound on
a credential's length.

A Workshop secret (an Agent key, a session) is under 100 bytes. One far longer is no
credential of ours, and left to itself it would meet gRPC's own metadata limit: a
server's transport drops a call whose metadata is over 8 KiB at random and every call
over 16 KiB (the defaults), answering RESOURCE_EXHAUSTED, which a caller reads as "retry
later" and which no retry fixes. So a secret over `MAX_SECRET_BYTES` is refused as
CREDENTIAL_MALFORMED, saying why, by every server (`bearer_secret`) and by the gateway
before it forwards one (`check_secret_length`); the bound leaves room under the 8 KiB
for the rest of a call's metadata (about 600 bytes: path, authority, user agent,
deadline, trace context). The servers take metadata up to gRPC's 16 KiB hard limit
without the random band (`MAX_METADATA_BYTES`, workshop.kit.server), so every call
with a credential up to about 15 KiB gets this answer, every time.
"""

from __future__ import annotations

from collections.abc import Iterable

from workshop.kit.errors import Unauthenticated

AUTHORIZATION_KEY = "authorization"
_SCHEME = "bearer"
MAX_SECRET_BYTES = 4096
# What a server's transport accepts of a call's metadata (gRPC's own hard limit, also as
# its soft limit: no call under it is dropped at random).
MAX_METADATA_BYTES = 16 * 1024

Metadata = Iterable[tuple[str, str | bytes]]


def bearer_metadata(secret: str) -> tuple[tuple[str, str]]:
    """Metadata that carries `secret` as a bearer credential."""
    if not secret or any(ch.isspace() for ch in secret):
        raise ValueError("a bearer secret must be non-empty and contain no whitespace")
    return ((AUTHORIZATION_KEY, f"Bearer {secret}"),)


def check_secret_length(secret: str | bytes, holder: str = "credential") -> None:
    """Unauthenticated (CREDENTIAL_MALFORMED) when `secret` is over MAX_SECRET_BYTES;
    `holder` names what carried it, for the message. Metadata: `limit_bytes` and
    `length_bytes`, so that an HTTP answer can word it for its caller."""
    size = len(secret.encode() if isinstance(secret, str) else secret)
    if size > MAX_SECRET_BYTES:
        raise Unauthenticated(
            f"The {holder} is {size} bytes; a credential is at most {MAX_SECRET_BYTES} "
            "(a Workshop key or session secret is under 100).",
            reason="CREDENTIAL_MALFORMED",
            metadata={"limit_bytes": str(MAX_SECRET_BYTES), "length_bytes": str(size)},
        )


def bearer_secret(metadata: Metadata | None) -> str:
    """The bearer secret in `metadata`; Unauthenticated when absent, malformed or over
    MAX_SECRET_BYTES."""
    values = [value for key, value in (metadata or ()) if key.lower() == AUTHORIZATION_KEY]
    if not values:
        raise Unauthenticated(
            "Missing credential: send metadata 'authorization: Bearer <key>'.",
            reason="CREDENTIAL_MISSING",
        )
    if len(values) > 1:
        raise Unauthenticated(
            "Send exactly one 'authorization' credential.", reason="CREDENTIAL_MALFORMED"
        )
    raw = values[0]
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    scheme, _, secret = text.strip().partition(" ")
    secret = secret.strip()
    check_secret_length(secret, "'authorization' credential")
    if scheme.lower() != _SCHEME or not secret or " " in secret:
        raise Unauthenticated(
            "Malformed credential: expected 'Bearer <key>'.", reason="CREDENTIAL_MALFORMED"
        )
    return secret
