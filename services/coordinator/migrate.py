"""Forward-only schema migrations, applied under an advisory lock.

Migrations are `migrations/NNNN_name.sql`, applied in number order, each in its
own transaction together with its bookkeeping row. Several replicas may run
`coordinator migrate` at once: the advisory lock makes the others wait, and
they then find nothing left to do.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import asyncpg

from services.coordinator import queries
from services.coordinator.db import fetch_column

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path


def list_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Every migration file in order; a misnamed file or a duplicate number is an error."""
    found: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise ValueError(f"{path.name}: migration files are named NNNN_name.sql")
        version = int(match.group(1))
        if version in found:
            raise ValueError(f"{path.name}: migration number {version} is used twice")
        found[version] = Migration(version, match.group(2), path)
    return [found[version] for version in sorted(found)]


async def apply_migrations(dsn: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply the migrations `dsn` lacks; returns the names applied by this call."""
    sql = queries.load("migrate")
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(sql["migration_lock"])
        try:
            await connection.execute(sql["migration_table_create"])
            applied = set(await fetch_column(connection, int, sql["migration_list_applied"]))
            done: list[str] = []
            for migration in list_migrations(directory):
                if migration.version in applied:
                    continue
                async with connection.transaction():
                    await connection.execute(migration.path.read_text(encoding="utf-8"))
                    await connection.execute(
                        sql["migration_record"], migration.version, migration.name
                    )
                done.append(f"{migration.version:04d}_{migration.name}")
            return done
        finally:
            await connection.execute(sql["migration_unlock"])
    finally:
        await connection.close()
