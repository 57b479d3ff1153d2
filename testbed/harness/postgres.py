"""A throwaway Postgres cluster per test session and a fresh database per test.

Fixtures:

- ``pg_cluster`` (session): a private cluster from ``tools.localstack.postgres`` (free
  loopback port, trust auth, durability off); skips where this machine cannot run one.
- ``pg_template`` (session): database ``workshop_template``, migrated with
  ``services.coordinator.platform.migrate.apply_migrations`` once that module exists.
- ``pg_database`` / ``pg_dsn`` (function): a database cloned from the template
  (``CREATE DATABASE ... TEMPLATE``), dropped with ``WITH (FORCE)`` afterwards;
  ``cloned_database(pg_template)`` makes one for a fixture of a wider scope.

The fixtures are synchronous, so sync and async tests can both use them; the few admin
statements they run go through asyncpg on a private event loop in a worker thread,
never on the test's loop.

Outside pytest (benchmarks, scripts) the same cluster comes from the context manager
``postgres_cluster()``, and ``create_migrated_database(cluster, name)`` returns the DSN
of a new, migrated database; both raise ``PostgresUnavailable`` where the fixtures skip.

Faults for tests of what rides out a database outage: ``terminate_connections`` drops
every connection to a database (``pg_terminate_backend``), ``stopped`` stops the whole
cluster for the body of an ``async with`` and starts it again on the same port (also
when the body fails; the session's later tests need it).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass

import asyncpg
import pytest

from services.coordinator.platform.migrate import apply_migrations
from tools.localstack.postgres import (
    TIMINGS,
    PostgresCluster,
    PostgresTimings,
    PostgresUnavailable,
    StopMode,
    admin_execute,
    create_database,
    postgres_cluster,
    quote_ident,
    run_async,
)
from tools.localstack.postgres import PostgresLaunchError as PostgresHarnessError

__all__ = [
    "TEMPLATE_DB",
    "TIMINGS",
    "PostgresCluster",
    "PostgresDatabase",
    "PostgresHarnessError",
    "PostgresTemplate",
    "PostgresTimings",
    "PostgresUnavailable",
    "StopMode",
    "create_migrated_database",
    "postgres_cluster",
    "quote_ident",
    "run_async",
    "stopped",
    "terminate_connections",
]

TEMPLATE_DB = "workshop_template"


# The migrated databases are built here, not in tools.localstack: applying the coordinator's
# migrations in-process imports the coordinator, which a tool may not (docs/architecture.md,
# "Import rules"); the demo runs `python -m services.coordinator migrate` instead.
def create_migrated_database(cluster: PostgresCluster, name: str) -> str:
    """Creates database `name` on the cluster, applies the migrations; returns its DSN."""
    create_database(cluster, name)
    migrate_database(cluster, name)
    return cluster.dsn(name)


def migrate_database(cluster: PostgresCluster, database: str) -> tuple[str, ...]:
    """Applies the coordinator's migrations in this process; returns what they reported."""
    return tuple(run_async(lambda: apply_migrations(cluster.dsn(database))))


@dataclass(frozen=True)
class PostgresTemplate:
    cluster: PostgresCluster
    name: str
    migrations: tuple[str, ...]  # what apply_migrations reported; empty without migrations


@dataclass(frozen=True)
class PostgresDatabase:
    cluster: PostgresCluster
    name: str
    dsn: str
    clone_s: float


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(postgres_cluster())
        except PostgresUnavailable as unavailable:
            pytest.skip(str(unavailable))
        yield cluster


@pytest.fixture(scope="session")
def pg_template(pg_cluster: PostgresCluster) -> PostgresTemplate:
    began = time.perf_counter()
    migrations = _build_template(pg_cluster)
    TIMINGS.template_s = time.perf_counter() - began
    TIMINGS.migrations = migrations
    return PostgresTemplate(cluster=pg_cluster, name=TEMPLATE_DB, migrations=migrations)


@contextlib.contextmanager
def cloned_database(template: PostgresTemplate) -> Iterator[PostgresDatabase]:
    """A new database cloned from `template`, dropped on exit (fixtures of any scope)."""
    cluster = template.cluster
    name = f"test_{uuid.uuid4().hex[:16]}"
    began = time.perf_counter()
    run_async(
        lambda: admin_execute(
            cluster.admin_dsn,
            f"CREATE DATABASE {quote_ident(name)} TEMPLATE {quote_ident(template.name)}",
        )
    )
    clone_s = time.perf_counter() - began
    TIMINGS.clones_s.append(clone_s)
    try:
        yield PostgresDatabase(cluster=cluster, name=name, dsn=cluster.dsn(name), clone_s=clone_s)
    finally:
        _drop_database(cluster, name)


@pytest.fixture
def pg_database(pg_template: PostgresTemplate) -> Iterator[PostgresDatabase]:
    with cloned_database(pg_template) as database:
        yield database


@pytest.fixture
def pg_dsn(pg_database: PostgresDatabase) -> str:
    """DSN of a fresh, migrated database that belongs to this test alone."""
    return pg_database.dsn


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TIMINGS.start_s:
        return
    clones = TIMINGS.clones_s
    line = (
        f"postgres harness: initdb {TIMINGS.initdb_s:.2f} s, start {TIMINGS.start_s:.2f} s, "
        f"template {TIMINGS.template_s * 1000:.0f} ms ({len(TIMINGS.migrations)} migrations)"
    )
    if clones:
        line += (
            f", {len(clones)} clones: median {statistics.median(clones) * 1000:.0f} ms, "
            f"max {max(clones) * 1000:.0f} ms"
        )
    if TIMINGS.restarts_s:
        line += f", {len(TIMINGS.restarts_s)} restarts: max {max(TIMINGS.restarts_s):.2f} s"
    terminalreporter.write_line(line)


def _build_template(cluster: PostgresCluster) -> tuple[str, ...]:
    name = quote_ident(TEMPLATE_DB)
    create_database(cluster, TEMPLATE_DB)
    migrations = migrate_database(cluster, TEMPLATE_DB)
    # A lingering connection to the template would make every clone fail.
    run_async(
        lambda: admin_execute(
            cluster.admin_dsn,
            f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false IS_TEMPLATE true",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{TEMPLATE_DB}' AND pid <> pg_backend_pid()",
        )
    )
    return migrations


def _drop_database(cluster: PostgresCluster, name: str) -> None:
    statement = f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)"
    try:
        run_async(lambda: admin_execute(cluster.admin_dsn, statement))
    except OSError:
        # The test stopped the server (or left it mid-restart): bring it back for the rest.
        if cluster.is_running():
            raise
        cluster.start()
        run_async(lambda: admin_execute(cluster.admin_dsn, statement))


async def terminate_connections(
    cluster: PostgresCluster, database: str, *, sparing: Iterable[int] = ()
) -> int:
    """Terminates every backend connected to `database` but the PIDs in `sparing` (the
    server sends each client FATAL 57P01 and closes it); returns how many it terminated."""
    connection = await asyncpg.connect(cluster.admin_dsn)
    try:
        terminated: int = await connection.fetchval(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid() AND NOT pid = ANY ($2::int[])",
            database,
            list(sparing),
        )
    finally:
        await connection.close()
    return terminated


@contextlib.asynccontextmanager
async def stopped(cluster: PostgresCluster, mode: StopMode = "fast") -> AsyncIterator[None]:
    """The cluster stopped (clients lose their connections, new ones are refused) for the
    body, then started again on the same port and data."""
    await asyncio.to_thread(cluster.stop, mode)
    try:
        yield
    finally:
        await asyncio.to_thread(cluster.start)
