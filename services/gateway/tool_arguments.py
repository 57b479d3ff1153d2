"""The MCP tools' arguments: their input schemas, and the one strict reading of them.

An argument that is a field of a /v1 request (a run's `revision`, `page_size`, a photo's
`time`...) is read by that field's JSON mapping, `jsonmap.from_json`, the code that reads
an HTTP body, and its input schema is that field's request schema
(`jsonmap.SchemaSet.parameter_schema`, bounds from `workshop.kit.limits` included): the same
value gets the same refusal, word for word, from both front doors. The few arguments of
a tool's own (`action`, `cursor`, `timeout_seconds`) are checked as strictly by `Own`.
Every argument is read before the tool does anything, whether its action uses it or
not, so a call with one wrong argument does nothing; all problems are reported at once
(400 INVALID_FIELD, one field violation each). null means absent, as in a body.

The SDK's own reading is bypassed (`mcp_app.WorkshopServer` calls the tools with what
`ToolArguments.read` returns): it validates with pydantic in lax mode, so "20" and true
became integers, and it first parses any string argument that holds JSON ("null" became
null).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from services.gateway.routes import OPERATIONS
from workshop.kit import jsonmap

Schema = dict[str, Any]
_OPERATIONS = {operation.name: operation for operation in OPERATIONS}


@dataclasses.dataclass(frozen=True)
class RequestField:
    """An argument that is the request field `field` of the /v1 operation `operation`."""

    name: str
    operation: str
    field: str
    description: str
    required: bool = False

    def schema(self) -> Schema:
        operation = _OPERATIONS[self.operation]
        schemas = jsonmap.SchemaSet()
        value = schemas.parameter_schema(operation.field(self.field))
        if "$ref" in value:  # an enum: inline, a tool's schema has no components
            value = dict(schemas.components()[value["$ref"].rsplit("/", 1)[1]])
        return {**value, "description": self.description}

    def check(self, value: object) -> list[jsonmap.FieldViolation]:
        operation = _OPERATIONS[self.operation]
        rename = {self.name: self.field} if self.name != self.field else None
        try:
            jsonmap.from_json({self.name: value}, operation.request_class(), rename=rename)
        except jsonmap.JsonInvalid as invalid:
            return invalid.violations
        return []


@dataclasses.dataclass(frozen=True)
class Own:
    """A tool's own argument: a string (one of `choices`, when given) or a number within
    `low`..`high`, `default` when absent."""

    name: str
    kind: str  # "string" or "number"
    description: str
    required: bool = False
    choices: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    default: Any = None

    def schema(self) -> Schema:
        schema: Schema = {"type": self.kind, "description": self.description}
        if self.choices:
            schema["enum"] = list(self.choices)
        if self.low is not None:
            schema["minimum"] = self.low
        if self.high is not None:
            schema["maximum"] = self.high
        if self.default is not None:
            schema["default"] = self.default
        return schema

    def check(self, value: object) -> list[jsonmap.FieldViolation]:
        problem = self._problem(value)
        return [jsonmap.FieldViolation(self.name, problem)] if problem else []

    def _problem(self, value: object) -> str:
        got = jsonmap.describe(value)
        if self.kind == "string":
            if self.choices and value not in self.choices:
                allowed = ", ".join(self.choices)
                if isinstance(value, str):
                    return f"unknown value {jsonmap.quote(value)}; expected one of {allowed}"
                return f"expected one of {allowed}; got {got}"
            return "" if isinstance(value, str) else f"expected a string, got {got}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected a number, got {got}"
        low = -math.inf if self.low is None else self.low
        high = math.inf if self.high is None else self.high
        if not low <= value <= high:  # NaN is never within
            return f"{got} is out of range {low:g}..{high:g}"
        return ""


Argument = RequestField | Own


@dataclasses.dataclass(frozen=True)
class ToolArguments:
    """A tool's arguments, in the order its input schema lists them."""

    arguments: tuple[Argument, ...]

    def schema(self) -> Schema:
        """The tool's input schema (what tools/list publishes)."""
        return {
            "type": "object",
            "properties": {argument.name: _schema(argument) for argument in self.arguments},
            "required": [argument.name for argument in self.arguments if argument.required],
            "additionalProperties": False,
        }

    def read(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every argument by name (absent and null: its default, or None), each checked;
        JsonInvalid (INVALID_FIELD) listing every problem otherwise."""
        known = {argument.name: argument for argument in self.arguments}
        problems = [
            jsonmap.FieldViolation(name, "unknown argument")
            for name in sorted(set(given) - set(known))
        ]
        values: dict[str, Any] = {}
        for name, argument in known.items():
            value = given.get(name)
            if value is None:
                if argument.required:
                    problems.append(jsonmap.FieldViolation(name, "required"))
                values[name] = argument.default if isinstance(argument, Own) else None
                continue
            problems += argument.check(value)
            values[name] = value
        if problems:
            raise jsonmap.JsonInvalid(problems)
        return values


def _schema(argument: Argument) -> Schema:
    """An argument's schema; null (absent) is admitted where it may be left out."""
    schema = argument.schema()
    return schema if argument.required else jsonmap.nullable(schema)
