"""Checks on request fields shared by every RPC: ids, digests, page sizes."""

from __future__ import annotations

import re

from services.coordinator.platform.errors import InvalidField
from workshop.kit import limits

# Always fullmatch: `$` (and `match` without it) would let a final newline in.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def check_id(field: str, value: str) -> str:
    """A client-chosen id: 1-128 characters of [A-Za-z0-9._-] starting with a letter or digit."""
    if not _ID.fullmatch(value):
        shown = repr(value) if value else "empty"
        raise InvalidField(
            f"{field} must be 1-128 characters of letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit (got {shown}).",
            metadata={"field": field},
        )
    return value


def check_request_id(field: str, value: str) -> str | None:
    """An optional client-chosen request id (None when empty): at most 64 characters of
    [A-Za-z0-9._:-], room for a UUID with a prefix."""
    if not value:
        return None
    if not _REQUEST_ID.fullmatch(value):
        raise InvalidField(
            f"{field} must be at most 64 characters of letters, digits, '.', '_', ':' or '-' "
            f"(got {value[:80]!r})."
        )
    return value


def check_sha256(field: str, value: str) -> str:
    if not _SHA256.fullmatch(value):
        raise InvalidField(f"{field} must be 64 lower-case hex characters (a SHA-256 digest).")
    return value


def page_size(requested: int, limit: limits.Limit = limits.PAGE) -> int:
    """The page size to use (`limit`'s default for 0); above its maximum is refused."""
    return bounded("page_size", requested, limit)


def bounded(field: str, requested: int, limit: limits.Limit) -> int:
    """A sizing field's value to use: the default for 0, refused above the maximum (the
    schemas publish that maximum, so nothing above it is quietly lowered)."""
    if requested > limit.maximum:
        raise InvalidField(
            f"{field} is at most {limit.maximum:,} (got {requested:,}).",
            metadata={"field": field},
        )
    return limit.resolve(requested)


def page_token(value: str) -> str | None:
    """The last key of the previous page, or None for the first page."""
    return value or None
