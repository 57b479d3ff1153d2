"""Which schema migrations this code knows, and the name its connections carry.

Migrations are `migrations/NNNN_name.sql` (beside the coordinator package), or a folder
`migrations/NNNN_name/` of `.sql` files applied in name order as one migration: release
0.1's baseline is such a folder, one file per room, so that each room's tables and
functions read apart. A migration is a pre-migration unless the comment that opens its
(first) file has the line `-- phase: post` (docs/upgrading.md). Kept apart from
`migrate` (which applies them) because `db` names its connections after the newest
migration (`application_name()`) and `migrate` connects through `db`.
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
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)(\.sql)?$")
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

    def files(self) -> list[Path]:
        """The `.sql` files it runs, in order: the file itself, or a folder's files."""
        return sorted(self.path.glob("*.sql")) if self.path.is_dir() else [self.path]

    def sql(self) -> str:
        """Its statements, as one text (a folder's files one after the other)."""
        return "\n".join(path.read_text(encoding="utf-8") for path in self.files())


def _phase_of(path: Path) -> Phase:
    """From a `-- phase: pre|post` line of the comment that opens the file (a folder's
    first file); "pre" without."""
    first = min(path.glob("*.sql")) if path.is_dir() else path
    lines = first.read_text(encoding="utf-8").splitlines()
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
    for path in sorted(directory.iterdir()):
        if path.name.startswith((".", "__")):
            continue
        match = _FILE_NAME.match(path.name)
        if match is None or (path.is_dir() == bool(match.group(3))):
            raise ValueError(
                f"{path.name}: migrations are files NNNN_name.sql or folders NNNN_name/"
            )
        if path.is_dir() and not any(path.glob("*.sql")):
            raise ValueError(f"{path.name}: a migration folder holds .sql files")
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
