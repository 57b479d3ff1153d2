"""Every typed row against the statement that feeds it, without running the statement.

The store modules read each result into a `Row` (services/coordinator/platform/db.py) by field
name. Here each `fetch_one` / `fetch_all` / `fetch_column` call in the coordinator's
source is found, its statement prepared on a migrated database, and the row's fields
checked against the statement's result columns: every field has a column of that name
(a renamed column fails here, not on the one request path that reads it), and the
column's Postgres type fits the field's annotation.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
import sys
import types
import typing
import uuid
from collections.abc import Iterator
from datetime import datetime, time
from pathlib import Path

import asyncpg
import pytest

import services.coordinator
from services.coordinator.platform.db import Params, Row, sql
from services.coordinator.review.listing import PageStatement
from services.coordinator.runs.status import RunCounts

SOURCE = Path(services.coordinator.__file__).parent

# fetch_one(connection, RunRow, sql("runs", "run_get"), ...) and the operator API's
# self._one(DeviceRow, sql(...))
ROW_CALL = re.compile(
    r"\b(?:fetch_one|fetch_all|_one|_all)\(\s*(?:\w+,\s*)?([A-Z]\w+),\s*"
    r'sql\(\s*"(\w+)",\s*"(\w+)"\s*\)'
)
# The lease functions' self._answer(Renewal, JobHeartbeat(...)), or of parameters made
# before it in the module: complete = JobComplete(...); self._answer(CommitAnswer, complete)
ANSWER_CALL = re.compile(r"\b_answer(?:_on)?\(\s*(?:\w+,\s*)?([A-Z]\w+),\s*(\w+)\b")
MADE = re.compile(r"\b([a-z]\w*) = ([A-Z]\w+)\(")
# ... or made by a function of the module that says the class it returns
# (def complete(...) -> JobComplete: ...; commit = complete(...), or complete(...) passed on)
RETURNS = re.compile(r"\bdef (\w+)\((?:[^()]|\([^()]*\))*\)\s*->\s*([A-Z]\w+):")
CALLED = re.compile(r"\b([a-z]\w*) = ([a-z]\w*)\(")
# A statement with named parameters, bound through its generated class, which names it:
# fetch_one(connection, KeyRow, *bind(KeyCreate(...))), self._one(RecordingRow, *bind(...))
# or of parameters made before it (keys = QueuePageKeys(...); fetch_all(c, QueueRow, *bind(keys)))
BOUND_CALL = re.compile(
    r"\b(?:fetch_one|fetch_all|_one|_all)\(\s*(?:\w+,\s*)?([A-Z]\w+),\s*\*bind\(\s*(\w+)\b"
)
# Parameters picked at run time, which the scan cannot follow: (module, variable) -> the
# union of the parameter classes it may be (ListBucketItems' page paths, review/listing.py).
PICKED: dict[tuple[str, str], object] = {
    ("services.coordinator.review.reviews", "statement"): PageStatement,
}
COLUMN_CALL = re.compile(r'\bfetch_column\(\s*\w+,\s*(\w+),\s*sql\(\s*"(\w+)",\s*"(\w+)"\s*\)')

# Postgres result types -> the Python types asyncpg decodes them to (jsonb: our codec).
PG_TYPES: dict[str, tuple[type, ...]] = {
    "int2": (int,),
    "int4": (int,),
    "int8": (int,),
    "text": (str,),
    "bool": (bool,),
    "float4": (float,),
    "float8": (float,),
    "uuid": (uuid.UUID,),
    "timestamptz": (datetime,),
    "time": (time,),
    "jsonb": (dict, list),
    "json": (dict, list),
    "text[]": (list,),
    "int8[]": (list,),
    "int4[]": (list,),
    "float4[]": (list,),
    "bool[]": (list,),
    "timestamptz[]": (list,),
}


@dataclasses.dataclass(frozen=True)
class Use:
    where: str
    file: str
    statement: str
    row: type[Row] | type


def _modules() -> Iterator[types.ModuleType]:
    for info in pkgutil.walk_packages([str(SOURCE)], "services.coordinator."):
        if not info.name.endswith("__main__"):
            yield importlib.import_module(info.name)


def _uses() -> list[Use]:
    found = []
    for module in _modules():
        assert module.__file__ is not None
        text = Path(module.__file__).read_text(encoding="utf-8")
        name = module.__name__
        for row, file, statement in ROW_CALL.findall(text):
            found.append(Use(name, file, statement, getattr(module, row)))
        made: dict[str, set[str]] = {}
        for variable, kind_name in MADE.findall(text):
            made.setdefault(variable, set()).add(kind_name)
        returns = dict(RETURNS.findall(text))
        for function, kind_name in returns.items():
            made.setdefault(function, set()).add(kind_name)
        for variable, function in CALLED.findall(text):
            if function in returns:
                made.setdefault(variable, set()).add(returns[function])
        for row, params in ANSWER_CALL.findall(text):
            if params[0].islower():  # a variable: the one class it is made of
                assert len(made.get(params, ())) == 1, f"{name}: {params} = ?"
                (params,) = made[params]
            kind = getattr(module, params)
            assert issubclass(kind, Params), f"{name}: {params} is no parameter class"
            found.append(Use(name, kind.FILE, kind.NAME, getattr(module, row)))
        for row, params in BOUND_CALL.findall(text):
            if (name, params) in PICKED:
                kinds = list(typing.get_args(PICKED[name, params]))
            elif params[0].islower():
                # a variable: the one class it is made of (one the scan cannot follow leaves
                # its row unread, which test_every_statement_read_into_a_row_is_found shows)
                if len(made.get(params, ())) != 1:
                    continue
                kinds = [getattr(module, next(iter(made[params])))]
            else:
                kinds = [getattr(module, params)]
            for kind in kinds:
                assert issubclass(kind, Params), f"{name}: {params} is no parameter class"
                found.append(Use(name, kind.FILE, kind.NAME, getattr(module, row)))
        for kind, file, statement in COLUMN_CALL.findall(text):
            found.append(Use(name, file, statement, {"str": str, "int": int}[kind]))
    return list({(use.file, use.statement, use.row): use for use in found}.values())


USES = _uses()


def _rows(row: type[Row]) -> Iterator[type[Row]]:
    """Row and its subclasses, as their modules name them (dataclass(slots=True) makes a
    new class: the one it replaced lingers among __subclasses__ until collected)."""
    if getattr(sys.modules[row.__module__], row.__name__, None) is row:
        yield row
    for sub in row.__subclasses__():
        yield from _rows(sub)


def _nested(row: type[Row]) -> Iterator[type[Row]]:
    for kind in typing.get_type_hints(row).values():
        if isinstance(kind, type) and issubclass(kind, Row):
            yield kind
            yield from _nested(kind)


def _fields(row: type[Row]) -> Iterator[tuple[str, object]]:
    """(column, annotation) of every field, nested rows flattened into their columns."""
    hints = typing.get_type_hints(row)
    for field in dataclasses.fields(row):  # type: ignore[arg-type]
        kind = hints[field.name]
        if isinstance(kind, type) and issubclass(kind, Row):
            yield from _fields(kind)
        else:
            yield field.name, kind


def _accepted(annotation: object) -> tuple[type, ...]:
    """The runtime types an annotation admits (None aside): `list[str] | None` -> (list,)."""
    parts = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    accepted: list[type] = []
    for part in parts or (annotation,):
        if part is type(None):
            continue
        origin = typing.get_origin(part) or part
        assert isinstance(origin, type), annotation
        accepted.append(origin)
    return tuple(accepted)


def test_every_statement_read_into_a_row_is_found() -> None:
    """The scan sees the store modules' reads, and every row type is read somewhere."""
    assert len(USES) >= 45, [f"{use.file}.{use.statement}" for use in USES]
    read = {use.row for use in USES}
    nested = {kind for row in read if issubclass(row, Row) for kind in _nested(row)}
    defined = {row for row in _rows(Row) if row is not Row}
    assert defined - read - nested == set()


@pytest.mark.parametrize(
    "use", USES, ids=[f"{use.file}.{use.statement}:{use.row.__name__}" for use in USES]
)
async def test_row_fields_match_the_statement_columns(pg_dsn: str, use: Use) -> None:
    connection = await asyncpg.connect(pg_dsn)
    try:
        statement = await connection.prepare(sql(use.file, use.statement))
        columns = {attribute.name: attribute.type.name for attribute in statement.get_attributes()}
    finally:
        await connection.close()
    if not issubclass(use.row, Row):  # fetch_column: the first column's type
        first = next(iter(columns.values()))
        assert use.row in PG_TYPES[first], (use.statement, first)
        return
    for name, annotation in _fields(use.row):
        assert name in columns, f"{use.row.__name__}.{name} has no column in {use.statement}"
        fits = set(PG_TYPES[columns[name]]) & set(_accepted(annotation))
        assert fits, f"{use.row.__name__}.{name}: {annotation} but {columns[name]}"


def test_a_row_built_from_a_record_equals_one_built_by_its_constructor() -> None:
    """Row.from_record stores fields through the slots rather than __init__ (db._builder):
    the instance must be the one __init__ makes, nested rows included."""
    record = {
        "run_id": "r1",
        "workflow_id": "w",
        **{field.name: index for index, field in enumerate(dataclasses.fields(RunCounts))},
    }

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithCounts(Row):
        run_id: str
        counts: RunCounts
        workflow_id: str

    built = WithCounts.from_record(record)
    expected = WithCounts("r1", RunCounts(*range(len(dataclasses.fields(RunCounts)))), "w")
    assert built == expected
    assert hash(built) == hash(expected)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.run_id = "r2"  # type: ignore[misc]
