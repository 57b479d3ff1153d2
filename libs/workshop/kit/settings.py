"""Settings from environment variables with a service prefix.

Each service declares one frozen dataclass; every field becomes the variable
`<PREFIX>_<FIELD NAME IN UPPER CASE>`. A field without a default is required.
Each field carries a `help` text in its metadata, used by the README table, and
optionally a `check` of its parsed value (`at_least`, `between`, `one_of`, or any
function returning a problem or None); a class of the dataclass's bases may define
`cross_checks(self)`, the (field name, problem) pairs of fields that go together (a
certificate and its key). Every missing, malformed or out-of-range
value is reported at once, one line per variable, and stops the process at start
with exit code 2, instead of failing later in the middle of work.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

EXIT_BAD_SETTINGS = 2
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


Check = Callable[[Any], str | None]


class SettingsError(ValueError):
    """Settings are missing or have values that cannot be used: one problem per variable.

    `variable` names the first; `problems` holds (variable, problem) for each.
    """

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable
        self.problems: list[tuple[str, str]] = [(variable, problem)]

    @classmethod
    def of(cls, problems: list[tuple[str, str]]) -> SettingsError:
        error = cls(*problems[0])
        error.problems = list(problems)
        error.args = ("; ".join(f"{variable}: {problem}" for variable, problem in problems),)
        return error


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    check: Check | None = None,
    secret: bool = False,
) -> Any:
    """Declare a settings field with its help text, a default if it is optional, and a check.

    A `secret` field (a key, a password, a URL that may carry one) is left out of the
    settings' repr, so a settings object that reaches a log or a traceback shows its
    other fields and never the secret."""
    return dataclasses.field(
        default=default, repr=not secret, metadata={"help": help, "check": check, "secret": secret}
    )


def at_least(low: float, unit: str = "") -> Check:
    return lambda value: None if value >= low else f"must be at least {low:g}{unit}"


def between(low: float, high: float, unit: str = "") -> Check:
    return lambda value: None if low <= value <= high else f"must be {low:g}..{high:g}{unit}"


def one_of(*choices: str) -> Check:
    named = ", ".join(choices[:-1]) + f" or {choices[-1]}"
    return lambda value: None if value in choices else f"must be {named}, got {value!r}"


def variable_name(prefix: str, field_name: str) -> str:
    return f"{prefix}_{field_name.upper()}"


def _parse(variable: str, raw: str, kind: Any) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        if raw == "":
            return None
        return _parse(variable, raw, inner[0])
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise SettingsError(variable, f"expected a boolean (1/0, true/false), got {raw!r}")
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise SettingsError(variable, f"expected an integer, got {raw!r}") from None
    if kind is float:
        try:
            return float(raw)
        except ValueError:
            raise SettingsError(variable, f"expected a number, got {raw!r}") from None
    if kind is Path:
        return Path(raw)
    if kind is str:
        return raw
    raise TypeError(f"unsupported settings type {kind!r} for {variable}")


def load_settings(cls: type[T], prefix: str, environ: Mapping[str, str]) -> T:
    """Build `cls` from `environ`; raises SettingsError naming every bad variable."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for field in dataclasses.fields(cls):
        variable = variable_name(prefix, field.name)
        raw = environ.get(variable)
        if raw is None:
            if field.default is dataclasses.MISSING:
                problems.append((variable, "required but not set"))
            continue
        try:
            value = _parse(variable, raw, hints[field.name])
        except SettingsError as error:
            problems.extend(error.problems)
            continue
        check: Check | None = field.metadata.get("check")
        problem = check(value) if check is not None and value is not None else None
        if problem is not None:
            problems.append((variable, problem))
        values[field.name] = value
    if problems:
        raise SettingsError.of(problems)
    settings = cls(**values)
    for base in cls.__mro__:
        cross_checks = base.__dict__.get("cross_checks")
        if cross_checks is not None:
            problems += [
                (variable_name(prefix, name), problem) for name, problem in cross_checks(settings)
            ]
    if problems:
        raise SettingsError.of(problems)
    return settings


def settings_or_exit(cls: type[T], prefix: str, environ: Mapping[str, str]) -> T:
    """Like load_settings, but prints every problem and exits with code 2."""
    try:
        return load_settings(cls, prefix, environ)
    except SettingsError as error:
        lines = "".join(f"\n  {variable}: {problem}" for variable, problem in error.problems)
        print(f"invalid settings:{lines}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_SETTINGS) from None


def describe_settings(cls: type[Any], prefix: str) -> list[tuple[str, str, str]]:
    """(variable, default or 'required', help) for each field; feeds the README table."""
    rows = []
    for field in dataclasses.fields(cls):
        default = "required" if field.default is dataclasses.MISSING else repr(field.default)
        rows.append((variable_name(prefix, field.name), default, field.metadata.get("help", "")))
    return rows
