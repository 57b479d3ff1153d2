"""Forward-only schema migrations in two phases, applied under an advisory lock.

Migrations are `migrations/NNNN_name.sql` (listed by `versions`), applied in number
order, each in its own transaction together with its bookkeeping row. Several replicas may run
`coordinator migrate` at once: the advisory lock makes the others wait, and
they then find nothing left to do.

A migration is a pre-migration (expand: safe while the previous version serves)
unless the comment that opens its file has the line `-- phase: post` (contract: it
drops what only the previous version used). Phase "pre" applies the pending
pre-migrations and leaves the post-migrations pending; phase "post" applies everything
pending, in number order (docs/upgrading.md).

Coordinators name their connections after the newest migration their code knows
(`application_name()`), and phase "post" refuses while a coordinator that predates a
pending post-migration is connected.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

from services.coordinator.platform import queries
from services.coordinator.platform.db import Connection, Record, UndefinedTableError, connect
from services.coordinator.platform.versions import (
    MIGRATIONS_DIR,
    PHASES,
    Migration,
    Phase,
    list_migrations,
)


class MigrationRefused(Exception):
    """Phase "post" while a coordinator older than a pending post-migration is connected."""


class SchemaBehind(Exception):
    """The database lacks a pre-migration of this code: it cannot serve there yet."""


class ForeignHistory(Exception):
    """The database's applied migrations are not this code's: made before release 0.1
    (whose baseline replaced migrations 0001-0024) or by another branch."""


def _check_history(rows: list[Record], known: list[Migration]) -> set[int]:
    """The versions applied, once each is this code's migration of that number; raises
    ForeignHistory naming the first that is not."""
    labels = {migration.version: migration.label for migration in known}
    for row in rows:
        version, name = int(row["version"]), str(row["name"])
        label = f"{version:04d}_{name}"
        if version in labels and labels[version] != label:
            raise ForeignHistory(
                f"the database has migration {label} where this version has "
                f"{labels[version]}: it was made before release 0.1 (whose baseline "
                "replaced the pre-release migrations) or by another branch. Move its data "
                "to a new database (docs/upgrading.md#before-release-01)"
            )
    return {int(row["version"]) for row in rows}


async def check_pre_migrations(connection: Connection) -> None:
    """Raises SchemaBehind when a pre-migration of this code is not applied (a coordinator
    checks before it serves; pending post-migrations and newer ones are fine)."""
    try:
        rows = await connection.fetch(queries.load("migrate")["migration_list_applied"])
    except UndefinedTableError:
        rows = []
    applied = _check_history(rows, list_migrations())
    missing = [m.label for m in list_migrations() if m.phase == "pre" and m.version not in applied]
    if missing:
        raise SchemaBehind(
            f"the database lacks the pre-migrations {', '.join(missing)} of this version: "
            "run `python -m services.coordinator migrate` first (docs/upgrading.md)"
        )


@dataclasses.dataclass(frozen=True)
class Outcome:
    applied: list[str]  # labels applied by this call, in order
    pending: list[str]  # labels still pending (the post-migrations after phase "pre")


async def migrate(
    dsn: str, phase: Phase, directory: Path = MIGRATIONS_DIR, *, wait_seconds: float = 10.0
) -> Outcome:
    """Apply what `dsn` lacks of `phase`: "pre" only the pre-migrations, "post" all. Phase
    "post" waits up to `wait_seconds` for older coordinators to disconnect (pods still
    stopping), then raises MigrationRefused."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    sql = queries.load("migrate")
    connection = await connect(dsn, named=False)
    try:
        await connection.execute(sql["migration_lock"])
        try:
            await connection.execute(sql["migration_table_create"])
            rows = await connection.fetch(sql["migration_list_applied"])
            known = list_migrations(directory)
            applied = _check_history(rows, known)
            todo = [m for m in known if m.version not in applied]
            post = [m.version for m in todo if m.phase == "post"]
            if phase == "post" and post:
                await _wait_for_older_coordinators(connection, sql, max(post), wait_seconds)
            done: list[str] = []
            pending: list[str] = []
            for migration in todo:
                if phase == "pre" and migration.phase == "post":
                    pending.append(migration.label)
                    continue
                async with connection.transaction():
                    await connection.execute(migration.sql())
                    await connection.execute(
                        sql["migration_record"], migration.version, migration.name
                    )
                done.append(migration.label)
            return Outcome(done, pending)
        finally:
            await connection.execute(sql["migration_unlock"])
    finally:
        await connection.close()


async def _wait_for_older_coordinators(
    connection: Connection, sql: dict[str, str], newest_post: int, wait_seconds: float
) -> None:
    """Returns once no coordinator whose code predates migration `newest_post` is connected;
    raises MigrationRefused naming them after `wait_seconds`."""
    deadline = time.monotonic() + wait_seconds
    while True:
        older = await connection.fetch(sql["migration_coordinators"], newest_post)
        if not older:
            return
        if time.monotonic() >= deadline:
            seen = ", ".join(
                f"pid {row['pid']} ({row['address']}, migrations up to {row['knows']:04d})"
                for row in older
            )
            raise MigrationRefused(
                f"post-migrations up to {newest_post:04d} would drop what running coordinators "
                f"of an older version use: {seen}. Finish the rollout (every coordinator on "
                "this version) and run it again"
            )
        await asyncio.sleep(0.5)


async def apply_migrations(
    dsn: str, directory: Path = MIGRATIONS_DIR, *, phase: Phase = "post"
) -> list[str]:
    """Apply the migrations `dsn` lacks (by default all of them, as for a new database or
    a test); returns the labels applied by this call."""
    return (await migrate(dsn, phase, directory)).applied
