"""Generate the coordinator's SQL parameter classes from its named statements.

`python -m scripts.gen_sql_params` writes, beside each room's `<stem>.sql` that has
statements with named parameters (`:run_id`; services/coordinator/platform/queries.py), a
module `<stem>_params.py` with one frozen, slotted, keyword-only dataclass per such
statement: `JobComplete` for `job_complete`, its fields the parameters in `$` order. A
field's type comes from the cast on the parameter's first use (`:lease_token::uuid` is a
`uuid.UUID`, `:labels::text[]` a `Sequence[str]`, jsonb any value the pool's JSON codec
encodes), `| None` where a comment line `-- nullable: a, b` in the block names it (`b[]`:
its elements, `Sequence[X | None]`).

`--check` writes nothing and fails when a generated module differs from what this would
write, or a `_params.py` beside a file has no named statement left (`make lint` runs it).
"""

from __future__ import annotations

import argparse
import keyword
import sys
from pathlib import Path

from services.coordinator.platform.queries import (
    COORDINATOR_DIR,
    Param,
    Statement,
    parse_statements,
    sql_files,
)

COMMAND = "python -m scripts.gen_sql_params"

# A cast's SQL type -> (the annotation, the import it needs, or "").
_SCALARS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("text", "varchar", "character varying"), ("str", "")),
    **dict.fromkeys(("integer", "int", "int4", "bigint", "int8", "smallint", "int2"), ("int", "")),
    **dict.fromkeys(("boolean", "bool"), ("bool", "")),
    **dict.fromkeys(("double precision", "float8", "real", "float4"), ("float", "")),
    "numeric": ("Decimal", "from decimal import Decimal"),
    **dict.fromkeys(("timestamptz", "timestamp"), ("datetime", "from datetime import datetime")),
    "date": ("date", "from datetime import date"),
    "time": ("time", "from datetime import time"),
    "interval": ("timedelta", "from datetime import timedelta"),
    "uuid": ("uuid.UUID", "import uuid"),
    "bytea": ("bytes", ""),
    # what the pool's codec (db._init_connection: json.dumps) encodes: any JSON value
    **dict.fromkeys(("jsonb", "json"), ("object", "")),
}
_SEQUENCE = "from collections.abc import Sequence"


def python_type(param: Param, *, where: str) -> tuple[str, set[str]]:
    """The annotation of `param`'s field and the imports it needs."""
    if keyword.iskeyword(param.name):
        raise ValueError(f"{where}: parameter :{param.name} is a Python keyword")
    if param.cast is None:
        raise ValueError(f"{where}: parameter :{param.name} has no cast on its first use")
    element = param.cast.removesuffix("[]")
    if element not in _SCALARS:
        raise ValueError(f"{where}: parameter :{param.name}: no Python type for {param.cast!r}")
    annotation, needs = _SCALARS[element]
    imports = {needs} - {""}
    if param.nullable_elements and element == param.cast:
        raise ValueError(f"{where}: parameter :{param.name} is no array: its elements cannot be")
    if element != param.cast:
        if param.nullable_elements:
            annotation += " | None"
        annotation = f"Sequence[{annotation}]"
        imports.add(_SEQUENCE)
    if param.nullable:
        annotation += " | None"
    return annotation, imports


def _import_order(name: str) -> tuple[int, str]:
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def class_name(statement: str) -> str:
    """`job_complete` -> `JobComplete`."""
    return "".join(word.capitalize() for word in statement.split("_"))


def render(sql_path: Path, statements: dict[str, Statement], *, root: Path) -> str | None:
    """The module of `sql_path`'s named statements; None when it has none."""
    named = [statement for statement in statements.values() if statement.params]
    if not named:
        return None
    stem = sql_path.stem
    relative = sql_path.relative_to(root).as_posix()
    imports = {"import dataclasses", "from typing import ClassVar"}
    classes: list[str] = []
    for statement in named:
        where = f"{relative}: query {statement.name!r}"
        lines = [
            "",
            "",
            "@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)",
            f"class {class_name(statement.name)}(Params):",
            f'    """The parameters of `{stem}.{statement.name}`."""',
            "",
            f'    FILE: ClassVar[str] = "{stem}"',
            f'    NAME: ClassVar[str] = "{statement.name}"',
            "",
        ]
        for param in statement.params:
            annotation, needs = python_type(param, where=where)
            imports |= needs
            lines.append(f"    {param.name}: {annotation}")
        classes.append("\n".join(lines))
    plain = sorted(line for line in imports if line.startswith("import "))
    names: dict[str, list[str]] = {}
    for line in imports - set(plain):
        _, module, _, name = line.split()
        names.setdefault(module, []).append(name)
    # as ruff's isort writes them: one line per module, CONSTANTS, Classes, then the rest
    froms = [
        f"from {module} import {', '.join(sorted(names[module], key=_import_order))}"
        for module in sorted(names)
    ]
    return "\n".join(
        [
            f'"""Parameters of the named statements of {relative} (generated by',
            f"`{COMMAND}`: do not edit; platform/queries.py says how).",
            '"""',
            "",
            "from __future__ import annotations",
            "",
            *plain,
            *froms,
            "",
            "from services.coordinator.platform.queries import Params",
            *classes,
            "",
        ]
    )


def params_path(sql_path: Path) -> Path:
    return sql_path.with_name(f"{sql_path.stem}_params.py")


def expected(root: Path = COORDINATOR_DIR) -> dict[Path, str | None]:
    """Every generated module under `root` -> its text (None: there should be none)."""
    modules: dict[Path, str | None] = {}
    for path in sql_files(root):
        statements = parse_statements(path.read_text(encoding="utf-8"), source=str(path))
        modules[params_path(path)] = render(path, statements, root=root)
    return modules


def stale(root: Path = COORDINATOR_DIR) -> list[Path]:
    """The generated modules under `root` that differ from what `generate` would write."""
    found = []
    for path, text in expected(root).items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            found.append(path)
    return found


def generate(root: Path = COORDINATOR_DIR) -> list[Path]:
    """Write (or remove) every stale generated module under `root`; returns them."""
    changed = []
    modules = expected(root)
    for path in stale(root):
        text = modules[path]
        if text is None:
            path.unlink()
        else:
            path.write_text(text, encoding="utf-8")
        changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if a module is stale")
    parser.add_argument("--root", type=Path, default=COORDINATOR_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.check:
        if found := stale(args.root):
            names = ", ".join(str(path) for path in found)
            print(f"stale SQL parameter modules: {names}; run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    for path in generate(args.root):
        print(f"wrote {path}" if path.exists() else f"removed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
