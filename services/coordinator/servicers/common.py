"""What every coordinator servicer needs: the caller's principal, and page tokens."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import grpc

from services.coordinator.identity.auth import (
    KEY_ADVICE,
    PRINCIPAL_CACHE_SECONDS,
    SESSION_ADVICE,
    Principal,
    authenticate,
    rejected,
)
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import Database
from services.coordinator.platform.errors import InvalidField
from workshop.kit.auth import bearer_secret
from workshop.kit.hashing import sha256_hex

Context = grpc.aio.ServicerContext[Any, Any]

PRINCIPAL_CACHE_SIZE = 10_000

T = TypeVar("T")


class Authenticator:
    """Turns the bearer credential of a call into a Principal (or UNAUTHENTICATED).

    `__call__` and `principal` read the credential from the database on every call.
    `cached` and `cached_principal` reuse a principal read within the last
    `PRINCIPAL_CACHE_SECONDS` (one round trip less per call); they are for the lease
    and publication calls alone, whose SQL checks the calling keys again under the
    committing transaction's snapshot: Claim the claiming key (job_claim), the fenced
    writes the reporting key and its user (fence 4, workshop_fence), staging and
    publishing also the preview service's key (key_live). A cached principal is
    still refused once its credential's own expiry passes, and a revocation made
    through this process (`forget`) empties the cache at once.
    """

    def __init__(
        self,
        db: Database,
        clock: Clock,
        *,
        cache_seconds: float = PRINCIPAL_CACHE_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = db
        self._clock = clock
        self._cache_seconds = cache_seconds
        self._monotonic = monotonic
        # SHA-256 of the secret -> (monotonic time read, principal)
        self._cache: dict[str, tuple[float, Principal]] = {}

    async def __call__(self, context: Context) -> Principal:
        return await self.principal(bearer_secret(context.invocation_metadata()))

    async def principal(self, secret: str) -> Principal:
        async with self._db.connection() as connection:
            return await authenticate(connection, secret, self._clock.now())

    async def cached(self, context: Context) -> Principal:
        return await self.cached_principal(bearer_secret(context.invocation_metadata()))

    async def cached_principal(self, secret: str) -> Principal:
        if self._cache_seconds <= 0:
            return await self.principal(secret)
        digest = sha256_hex(secret.encode())
        found = self._cache.get(digest)
        now = self._monotonic()
        if found is not None and now - found[0] < self._cache_seconds:
            principal = found[1]
            if principal.expires_at is not None and principal.expires_at <= self._clock.now():
                del self._cache[digest]
                advice = SESSION_ADVICE if principal.kind == "session" else KEY_ADVICE
                raise rejected(f"{principal.kind} has expired", advice)
            return principal
        principal = await self.principal(secret)
        if len(self._cache) >= PRINCIPAL_CACHE_SIZE:
            self._evict(now)
        self._cache[digest] = (now, principal)
        return principal

    def forget(self) -> None:
        """Drops every cached principal (after a revocation made through this process)."""
        self._cache.clear()

    def _evict(self, now: float) -> None:
        stale = [key for key, (read, _) in self._cache.items() if now - read >= self._cache_seconds]
        for key in stale:
            del self._cache[key]
        if len(self._cache) >= PRINCIPAL_CACHE_SIZE:
            self._cache.clear()


def split_token(token: str, parts: int) -> list[str] | None:
    """A composite page token 'a|b' split into its parts; None for the first page."""
    if not token:
        return None
    values = token.split("|")
    if len(values) != parts or not all(values):
        raise InvalidField("page_token is malformed; pass the next_page_token of a previous page.")
    return values


def time_and_id_token(token: str) -> tuple[datetime, str] | None:
    """A page token made of a timestamp and an id, as `next_token` writes it."""
    parts = split_token(token, 2)
    if parts is None:
        return None
    try:
        return datetime.fromisoformat(parts[0]), parts[1]
    except ValueError:
        raise InvalidField("page_token is malformed.") from None


def next_token(rows: Sequence[T], limit: int, key: Callable[[T], tuple[object, ...]]) -> str:
    """The token after the last row when the page is full, else ''; `key` gives the values
    the page is ordered by (a timestamp is written as ISO 8601)."""
    if len(rows) < limit:
        return ""
    return "|".join(
        value.isoformat() if isinstance(value, datetime) else str(value) for value in key(rows[-1])
    )
