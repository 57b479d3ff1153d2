"""The coordinator's only door to Postgres (asyncpg).

Statements come from the named `.sql` files (see `queries`); callers name them
as `sql("runs", "run_insert")`. jsonb columns travel as Python values.

Pooled connections carry no session state, so releasing one costs no round trip:
asyncpg's default reset (`pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET
ALL`, measured at 2.6 ms of a 4-call lease cycle) is replaced by nothing beyond what
asyncpg always does (roll back an open transaction, drop listener callbacks). Work
that leaves session state behind (the session advisory locks of the maintenance and
scheduler loops) runs on `Database.session()`, which resets fully before release;
RunEvents LISTENs on a connection of its own.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from asyncpg.exceptions import (
    ForeignKeyViolationError,
    InvalidAuthorizationSpecificationError,
    UniqueViolationError,
)

from services.coordinator import queries

Connection = asyncpg.Connection
Pool = asyncpg.Pool
Record = asyncpg.Record

__all__ = [
    "Connection",
    "Database",
    "ForeignKeyViolationError",
    "InvalidAuthorizationSpecificationError",
    "Pool",
    "Record",
    "UniqueViolationError",
    "sql",
]


def sql(file_stem: str, name: str) -> str:
    """The statement `name` of `sql/<file_stem>.sql`."""
    return queries.load(file_stem)[name]


async def _init_connection(connection: Any) -> None:
    for type_name in ("json", "jsonb"):
        await connection.set_type_codec(
            type_name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )


async def _no_session_reset(connection: Any) -> None:
    """Releases a pooled connection as it is: see the module docstring."""


class Database:
    """A connection pool plus the few helpers every store module uses."""

    def __init__(self, pool: Any, dsn: str) -> None:
        self.pool = pool
        self.dsn = dsn  # for the one LISTEN connection of RunEvents

    @classmethod
    @asynccontextmanager
    async def open(cls, dsn: str, *, size: int = 10) -> AsyncIterator[Database]:
        pool = await asyncpg.create_pool(
            dsn, min_size=1, max_size=size, init=_init_connection, reset=_no_session_reset
        )
        try:
            yield cls(pool, dsn)
        finally:
            await pool.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        async with self.pool.acquire() as connection:
            yield connection

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        async with self.pool.acquire() as connection, connection.transaction():
            yield connection

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Any]:
        """A pooled connection for work that leaves session state (advisory locks).

        It goes back to the pool only after asyncpg's full reset; if that reset fails
        or is cancelled, the connection is closed instead, so no lock outlives its user.
        """
        async with self.pool.acquire() as connection:
            try:
                yield connection
            finally:
                try:
                    await connection.reset()
                except BaseException:
                    connection.terminate()
                    raise
