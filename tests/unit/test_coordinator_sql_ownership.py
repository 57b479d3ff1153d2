"""No room of the coordinator reads or writes another room's tables through its own SQL
(docs/architecture.md, "The rooms' SQL").

A table or view belongs to the room whose baseline file creates it
(`migrations/0001_release_0_1/<n>_<room>.sql`, rooms in layer order, bottom up), or whose
section of a later migration creates it (a migration after the baseline is split into
sections by `-- room: <room>` lines), or whose named statements create it (platform's
`schema_migrations`); a function belongs to the room that first creates it. A room's SQL
is its named statements (`<room>/*.sql`), the bodies of the functions, views and
triggers of its baseline file, and its sections of later migrations (whole: their
backfills and drops too).
It names its own tables and views, and reaches another room only through that room's
public surface, downwards:

- a function or view marked `-- public: <who calls it>` in the comment above it, of a
  room below;
- an interface: a function a room declares (`-- interface: implemented by <room>`) for
  a room above it to implement in its own baseline file (`CREATE OR REPLACE FUNCTION`),
  the SQL form of a callable given to a lower room (as `app.py` gives runs'
  cancellation to workflows). The declaring room calls it; the implementation is the
  implementing room's SQL.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from services.coordinator.platform import queries
from services.coordinator.platform.versions import list_migrations

BASELINE = queries.COORDINATOR_DIR / "migrations" / "0001_release_0_1"
_BASELINE_FILE = re.compile(r"^(\d+)_([a-z]+)\.sql$")

_CREATE_TABLE = re.compile(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.I)
_CREATE_VIEW = re.compile(
    r"^CREATE\s+(OR\s+REPLACE\s+)?VIEW\s+(\w+)\s+AS\b(.*?);\s*$", re.I | re.S | re.M
)
_CREATE_FUNCTION = re.compile(
    r"^CREATE\s+(OR\s+REPLACE\s+)?FUNCTION\s+(\w+)\s*\((.*?)\$(\w*)\$(.*?)\$\4\$",
    re.I | re.S | re.M,
)
# what a baseline file may create: a kind not listed here would escape the checks below
_CREATE_ANY = re.compile(
    r"^CREATE\s+((?:OR\s+REPLACE\s+|UNIQUE\s+|CONSTRAINT\s+)?\w+)", re.I | re.M
)
_KINDS = {
    "table",
    "index",
    "unique index",
    "view",
    "function",
    "or replace function",
    "trigger",
    "constraint trigger",
}
_CREATE_TRIGGER = re.compile(
    r"^CREATE\s+(?:CONSTRAINT\s+)?TRIGGER\s+(\w+)(.*?);\s*$", re.I | re.S | re.M
)
_TRIGGER_TABLE = re.compile(r"\bON\s+(\w+)", re.I)
_PUBLIC = re.compile(r"^--\s*public:", re.M)
_ROOM_LINE = re.compile(r"^--\s*room:\s*(\w+)\s*$", re.M)
_INTERFACE = re.compile(r"^--\s*interface:\s*implemented by\s+(\w+)", re.M)
# a comment, a string literal (its quotes doubled inside), or a quoted identifier
_NOT_CODE = re.compile(r"--[^\n]*|'(?:[^']|'')*'|\"[^\"]*\"")


@dataclasses.dataclass(frozen=True)
class Relation:
    name: str
    room: str
    kind: str  # "table" | "view"
    public: bool


@dataclasses.dataclass(frozen=True)
class Function:
    name: str
    room: str  # the declaring room
    public: bool
    implemented_by: str | None  # an interface: the room above that implements it


@dataclasses.dataclass(frozen=True)
class Text:
    """SQL of one room: a named statement, or a body in its baseline file."""

    room: str
    where: str
    sql: str


def _rooms() -> dict[str, tuple[int, Path]]:
    rooms = {}
    for path in sorted(BASELINE.glob("*.sql")):
        match = _BASELINE_FILE.match(path.name)
        assert match, f"{path.name}: baseline files are <n>_<room>.sql"
        rooms[match.group(2)] = (int(match.group(1)), path)
    return rooms


ROOMS = _rooms()


def _layer(room: str) -> int:
    return ROOMS[room][0]


def _comment_above(text: str, start: int) -> str:
    """The comment lines right above position `start` (the opening of a CREATE)."""
    lines = text[:start].rstrip("\n").split("\n")
    above: list[str] = []
    for line in reversed(lines):
        if not line.startswith("--"):
            break
        above.append(line)
    return "\n".join(reversed(above))


def _code(sql: str) -> str:
    """`sql` without comments and string literals (names in them are not references)."""
    return _NOT_CODE.sub(lambda match: "''" if match.group(0)[0] == "'" else " ", sql)


def _names(sql: str) -> set[str]:
    """Identifiers used as names: not after a dot (a column of an alias) nor after AS
    (an alias or a column's name)."""
    code = re.sub(r"\bpublic\s*\.\s*", "", _code(sql), flags=re.I)  # schema-qualified
    code = re.sub(r"(?<!:):[a-z_]\w*", " ", code, flags=re.I)  # a named parameter
    code = re.sub(r"\bAS\s+\w+", " ", code, flags=re.I)
    code = re.sub(r"\.\s*\w+", " ", code)
    return {word.lower() for word in re.findall(r"\b[a-z_][a-z0-9_]*\b", code, re.I)}


def _calls(sql: str) -> set[str]:
    code = re.sub(r"\bpublic\s*\.\s*", "", _code(sql), flags=re.I)
    return {match.lower() for match in re.findall(r"\b([a-z_][a-z0-9_]*)\s*\(", code, re.I)}


@dataclasses.dataclass
class Schema:
    relations: dict[str, Relation]
    functions: dict[str, Function]
    implementations: list[tuple[str, str]]  # (function, implementing room)
    texts: list[Text]
    triggers: list[tuple[str, str, str]]  # (room, trigger, table)


def _read(schema: Schema, room: str, text: str, where: str, *, later: bool) -> None:
    """Adds what `text` (a baseline file, or a room's section of a later migration) creates
    to `schema`. In a later migration, CREATE OR REPLACE of a function that is no interface
    replaces the body of the room's own function (docs/upgrading.md)."""
    relations, functions = schema.relations, schema.functions
    for match in _CREATE_TABLE.finditer(_code(text)):
        assert match.group(1) not in relations, f"table {match.group(1)} created twice"
        relations[match.group(1)] = Relation(match.group(1), room, "table", public=False)
    for match in _CREATE_VIEW.finditer(text):
        name = match.group(2)
        public = bool(_PUBLIC.search(_comment_above(text, match.start())))
        if name in relations:
            assert later, f"{where}: view {name} created twice"
            assert relations[name].room == room, f"{where}: {room} replaces view {name}"
        relations[name] = Relation(name, room, "view", public)
        schema.texts.append(Text(room, f"{where}: view {name}", match.group(3)))
    for match in _CREATE_FUNCTION.finditer(text):
        replace, name, signature, _, body = match.groups()
        comment = _comment_above(text, match.start())
        own = functions.get(name)
        if replace and later and own is not None and own.implemented_by is None:
            assert own.room == room, f"{where}: {room} replaces {own.room}'s {name}"
        elif replace:
            schema.implementations.append((name, room))
        else:
            assert name not in functions, f"function {name} declared twice"
            interface = _INTERFACE.search(comment)
            functions[name] = Function(
                name,
                room,
                public=bool(_PUBLIC.search(comment)),
                implemented_by=interface.group(1) if interface else None,
            )
        schema.texts.append(Text(room, f"{where}: function {name}", signature + body))
    for match in _CREATE_TRIGGER.finditer(text):
        table = _TRIGGER_TABLE.search(match.group(2))
        assert table, f"{where}: trigger {match.group(1)} names no table"
        schema.triggers.append((room, match.group(1), table.group(1)))
        schema.texts.append(Text(room, f"{where}: trigger {match.group(1)}", match.group(2)))
    if later:  # the section's own statements (backfills, drops) are the room's SQL too
        rest = _CREATE_VIEW.sub(" ", _CREATE_FUNCTION.sub(" ", text))
        schema.texts.append(Text(room, f"{where}: section", rest))


def later_sections() -> list[tuple[str, str, str]]:
    """(migration label, room, text) of every `-- room:` section of the migrations after the
    baseline, in order; a CREATE before the first section is an error."""
    sections = []
    for migration in list_migrations():
        if migration.path == BASELINE:
            continue
        text = migration.sql()
        marks = list(_ROOM_LINE.finditer(text))
        head = text[: marks[0].start()] if marks else text
        assert not _CREATE_ANY.search(head), f"{migration.label}: CREATE outside a room section"
        # (a migration without sections, e.g. 0005's ALTER of a table, holds no CREATE)
        for mark, following in zip(marks, [*marks[1:], None], strict=False):
            room = mark.group(1)
            assert room in ROOMS, f"{migration.label}: no room {room}"
            end = following.start() if following else len(text)
            sections.append((migration.label, room, text[mark.end() : end]))
    return sections


def _schema() -> Schema:
    schema = Schema({}, {}, [], [], [])
    for room, (_, path) in ROOMS.items():
        _read(schema, room, path.read_text(encoding="utf-8"), path.name, later=False)
    for label, room, text in later_sections():
        _read(schema, room, text, f"{label} ({room})", later=True)
    for path in queries.sql_files():
        room = path.parent.name
        for name, statement in queries.parse_queries(path.read_text(encoding="utf-8")).items():
            schema.texts.append(Text(room, f"{room}/{path.name}: {name}", statement))
            for match in _CREATE_TABLE.finditer(_code(statement)):
                schema.relations.setdefault(
                    match.group(1), Relation(match.group(1), room, "table", False)
                )
    return schema


SCHEMA = _schema()

# Crossings not removed yet, as (where, name): each one is a room's SQL naming another
# room's table or calling a function it may not call. Empty once every room keeps to its
# own; a new crossing is never added here.
KNOWN_CROSSINGS: set[tuple[str, str]] = set()


def _crossings() -> list[tuple[str, str, str]]:
    """(where, name, why) for every reference across rooms that the rules above forbid."""
    found = []
    for text in SCHEMA.texts:
        for name in sorted(_names(text.sql)):
            relation = SCHEMA.relations.get(name)
            if relation is None or relation.room == text.room:
                continue
            if relation.public and _layer(relation.room) < _layer(text.room):
                continue
            why = f"{text.room} names {relation.room}'s {relation.kind}" + (
                " (public, but to rooms above it)" if relation.public else ""
            )
            found.append((text.where, name, why))
        for name in sorted(_calls(text.sql)):
            function = SCHEMA.functions.get(name)
            if function is None or function.room == text.room:
                continue
            if function.public and _layer(function.room) < _layer(text.room):
                continue
            found.append((text.where, name, f"{text.room} calls {function.room}'s function {name}"))
    return found


def test_rooms_are_the_layers() -> None:
    assert list(ROOMS) == [
        "platform",
        "identity",
        "resources",
        "workflows",
        "runs",
        "review",
        "leases",
        "previews",
    ]
    assert {path.parent.name for path in queries.sql_files()} <= set(ROOMS)


def test_the_baseline_creates_only_what_is_checked() -> None:
    for _, path in ROOMS.values():
        text = path.read_text(encoding="utf-8")
        kinds = [" ".join(m.group(1).lower().split()) for m in _CREATE_ANY.finditer(text)]
        assert set(kinds) <= _KINDS, f"{path.name}: creates {set(kinds) - _KINDS}"
        functions = sum(1 for kind in kinds if kind.endswith("function"))
        assert len(_CREATE_FUNCTION.findall(text)) == functions, f"{path.name}: a function unread"
        assert len(_CREATE_VIEW.findall(text)) == kinds.count("view"), f"{path.name}: a view unread"
        assert not re.search(r"^DO\b", text, re.I | re.M), f"{path.name}: a DO block is not read"


def test_later_migrations_create_only_what_is_checked() -> None:
    sections = later_sections()
    for label, _, text in sections:
        kinds = [" ".join(m.group(1).lower().split()) for m in _CREATE_ANY.finditer(text)]
        assert set(kinds) <= _KINDS | {"or replace view"}, f"{label}: creates {set(kinds) - _KINDS}"
        functions = sum(1 for kind in kinds if kind.endswith("function"))
        assert len(_CREATE_FUNCTION.findall(text)) == functions, f"{label}: a function unread"
        views = sum(1 for kind in kinds if kind.endswith("view"))
        assert len(_CREATE_VIEW.findall(text)) == views, f"{label}: a view unread"
        assert not re.search(r"^DO\b", text, re.I | re.M), f"{label}: a DO block is not read"
    assert {room for _, room, _ in sections} >= {"review", "leases"}  # 0002, 0003


def test_every_table_has_a_room() -> None:
    rooms = {name: relation.room for name, relation in SCHEMA.relations.items()}
    assert rooms["schema_migrations"] == "platform"
    assert rooms["keys"] == "identity"
    assert rooms["recordings"] == "resources"
    assert rooms["workflows"] == "workflows"
    assert rooms["runs"] == "runs"
    assert rooms["bucket_items"] == "review"
    assert rooms["jobs"] == "leases"
    assert rooms["sightings"] == "review"  # 0002_review_storage


def test_no_room_names_another_rooms_tables() -> None:
    found = _crossings()
    new = [
        f"{where}: {name} ({why})"
        for where, name, why in found
        if (where, name) not in KNOWN_CROSSINGS
    ]
    assert not new, "SQL across rooms:\n" + "\n".join(new)
    gone = KNOWN_CROSSINGS - {(where, name) for where, name, _ in found}
    assert not gone, f"crossings removed: drop them from KNOWN_CROSSINGS: {sorted(gone)}"


def test_triggers_are_on_their_rooms_tables() -> None:
    wrong = [
        f"{room}: trigger {trigger} on {SCHEMA.relations[table].room}'s {table}"
        for room, trigger, table in SCHEMA.triggers
        if SCHEMA.relations[table].room != room
    ]
    assert not wrong


def test_interfaces_are_implemented_above_by_their_room() -> None:
    implemented: dict[str, list[str]] = {}
    for name, room in SCHEMA.implementations:
        function = SCHEMA.functions.get(name)
        assert function is not None, f"{room} replaces {name}, which no room declares"
        assert function.implemented_by == room, (
            f"{room} replaces {function.room}'s {name}, which is not an interface it implements"
        )
        implemented.setdefault(name, []).append(room)
    for function in SCHEMA.functions.values():
        if function.implemented_by is None:
            continue
        assert function.implemented_by in ROOMS, (
            f"{function.name}: no room {function.implemented_by}"
        )
        assert _layer(function.implemented_by) > _layer(function.room), (
            f"{function.name}: {function.room}'s interface must be implemented by a room above it"
        )
        assert sorted(set(implemented.get(function.name, []))) == [function.implemented_by], (
            f"{function.room}'s interface {function.name} is implemented "
            f"{implemented.get(function.name, [])}, not once by {function.implemented_by}"
        )


def _params_room(module: str) -> str:
    """The room of a generated `services.coordinator.<room>.<stem>_params` module, or ''."""
    parts = module.split(".")
    is_params = parts[:2] == ["services", "coordinator"] and len(parts) == 4
    return parts[2] if is_params and parts[3].endswith("_params") else ""


def _statements_used(module: Path) -> tuple[set[str], set[str]]:
    """The `.sql` file stems a module runs (`sql("jobs", ...)`, `load("jobs")`) and the rooms
    whose generated `<stem>_params` modules it imports."""
    stems: set[str] = set()
    params: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            first = node.args[0] if node.args else None
            if name in {"sql", "load", "statements"} and isinstance(first, ast.Constant):
                stems.add(str(first.value))
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            params.update(_params_room(name) for name in names if _params_room(name))
        elif isinstance(node, ast.Import):
            params.update(_params_room(a.name) for a in node.names if _params_room(a.name))
    return stems, params


def test_each_room_runs_only_its_own_statements() -> None:
    """A room's Python runs the statements of its own `.sql` files only (by file stem, or
    through the generated `<stem>_params` classes of its own package)."""
    owners = {path.stem: path.parent.name for path in queries.sql_files()}
    wrong = []
    for room in ROOMS:
        for module in sorted((queries.COORDINATOR_DIR / room).glob("*.py")):
            stems, params = _statements_used(module)
            wrong += [
                f"{room}/{module.name} runs {owners[stem]}'s {stem}.sql"
                for stem in sorted(stems)
                if owners.get(stem, room) != room
            ]
            wrong += [
                f"{room}/{module.name} binds {owner}'s statements"
                for owner in sorted(params)
                if owner != room
            ]
    assert not wrong, "\n".join(wrong)
