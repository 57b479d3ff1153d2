"""Forward-only schema migrations in two phases, applied under an advisory lock.

Migrations are `migrations/NNNN_name.sql`, applied in number order, each in its
own transaction together with its bookkeeping row. Several replicas may run
`coordinator migrate` at once: the advisory lock makes the others wait, and
they then find nothing left to do.

A migration is a pre-migration (expand: safe while the previous version serves)
unless its file has the line `-- phase: post` (contract: it drops what only the
previous version used). Phase "pre" applies the pending pre-migrations and leaves the
post-migrations pending; phase "post" applies everything pending, in number order
(docs/upgrading.md).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Literal

import asyncpg

from services.coordinator import queries
from services.coordinator.db import fetch_column

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_PHASE_LINE = re.compile(r"^--\s*phase:\s*(\S*)\s*$", re.MULTILINE)

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
    marks = _PHASE_LINE.findall(path.read_text(encoding="utf-8"))
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


@dataclasses.dataclass(frozen=True)
class Outcome:
    applied: list[str]  # labels applied by this call, in order
    pending: list[str]  # labels still pending (the post-migrations after phase "pre")


async def migrate(dsn: str, phase: Phase, directory: Path = MIGRATIONS_DIR) -> Outcome:
    """Apply what `dsn` lacks of `phase`: "pre" only the pre-migrations, "post" all."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    sql = queries.load("migrate")
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(sql["migration_lock"])
        try:
            await connection.execute(sql["migration_table_create"])
            applied = set(await fetch_column(connection, int, sql["migration_list_applied"]))
            done: list[str] = []
            pending: list[str] = []
            for migration in list_migrations(directory):
                if migration.version in applied:
                    continue
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


async def apply_migrations(
    dsn: str, directory: Path = MIGRATIONS_DIR, *, phase: Phase = "post"
) -> list[str]:
    """Apply the migrations `dsn` lacks (by default all of them, as for a new database or
    a test); returns the labels applied by this call."""
    return (await migrate(dsn, phase, directory)).applied
