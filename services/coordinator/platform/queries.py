"""Named SQL blocks loaded from the `.sql` files beside this module.

A file holds blocks that start with `-- name: entity_verb`; the text up to the
next such line is the statement. Python code refers to statements by name only,
so every statement the coordinator runs can be read, reviewed and EXPLAINed in
one place.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

SQL_DIR = Path(__file__).parent.parent / "sql"
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


@cache
def load(file_stem: str) -> dict[str, str]:
    """The named statements of `sql/<file_stem>.sql`, parsed once per process."""
    path = SQL_DIR / f"{file_stem}.sql"
    return parse_queries(path.read_text(encoding="utf-8"), source=str(path))
