"""Forward-only schema migrations in two phases, applied under an advisory lock.

Migrations are `migrations/NNNN_name.sql`, applied in number order, each in its
own transaction together with its bookkeeping row. Several replicas may run
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
import itertools
import re
import time
from functools import cache
from pathlib import Path
from typing import Literal

import asyncpg

from services.coordinator import queries

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_PHASE_LINE = re.compile(r"^--\s*phase:\s*(\S*)\s*$")

Phase = Literal["pre", "post"]
PHASES: tuple[Phase, ...] = ("pre", "post")


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    phase: Phase = "pre"

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


def _phase_of(path: Path) -> Phase:
    """From a `-- phase: pre|post` line of the comment that opens the file; "pre" without."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header = itertools.takewhile(lambda line: line.startswith("--") or not line.strip(), lines)
    marks = [match.group(1) for line in header if (match := _PHASE_LINE.match(line))]
    if not marks:
        return "pre"
    if len(marks) > 1 or marks[0] not in PHASES:
        raise ValueError(f"{path.name}: at most one '-- phase: pre|post' line, found {marks}")
    phase: Phase = marks[0]
    return phase


def list_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Every migration file in order; a misnamed file, a duplicate number or an unknown
    phase is an error."""
    found: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise ValueError(f"{path.name}: migration files are named NNNN_name.sql")
        version = int(match.group(1))
        if version in found:
            raise ValueError(f"{path.name}: migration number {version} is used twice")
        found[version] = Migration(version, match.group(2), path, _phase_of(path))
    return [found[version] for version in sorted(found)]


@cache
def application_name() -> str:
    """What a coordinator names its database connections: the newest migration its code
    knows (the `migration_coordinators` statement reads it back)."""
    return f"workshop-coordinator schema={list_migrations()[-1].version:04d}"


class MigrationRefused(Exception):
    """Phase "post" while a coordinator older than a pending post-migration is connected."""


class SchemaBehind(Exception):
    """The database lacks a pre-migration of this code: it cannot serve there yet."""


async def check_pre_migrations(connection: asyncpg.Connection) -> None:
    """Raises SchemaBehind when a pre-migration of this code is not applied (a coordinator
    checks before it serves; pending post-migrations and newer ones are fine)."""
    try:
        rows = await connection.fetch(queries.load("migrate")["migration_list_applied"])
    except asyncpg.UndefinedTableError:
        rows = []
    applied = {int(row["version"]) for row in rows}
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
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(sql["migration_lock"])
        try:
            await connection.execute(sql["migration_table_create"])
            rows = await connection.fetch(sql["migration_list_applied"])
            applied = {int(row["version"]) for row in rows}
            todo = [m for m in list_migrations(directory) if m.version not in applied]
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
                    await connection.execute(migration.path.read_text(encoding="utf-8"))
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
    connection: asyncpg.Connection, sql: dict[str, str], newest_post: int, wait_seconds: float
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
