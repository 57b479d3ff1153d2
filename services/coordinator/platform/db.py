"""The coordinator's only door to Postgres (asyncpg).

Statements come from the named `.sql` files (see `queries`); callers name them
as `sql("runs", "run_get")`, or, for a statement with named parameters, bind its
generated parameter class: `connection.fetchrow(*bind(KeyCreate(key_id=..., ...)))`
(`queries.bind`: the statement's text, then the values in order; `fetch_one` and
`fetch_all` take them the same way). jsonb columns and parameters travel as Python values.

Pooled connections carry no session state, so releasing one costs no round trip:
asyncpg's default reset (`pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET
ALL`, measured at 2.6 ms of a 4-call lease cycle) is replaced by nothing beyond what
asyncpg always does (roll back an open transaction, drop listener callbacks). Work
that leaves session state behind (the session advisory locks of the maintenance and
scheduler loops) runs on `Database.session()`, which resets fully before release;
RunEvents LISTENs on a connection of its own.

Rows leave this layer typed: each statement's result is read into a small frozen
dataclass derived from `Row`, named after the domain (`RunRow`, `JobRow`, ...) and
defined beside the module that runs the statement. Its fields name the columns it reads,
so the column list is written once; `fetch_one`, `fetch_all` and `Row.from_record`
build it right at the fetch, and nothing above the store layer indexes a record.

A database that cannot be reached (down, restarting, refusing connections, or a
connection dropped under a statement, e.g. by `pg_terminate_backend`) is not a bug: every
helper here turns that into `DatabaseUnavailable` (UNAVAILABLE, safe to ask again), so
no caller answers INTERNAL for it and the kit needs no asyncpg.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import typing
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Self, TypeAlias, TypeVar

import asyncpg
from asyncpg.exceptions import (
    AdminShutdownError,
    CannotConnectNowError,
    CrashShutdownError,
    ForeignKeyViolationError,
    IdleSessionTimeoutError,
    InterfaceError,
    InvalidAuthorizationSpecificationError,
    PostgresConnectionError,
    PostgresError,
    TooManyConnectionsError,
    UndefinedTableError,
    UniqueViolationError,
)

from services.coordinator.platform import queries
from services.coordinator.platform.errors import DatabaseUnavailable
from services.coordinator.platform.queries import Bound, Params, bind
from services.coordinator.platform.versions import application_name

log = logging.getLogger(__name__)

# asyncpg ships no type information: these are Any to the checker, which is why rows
# leave this module typed.
Connection: TypeAlias = asyncpg.Connection
Pool: TypeAlias = asyncpg.Pool
Record: TypeAlias = asyncpg.Record

__all__ = [
    "Bound",
    "Connection",
    "Database",
    "ForeignKeyViolationError",
    "InvalidAuthorizationSpecificationError",
    "Params",
    "Pool",
    "PostgresError",
    "Record",
    "Row",
    "UndefinedTableError",
    "UniqueViolationError",
    "bind",
    "connect",
    "fetch_all",
    "fetch_column",
    "fetch_one",
    "sql",
]

R = TypeVar("R", bound="Row")
T = TypeVar("T")


# What says the database cannot be reached now, whichever connection it came from: a
# refused, reset or timed-out socket (OSError, TimeoutError included: a connect or pool
# acquire that timed out), SQLSTATE class 08, and a server shutting down, starting up,
# crashed or out of connection slots. (Any error on a connection that is closed
# afterwards means the same: see `unreachable`.)
UNREACHABLE: tuple[type[BaseException], ...] = (
    OSError,
    PostgresConnectionError,
    AdminShutdownError,
    CrashShutdownError,
    CannotConnectNowError,
    IdleSessionTimeoutError,
    TooManyConnectionsError,
)


def unreachable(error: BaseException, connection: Any = None) -> bool:
    """Whether `error` says the database could not be reached, rather than refusing a statement.

    The connection's own state decides too: a connection the server dropped fails its next
    use with whatever asyncpg makes of the half-read goodbye (ConnectionDoesNotExistError,
    InterfaceError "connection is closed", or InternalClientError "cannot switch to state
    12; another operation (2) is in progress" when the server's FATAL arrived while it sat
    idle in the pool and was read before the end of the stream), and is closed after it.
    """
    return isinstance(error, UNREACHABLE) or (connection is not None and _closed(connection))


def _closed(connection: Any) -> bool:
    """Whether a pooled connection in use was closed. asyncpg hands one that closes under
    its user (the server ended the session mid-transaction) back to the pool at once, and
    then every call on it, is_closed() too, raises InterfaceError "connection has been
    released back to the pool": such a connection is closed."""
    try:
        return bool(connection.is_closed())
    except InterfaceError:
        return True


def sql(file_stem: str, name: str) -> str:
    """The statement `name` of the room's `<file_stem>.sql`."""
    return queries.load(file_stem)[name]


class Row:
    """The base of a typed row: a frozen, slotted dataclass whose fields are columns.

    Frozen dataclasses rather than NamedTuples: a row is a record, not a sequence. A
    NamedTuple also unpacks, indexes by position and compares equal to any tuple of the
    same values, which is how two swapped columns would go unnoticed; a dataclass offers
    attribute access only. `slots=True` keeps one as small as a tuple.

    `from_record` reads each field from the column of the same name (columns the row
    does not declare are ignored, so a `SELECT *` feeds it). A field whose type is itself
    a `Row` is read from the same record: `RunRow.counts` is a `RunCounts` built from the
    run's count columns. A missing column is a KeyError naming it, in the one place that
    reads it; tests/service/test_coordinator_rows.py checks every statement against its row
    type without running it.
    """

    __slots__ = ()

    if TYPE_CHECKING:
        # What each dataclass subclass generates; declared so `cls(*values)` checks.
        def __init__(self, *values: object) -> None: ...

    @classmethod
    def from_record(cls, record: Record) -> Self:
        build = _BUILDERS.get(cls) or _builder(cls)
        return build(record)  # type: ignore[return-value]


Builder = Callable[[Record], Row]
_BUILDERS: dict[type[Row], Builder] = {}


def _builder(row: type[Row]) -> Builder:
    """Builds a row type's instances from records (made once per type).

    A frozen dataclass's own __init__ stores each field through object.__setattr__,
    about 2.6 us for 15 fields; a review page builds 2,000 rows. The builder made here
    stores them through the slots' own descriptors instead (0.9 us), which is what
    __init__ amounts to for these classes: every field is read from the record (defaults
    never apply) and rows have no __post_init__, so the instance is the same. Columns
    are read by one itemgetter (in C); a field whose type is itself a Row is built from
    the same record.
    """
    hints = typing.get_type_hints(row)
    fields = dataclasses.fields(row)  # type: ignore[arg-type]
    if hasattr(row, "__post_init__"):
        raise TypeError(f"{row.__name__}: a Row is built without __init__; no __post_init__")
    scope: dict[str, object] = {"new": object.__new__, "row": row}
    columns: list[str] = []  # read by one itemgetter, into v0, v1, ...
    stores: list[str] = []
    for index, field in enumerate(fields):
        scope[f"set{index}"] = getattr(row, field.name).__set__  # the slot's descriptor
        kind = hints[field.name]
        if isinstance(kind, type) and issubclass(kind, Row):
            scope[f"nested{index}"] = kind.from_record
            stores.append(f"    set{index}(built, nested{index}(record))")
        else:
            stores.append(f"    set{index}(built, v{len(columns)})")
            columns.append(field.name)
    names = [f"v{index}" for index in range(len(columns))]
    # itemgetter of one name answers its value, of several a tuple of them
    scope["read"] = itemgetter(*columns) if columns else None
    read = [f"    {', '.join(names)} = read(record)"] if columns else []
    source = "\n".join(
        ["def build(record):", *read, "    built = new(row)", *stores, "    return built"]
    )
    exec(compile(source, f"<row builder {row.__name__}>", "exec"), scope)
    build: Builder = scope["build"]  # type: ignore[assignment]
    _BUILDERS[row] = build
    return build


async def fetch_one(connection: Connection, row: type[R], query: str, *args: object) -> R | None:
    """The first row of `query` as `row`, or None when it returns none."""
    record = await connection.fetchrow(query, *args)
    return None if record is None else row.from_record(record)


async def fetch_all(connection: Connection, row: type[R], query: str, *args: object) -> list[R]:
    """Every row of `query` as `row`."""
    return [row.from_record(record) for record in await connection.fetch(query, *args)]


async def fetch_column(connection: Connection, kind: type[T], query: str, *args: object) -> list[T]:
    """The first column of every row of `query` (a list of ids); `kind` is its type."""
    return [record[0] for record in await connection.fetch(query, *args)]


async def _init_connection(connection: Any) -> None:
    for type_name in ("json", "jsonb"):
        await connection.set_type_codec(
            type_name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )
    # asyncpg looks an array type's element up in the catalog on the first statement of a
    # connection that uses it, with a recursive query of about 2 ms of Postgres CPU: up to
    # four of them on each new connection, one in the middle of its first full-run commit
    # (bench.processor_throughput --profile-control). Preparing one statement that names
    # them all does it in one query, when the connection opens.
    await connection.prepare(sql("db", "array_types"))


# The pool's sessions run without JIT. Every statement of the coordinator reads or
# writes a page at most, which compiling costs more than it saves, and Postgres compiles
# any plan whose estimate passes jit_above_cost: a statement's first five runs on a
# connection are planned for their values, and review_page_boxes' plan for a 1,000-item
# page estimated 900,000 box rows (100 per item), so GetReview took 10-15 ms of JIT on
# top of ~15 ms in each of them (bench.review's page p99).
POOL_SETTINGS = {"jit": "off"}


async def _no_session_reset(connection: Any) -> None:
    """Releases a pooled connection as it is: see the module docstring."""


async def connect(dsn: str, *, named: bool) -> Connection:
    """One connection outside the pool, for work that owns it whole (RunEvents' LISTEN,
    migrate's advisory lock). `named` gives it the coordinator's application name, as the
    pool's connections have; migrate's own connection stays unnamed, so phase "post" never
    counts it among the coordinators it waits for."""
    if not named:
        return await asyncpg.connect(dsn)
    return await asyncpg.connect(dsn, server_settings={"application_name": application_name()})


class Database:
    """A connection pool plus the few helpers every store module uses."""

    def __init__(self, pool: Any, dsn: str) -> None:
        self.pool = pool
        self.dsn = dsn  # for the one LISTEN connection of RunEvents

    @classmethod
    @asynccontextmanager
    async def open(cls, dsn: str, *, size: int = 10) -> AsyncIterator[Database]:
        pool = await asyncpg.create_pool(
            dsn,
            min_size=1,
            max_size=size,
            init=_init_connection,
            reset=_no_session_reset,
            server_settings={"application_name": application_name()} | POOL_SETTINGS,
        )
        try:
            yield cls(pool, dsn)
        finally:
            await pool.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        async with self._acquired() as connection:
            yield connection

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        async with self._acquired() as connection, connection.transaction():
            yield connection

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[Any]:
        """A read-only transaction whose statements all see one snapshot (REPEATABLE
        READ): for a view read in several statements that must agree with each other
        (a run's status and counts with its jobs' states and progress)."""
        async with (
            self._acquired() as connection,
            connection.transaction(isolation="repeatable_read", readonly=True),
        ):
            yield connection

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Any]:
        """A pooled connection for work that leaves session state (advisory locks).

        It goes back to the pool only after asyncpg's full reset; if that reset fails
        or is cancelled, the connection is closed instead, so no lock outlives its user.
        """
        async with self._acquired() as connection:
            try:
                yield connection
            finally:
                try:
                    await connection.reset()
                except BaseException:
                    connection.terminate()
                    raise

    @asynccontextmanager
    async def _acquired(self) -> AsyncIterator[Any]:
        """A pooled connection; what says the database cannot be reached, from acquiring
        it or from the work done on it, becomes DatabaseUnavailable."""
        try:
            async with self.pool.acquire() as connection:
                try:
                    yield connection
                except Exception as error:  # judged while the connection is still ours
                    _raise_if_unreachable(error, connection)
                    raise
        except Exception as error:
            _raise_if_unreachable(error, None)
            raise


def _raise_if_unreachable(error: Exception, connection: Any) -> None:
    """DatabaseUnavailable in place of `error` when it says the database cannot be reached."""
    if isinstance(error, DatabaseUnavailable) or not unreachable(error, connection):
        return
    log.warning("database unreachable: %s: %s", type(error).__name__, error)
    raise DatabaseUnavailable("The database cannot be reached now; ask again shortly.") from error
