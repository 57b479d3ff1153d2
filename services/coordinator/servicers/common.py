"""What every coordinator servicer needs: the caller's principal, and page tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import grpc

from services.coordinator.auth import Principal, authenticate
from services.coordinator.clock import Clock
from services.coordinator.db import Database
from services.coordinator.errors import InvalidField
from workshop.kit.auth import bearer_secret

Context = grpc.aio.ServicerContext[Any, Any]


class Authenticator:
    """Turns the bearer credential of a call into a Principal (or UNAUTHENTICATED)."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    async def __call__(self, context: Context) -> Principal:
        return await self.principal(bearer_secret(context.invocation_metadata()))

    async def principal(self, secret: str) -> Principal:
        async with self._db.connection() as connection:
            return await authenticate(connection, secret, self._clock.now())


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


def next_token(rows: list[Any], limit: int, *columns: str) -> str:
    """The token after the last row when the page is full, else ''."""
    if len(rows) < limit:
        return ""
    last = rows[-1]
    return "|".join(
        value.isoformat() if hasattr(value, "isoformat") else str(value)
        for value in (last[column] for column in columns)
    )
