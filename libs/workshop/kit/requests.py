"""From request bytes to the request a handler sees, or to the refusal it never sees.

grpc deserializes a request before it calls the handler, outside every
interceptor's try block: a deserializer that raises reaches the caller as
UNKNOWN "Unexpected <class 'DecodeError'>". So `request_decoder` wraps each
handler's deserializer and never raises; it returns a `Refusal` instead, which the
error-mapping interceptor answers as INVALID_ARGUMENT before the handler runs:

- a request over its service's size limit, counted on the raw bytes (unknown
  fields included): PAYLOAD_TOO_LARGE;
- bytes that are not a message of the request type (truncated, random, invalid
  UTF-8 in a string field): MALFORMED_REQUEST;
- a field holding what its type cannot mean, at any depth: an enum number its
  enum does not define (proto3 enums are open, so the parser keeps it), naming the
  values to send; a google.protobuf.Timestamp outside years 1-9999 or a Duration
  outside ±10,000 years, or either with nanos out of range (converting them would
  raise in the handler); a string with U+0000, which no text column (Postgres)
  can hold and no Workshop field means: INVALID_FIELD, naming the field.

The check walks only the fields below which such a value can occur, found once per
message type.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from functools import cache
from keyword import iskeyword
from typing import Any

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from workshop.kit.errors import InvalidArgument, PayloadTooLarge, WorkshopError

Deserializer = Callable[[bytes], Any]
ENUM_NAMES_SHOWN = 12
# google.protobuf.Timestamp: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z; Duration: ±10,000 years.
TIMESTAMP_MIN_SECONDS = -62_135_596_800
TIMESTAMP_MAX_SECONDS = 253_402_300_799
DURATION_MAX_SECONDS = 315_576_000_000
NANOS_PER_SECOND = 1_000_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """What a handler would have been given for a request it must never see."""

    error: WorkshopError


def request_decoder(
    deserialize: Deserializer | None, *, max_bytes: int | None, type_name: str
) -> Deserializer:
    """`deserialize`, made total: a request or a `Refusal` (see the module docstring)."""

    def decode(data: bytes) -> Any:
        if max_bytes is not None and len(data) > max_bytes:
            return Refusal(
                PayloadTooLarge(
                    f"The request is {len(data)} bytes; at most {max_bytes} are accepted.",
                    metadata={"limit_bytes": str(max_bytes)},
                )
            )
        if deserialize is None:
            return data
        try:
            request = deserialize(data)
        except Exception:  # DecodeError, and whatever else a parser may raise on bad bytes
            return Refusal(
                InvalidArgument(
                    f"The request is not a valid {type_name}: its bytes are truncated, are "
                    "not protobuf, or hold a string field that is not UTF-8.",
                    reason="MALFORMED_REQUEST",
                )
            )
        if isinstance(request, Message):
            problem = field_problem(request)
            if problem is not None:
                return Refusal(problem)
        return request

    return decode


def field_problem(message: Message) -> InvalidArgument | None:
    """INVALID_FIELD for the first field, at any depth, that holds what its type cannot
    mean (see the module docstring); None when there is none."""
    found = _first_problem(message)
    if found is None:
        return None
    path, problem = found
    return InvalidArgument(f"{path} {problem}", reason="INVALID_FIELD", metadata={"field": path})


def _timestamp_problem(stamp: Any) -> str | None:
    if not TIMESTAMP_MIN_SECONDS <= stamp.seconds <= TIMESTAMP_MAX_SECONDS:
        return "is not an instant from 0001-01-01 to 9999-12-31 UTC (seconds out of range)."
    if not 0 <= stamp.nanos < NANOS_PER_SECOND:
        return "has nanos outside 0..999999999."
    return None


def _duration_problem(duration: Any) -> str | None:
    if not -DURATION_MAX_SECONDS <= duration.seconds <= DURATION_MAX_SECONDS:
        return "is not a duration of at most 10,000 years (seconds out of range)."
    if not -NANOS_PER_SECOND < duration.nanos < NANOS_PER_SECOND:
        return "has nanos outside -999999999..999999999."
    if duration.seconds * duration.nanos < 0:
        return "has seconds and nanos of different signs."
    return None


# Well-known types whose every value a field can hold is not one the type means.
_VALUE_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "google.protobuf.Timestamp": _timestamp_problem,
    "google.protobuf.Duration": _duration_problem,
}


NUL_PROBLEM = "contains U+0000 (NUL), which no Workshop text may hold."

# What a step of a walk checks, and how the field holds its values.
_ENUM, _TEXT, _MESSAGE = range(3)
_SINGLE, _REPEATED, _MAP = range(3)


@dataclasses.dataclass(frozen=True, slots=True)
class _Step:
    """One field of a message type to look at: its name, what to check, its shape, and for
    an enum the numbers it defines."""

    name: str
    kind: int
    shape: int
    enum: EnumDescriptor | None = None
    numbers: frozenset[int] = frozenset()
    child: Descriptor | None = None  # a message step's type (a map's value type)


Check = Callable[[Any], tuple[str, str] | None]


def _first_problem(message: Message) -> tuple[str, str] | None:
    """(path below `message`, what is wrong) of the first value out of range, or None."""
    descriptor: Descriptor = message.DESCRIPTOR  # type: ignore[assignment]  # upb's own class
    return _check_of(descriptor)(message)


# Each message type's check, made once: a function whose body looks at each of the type's
# steps (`_walk`) in order, straight from the message's attributes. A record batch of 90
# previews (3 boxes each) took 4.3 us a preview walking the steps generically, a call per
# step and value; positions are still formatted only for the value that fails. Checks are
# made under a lock and published when whole (a deserializer may run on any thread).
_CHECKS: dict[Descriptor, Check] = {}
_MAKING = threading.Lock()


def _check_of(descriptor: Descriptor) -> Check:
    found = _CHECKS.get(descriptor)
    if found is None:
        with _MAKING:
            made: dict[Descriptor, list[Check]] = {}
            found = _CHECKS.get(descriptor) or _compile(descriptor, made)
            _CHECKS.update({made_for: cell[0] for made_for, cell in made.items()})
    return found


def _compile(descriptor: Descriptor, made: dict[Descriptor, list[Check]]) -> Check:
    """The check of `descriptor`'s messages, and in `made` each one this made (those of its
    fields' types), for the caller to publish."""
    if descriptor in _CHECKS:
        return _CHECKS[descriptor]
    if descriptor in made:
        cell = made[descriptor]
        if cell:
            return cell[0]
        # a type that holds itself, at some depth: its check calls it through the cell
        # that holds it once it is made
        return lambda message: cell[0](message)
    value_check = _VALUE_CHECKS.get(descriptor.full_name)
    if value_check is not None:
        problem_of = value_check

        def check_value(message: Any) -> tuple[str, str] | None:
            problem = problem_of(message)
            return None if problem is None else ("", problem)

        made[descriptor] = [check_value]
        return check_value
    made[descriptor] = []
    scope: dict[str, Any] = {"below": _below, "NUL": NUL_PROBLEM, "enum_problem": _enum_problem}
    lines = ["def check(m):"]
    for number, step in enumerate(_walk(descriptor)):
        field = f"m.{step.name}" if not iskeyword(step.name) else f"getattr(m, {step.name!r})"
        name = repr(step.name)
        scope[f"step{number}"] = step
        scope[f"numbers{number}"] = step.numbers
        if step.child is not None:
            scope[f"child{number}"] = _compile(step.child, made)
        if step.shape == _SINGLE:
            if step.kind == _TEXT:
                lines.append(f"    if '\\0' in {field}: return ({name}, NUL)")
            elif step.kind == _ENUM:
                lines += [
                    f"    v = {field}",
                    f"    if v not in numbers{number}:",
                    f"        return ({name}, enum_problem(step{number}, v))",
                ]
            else:
                lines += [
                    f"    if m.HasField({name}):",
                    f"        found = child{number}({field})",
                    f"        if found is not None: return below({name}, None, found)",
                ]
            continue
        if step.shape == _MAP:
            lines.append(f"    for p, v in {field}.items():")
            where = "repr(p)"
        else:
            lines.append(f"    for p, v in enumerate({field}):")
            where = "p"
        if step.kind == _TEXT:
            test = "'\\0' in v"
            if step.shape == _MAP:  # a key or a value may be the text
                test = "(isinstance(p, str) and '\\0' in p) or (isinstance(v, str) and '\\0' in v)"
            lines.append(f"        if {test}: return below({name}, {where}, ('', NUL))")
        elif step.kind == _ENUM:
            lines += [
                f"        if v not in numbers{number}:",
                f"            return below({name}, {where}, ('', enum_problem(step{number}, v)))",
            ]
        else:
            lines += [
                f"        found = child{number}(v)",
                f"        if found is not None: return below({name}, {where}, found)",
            ]
    lines.append("    return None")
    exec(compile("\n".join(lines), f"<request check {descriptor.full_name}>", "exec"), scope)
    check: Check = scope["check"]
    made[descriptor].append(check)
    return check


def _below(name: str, position: object, found: tuple[str, str]) -> tuple[str, str]:
    inner, problem = found
    where = name if position is None else f"{name}[{position}]"
    return (f"{where}.{inner}" if inner else where), problem


def _enum_problem(step: _Step, number: int) -> str:
    assert step.enum is not None
    names = [value.name for value in step.enum.values if not value.name.endswith("_UNSPECIFIED")]
    listed = ", ".join(names[:ENUM_NAMES_SHOWN])
    if len(names) > ENUM_NAMES_SHOWN:
        listed += ", ..."
    return f"is {number}, which is not a {step.enum.name}; send one of {listed}."


def _is_map(field: FieldDescriptor) -> bool:
    entry = field.message_type
    return entry is not None and entry.GetOptions().map_entry and field.is_repeated


def _is_open_enum(field: FieldDescriptor) -> bool:
    return field.enum_type is not None and not field.enum_type.is_closed


def _is_text(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_STRING


@cache
def _walk(descriptor: Descriptor) -> tuple[_Step, ...]:
    """The steps for a message type: the fields below which something can be out of range."""
    steps = []
    for field in descriptor.fields:
        shape = _MAP if _is_map(field) else _REPEATED if field.is_repeated else _SINGLE
        held = field
        if shape == _MAP:
            assert field.message_type is not None
            held = field.message_type.fields_by_name["value"]
            if _is_text(field.message_type.fields_by_name["key"]) or _is_text(held):
                steps.append(_Step(field.name, _TEXT, shape))
        elif _is_text(field):
            steps.append(_Step(field.name, _TEXT, shape))
        if _is_open_enum(held):
            assert held.enum_type is not None
            numbers = frozenset(value.number for value in held.enum_type.values)
            steps.append(_Step(field.name, _ENUM, shape, held.enum_type, numbers))
        elif held.message_type is not None and _needs_checks(held.message_type):
            steps.append(_Step(field.name, _MESSAGE, shape, child=held.message_type))
    return tuple(steps)


@cache
def _needs_checks(descriptor: Descriptor) -> bool:
    """Whether a message of this type can hold, at some depth, an open enum, a string or a
    well-known value with a range (recursive types included: the search remembers what it
    has seen)."""
    seen = {descriptor}
    pending = [descriptor]
    while pending:
        current = pending.pop()
        if current.full_name in _VALUE_CHECKS:
            return True
        for field in current.fields:
            if _is_open_enum(field) or _is_text(field):
                return True
            child = field.message_type
            if child is not None and child not in seen:
                seen.add(child)
                pending.append(child)
    return False
