"""Printing answers: JSON (`--output json`, `jsonl`) or a rich table for people.

The JSON of a message is the HTTP API's (libs/workshop/kit/jsonmap.py): one mapping for the
gateway, its MCP tools and this command line, so a script reads `"status": "completed"` and
`"revision": 2` whichever it asked. Tables fit a terminal's width; written anywhere else
(a pipe, a file) they keep every value whole, however wide.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

from tools.cli.context import Options
from workshop.kit.jsonmap import to_json

Row = Mapping[str, Any]


# Off a terminal nothing is cut: wider than any row (rich pads nothing to this width).
UNBOUNDED_WIDTH = 1_000_000


def as_dict(message: Message) -> dict[str, Any]:
    """A message as the HTTP API's JSON: proto field names, enums as lower-case words,
    integers as numbers, every field without presence present (docs/http-api.md)."""
    return to_json(message)


def console() -> Console:
    """stdout for people: a terminal's width, or unbounded when it is not a terminal."""
    return Console(soft_wrap=True, width=None if sys.stdout.isatty() else UNBOUNDED_WIDTH)


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
    out = console()
    if title:
        out.print(title, style="bold")
    for name, item in value.items():
        text = item if isinstance(item, str) else json.dumps(item)
        out.print(f"{name}: {text}", highlight=False, markup=False)


def show_table(rows: Iterable[Row], *, title: str = "") -> None:
    rows = list(rows)
    out = console()
    if not rows:
        out.print(f"{title}: none" if title else "none", highlight=False)
        return
    table = Table(title=title or None, show_lines=False)
    columns = list(rows[0])
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_cell(row.get(column)) for column in columns))
    out.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value)
