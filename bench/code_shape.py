"""Shape of the code: lines and largest module per service, the largest class, import
levels inside the coordinator, function lengths, migrations and SQL function definitions.

    .venv/bin/python -m bench.code_shape [ROOT]

Not a speed benchmark: the measures of a redesign (issue 32), for any checkout ROOT
(default: the current directory), so that before and after are counted alike. Lines
exclude generated code (`*_pb2*.py`, `*_params.py`); import levels are the longest chain
of imports between the coordinator's own modules; a redefinition is a second `CREATE
FUNCTION` of a name across the migrations.
"""

from __future__ import annotations

import ast
import re
import statistics
import sys
from functools import cache
from pathlib import Path

GENERATED = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi", "_pb2_grpc.pyi", "_params.py")


def python_files(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*.py")
        if not p.name.endswith(GENERATED) and "__pycache__" not in p.parts
    )


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def coordinator_import_levels(root: Path) -> tuple[int, list[str]]:
    """The longest chain of imports between the coordinator's own modules."""
    folder = root / "services" / "coordinator"
    modules = {module_name(root, p): p for p in python_files(folder)}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    edges[name].add(target)

    @cache
    def longest(name: str, seen: frozenset[str] = frozenset()) -> tuple[str, ...]:
        best: tuple[str, ...] = ()
        for child in edges[name]:
            if child in seen:
                continue
            chain = longest(child, seen | {name})
            if len(chain) > len(best):
                best = chain
        return (name, *best)

    chain = max((longest(m) for m in modules), key=len)
    return len(chain), list(chain)


def span(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def migration_functions(root: Path) -> tuple[int, int, int]:
    """(migrations, functions, redefinitions): a redefinition is a function name that a
    later migration creates again (an interface's stub and its implementation in one
    migration are one definition)."""
    folder = root / "services" / "coordinator" / "migrations"
    migrations = [m for m in sorted(folder.iterdir()) if m.name[:4].isdigit()]
    seen: set[str] = set()
    redefinitions = 0
    for migration in migrations:
        files = [migration] if migration.is_file() else sorted(migration.glob("*.sql"))
        text = "\n".join(p.read_text(encoding="utf-8") for p in files)
        names = set(re.findall(r"CREATE (?:OR REPLACE )?FUNCTION (\w+)", text))
        redefinitions += len(names & seen)
        seen |= names
    return len(migrations), len(seen), redefinitions


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    print(f"root: {root}")
    services = sorted(p for p in (root / "services").iterdir() if (p / "__init__.py").exists())
    for service in services:
        sized = sorted(((lines(p), p) for p in python_files(service)), reverse=True)
        top, where = sized[0]
        total = sum(n for n, _ in sized)
        print(
            f"{service.name:12s} lines={total:6d} modules={len(sized):3d} largest={top} "
            f"({where.relative_to(root)})"
        )
    classes: list[tuple[int, str]] = []
    functions: list[int] = []
    for path in python_files(root / "services"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                classes.append((span(node), f"{path.relative_to(root)}:{node.name}"))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append(span(node))
    classes.sort(reverse=True)
    functions.sort()
    p90 = functions[int(0.9 * (len(functions) - 1))]
    median = statistics.median(functions)
    print("largest classes:", ", ".join(f"{n} {where}" for n, where in classes[:3]))
    print(f"functions: {len(functions)} median={median} p90={p90} max={functions[-1]}")
    levels, chain = coordinator_import_levels(root)
    short = [m.removeprefix("services.coordinator.") for m in chain]
    print(f"coordinator import levels: {levels}: {' -> '.join(short)}")
    migrations, functions_sql, repeats = migration_functions(root)
    print(f"migrations={migrations} SQL functions={functions_sql} redefinitions={repeats}")
    coordinator = sum(lines(p) for p in python_files(root / "services" / "coordinator"))
    print(
        f"RESULT coordinator_lines={coordinator} import_levels={levels} "
        f"largest_class={classes[0][0]} function_median={median} function_p90={p90} "
        f"function_max={functions[-1]} migrations={migrations} function_redefinitions={repeats}"
    )


if __name__ == "__main__":
    main()
