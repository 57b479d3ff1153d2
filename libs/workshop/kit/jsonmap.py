"""Protobuf messages to and from the HTTP API's JSON, and the JSON Schema of that mapping.

It lives in the kit, not in the gateway, because three programs must spell a message the
same way: the gateway (its bodies, OpenAPI documents and MCP tools), the `workshop`
command line (`--json` output, tools/cli/output.py) and the demo (tools/demo/script.py);
tools never import a service (docs/architecture.md, "Import rules").

The gateway's bodies are the messages of `workshop.v1`, spelled as JSON by these rules
(docs/http-api.md, "JSON conventions", says the same for API users):

- Keys are the proto field names (snake_case), exactly; requests accept no other
  spelling (not the lowerCamelCase JSON names), so there is one.
- Responses (`to_json`): every scalar, enum, repeated and map field is always present
  (defaults included; repeated as an array, map as an object); message fields and
  proto3 `optional` fields only when set; of a oneof, only the member that is set.
- Integers of every kind are JSON numbers (a JavaScript client loses precision past
  2^53). float/double are numbers; NaN and the infinities, which JSON has no number
  for, are null in responses (as JavaScript's JSON.stringify writes them: only rows an
  earlier release stored hold one, since every request now refuses them) and refused in
  requests. bool is true/false, string is a string, bytes standard padded base64.
- Enums: the value name without the enum's prefix (the UPPER_SNAKE type name + "_"),
  lower-cased: RUN_MODE_TEST is "test". An enum whose values do not all carry that
  prefix uses its whole value names, lower-cased. A response holding a number its enum
  does not define says the zero value's name ("unspecified").
- google.protobuf.Timestamp: RFC 3339 in UTC with "Z", fractional seconds only when
  non-zero, in 3, 6 or 9 digits. Requests accept any offset ("Z" or +hh:mm) and refuse
  a time without one, and instants outside years 0001..9999.
- google.protobuf.Duration: a JSON number of seconds (3600, 1.5, -0.25) within
  +-315,576,000,000 s (10,000 years); requests round it to the nanosecond. A double
  carries every nanosecond below about 48 days, milliseconds over the whole range.
- No other well-known type has a mapping (none is used): meeting one, or a map with
  non-string keys, raises TypeError when its message is first mapped.

Requests (`from_json`) are strict and every problem is reported at once: `JsonInvalid`
(INVALID_FIELD) lists `FieldViolation`s with paths like `labels["k"]` or
`spec.graph.steps[2].sample.interval_seconds`. `null` means absent, for any field (a
proto3 `optional` stays unset); so does an enum's zero-value name ("unspecified") for a
singular field. Inside arrays
and maps null is refused. Message nesting deeper than `MAX_DEPTH` is refused, so a
recursive message cannot exhaust the stack; the gateway caps the body size.

`rename` (JSON key -> proto field name) and `exclude` (proto field names) adjust the top
level only, for fields the gateway takes from the URL or spells differently; an
excluded or renamed-away name in a body is an unknown field. `SchemaSet` gives the
JSON Schema (2020-12, as OpenAPI 3.1 uses it) of exactly this mapping, described by the
comments of the contracts (descriptors.binpb).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import functools
import json
import math
import re
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from decimal import ROUND_HALF_EVEN, Decimal
from importlib import resources
from math import isfinite
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from workshop.kit import limits
from workshop.kit.bounds import shortened
from workshop.kit.errors import InvalidArgument
from workshop.kit.jsonmap_writers import ARRAY, MAP, SINGLE, FieldPlan, Writer, compile_writer
from workshop.kit.requests import (
    DURATION_MAX_SECONDS,
    NANOS_PER_SECOND,
    TIMESTAMP_MAX_SECONDS,
    TIMESTAMP_MIN_SECONDS,
)

if TYPE_CHECKING:
    # What the stubs say `Message.DESCRIPTOR` is, besides Descriptor.
    from google._upb._message import Descriptor as UpbDescriptor

M = TypeVar("M", bound=Message)
Direction = Literal["request", "response"]
Schema = dict[str, Any]
# One message's body: JSON key -> its field, in field order.
Layout = Mapping[str, "_Slot"]

MAX_DEPTH = 32
VIOLATIONS_NAMED = 3
TIMESTAMP = "google.protobuf.Timestamp"
DURATION = "google.protobuf.Duration"
FLOAT32_MAX = 3.4028234663852886e38

_F = FieldDescriptor
_INTEGER_RANGES: dict[int, tuple[int, int]] = {
    **dict.fromkeys((_F.TYPE_INT32, _F.TYPE_SINT32, _F.TYPE_SFIXED32), (-(2**31), 2**31 - 1)),
    **dict.fromkeys((_F.TYPE_UINT32, _F.TYPE_FIXED32), (0, 2**32 - 1)),
    **dict.fromkeys((_F.TYPE_INT64, _F.TYPE_SINT64, _F.TYPE_SFIXED64), (-(2**63), 2**63 - 1)),
    **dict.fromkeys((_F.TYPE_UINT64, _F.TYPE_FIXED64), (0, 2**64 - 1)),
}
# Every integer kind of field (what a query parameter's string is read as a number for).
INTEGER_KINDS = frozenset(_INTEGER_RANGES)
_INTEGER_FORMATS = {
    **dict.fromkeys((_F.TYPE_INT32, _F.TYPE_SINT32, _F.TYPE_SFIXED32), "int32"),
    **dict.fromkeys((_F.TYPE_INT64, _F.TYPE_SINT64, _F.TYPE_SFIXED64), "int64"),
}
# The same text checks requests here and in the schema (ECMA-262 and Python agree on
# these; `fullmatch` keeps `$` from accepting a trailing newline).
BASE64_PATTERN = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
TIMESTAMP_PATTERN = (
    "^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    "(?:[.]([0-9]{1,9}))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))$"
)
RESPONSE_TIMESTAMP_PATTERN = (
    "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}([.]([0-9]{3}){1,3})?Z$"
)
_BASE64 = re.compile(BASE64_PATTERN)
_TIMESTAMP = re.compile(TIMESTAMP_PATTERN)
_NO_OFFSET = re.compile(TIMESTAMP_PATTERN.split("(?:([Zz])")[0] + "$")
_IDENTIFIER = re.compile("[A-Za-z_][A-Za-z0-9_]*")
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_DAY = _EPOCH.toordinal()


@dataclasses.dataclass(frozen=True, slots=True)
class FieldViolation:
    """One problem of a request body: where (`spec.graph.steps[2].label`; "" for the body
    itself) and what is wrong."""

    field: str
    description: str


class JsonInvalid(InvalidArgument):
    """A request body that does not map to its message; `violations` lists every problem
    and metadata "field" names the first, like every INVALID_FIELD."""

    reason = "INVALID_FIELD"

    def __init__(self, violations: Sequence[FieldViolation]) -> None:
        self.violations = list(violations)
        super().__init__(_summary(self.violations), metadata={"field": self.violations[0].field})


def _summary(violations: Sequence[FieldViolation]) -> str:
    named = "; ".join(
        f"{v.field or 'body'}: {v.description}" for v in violations[:VIOLATIONS_NAMED]
    )
    if len(violations) == 1:
        return named
    more = len(violations) - VIOLATIONS_NAMED
    return f"{len(violations)} problems: {named}" + (f"; and {more} more" if more > 0 else "")


class _Wrong(Exception):
    """A value that does not map; the caller adds where it is."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


# --- layouts: which fields a body has, under which keys -------------------------------

_SINGLE, _ARRAY, _MAP = SINGLE, ARRAY, MAP  # a slot's shape, as the writers read it


@dataclasses.dataclass(frozen=True, slots=True)
class _Slot:
    """One field of a body, with what each mapping of it needs worked out once."""

    key: str  # its JSON key
    name: str  # its proto name
    field: FieldDescriptor
    held: FieldDescriptor  # the field each value is of: a map's value field, else `field`
    shape: int  # _SINGLE, _ARRAY or _MAP
    presence: bool  # in a response only when set
    oneof: tuple[str, ...]  # proto names of the members of its real oneof; () outside one


def _key(rename: Mapping[str, str] | None, exclude: Collection[str]) -> tuple[Any, ...]:
    """The rename/exclude arguments as a hashable cache key."""
    return tuple(sorted((rename or {}).items())), frozenset(exclude)


@functools.cache
def _layout(
    descriptor: Descriptor, rename: tuple[tuple[str, str], ...], exclude: frozenset[str]
) -> Layout:
    """The top-level layout of a body; ValueError for arguments that do not fit the message."""
    if _is_value(descriptor):
        raise TypeError(f"{descriptor.full_name} is a value, not a body")
    slots = _fields(descriptor)
    targets = [name for _, name in rename]
    unknown = sorted((exclude | set(targets)) - slots.keys())
    if unknown:
        raise ValueError(f"{descriptor.full_name} has no field {', '.join(unknown)}")
    if len(set(targets)) < len(targets) or exclude & set(targets):
        raise ValueError(f"{descriptor.full_name}: a field renamed twice, or renamed and excluded")
    keys = {name: key for key, name in rename}
    layout = {
        keys.get(name, name): dataclasses.replace(slot, key=keys.get(name, name))
        for name, slot in slots.items()
        if name not in exclude
    }
    bad = [key for key, _ in rename if not _IDENTIFIER.fullmatch(key)]
    if bad or len(layout) < len(slots) - len(exclude):
        raise ValueError(
            f"{descriptor.full_name}: rename {dict(rename)} gives a key twice or badly"
        )
    return layout


@functools.cache
def _fields(descriptor: Descriptor) -> Layout:
    """The plain layout of a message (proto names); TypeError for what has no mapping."""
    if descriptor.full_name.startswith("google.protobuf.") and not _is_value(descriptor):
        raise TypeError(f"{descriptor.full_name} has no JSON mapping in the gateway")
    groups = {name: group for group in _oneofs(descriptor) for name in group}
    layout: dict[str, _Slot] = {}
    for field in descriptor.fields:
        held = field
        if _is_map(field):
            assert field.message_type is not None
            if field.message_type.fields_by_name["key"].type != _F.TYPE_STRING:
                raise TypeError(f"{field.full_name}: only maps with string keys have a mapping")
            held = field.message_type.fields_by_name["value"]
        _check_type(held)
        shape = _MAP if held is not field else _ARRAY if field.is_repeated else _SINGLE
        oneof = groups.get(field.name, ())
        layout[field.name] = _Slot(
            field.name, field.name, field, held, shape, field.has_presence, oneof
        )
    return layout


def _check_type(field: FieldDescriptor) -> None:
    if field.type == _F.TYPE_GROUP:
        raise TypeError(f"{field.full_name}: groups have no JSON mapping")
    message = field.message_type
    if message is not None and message.full_name.startswith("google.protobuf."):
        _fields(message)


def _is_value(descriptor: Descriptor) -> bool:
    """Well-known types that map to one JSON value, not an object."""
    return descriptor.full_name in (TIMESTAMP, DURATION)


def _is_map(field: FieldDescriptor) -> bool:
    entry = field.message_type
    return field.is_repeated and entry is not None and entry.GetOptions().map_entry


@functools.cache
def _oneofs(descriptor: Descriptor) -> tuple[tuple[str, ...], ...]:
    """The field names of each real oneof (proto3 `optional` makes a synthetic one each,
    which only the descriptor proto tells apart)."""
    proto = descriptor_pb2.DescriptorProto()
    descriptor.CopyToProto(proto)
    optional = {field.name for field in proto.field if field.proto3_optional}
    groups = (tuple(field.name for field in oneof.fields) for oneof in descriptor.oneofs)
    return tuple(group for group in groups if not set(group) <= optional)


# --- enums ----------------------------------------------------------------------------


def _upper_snake(name: str) -> str:
    return re.sub("(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).upper()


@functools.cache
def _enum_numbers(enum: EnumDescriptor) -> Mapping[str, int]:
    """JSON name -> number, for every value name (aliases included)."""
    prefix = _upper_snake(enum.name) + "_"
    names = [value.name for value in enum.values]
    stripped = [name.removeprefix(prefix) for name in names]
    # Strip only when every value has the prefix and the rest stays distinct and non-empty.
    prefixed = all(name.startswith(prefix) and name != prefix for name in names)
    if prefixed and len(set(stripped)) == len(names):
        names = stripped
    return {name.lower(): value.number for name, value in zip(names, enum.values, strict=True)}


@functools.cache
def _enum_names(enum: EnumDescriptor) -> Mapping[int, str]:
    """Number -> the JSON name a response says (the first name of an alias)."""
    found: dict[int, str] = {}
    for name, number in _enum_numbers(enum).items():
        found.setdefault(number, name)
    return found


def enum_word(enum: EnumDescriptor, number: int) -> str:
    """The word a response says for `number` of `enum` (RUN_STATUS_COMPLETED: "completed"),
    for whatever shows an enum as the HTTP API does (the CLI's tables)."""
    names = _enum_names(enum)
    return names.get(number) or names[enum.values[0].number]


# --- messages to JSON -------------------------------------------------------------------


def to_json(
    message: Message, *, rename: Mapping[str, str] | None = None, exclude: Collection[str] = ()
) -> dict[str, Any]:
    """The response body of `message` (see the module docstring); ValueError for a value
    no JSON can carry (a non-finite float, a Timestamp or Duration out of range)."""
    return _body_writer(message.DESCRIPTOR, *_key(rename, exclude))(message)


@functools.cache
def _body_writer(
    descriptor: Descriptor, rename: tuple[tuple[str, str], ...], exclude: frozenset[str]
) -> Writer:
    return _writer(descriptor.full_name, _layout(descriptor, rename, exclude))


# Each message's writer, and the messages whose writer is being made: a field of one of
# them (a recursive message) finds the writer when it runs, not while it is made. Made
# under a lock (re-entered by the nested messages' making), so a thread never sees a
# writer half made.
_writers: dict[Descriptor, Writer] = {}
_making: set[Descriptor] = set()
_making_lock = threading.RLock()


def _message_writer(descriptor: Descriptor) -> Writer:
    """A nested message's writer (Timestamp and Duration are values: _value_out)."""
    made = _writers.get(descriptor)
    if made is not None:
        return made
    with _making_lock:
        made = _writers.get(descriptor)
        if made is not None:
            return made
        if descriptor in _making:
            return lambda message: _writers[descriptor](message)
        _making.add(descriptor)
        try:
            made = _writers[descriptor] = _writer(descriptor.full_name, _fields(descriptor))
        finally:
            _making.discard(descriptor)
        return made


def _writer(title: str, layout: Layout) -> Writer:
    return compile_writer(
        title,
        [
            FieldPlan(slot.key, slot.name, slot.shape, slot.presence, _value_out(slot.held))
            for slot in layout.values()
        ],
    )


def _value_out(field: FieldDescriptor) -> Callable[[Any], Any] | None:
    """How one value of `field` becomes JSON; None where the Python value is JSON already.
    A nested message's writer and an enum's names are found once, here."""
    message = field.message_type
    if message is not None:
        if message.full_name == TIMESTAMP:
            return lambda value: _timestamp_out(value.seconds, value.nanos)
        if message.full_name == DURATION:
            return lambda value: _duration_out(value.seconds, value.nanos)
        return _message_writer(message)
    if field.enum_type is not None:
        names = _enum_names(field.enum_type)
        zero = names[field.enum_type.values[0].number]
        return lambda number: names.get(number) or zero
    if field.type in (_F.TYPE_FLOAT, _F.TYPE_DOUBLE):
        return _float_out
    if field.type == _F.TYPE_BYTES:
        return _base64_out
    return None


def _float_out(value: float) -> float | None:
    """A float as JSON: null for NaN and the infinities (no JSON number is one), which a
    row stored by an earlier release may hold; a page holding one still answers."""
    return value if isfinite(value) else None


def _base64_out(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _timestamp_out(seconds: int, nanos: int) -> str:
    if not (TIMESTAMP_MIN_SECONDS <= seconds <= TIMESTAMP_MAX_SECONDS and 0 <= nanos < 10**9):
        raise ValueError(f"Timestamp {seconds}s {nanos}ns is outside years 0001..9999")
    text = (_EPOCH + datetime.timedelta(seconds=seconds)).isoformat()
    if nanos:
        # proto JSON's rule: milli-, micro- or nanoseconds, whichever shows every digit.
        digits = 3 if nanos % 10**6 == 0 else 6 if nanos % 10**3 == 0 else 9
        text += "." + f"{nanos:09d}"[:digits]
    return text + "Z"


def _duration_out(seconds: int, nanos: int) -> int | float:
    total = seconds * NANOS_PER_SECOND + nanos
    if (
        seconds * nanos < 0
        or not -NANOS_PER_SECOND < nanos < NANOS_PER_SECOND
        or abs(total) > DURATION_MAX_SECONDS * NANOS_PER_SECOND
    ):
        raise ValueError(f"Duration {seconds}s {nanos}ns is not one of +-10,000 years")
    # Through Decimal: the double nearest the exact value, so that it reads back exactly.
    return seconds if nanos == 0 else float(Decimal(total).scaleb(-9))


# --- JSON to messages -------------------------------------------------------------------


def from_json(
    data: object,
    cls: type[M],
    *,
    rename: Mapping[str, str] | None = None,
    exclude: Collection[str] = (),
) -> M:
    """The message a request body means; JsonInvalid listing every violation otherwise."""
    layout = _layout(cls.DESCRIPTOR, *_key(rename, exclude))
    message = cls()
    problems: list[FieldViolation] = []
    if isinstance(data, dict):
        _object_in(data, message, layout, "", 1, problems)
    else:
        problems.append(FieldViolation("", f"expected a JSON object, got {_kind(data)}"))
    if problems:
        raise JsonInvalid(problems)
    return message


def _object_in(
    data: dict[Any, Any],
    message: Message,
    layout: Layout,
    path: str,
    depth: int,
    problems: list[FieldViolation],
) -> None:
    if depth > MAX_DEPTH:
        problems.append(FieldViolation(path, f"nested deeper than {MAX_DEPTH} objects"))
        return
    set_members: dict[tuple[str, ...], str] = {}
    for key, value in data.items():
        slot = layout.get(key)
        if slot is None:
            problems.append(FieldViolation(_member(path, key), "unknown field"))
            continue
        if value is None:
            continue
        where = f"{path}.{key}" if path else key  # a known key is an identifier
        if slot.oneof:
            first = set_members.setdefault(slot.oneof, key)
            if first != key:
                members = ", ".join(s.key for s in layout.values() if s.oneof == slot.oneof)
                problems.append(FieldViolation(where, f"{first} is set too: set one of {members}"))
                continue
        try:
            _field_in(value, message, slot, where, depth, problems)
        except _Wrong as wrong:
            problems.append(FieldViolation(where, wrong.description))


def _field_in(
    value: object,
    message: Message,
    slot: _Slot,
    where: str,
    depth: int,
    problems: list[FieldViolation],
) -> None:
    if slot.shape == _MAP:
        _map_in(value, getattr(message, slot.name), slot.held, where, depth, problems)
    elif slot.shape == _ARRAY:
        _array_in(value, getattr(message, slot.name), slot.held, where, depth, problems)
    elif slot.held.message_type is not None:
        child = getattr(message, slot.name)
        child.SetInParent()
        _message_in(value, child, where, depth, problems)
    else:
        scalar = _scalar_in(value, slot.held)
        # An enum's zero value is "not set": a proto3 `optional` or oneof stays unset.
        if not (slot.held.enum_type is not None and scalar == 0):
            setattr(message, slot.name, scalar)


def _array_in(
    value: object,
    target: Any,
    field: FieldDescriptor,
    where: str,
    depth: int,
    problems: list[FieldViolation],
) -> None:
    if not isinstance(value, list):
        raise _Wrong(f"expected an array, got {_kind(value)}")
    for index, item in enumerate(value):
        at = f"{where}[{index}]"
        try:
            if item is None:
                raise _Wrong("expected a value, got null")
            if field.message_type is not None:
                _message_in(item, target.add(), at, depth, problems)
            else:
                target.append(_scalar_in(item, field))
        except _Wrong as wrong:
            problems.append(FieldViolation(at, wrong.description))


def _map_in(
    value: object,
    target: Any,
    held: FieldDescriptor,
    where: str,
    depth: int,
    problems: list[FieldViolation],
) -> None:
    if not isinstance(value, dict):
        raise _Wrong(f"expected an object, got {_kind(value)}")
    for key, item in value.items():
        at = f"{where}[{_quote(key)}]"
        try:
            _text_in(key)
            if item is None:
                raise _Wrong("expected a value, got null")
            if held.message_type is not None:
                _message_in(item, target[key], at, depth, problems)
            else:
                target[key] = _scalar_in(item, held)
        except _Wrong as wrong:
            problems.append(FieldViolation(at, wrong.description))


def _message_in(
    value: object, message: Message, where: str, depth: int, problems: list[FieldViolation]
) -> None:
    name = message.DESCRIPTOR.full_name
    if name in (TIMESTAMP, DURATION):
        reader = _timestamp_in if name == TIMESTAMP else _duration_in
        seconds, nanos = reader(value)
        setattr(message, "seconds", seconds)  # noqa: B010 (Message has no typed attributes)
        setattr(message, "nanos", nanos)  # noqa: B010
        return
    if not isinstance(value, dict):
        raise _Wrong(f"expected an object, got {_kind(value)}")
    _object_in(value, message, _fields(message.DESCRIPTOR), where, depth + 1, problems)


def _scalar_in(value: object, field: FieldDescriptor) -> Any:
    kind = field.type
    if kind in _INTEGER_RANGES:
        return _integer_in(value, *_INTEGER_RANGES[kind])
    if kind in (_F.TYPE_FLOAT, _F.TYPE_DOUBLE):
        return _number_in(value, 32 if kind == _F.TYPE_FLOAT else 64)
    if kind == _F.TYPE_BOOL:
        if not isinstance(value, bool):
            raise _Wrong(f"expected true or false, got {_kind(value)}")
        return value
    if kind == _F.TYPE_STRING:
        return _text_in(value)
    if kind == _F.TYPE_BYTES:
        return _bytes_in(value)
    assert field.enum_type is not None
    return _enum_in(value, field.enum_type)


def _integer_in(value: object, low: int, high: int) -> int:
    # bool is an int to Python, not to JSON; a float (even 1.0) was written as one.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Wrong(f"expected an integer, got {_kind(value)}")
    if not low <= value <= high:
        raise _Wrong(f"{_kind(value)} is out of range {low}..{high}")
    return value


def _number_in(value: object, bits: int) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Wrong(f"expected a number, got {_kind(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _Wrong(f"expected a finite number, got {value}")
    limit = FLOAT32_MAX if bits == 32 else math.inf
    try:
        number = float(value)
    except OverflowError:  # an integer beyond every double
        number = math.inf
    if math.isinf(number) or abs(number) > limit:
        raise _Wrong(f"{_kind(value)} is out of range for a {bits}-bit float")
    return number


def _text_in(value: object) -> str:
    if not isinstance(value, str):
        raise _Wrong(f"expected a string, got {_kind(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # json.loads turns "\ud800" into a lone surrogate, which protobuf cannot encode.
        raise _Wrong("is not valid Unicode (a lone surrogate)") from None
    return value


def _bytes_in(value: object) -> bytes:
    if not isinstance(value, str):
        raise _Wrong(f"expected a base64 string, got {_kind(value)}")
    if not _BASE64.fullmatch(value):
        raise _Wrong("is not standard base64 (A-Z, a-z, 0-9, +, / padded with =)")
    return base64.b64decode(value)


def _enum_in(value: object, enum: EnumDescriptor) -> int:
    numbers = _enum_numbers(enum)
    if isinstance(value, str) and value in numbers:
        return numbers[value]
    allowed = ", ".join(numbers)
    if not isinstance(value, str):
        raise _Wrong(f"expected one of {allowed}; got {_kind(value)}")
    raise _Wrong(f"unknown value {_quote(value)}; expected one of {allowed}")


def _timestamp_in(value: object) -> tuple[int, int]:
    if not isinstance(value, str):
        raise _Wrong(f"expected an RFC 3339 date-time string, got {_kind(value)}")
    match = _TIMESTAMP.fullmatch(value)
    if match is None:
        if _NO_OFFSET.fullmatch(value):
            raise _Wrong("has no UTC offset: end it with Z or +hh:mm")
        raise _Wrong("expected an RFC 3339 date-time like 2026-11-30T12:00:00Z")
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    try:
        date = datetime.date(int(year), int(month), int(day))
    except ValueError:
        raise _Wrong("is not a date from 0001-01-01 to 9999-12-31") from None
    if int(hour) > 23 or int(minute) > 59 or int(second) > 59:
        raise _Wrong("is not a time of day (leap seconds are not accepted)")
    offset = 0 if zulu else int(off_h) * 3600 + int(off_m) * 60
    if zulu is None and (int(off_h) > 23 or int(off_m) > 59):
        raise _Wrong("has an offset that is not +-hh:mm up to 23:59")
    seconds = (date.toordinal() - _EPOCH_DAY) * 86400
    seconds += int(hour) * 3600 + int(minute) * 60 + int(second)
    seconds -= -offset if sign == "-" else offset
    if not TIMESTAMP_MIN_SECONDS <= seconds <= TIMESTAMP_MAX_SECONDS:
        raise _Wrong("is outside years 0001..9999 once in UTC")
    return seconds, int((fraction or "0").ljust(9, "0"))


def _duration_in(value: object) -> tuple[int, int]:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Wrong(f"expected a number of seconds, got {_kind(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _Wrong(f"expected a finite number of seconds, got {value}")
    # repr: the digits the client wrote (json.loads keeps the nearest double, and its
    # shortest repr is those digits whenever they fit one).
    exact = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if abs(exact) > DURATION_MAX_SECONDS:
        limit = DURATION_MAX_SECONDS
        raise _Wrong(f"{_kind(value)} is out of range -{limit}..{limit}")
    total = int((exact * NANOS_PER_SECOND).to_integral_value(ROUND_HALF_EVEN))
    seconds = abs(total) // NANOS_PER_SECOND * (1 if total >= 0 else -1)
    return seconds, total - seconds * NANOS_PER_SECOND


def describe(value: object) -> str:
    """What a JSON value is, as a violation's text says it ("a string", "true", "20")."""
    return _kind(value)


def quote(text: object) -> str:
    """A value the client sent, quoted as a violation's text quotes it."""
    return _quote(text)


def _kind(value: object) -> str:
    """What a JSON value is, for a violation's text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value.bit_length() > 80:
        return "a number"  # not its digits: they can be thousands
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _quote(text: object) -> str:
    """A key or value the client sent, as a JSON string: shortened like every quoted value
    in an error (kit.bounds), and escaped as far as needed to stay valid Unicode."""
    short = shortened(str(text))
    quoted = json.dumps(short, ensure_ascii=False)
    try:
        quoted.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(short)
    return quoted


def _member(path: str, key: object) -> str:
    name = key if isinstance(key, str) and _IDENTIFIER.fullmatch(key) else f"[{_quote(key)}]"
    return f"{path}.{name}" if path and not name.startswith("[") else f"{path}{name}"


# --- JSON Schema --------------------------------------------------------------------------


class SchemaSet:
    """Component schemas of request and response bodies, for an OpenAPI 3.1 document.

    `ref` registers a message (and every message and enum below it) and answers the
    `$ref` to use; `components()` is the `components.schemas` object. A message's name
    is its full proto name in its natural direction (requests for `*Request`, responses
    for the rest) and gets "-request" or "-response" in the other; a renamed or excluded
    variant appends "-<field>.as.<key>" and "-without.<field>". Enums are the same in both
    directions and have one name."""

    def __init__(self) -> None:
        self._schemas: dict[str, Schema] = {}

    def ref(
        self,
        message: Descriptor | UpbDescriptor | type[Message],
        *,
        direction: Direction,
        rename: Mapping[str, str] | None = None,
        exclude: Collection[str] = (),
    ) -> dict[str, str]:
        descriptor = message.DESCRIPTOR if isinstance(message, type) else message
        assert isinstance(descriptor, Descriptor)  # upb's descriptors are instances of it
        renames, excluded = _key(rename, exclude)
        name = _component_name(descriptor, direction, renames, excluded)
        if name not in self._schemas:
            self._schemas[name] = {}  # taken before the fields: a recursive message refers back
            layout = _layout(descriptor, renames, excluded)
            self._schemas[name].update(self._message(descriptor, layout, direction))
        return _ref(name)

    def components(self) -> dict[str, Schema]:
        return dict(sorted(self._schemas.items()))

    def value_schema(self, field: FieldDescriptor) -> Schema:
        """The request schema of one value of `field` (what a query parameter holds)."""
        return self._value(field, "request")

    def parameter_schema(self, field: FieldDescriptor) -> Schema:
        """`value_schema`, narrowed for a field that sizes an answer to the bounds and
        default the server keeps (workshop.kit.limits): the schema of a query parameter
        or an MCP tool's argument. Body components keep the mapping's own range: they
        describe what the JSON reading accepts, and the server checks meaning."""
        schema = self.value_schema(field)
        limit = limits.FIELDS.get(field.full_name)
        if limit is None:
            return schema
        return {
            **schema,
            "minimum": limit.minimum,
            "maximum": limit.maximum,
            "default": limit.default,
        }

    def _message(self, descriptor: Descriptor, layout: Layout, direction: Direction) -> Schema:
        properties = {key: self._property(slot, direction) for key, slot in layout.items()}
        schema: Schema = {
            "type": "object",
            "description": _description(descriptor.full_name),
            "properties": properties,
            "additionalProperties": False,
        }
        required = [key for key, slot in layout.items() if not slot.presence]
        if direction == "response" and required:
            schema["required"] = required
        exclusive = _exclusive(layout)
        if exclusive is not None:
            schema["not"] = exclusive
        return schema

    def _property(self, slot: _Slot, direction: Direction) -> Schema:
        value = self._value(slot.held, direction)
        if slot.shape == _MAP:
            schema: Schema = {"type": "object", "additionalProperties": value}
        elif slot.shape == _ARRAY:
            schema = {"type": "array", "items": value}
        else:
            schema = value
        description = _description(slot.field.full_name)
        held = slot.held.message_type
        if held is not None and held.full_name == DURATION:
            description += "\n\nA number of seconds."
        schema = {**schema, "description": description}
        return _nullable(schema) if direction == "request" else schema

    def _value(self, field: FieldDescriptor, direction: Direction) -> Schema:
        """The schema of one value of a field (an element, for repeated and map fields)."""
        kind = field.type
        if field.message_type is not None:
            return self._message_value(field.message_type, direction)
        if field.enum_type is not None:
            return self._enum(field.enum_type)
        if kind in _INTEGER_RANGES:
            low, high = _INTEGER_RANGES[kind]
            schema: Schema = {"type": "integer", "minimum": low, "maximum": high}
            if kind in _INTEGER_FORMATS:
                schema["format"] = _INTEGER_FORMATS[kind]
            return schema
        if kind in (_F.TYPE_FLOAT, _F.TYPE_DOUBLE):
            return _float_schema(kind, direction)
        if kind == _F.TYPE_BOOL:
            return {"type": "boolean"}
        if kind == _F.TYPE_BYTES:
            return {"type": "string", "format": "byte", "pattern": BASE64_PATTERN}
        return {"type": "string"}

    def _message_value(self, message: Descriptor, direction: Direction) -> Schema:
        if message.full_name == TIMESTAMP:
            pattern = TIMESTAMP_PATTERN if direction == "request" else RESPONSE_TIMESTAMP_PATTERN
            return {"type": "string", "format": "date-time", "pattern": pattern}
        if message.full_name == DURATION:
            limit = DURATION_MAX_SECONDS
            return {"type": "number", "minimum": -limit, "maximum": limit}
        return self.ref(message, direction=direction)

    def _enum(self, enum: EnumDescriptor) -> Schema:
        name = enum.full_name
        if name not in self._schemas:
            values = "\n".join(
                f"- `{enum_word(enum, value.number)}`: {_description(f'{name}.{value.name}')}"
                for value in enum.values
            )
            self._schemas[name] = {
                "type": "string",
                "enum": list(_enum_numbers(enum)),
                "description": f"{_description(name)}\n\n{values}",
            }
        return _ref(name)


def _float_schema(kind: int, direction: Direction) -> Schema:
    """A float or double: a number, in responses also null (NaN or an infinity an earlier
    release stored: `_float_out`)."""
    schema: Schema = {"type": "number" if direction == "request" else ["number", "null"]}
    if kind == _F.TYPE_FLOAT:
        return {**schema, "format": "float", "minimum": -FLOAT32_MAX, "maximum": FLOAT32_MAX}
    return {**schema, "format": "double"}


def _component_name(
    descriptor: Descriptor,
    direction: Direction,
    rename: tuple[tuple[str, str], ...] = (),
    exclude: frozenset[str] = frozenset(),
) -> str:
    """The component name of a message body (see `SchemaSet`); matches `^[a-zA-Z0-9.\\-_]+$`
    (rename keys are identifiers, and "-" appears in no proto name)."""
    name = descriptor.full_name
    natural = "request" if descriptor.name.endswith("Request") else "response"
    if direction != natural:
        name += f"-{direction}"
    name += "".join(f"-{field}.as.{key}" for key, field in sorted(rename, key=lambda kv: kv[1]))
    return name + "".join(f"-without.{field}" for field in sorted(exclude))


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    """`schema` that also admits null (a request's way to say absent)."""
    return _nullable(schema)


def _nullable(schema: Schema) -> Schema:
    """`schema` that also admits null (a request's way to say absent)."""
    if "$ref" in schema:
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return {"anyOf": [{"$ref": schema["$ref"]}, {"type": "null"}], **rest}
    if "enum" in schema:
        schema = {**schema, "enum": [*schema["enum"], None]}
    return {**schema, "type": [schema["type"], "null"]}


def _exclusive(layout: Layout) -> Schema | None:
    """The `not` of a body that sets two members of one oneof (null counts as unset)."""
    groups = dict.fromkeys(slot.oneof for slot in layout.values() if slot.oneof)
    pairs: list[Schema] = []
    for group in groups:
        members = [slot.key for slot in layout.values() if slot.oneof == group]
        for i, first in enumerate(members):
            for second in members[i + 1 :]:
                not_null = {"not": {"type": "null"}}
                pairs.append(
                    {
                        "required": [first, second],
                        "properties": dict.fromkeys((first, second), not_null),
                    }
                )
    if not pairs:
        return None
    return {"description": "Two members of one oneof are set.", "anyOf": pairs}


# --- descriptions from the contracts' comments ----------------------------------------------


def comment(full_name: str) -> str:
    """The proto comment of a message, field, enum, value or method (its name when none)."""
    return _description(full_name)


def _description(full_name: str) -> str:
    return _comments().get(full_name) or f"`{full_name}`."


@functools.cache
def _comments() -> Mapping[str, str]:
    """Leading comments by full name: messages, fields, enums and enum values ("Enum.VALUE")."""
    data = resources.files("workshop.v1").joinpath("descriptors.binpb").read_bytes()
    found: dict[str, str] = {}
    for file in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        names = dict(_element_paths(file))
        for location in file.source_code_info.location:
            name = names.get(tuple(location.path))
            text = _clean(location.leading_comments)
            if name is not None and text:
                found[name] = text
    return found


def _element_paths(
    file: descriptor_pb2.FileDescriptorProto,
) -> Iterator[tuple[tuple[int, ...], str]]:
    """(source_code_info path, full name) of every message, field, enum, enum value and
    RPC method ("Service.Method")."""
    scope = file.package
    for i, message in enumerate(file.message_type):
        yield from _message_paths(message, (_FILE_MESSAGES, i), scope)
    for i, enum in enumerate(file.enum_type):
        yield from _enum_paths(enum, (_FILE_ENUMS, i), scope)
    for i, service in enumerate(file.service):
        for j, method in enumerate(service.method):
            yield (_FILE_SERVICES, i, _SERVICE_METHODS, j), f"{scope}.{service.name}.{method.name}"


def _message_paths(
    message: descriptor_pb2.DescriptorProto, path: tuple[int, ...], scope: str
) -> Iterator[tuple[tuple[int, ...], str]]:
    name = f"{scope}.{message.name}"
    yield path, name
    for i, field in enumerate(message.field):
        yield (*path, _MESSAGE_FIELDS, i), f"{name}.{field.name}"
    for i, nested in enumerate(message.nested_type):
        yield from _message_paths(nested, (*path, _MESSAGE_NESTED, i), name)
    for i, enum in enumerate(message.enum_type):
        yield from _enum_paths(enum, (*path, _MESSAGE_ENUMS, i), name)


def _enum_paths(
    enum: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...], scope: str
) -> Iterator[tuple[tuple[int, ...], str]]:
    name = f"{scope}.{enum.name}"
    yield path, name
    for i, value in enumerate(enum.value):
        yield (*path, _ENUM_VALUES, i), f"{name}.{value.name}"


_FILE_MESSAGES = descriptor_pb2.FileDescriptorProto.MESSAGE_TYPE_FIELD_NUMBER
_FILE_ENUMS = descriptor_pb2.FileDescriptorProto.ENUM_TYPE_FIELD_NUMBER
_FILE_SERVICES = descriptor_pb2.FileDescriptorProto.SERVICE_FIELD_NUMBER
_SERVICE_METHODS = descriptor_pb2.ServiceDescriptorProto.METHOD_FIELD_NUMBER
_MESSAGE_FIELDS = descriptor_pb2.DescriptorProto.FIELD_FIELD_NUMBER
_MESSAGE_NESTED = descriptor_pb2.DescriptorProto.NESTED_TYPE_FIELD_NUMBER
_MESSAGE_ENUMS = descriptor_pb2.DescriptorProto.ENUM_TYPE_FIELD_NUMBER
_ENUM_VALUES = descriptor_pb2.EnumDescriptorProto.VALUE_FIELD_NUMBER


def _clean(comment: str) -> str:
    """A comment without protoc's one leading space per line."""
    return "\n".join(line.removeprefix(" ").rstrip() for line in comment.splitlines()).strip()
