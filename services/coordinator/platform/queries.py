"""Named SQL blocks loaded from the coordinator's `.sql` files.

A room keeps its statements beside its modules (`identity/auth.sql`, `runs/runs.sql`). A
file stem names one file across the rooms, so call sites say `sql("auth", "key_revoke")`
without naming the room.

A file holds blocks that start with `-- name: entity_verb`; the text up to the
next such line is the statement. Python code refers to statements by name only,
so every statement the coordinator runs can be read, reviewed and EXPLAINed in
one place.

Parameters are positional (`$1`, `$2`, ...) or named (`:run_id`), never both in one
statement; a statement with more than five inputs names them (tests/unit/test_sql_params.py
keeps it so). A name is a lowercase identifier after a colon that is not part of a cast's
`::`, outside string literals, quoted identifiers and comments. The loader rewrites the
names to `$1..$n` in order of first appearance, once per process (the same name again is
the same `$k`), so asyncpg and Postgres see an ordinary statement. The first use of each
name carries a cast that gives its type (`:lease_token::uuid`, `:labels::text[]`); a
comment line `-- nullable: a, b` in the block says which may be NULL (`b[]`: an array
whose elements may be NULL).

`python -m scripts.gen_sql_params` writes, for each file with named statements, a module
`<room>/<stem>_params.py` holding one frozen, slotted, keyword-only dataclass per named
statement (`JobComplete` for `job_complete`), its fields the parameters in order, typed
from their casts; `make lint` fails when one is stale (`--check`). A call binds one by
name, and the class knows its statement, so no call site orders values by hand nor pairs
a class with another statement:

    await connection.fetchrow(*bind(KeyCreate(key_id=..., name=..., ...)))

`bind` is the statement's text and the fields' values in order: one dict lookup and one
`attrgetter` (made once per class, when the fields are also checked against the
statement), so binding by name costs the hot path nothing measurable.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from functools import cache
from operator import attrgetter
from pathlib import Path
from typing import ClassVar, TypeAlias

COORDINATOR_DIR = Path(__file__).parent.parent
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


def sql_files(root: Path = COORDINATOR_DIR) -> list[Path]:
    """Every file of named statements, in every room (migrations are not named blocks)."""
    return sorted(path for path in root.glob("*/*.sql") if path.parent.name != "migrations")


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
    """The statements of the file `file_stem` as sent (named parameters rewritten to
    `$1..$n`), parsed once per process."""
    return {name: statement.text for name, statement in statements(file_stem).items()}


@cache
def statements(file_stem: str) -> dict[str, Statement]:
    """The statements of the file `file_stem`, with their parameters, parsed once per process."""
    path = sql_file(file_stem)
    return parse_statements(path.read_text(encoding="utf-8"), source=str(path))


def parse_statements(text: str, *, source: str = "<sql>") -> dict[str, Statement]:
    """`parse_queries`, each statement's named parameters rewritten (see `rewrite`)."""
    return {
        name: rewrite(body, name=name, source=source)
        for name, body in parse_queries(text, source=source).items()
    }


@dataclasses.dataclass(frozen=True, slots=True)
class Param:
    """A named parameter: its name and the type its first use casts it to ("uuid",
    "text[]"; None: no cast), and whether the block declares it nullable (`-- nullable:
    name`) or, for an array, its elements (`-- nullable: name[]`)."""

    name: str
    cast: str | None
    nullable: bool
    nullable_elements: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Statement:
    """A named block: `text` as sent (`$1..$n`) and its named parameters in `$` order
    (empty for a positional statement; `positional` counts its `$n`)."""

    name: str
    text: str
    params: tuple[Param, ...]
    positional: int

    @property
    def inputs(self) -> int:
        """How many values the statement takes."""
        return len(self.params) or self.positional


# One pass over a statement: what the parameter scan skips (string literals, quoted
# identifiers, comments, dollar-quoted bodies and a cast's `::`), a named parameter (a
# colon that follows no word character or colon, then a lowercase identifier) with the
# cast that may follow it, or a positional `$n`.
_TOKENS = re.compile(
    r"""
      (?P<skip> '(?:[^']|'')*'
              | "(?:[^"]|"")*"
              | --[^\n]*
              | /\*.*?\*/
              | \$(?P<tag>[A-Za-z_]\w*|)\$.*?\$(?P=tag)\$
              | ::
      )
    | (?<![\w:]) :(?P<name>[a-z_][a-z0-9_]*)\b
      (?:\s*::\s*(?P<cast>(?:double\s+precision|[a-z_][a-z0-9_]*)(?:\s*\[\])?))?
    | \$(?P<number>[0-9]+)
    """,
    re.VERBOSE | re.DOTALL,
)
_NULLABLE_LINE = re.compile(r"^--\s*nullable:\s*(.*?)\s*$", re.MULTILINE)


def rewrite(body: str, *, name: str = "<statement>", source: str = "<sql>") -> Statement:
    """`body` with each named parameter `:x` replaced by `$k`, k its order of first
    appearance (a cast after it stays: `:x::uuid` becomes `$1::uuid`)."""
    order: dict[str, int] = {}
    casts: dict[str, str | None] = {}
    numbers: set[int] = set()
    parts: list[str] = []
    at = 0
    for match in _TOKENS.finditer(body):
        if match.group("number") is not None:
            numbers.add(int(match.group("number")))
            continue
        param = match.group("name")
        if param is None:
            continue
        if param not in order:
            order[param] = len(order) + 1
            cast = match.group("cast")
            casts[param] = None if cast is None else re.sub(r"\s+", " ", cast).replace(" [", "[")
        parts += [body[at : match.start()], f"${order[param]}"]
        at = match.start("name") + len(param)
    parts.append(body[at:])
    where = f"{source}: query {name!r}"
    if order and numbers:
        raise ValueError(f"{where} mixes named and positional ($n) parameters")
    nullable = {
        word.strip()
        for line in _NULLABLE_LINE.findall(body)
        for word in line.split(",")
        if word.strip()
    }
    if unknown := sorted({word.removesuffix("[]") for word in nullable} - order.keys()):
        raise ValueError(f"{where}: nullable names no parameter: {', '.join(unknown)}")
    params = tuple(Param(key, casts[key], key in nullable, f"{key}[]" in nullable) for key in order)
    return Statement(name, "".join(parts), params, max(numbers, default=0))


class Params:
    """The base of a generated parameter class (`<room>/<stem>_params.py`): a frozen,
    slotted, keyword-only dataclass whose fields are one named statement's parameters, in
    order; FILE and NAME say which statement."""

    __slots__ = ()
    FILE: ClassVar[str]
    NAME: ClassVar[str]


Bound: TypeAlias = tuple[str, *tuple[object, ...]]
_BINDERS: dict[type[Params], Callable[[Params], Bound]] = {}


def bind(params: Params) -> Bound:
    """The statement of `params`' class and its values in order, as a fetch takes them:
    `connection.fetch(*bind(params))`, `fetch_one(connection, Row, *bind(params))`."""
    binder = _BINDERS.get(type(params)) or _binder(type(params))
    return binder(params)


def _binder(kind: type[Params]) -> Callable[[Params], Bound]:
    """Made once per class: the statement's text and an attrgetter of the fields, after
    checking them against the statement's parameters (a stale class fails here)."""
    statement = statements(kind.FILE)[kind.NAME]
    fields = tuple(field.name for field in dataclasses.fields(kind))  # type: ignore[arg-type]
    expected = tuple(param.name for param in statement.params)
    if fields != expected:
        raise TypeError(
            f"{kind.__name__} has fields {fields}, but {kind.FILE}.{kind.NAME} takes {expected}: "
            "run `python -m scripts.gen_sql_params`"
        )
    text = statement.text
    read = attrgetter(*fields)
    binder: Callable[[Params], Bound]
    if len(fields) == 1:  # an attrgetter of one name answers its value, not a tuple
        binder = lambda params: (text, read(params))  # noqa: E731
    else:
        binder = lambda params: (text, *read(params))  # noqa: E731
    _BINDERS[kind] = binder
    return binder
