"""Named SQL parameters: the loader's rewriting to `$n`, the generated parameter classes
(scripts/gen_sql_params.py) and binding them (services/coordinator/platform/queries.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from scripts import gen_sql_params
from services.coordinator.identity.auth_params import KeyCreate, KeyListOfUser
from services.coordinator.platform import queries
from services.coordinator.platform.queries import Param, Params, bind, rewrite

# More inputs than this and a statement must name them.
MAX_POSITIONAL = 5


def test_names_become_numbers_in_order_of_first_appearance() -> None:
    statement = rewrite("SELECT f(p_b => :b::text, p_a => :a::bigint, p_b2 => :b, :a)")
    assert statement.text == "SELECT f(p_b => $1::text, p_a => $2::bigint, p_b2 => $1, $2)"
    assert statement.params == (Param("b", "text", False), Param("a", "bigint", False))
    assert statement.inputs == 2


def test_a_cast_is_no_parameter_and_stays() -> None:
    statement = rewrite("SELECT x::text, :y::timestamptz, now()::date, :z :: double  precision")
    assert statement.text == "SELECT x::text, $1::timestamptz, now()::date, $2 :: double  precision"
    assert [(param.name, param.cast) for param in statement.params] == [
        ("y", "timestamptz"),
        ("z", "double precision"),
    ]


def test_array_casts_and_a_name_without_a_cast() -> None:
    statement = rewrite("SELECT unnest(:labels::text[]), :flags::boolean [], :bare")
    assert statement.text == "SELECT unnest($1::text[]), $2::boolean [], $3"
    assert [param.cast for param in statement.params] == ["text[]", "boolean[]", None]


def test_colons_in_strings_comments_identifiers_and_slices_are_not_parameters() -> None:
    body = """SELECT ':not' AS "also:not", 'it''s :not', a[lo:hi], $$ :not $$, $q$ :not $q$
-- a comment :not
/* a block :not */ FROM t WHERE x = :yes::text"""
    statement = rewrite(body)
    assert [param.name for param in statement.params] == ["yes"]
    assert statement.text == body.replace(":yes", "$1")


def test_a_positional_statement_is_left_as_it_is() -> None:
    statement = rewrite("SELECT $1::text, $3, x::int")
    assert statement.text == "SELECT $1::text, $3, x::int"
    assert statement.params == ()
    assert statement.inputs == 3


def test_named_and_positional_parameters_do_not_mix() -> None:
    with pytest.raises(ValueError, match="mixes named and positional"):
        rewrite("SELECT :a::text, $2")


def test_nullable_comment_line() -> None:
    statement = rewrite("-- nullable: b, c, d[]\nSELECT :a::text, :b::text, :c::bigint, :d::text[]")
    assert [param.nullable for param in statement.params] == [False, True, True, False]
    assert [param.nullable_elements for param in statement.params] == [False] * 3 + [True]
    with pytest.raises(ValueError, match="nullable names no parameter: d"):
        rewrite("-- nullable: d\nSELECT :a::text")


def _module(body: str) -> str:
    path = Path("/rooms/room/things.sql")
    text = gen_sql_params.render(
        path, queries.parse_statements(f"-- name: thing_do\n{body}"), root=Path("/rooms")
    )
    assert text is not None
    return text


def test_the_generator_types_fields_from_their_casts() -> None:
    module = _module(
        """-- nullable: e, k, o[]
SELECT :a::text, :b::bigint, :c::integer, :d::boolean, :e::timestamptz, :f::uuid,
       :g::double precision, :h::numeric, :i::bytea, :j::jsonb, :k::text[], :l::int[],
       :m::time, :n::double precision[], :o::text[], :p::interval, :a"""
    )
    fields = [
        line.strip() for line in module.splitlines() if line.startswith("    ") and ": " in line
    ]
    assert fields == [
        'FILE: ClassVar[str] = "things"',
        'NAME: ClassVar[str] = "thing_do"',
        "a: str",
        "b: int",
        "c: int",
        "d: bool",
        "e: datetime | None",
        "f: uuid.UUID",
        "g: float",
        "h: Decimal",
        "i: bytes",
        "j: object",
        "k: Sequence[str] | None",
        "l: Sequence[int]",
        "m: time",
        "n: Sequence[float]",
        "o: Sequence[str | None]",
        "p: timedelta",
    ]
    assert "class ThingDo(Params):" in module
    assert "do not edit" in module
    assert "from datetime import datetime, time, timedelta\n" in module


def test_a_generated_module_imports_and_its_fields_are_the_parameters(tmp_path: Path) -> None:
    path = tmp_path / "generated_things_params.py"
    path.write_text(_module("SELECT :b::timestamptz, :a::bigint[], :c::jsonb, :b"))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses reads ClassVar annotations through it
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[path.stem]
    thing = module.ThingDo
    assert issubclass(thing, Params)
    assert (thing.FILE, thing.NAME) == ("things", "thing_do")
    assert [field.name for field in dataclasses.fields(thing)] == ["b", "a", "c"]
    with pytest.raises(TypeError):
        thing(datetime.now(UTC), [1], {})  # keyword-only: values are bound by name
    made = thing(a=[1], b=datetime.now(UTC), c={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.a = []
    assert not hasattr(made, "__dict__")  # slotted


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("SELECT :a", "has no cast on its first use"),
        ("SELECT :a::point", "no Python type for 'point'"),
        ("SELECT :from::text", "is a Python keyword"),
        ("-- nullable: a[]\nSELECT :a::text", "is no array"),
    ],
)
def test_the_generator_refuses(body: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        _module(body)


def test_a_file_without_named_statements_has_no_module() -> None:
    path = Path("/rooms/room/things.sql")
    statements = queries.parse_statements("-- name: thing_get\nSELECT $1")
    assert gen_sql_params.render(path, statements, root=Path("/rooms")) is None


def test_check_finds_a_stale_module(tmp_path: Path) -> None:
    room = tmp_path / "room"
    room.mkdir()
    sql_path = room / "things.sql"
    sql_path.write_text("-- name: thing_put\nINSERT INTO t VALUES (:a::text)\n")
    check = ["--root", str(tmp_path), "--check"]
    assert gen_sql_params.main(check) == 1  # not generated yet
    assert gen_sql_params.main(["--root", str(tmp_path)]) == 0
    assert (room / "things_params.py").exists()
    assert gen_sql_params.main(check) == 0
    sql_path.write_text("-- name: thing_put\nINSERT INTO t VALUES (:a::text, :b::bigint)\n")
    assert gen_sql_params.main(check) == 1  # a new parameter
    assert gen_sql_params.stale(tmp_path) == [room / "things_params.py"]
    gen_sql_params.generate(tmp_path)
    assert gen_sql_params.main(check) == 0
    sql_path.write_text("-- name: thing_put\nINSERT INTO t VALUES ($1)\n")
    assert gen_sql_params.main(check) == 1  # no named statement left: the module must go
    gen_sql_params.generate(tmp_path)
    assert not (room / "things_params.py").exists()


def test_the_committed_modules_are_current() -> None:
    assert gen_sql_params.stale() == []


def test_every_statement_with_more_than_five_inputs_names_them() -> None:
    positional = {
        f"{path.stem}.{name}"
        for path in queries.sql_files()
        for name, statement in queries.statements(path.stem).items()
        if not statement.params and statement.inputs > MAX_POSITIONAL
    }
    assert positional == set()


def test_bind_is_the_statement_then_the_values_in_order() -> None:
    now = datetime(2026, 1, 2, tzinfo=UTC)
    params = KeyListOfUser(
        limit=10, after_id=None, after_at=None, now=now, include_revoked=True, user_id="ann"
    )
    assert bind(params) == (
        queries.load("auth")["key_list_of_user"],
        "ann",
        True,
        now,
        None,
        None,
        10,
    )
    assert ":user_id" not in bind(params)[0]
    created = KeyCreate(
        key_id="k",
        name="n",
        user_id=None,
        secret_hash="h",
        scopes=[],
        created_at=now,
        expires_at=None,
    )
    assert bind(created)[1:] == ("k", "n", None, "h", [], now, None)


def test_a_class_that_does_not_match_its_statement_is_refused() -> None:
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Stale(Params):
        FILE = "auth"
        NAME = "key_create"
        key_id: str
        name: str

    with pytest.raises(TypeError, match=r"gen_sql_params"):
        bind(Stale(key_id="k", name="n"))


def test_bind_one_field() -> None:
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class One(Params):
        FILE = "auth"
        NAME = "one"
        token: uuid.UUID

    statement = rewrite("SELECT :token::uuid", name="one")
    queries.statements("auth")  # the real file's statements, with one added for this test
    token = uuid.uuid4()
    try:
        queries.statements("auth")["one"] = statement
        assert bind(One(token=token)) == ("SELECT $1::uuid", token)
    finally:
        del queries.statements("auth")["one"]
