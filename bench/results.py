"""RESULT lines, and the files under bench/results/ that keep each benchmark's latest one.

Every benchmark ends with `RESULT name=value ...`. A value is a number or a word, never
NaN or infinite: a figure that was not measured is left out of the line, so that a
script comparing lines never reads `nan` as a measurement.

bench/results/<module>.txt holds the figures of record of `bench.<module>`: `key: value`
lines (command, date, commit, machine, target, and optionally note) and the RESULT line
the run printed, exactly. Lines starting with `#` are comments. docs/benchmarks.md's
tables are generated from these files (`python -m bench.report`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from pathlib import Path

PREFIX = "RESULT "
RESULTS_DIR = Path(__file__).resolve().parent / "results"
KEYS = ("command", "date", "commit", "machine", "target")
OPTIONAL_KEYS = ("note",)
_FIELD = re.compile(r"[a-z][a-z0-9_]*=\S+")


class ResultError(ValueError):
    """A RESULT line or a saved results file that does not read as one."""


def _check_value(name: str, value: str) -> None:
    try:
        number = float(value)
    except ValueError:
        return  # a word, e.g. a codec's name
    if not math.isfinite(number):
        raise ResultError(f"{name}={value}: a RESULT value must be a finite number")


def result_line(fields: Mapping[str, str]) -> str:
    """`RESULT name=value ...` of already formatted values, in the order given; refuses NaN
    and infinities (leave a figure that was not measured out instead)."""
    if not fields:
        raise ResultError("a RESULT line needs at least one figure")
    for name, value in fields.items():
        if not _FIELD.fullmatch(f"{name}={value}"):
            raise ResultError(f"{name}={value!r} is not a RESULT field")
        _check_value(name, value)
    return PREFIX + " ".join(f"{name}={value}" for name, value in fields.items())


def parse_result(line: str) -> dict[str, str]:
    """The figures of one RESULT line, by name."""
    if not line.startswith(PREFIX):
        raise ResultError(f"not a RESULT line: {line!r}")
    fields: dict[str, str] = {}
    for field in line[len(PREFIX) :].split():
        if not _FIELD.fullmatch(field):
            raise ResultError(f"{field!r} in {line!r} is not name=value")
        name, value = field.split("=", 1)
        _check_value(name, value)
        if name in fields:
            raise ResultError(f"{name} twice in {line!r}")
        fields[name] = value
    if not fields:
        raise ResultError(f"a RESULT line without figures: {line!r}")
    return fields


def last_result(output: str) -> str:
    """The last RESULT line of a benchmark's output."""
    lines = [line.strip() for line in output.splitlines() if line.startswith(PREFIX)]
    if not lines:
        raise ResultError("the output has no RESULT line")
    parse_result(lines[-1])
    return lines[-1]


@dataclasses.dataclass(frozen=True)
class Saved:
    """One benchmark's figures of record."""

    benchmark: str  # the module, e.g. bench.review
    facts: dict[str, str]  # KEYS and OPTIONAL_KEYS present, in file order
    result: str | None  # the RESULT line; None for a benchmark never run

    def text(self) -> str:
        lines = [f"{key}: {value}" for key, value in self.facts.items()]
        if self.result is not None:
            lines.append(self.result)
        return "\n".join(lines) + "\n"


def read_saved(path: Path) -> Saved:
    """A results file; ResultError names the file and what is wrong with it."""
    benchmark = f"bench.{path.stem}"
    facts: dict[str, str] = {}
    result = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        if result is not None:
            raise ResultError(f"{where}: nothing may follow the RESULT line")
        if line.startswith(PREFIX):
            parse_result(line)
            result = line
            continue
        key, colon, value = line.partition(":")
        if not colon or key not in (*KEYS, *OPTIONAL_KEYS) or not value.strip():
            raise ResultError(f"{where}: expected one of {', '.join(KEYS)}, note: <text>")
        if key in facts:
            raise ResultError(f"{where}: {key} twice")
        facts[key] = value.strip()
    missing = [key for key in KEYS if key not in facts]
    if missing:
        raise ResultError(f"{path}: missing {', '.join(missing)}")
    if result is None and "note" not in facts:
        raise ResultError(f"{path}: no RESULT line, and no note saying why")
    return Saved(benchmark, facts, result)


def read_all(folder: Path = RESULTS_DIR) -> list[Saved]:
    return [read_saved(path) for path in sorted(folder.glob("*.txt"))]
