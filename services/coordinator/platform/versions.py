"""Which schema migrations this code knows, and the name its connections carry.

Migrations are `migrations/NNNN_name.sql` (beside the coordinator package). A migration is
a pre-migration unless the comment that opens its file has the line `-- phase: post`
(docs/upgrading.md). Kept apart from `migrate` (which applies them) because `db` names its
connections after the newest migration (`application_name()`) and `migrate` connects
through `db`.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from functools import cache
from pathlib import Path
from typing import Literal

# The migrations are the schema: they stay beside the coordinator package, not in platform/.
MIGRATIONS_DIR = Path(__file__).parent.parent / "migrations"
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
