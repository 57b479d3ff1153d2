"""Every SQL function of the coordinator carries its version in its name (docs/upgrading.md,
"Versioned function names"): release 0.1's baseline defines `<name>_v1`, and a change to
a function's contract creates the next version (a body-only change may replace a
version's body under its name)."""

from __future__ import annotations

import re

from services.coordinator.platform.versions import list_migrations

CREATED = re.compile(r"CREATE (OR REPLACE )?FUNCTION (\w+)\s*\(")
VERSIONED = re.compile(r"^[a-z][a-z0-9_]*_v[1-9][0-9]*$")


def test_every_function_name_ends_in_its_version() -> None:
    created = [
        (migration.label, match.group(2))
        for migration in list_migrations()
        for match in CREATED.finditer(migration.sql())
    ]
    assert created, "the migrations define no function"
    unversioned = sorted({name for _, name in created if not VERSIONED.match(name)})
    assert unversioned == []
