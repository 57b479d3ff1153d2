"""Settings from environment variables with a service prefix.

Each service declares one frozen dataclass; every field becomes the variable
`<PREFIX>_<FIELD NAME IN UPPER CASE>`. A field without a default is required.
Each field carries a `help` text in its metadata, used by the README table.
A missing or malformed value stops the process at start with exit code 2 and a
message naming the variable, instead of failing later in the middle of work.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

EXIT_BAD_SETTINGS = 2
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class SettingsError(ValueError):
    """A setting is missing or has a value that cannot be used."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


def setting(default: Any = dataclasses.MISSING, *, help: str) -> Any:
    """Declare a settings field with its help text (and a default if it is optional)."""
    return dataclasses.field(default=default, metadata={"help": help})


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
    """Build `cls` from `environ`; raises SettingsError naming the first bad variable."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        variable = variable_name(prefix, field.name)
        raw = environ.get(variable)
        if raw is None:
            if field.default is dataclasses.MISSING:
                raise SettingsError(variable, "required but not set")
            continue
        values[field.name] = _parse(variable, raw, hints[field.name])
    instance = cls(**values)
    validate = getattr(instance, "validate", None)
    if callable(validate):
        validate()
    return instance


def settings_or_exit(cls: type[T], prefix: str, environ: Mapping[str, str]) -> T:
    """Like load_settings, but prints the problem and exits with code 2."""
    try:
        return load_settings(cls, prefix, environ)
    except SettingsError as error:
        print(f"invalid settings: {error}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_SETTINGS) from None


def describe_settings(cls: type[Any], prefix: str) -> list[tuple[str, str, str]]:
    """(variable, default or 'required', help) for each field; feeds the README table."""
    rows = []
    for field in dataclasses.fields(cls):
        default = "required" if field.default is dataclasses.MISSING else repr(field.default)
        rows.append((variable_name(prefix, field.name), default, field.metadata.get("help", "")))
    return rows
