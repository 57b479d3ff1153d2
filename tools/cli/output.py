"""Printing answers: JSON (`--output json`, `jsonl`) or a rich table for people."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

from tools.cli.context import Options

Row = Mapping[str, Any]


def as_dict(message: Message) -> dict[str, Any]:
    """A message as the JSON the gateway speaks: proto field names, enums by name, every
    field present (so scripts need not know proto3's defaults)."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def emit(opts: Options, value: Any, *, table: Sequence[Row] | None = None, title: str = "") -> None:
    """`value` as JSON, or `table` (rows of one dict each) for people; with no table, the
    value's fields one a line."""
    if opts.json:
        text = json.dumps(value, sort_keys=True, indent=None if opts.output == "jsonl" else 2)
        sys.stdout.write(text + "\n")
        return
    rows = table if table is not None else [value] if isinstance(value, Mapping) else None
    if rows is None:
        print(value)
        return
    if table is None:
        fields(value, title=title)
    else:
        show_table(rows, title=title)


def fields(value: Mapping[str, Any], *, title: str = "") -> None:
    """One `name: value` line per field."""
    console = Console(soft_wrap=True)
    if title:
        console.print(title, style="bold")
    for name, item in value.items():
        text = item if isinstance(item, str) else json.dumps(item)
        console.print(f"{name}: {text}", highlight=False, markup=False)


def show_table(rows: Iterable[Row], *, title: str = "") -> None:
    rows = list(rows)
    console = Console(soft_wrap=True)
    if not rows:
        console.print(f"{title}: none" if title else "none", highlight=False)
        return
    table = Table(title=title or None, show_lines=False)
    columns = list(rows[0])
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_cell(row.get(column)) for column in columns))
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value)
