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
- an enum field holding a number its enum does not define (proto3 enums are open,
  so the parser keeps it): INVALID_FIELD, naming the field and the values to send.

The enum check walks only the fields under which an enum can occur, found once
per message type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from workshop.kit.errors import InvalidArgument, PayloadTooLarge, WorkshopError

Deserializer = Callable[[bytes], Any]
ENUM_NAMES_SHOWN = 12


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
            problem = enum_problem(request)
            if problem is not None:
                return Refusal(problem)
        return request

    return decode


def enum_problem(message: Message) -> InvalidArgument | None:
    """INVALID_FIELD for the first enum field, at any depth, whose number is not a value of
    its enum; None when every one is."""
    found = _first_bad_enum(message)
    if found is None:
        return None
    path, enum, number = found
    names = [value.name for value in enum.values if not value.name.endswith("_UNSPECIFIED")]
    listed = ", ".join(names[:ENUM_NAMES_SHOWN])
    if len(names) > ENUM_NAMES_SHOWN:
        listed += ", ..."
    return InvalidArgument(
        f"{path} is {number}, which is not a {enum.name}; send one of {listed}.",
        reason="INVALID_FIELD",
        metadata={"field": path},
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Walk:
    """The fields of one message type under which an open enum can occur."""

    enums: tuple[FieldDescriptor, ...]  # enum fields, and maps whose values are enums
    messages: tuple[FieldDescriptor, ...]  # message fields and maps of messages below which one is


def _first_bad_enum(message: Message) -> tuple[str, EnumDescriptor, int] | None:
    walk = _walk(message.DESCRIPTOR)
    if walk is None:
        return None
    for field in walk.enums:
        enum = _value_field(field).enum_type
        assert enum is not None  # _walk lists enum fields only
        for where, number in _enum_values(message, field):
            if number not in enum.values_by_number:
                return f"{field.name}{where}", enum, number
    for field in walk.messages:
        for where, child in _child_messages(message, field):
            found = _first_bad_enum(child)
            if found is not None:
                return f"{field.name}{where}.{found[0]}", found[1], found[2]
    return None


def _enum_values(message: Message, field: FieldDescriptor) -> Iterator[tuple[str, int]]:
    value = getattr(message, field.name)
    if _is_map(field):
        for key, number in value.items():
            yield f"[{key!r}]", number
    elif _is_repeated(field):
        for index, number in enumerate(value):
            yield f"[{index}]", number
    else:
        yield "", value


def _child_messages(message: Message, field: FieldDescriptor) -> Iterator[tuple[str, Message]]:
    if _is_map(field):
        for key, child in getattr(message, field.name).items():
            yield f"[{key!r}]", child
    elif _is_repeated(field):
        for index, child in enumerate(getattr(message, field.name)):
            yield f"[{index}]", child
    elif message.HasField(field.name):
        yield "", getattr(message, field.name)


def _is_repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


def _is_map(field: FieldDescriptor) -> bool:
    entry = field.message_type
    return entry is not None and entry.GetOptions().map_entry and field.is_repeated


def _value_field(field: FieldDescriptor) -> FieldDescriptor:
    """The field that holds the values: the field itself, or a map entry's `value`."""
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry and field.is_repeated:
        return entry.fields_by_name["value"]
    return field


def _is_open_enum(field: FieldDescriptor) -> bool:
    return field.enum_type is not None and not field.enum_type.is_closed


@cache
def _walk(descriptor: Descriptor) -> _Walk | None:
    enums: list[FieldDescriptor] = []
    messages: list[FieldDescriptor] = []
    for field in descriptor.fields:
        held = _value_field(field)
        if _is_open_enum(held):
            enums.append(field)
        elif held.message_type is not None and _reaches_open_enum(held.message_type):
            messages.append(field)
    return _Walk(tuple(enums), tuple(messages)) if enums or messages else None


@cache
def _reaches_open_enum(descriptor: Descriptor) -> bool:
    """Whether a message of this type can hold an open enum at some depth (recursive types
    included: the search remembers the types it has seen)."""
    seen = {descriptor}
    pending = [descriptor]
    while pending:
        for field in pending.pop().fields:
            if _is_open_enum(field):
                return True
            child = field.message_type
            if child is not None and child not in seen:
                seen.add(child)
                pending.append(child)
    return False
