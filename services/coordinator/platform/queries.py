"""Named SQL blocks loaded from the coordinator's `.sql` files.

A room keeps its statements beside its modules (`identity/auth.sql`, `runs/runs.sql`). A
file stem names one file across the rooms, so call sites say `sql("auth", "key_revoke")`
without naming the room.

A file holds blocks that start with `-- name: entity_verb`; the text up to the
next such line is the statement. Python code refers to statements by name only,
so every statement the coordinator runs can be read, reviewed and EXPLAINed in
one place.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

COORDINATOR_DIR = Path(__file__).parent.parent
SQL_DIR = COORDINATOR_DIR / "sql"
_NAME_LINE = re.compile(r"^--\s*name:\s*([a-z][a-z0-9_]*)\s*$", re.MULTILINE)


def parse_queries(text: str, *, source: str = "<sql>") -> dict[str, str]:
    """Split `text` into {name: statement}; duplicate or empty blocks are errors."""
    queries: dict[str, str] = {}
    matches = list(_NAME_LINE.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        name = match.group(1)
        if not body:
            raise ValueError(f"{source}: query {name!r} is empty")
        if name in queries:
            raise ValueError(f"{source}: query {name!r} is defined twice")
        queries[name] = body
    return queries


def sql_files() -> list[Path]:
    """Every file of named statements, in every room (migrations are not named blocks)."""
    return sorted(
        path for path in COORDINATOR_DIR.glob("*/*.sql") if path.parent.name != "migrations"
    )


def sql_file(file_stem: str) -> Path:
    """The one file `<room>/<file_stem>.sql`."""
    found = [path for path in sql_files() if path.stem == file_stem]
    if len(found) != 1:
        raise FileNotFoundError(
            f"SQL file stem {file_stem!r}: expected one file in a room, found "
            f"{[str(path) for path in found]}"
        )
    return found[0]


@cache
def load(file_stem: str) -> dict[str, str]:
    """The named statements of the file `file_stem`, parsed once per process."""
    path = sql_file(file_stem)
    return parse_queries(path.read_text(encoding="utf-8"), source=str(path))
