"""Response bodies written by one generated function per message layout (`jsonmap.to_json`).

Why generated: a page of 200 bucket items is about 40,000 field values. Walking each
message's layout in a loop (the field read by name, its converter called through a
`functools.partial`, the well-known types told apart at every message) took 6 ms of the
gateway's 15 ms for such a page; a function with each field's read and conversion written
out takes under 3 ms (docs/benchmarks.md, the bucket browser). The rules are jsonmap's and
stay there: this module only turns a layout's slots into straight-line code, e.g.

    def write(m):
        b = {}
        b['item_id'] = m.item_id
        v = m.review_state; b['review_state'] = c12(v)
        if m.HasField('relabel_class'):
            b['relabel_class'] = m.relabel_class
        b['boxes'] = [c11(x) for x in m.boxes]
        return b

The generated text holds only the layout's JSON keys (as Python literals, `repr`) and its
proto field names (identifiers by the proto grammar; a Python keyword is read with
`getattr`); every converter is passed in as a value, never written into the source.
"""

from __future__ import annotations

import dataclasses
import keyword
from collections.abc import Callable, Sequence
from typing import Any

Writer = Callable[[Any], dict[str, Any]]

SINGLE, ARRAY, MAP = range(3)


@dataclasses.dataclass(frozen=True, slots=True)
class FieldPlan:
    """One field of a body as the writer reads it."""

    key: str  # its JSON key
    name: str  # its proto field name
    shape: int  # SINGLE, ARRAY or MAP
    presence: bool  # written only when set (HasField)
    convert: Callable[[Any], Any] | None  # one value to JSON; None where it is JSON already


def compile_writer(title: str, plans: Sequence[FieldPlan]) -> Writer:
    """The function writing a message of `plans` as a JSON object, keys in plan order."""
    scope: dict[str, Any] = {}
    lines = ["def write(m):", "    b = {}"]
    for n, plan in enumerate(plans):
        read = f"getattr(m, {plan.name!r})" if keyword.iskeyword(plan.name) else f"m.{plan.name}"
        key = repr(plan.key)
        convert = f"c{n}"
        scope[convert] = plan.convert
        if plan.shape == ARRAY:
            line = (
                f"b[{key}] = list({read})"
                if plan.convert is None
                else f"b[{key}] = [{convert}(x) for x in {read}]"
            )
        elif plan.shape == MAP:
            line = (
                f"b[{key}] = dict({read})"
                if plan.convert is None
                else f"b[{key}] = {{k: {convert}(x) for k, x in {read}.items()}}"
            )
        elif plan.convert is None:
            line = f"b[{key}] = {read}"
        else:
            line = f"b[{key}] = {convert}({read})"
        if plan.presence:
            lines += [f"    if m.HasField({plan.name!r}):", f"        {line}"]
        else:
            lines.append(f"    {line}")
    lines.append("    return b")
    code = compile("\n".join(lines), f"<json writer of {title}>", "exec")
    exec(code, scope)
    writer: Writer = scope["write"]
    return writer
