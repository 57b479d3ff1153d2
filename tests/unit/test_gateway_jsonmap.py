"""workshop.kit.jsonmap: protobuf <-> JSON for the HTTP API, and its JSON Schema.

Every message of the contracts (descriptors.binpb) round-trips through JSON and its
response body validates against its schema; a synthetic contract built here covers
what the contracts do not use (every integer kind, a recursive message, maps of
messages, an enum without the usual prefix, unsupported well-known types).

Schemas are checked with `jsonschema_rs` (the validator schemathesis uses), Draft 2020-12
as OpenAPI 3.1 has it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import math
import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

import jsonschema_rs
import pytest
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    message_factory,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workshop.kit import jsonmap
from workshop.kit.errors import InvalidArgument
from workshop.kit.jsonmap import FieldViolation, JsonInvalid, SchemaSet, from_json, to_json
from workshop.v1 import workshop_pb2

F = FieldDescriptor
NAME = re.compile(r"^[a-zA-Z0-9\.\-_]+$")
ROUND_TRIP = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Each of the contracts' ~200 messages: fewer examples apiece, since every field kind they
# combine is drawn 25 times by the synthetic message's round trip below.
CONTRACT_ROUND_TRIP = settings(ROUND_TRIP, max_examples=10)


# --- the contracts -------------------------------------------------------------------------


@functools.cache
def contract_names() -> tuple[str, ...]:
    """Full names of every message in descriptors.binpb, map entries left out."""
    data = resources.files("workshop.v1").joinpath("descriptors.binpb").read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(data).file
    names: list[str] = []
    for proto in files:
        importlib.import_module(proto.name.removesuffix(".proto").replace("/", ".") + "_pb2")
        for message in descriptor_pool.Default().FindFileByName(proto.name).message_types_by_name:
            names.extend(_nested(f"{proto.package}.{message}"))
    return tuple(names)


def _nested(full_name: str) -> Iterator[str]:
    descriptor = descriptor_pool.Default().FindMessageTypeByName(full_name)
    if not descriptor.GetOptions().map_entry:
        yield full_name
    for nested in descriptor.nested_types:
        yield from _nested(nested.full_name)


def cls(full_name: str, pool: Any = None) -> type[Message]:
    found = (pool or descriptor_pool.Default()).FindMessageTypeByName(full_name)
    return message_factory.GetMessageClass(found)


# --- a synthetic contract: what the real ones do not use ---------------------------------------


def _kinds_file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(
        name="jsonmaptest/v1/kinds.proto",
        package="jsonmaptest.v1",
        syntax="proto3",
        dependency=[
            "google/protobuf/timestamp.proto",
            "google/protobuf/duration.proto",
            "google/protobuf/wrappers.proto",
        ],
    )
    file.enum_type.add(name="Color").value.extend(
        descriptor_pb2.EnumValueDescriptorProto(name=name, number=number)
        for number, name in enumerate(["COLOR_UNSPECIFIED", "COLOR_RED", "COLOR_DARK_BLUE"])
    )
    file.enum_type.add(name="Odd").value.extend(
        descriptor_pb2.EnumValueDescriptorProto(name=name, number=number)
        for number, name in enumerate(["NOT_PREFIXED", "ODD_ONE"])
    )
    kinds = file.message_type.add(name="Kinds")
    kinds.oneof_decl.add(name="choice")
    scalars = {
        "int32": F.TYPE_INT32, "int64": F.TYPE_INT64, "uint32": F.TYPE_UINT32,
        "uint64": F.TYPE_UINT64, "sint32": F.TYPE_SINT32, "sint64": F.TYPE_SINT64,
        "fixed32": F.TYPE_FIXED32, "fixed64": F.TYPE_FIXED64, "sfixed32": F.TYPE_SFIXED32,
        "sfixed64": F.TYPE_SFIXED64, "float": F.TYPE_FLOAT, "double": F.TYPE_DOUBLE,
        "bool": F.TYPE_BOOL, "string": F.TYPE_STRING, "bytes": F.TYPE_BYTES,
    }  # fmt: skip
    for name, kind in scalars.items():
        _add(kinds, f"a_{name}", kind)
    _add(kinds, "color", F.TYPE_ENUM, ".jsonmaptest.v1.Color")
    _add(kinds, "odd", F.TYPE_ENUM, ".jsonmaptest.v1.Odd")
    _add(kinds, "when", F.TYPE_MESSAGE, ".google.protobuf.Timestamp")
    _add(kinds, "took", F.TYPE_MESSAGE, ".google.protobuf.Duration")
    _add(kinds, "child", F.TYPE_MESSAGE, ".jsonmaptest.v1.Kinds")
    _add(kinds, "many_ints", F.TYPE_SINT32, repeated=True)
    _add(kinds, "colors", F.TYPE_ENUM, ".jsonmaptest.v1.Color", repeated=True)
    _add(kinds, "blobs", F.TYPE_BYTES, repeated=True)
    _add(kinds, "times", F.TYPE_MESSAGE, ".google.protobuf.Timestamp", repeated=True)
    _add(kinds, "children", F.TYPE_MESSAGE, ".jsonmaptest.v1.Kinds", repeated=True)
    _add(kinds, "text", F.TYPE_STRING, oneof=0)
    _add(kinds, "tint", F.TYPE_ENUM, ".jsonmaptest.v1.Color", oneof=0)
    _add(kinds, "nested", F.TYPE_MESSAGE, ".jsonmaptest.v1.Kinds", oneof=0)
    _add(kinds, "at", F.TYPE_MESSAGE, ".google.protobuf.Timestamp", oneof=0)
    _map(kinds, "by_name", F.TYPE_MESSAGE, ".jsonmaptest.v1.Kinds")
    _map(kinds, "color_by_name", F.TYPE_ENUM, ".jsonmaptest.v1.Color")
    _map(kinds, "weights", F.TYPE_DOUBLE)
    for name, kind, type_name in [
        ("maybe_int", F.TYPE_INT32, ""),
        ("maybe_color", F.TYPE_ENUM, ".jsonmaptest.v1.Color"),
        ("maybe_took", F.TYPE_MESSAGE, ".google.protobuf.Duration"),
    ]:
        kinds.oneof_decl.add(name=f"_{name}")
        field = _add(kinds, name, kind, type_name, oneof=len(kinds.oneof_decl) - 1)
        field.proto3_optional = True
    wrapped = file.message_type.add(name="Wrapped")
    _add(wrapped, "text", F.TYPE_MESSAGE, ".google.protobuf.StringValue")
    _map(file.message_type.add(name="IntKeys"), "by_number", F.TYPE_STRING, key=F.TYPE_INT32)
    return file


def _add(
    message: descriptor_pb2.DescriptorProto,
    name: str,
    kind: int,
    type_name: str = "",
    *,
    repeated: bool = False,
    oneof: int | None = None,
) -> descriptor_pb2.FieldDescriptorProto:
    label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
    field = message.field.add(name=name, number=len(message.field) + 1, label=label)
    field.type = kind  # type: ignore[assignment]
    if type_name:
        field.type_name = type_name
    if oneof is not None:
        field.oneof_index = oneof
    return field


def _map(
    message: descriptor_pb2.DescriptorProto,
    name: str,
    kind: int,
    type_name: str = "",
    *,
    key: int = F.TYPE_STRING,
) -> None:
    entry_name = "".join(part.title() for part in name.split("_")) + "Entry"
    entry = message.nested_type.add(name=entry_name)
    entry.options.map_entry = True
    _add(entry, "key", key)
    _add(entry, "value", kind, type_name)
    _add(
        message, name, F.TYPE_MESSAGE, f".jsonmaptest.v1.{message.name}.{entry_name}", repeated=True
    )


@functools.cache
def synthetic_pool() -> Any:
    pool = descriptor_pool.DescriptorPool()
    for module in (timestamp_pb2, duration_pb2, wrappers_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    pool.Add(_kinds_file())
    return pool


def kinds(**fields: Any) -> Message:
    return cls("jsonmaptest.v1.Kinds", synthetic_pool())(**fields)


# --- messages from a descriptor, for hypothesis --------------------------------------------------

INTEGERS = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1), F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1), F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1), F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1), F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1), F.TYPE_FIXED64: (0, 2**64 - 1),
}  # fmt: skip
MAX_DEPTH_DRAWN = 3
DIRECTIONS: tuple[jsonmap.Direction, ...] = ("request", "response")
SECOND = 10**9


def _synthetic_oneofs(descriptor: Descriptor) -> set[str]:
    proto = descriptor_pb2.DescriptorProto()
    descriptor.CopyToProto(proto)
    return {f"_{field.name}" for field in proto.field if field.proto3_optional}


def _split(total: int) -> tuple[int, int]:
    """Nanoseconds as Duration (seconds, nanos): both of the sign of the total."""
    seconds = abs(total) // SECOND * (1 if total >= 0 else -1)
    return seconds, total - seconds * SECOND


@functools.cache
def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of `descriptor`: every field kind, presence drawn, at most 3 levels deep."""
    message_class = message_factory.GetMessageClass(descriptor)
    if descriptor.full_name == "google.protobuf.Timestamp":
        seconds = st.integers(-62_135_596_800, 253_402_300_799)
        return st.builds(message_class, seconds=seconds, nanos=st.integers(0, SECOND - 1))
    if descriptor.full_name == "google.protobuf.Duration":
        fine = st.integers(-(2**22) * SECOND, 2**22 * SECOND)
        coarse = st.integers(-315_576_000_000_000, 315_576_000_000_000).map(lambda ms: ms * 10**6)
        return st.one_of(fine, coarse).map(
            lambda total: message_class(seconds=_split(total)[0], nanos=_split(total)[1])
        )

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        message = message_class()
        for oneof in descriptor.oneofs:
            if oneof.name in _synthetic_oneofs(descriptor):
                continue
            member = draw(st.sampled_from([None, *oneof.fields]))
            if member is not None and _drawable(member, depth):
                _set(message, member, draw(_values(member, depth)))
        for field in descriptor.fields:
            real_oneof = field.containing_oneof is not None and (
                field.containing_oneof.name not in _synthetic_oneofs(descriptor)
            )
            if real_oneof or not _drawable(field, depth):
                continue
            if _is_map(field):
                value = field.message_type.fields_by_name["value"]  # type: ignore[union-attr]
                entries = draw(
                    st.dictionaries(st.text(max_size=4), _values(value, depth), max_size=2)
                )
                for key, item in entries.items():
                    target = getattr(message, field.name)
                    if value.message_type is not None:
                        target[key].CopyFrom(item)
                    else:
                        target[key] = item
            elif field.is_repeated:
                for item in draw(st.lists(_values(field, depth), max_size=2)):
                    target = getattr(message, field.name)
                    if field.message_type is not None:
                        target.add().CopyFrom(item)
                    else:
                        target.append(item)
            elif not field.has_presence or draw(st.booleans()):
                _set(message, field, draw(_values(field, depth)))
        return message

    return build()


def _is_map(field: FieldDescriptor) -> bool:
    entry = field.message_type
    return field.is_repeated and entry is not None and entry.GetOptions().map_entry


def _drawable(field: FieldDescriptor, depth: int) -> bool:
    held = field.message_type
    if held is not None and _is_map(field):
        held = held.fields_by_name["value"].message_type
    return held is None or held.full_name.startswith("google.") or depth < MAX_DEPTH_DRAWN


def _set(message: Message, field: FieldDescriptor, value: Any) -> None:
    if field.message_type is not None:
        child = getattr(message, field.name)
        child.SetInParent()
        child.CopyFrom(value)
    else:
        setattr(message, field.name, value)


def _values(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.message_type is not None:
        return messages(field.message_type, depth + 1)
    if field.enum_type is not None:
        return st.sampled_from([value.number for value in field.enum_type.values])
    if field.type in INTEGERS:
        return st.integers(*INTEGERS[field.type])
    if field.type == F.TYPE_FLOAT:
        return st.floats(width=32, allow_nan=False, allow_infinity=False)
    if field.type == F.TYPE_DOUBLE:
        return st.floats(allow_nan=False, allow_infinity=False)
    if field.type == F.TYPE_BOOL:
        return st.booleans()
    if field.type == F.TYPE_BYTES:
        return st.binary(max_size=12)
    return st.text(max_size=8)


def normalized(message: Message) -> Message:
    """`message` as a request reads it back: a singular enum field with presence (proto3
    `optional`, oneof member) that holds its zero value reads as unset."""
    copy = type(message)()
    copy.CopyFrom(message)
    _normalize(copy)
    return copy


def _normalize(message: Message) -> None:
    for field, value in message.ListFields():
        if field.enum_type is not None and not field.is_repeated and value == 0:
            message.ClearField(field.name)
        elif field.message_type is not None and _is_map(field):
            for item in value.values():
                if isinstance(item, Message):
                    _normalize(item)
        elif field.message_type is not None and field.is_repeated:
            for item in value:
                _normalize(item)
        elif field.message_type is not None:
            _normalize(value)


# --- schema checks ------------------------------------------------------------------------------


def schema_errors(value: Any, ref: dict[str, str], components: dict[str, Any]) -> list[str]:
    root = {"components": {"schemas": components}, **ref}
    return [error.message for error in jsonschema_rs.Draft202012Validator(root).iter_errors(value)]


def assert_valid(value: Any, schemas: SchemaSet, ref: dict[str, str]) -> None:
    assert schema_errors(value, ref, schemas.components()) == []


_VALIDATORS: dict[tuple[type[Message], str, str], Any] = {}


def _validator(message_class: type[Message], direction: str, options: dict[str, Any]) -> Any:
    key = (message_class, direction, json.dumps(options, sort_keys=True))
    if key not in _VALIDATORS:
        schemas = SchemaSet()
        ref = schemas.ref(message_class, direction=direction, **options)  # type: ignore[arg-type]
        root = {"components": {"schemas": schemas.components()}, **ref}
        _VALIDATORS[key] = jsonschema_rs.Draft202012Validator(root)
    return _VALIDATORS[key]


def assert_matches_schema(
    value: Any, message_class: type[Message], direction: str, **options: Any
) -> None:
    """`value` against the schema SchemaSet gives `message_class` in `direction`, compiled
    once per message, direction and options: the round trips check hundreds of bodies per
    message, and compiling the validator each time was most of their time."""
    validator = _validator(message_class, direction, options)
    assert [error.message for error in validator.iter_errors(value)] == []


def as_json(body: dict[str, Any]) -> Any:
    """`body` through JSON text, as the gateway sends it and a client parses it."""
    return json.loads(json.dumps(body, allow_nan=False))


# --- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", contract_names())
@CONTRACT_ROUND_TRIP
@given(data=st.data())
def test_every_contract_message_round_trips_and_matches_its_schemas(
    name: str, data: st.DataObject
) -> None:
    message_class = cls(name)
    message = data.draw(messages(message_class.DESCRIPTOR))
    body = as_json(to_json(message))
    assert from_json(body, message_class) == normalized(message)
    assert_matches_schema(body, message_class, "response")
    # The response form is a valid request too.
    assert_matches_schema(body, message_class, "request")


@ROUND_TRIP
@given(message=messages(cls("jsonmaptest.v1.Kinds", synthetic_pool()).DESCRIPTOR))
def test_every_field_kind_round_trips_and_matches_its_schemas(message: Message) -> None:
    body = as_json(to_json(message))
    assert from_json(body, type(message)) == normalized(message)
    assert_matches_schema(body, type(message), "response")
    assert_matches_schema(body, type(message), "request")


@ROUND_TRIP
@given(data=st.data())
def test_renamed_and_excluded_bodies_round_trip(data: st.DataObject) -> None:
    request_class = cls("workshop.v1.CreateRunRequest")
    message = data.draw(messages(request_class.DESCRIPTOR))
    options: dict[str, Any] = {"rename": {"id": "run_id"}, "exclude": ["workflow_id"]}
    body = as_json(to_json(message, **options))
    assert "run_id" not in body
    assert "workflow_id" not in body
    assert "id" in body
    expected = normalized(message)
    expected.ClearField("workflow_id")
    assert from_json(body, request_class, **options) == expected
    assert_matches_schema(body, request_class, "response", **options)


def test_every_contract_message_maps_and_has_described_schemas() -> None:
    schemas = SchemaSet()
    for name in contract_names():
        message_class = cls(name)
        assert from_json(to_json(message_class()), message_class) == message_class()
        for direction in DIRECTIONS:
            ref = schemas.ref(message_class, direction=direction)
            assert_valid(to_json(message_class()), schemas, ref)
    components = schemas.components()
    assert len(components) > len(contract_names())  # both directions, and the enums
    for name, schema in components.items():
        assert NAME.match(name), name
        assert jsonschema_rs.meta.is_valid(schema), name
        assert _from_comments(schema["description"]), name
        for key, child in schema.get("properties", {}).items():
            # Every field of the contracts has a comment (map entries are inlined).
            assert _from_comments(child["description"]), (name, key)


def _from_comments(description: str) -> bool:
    """Whether a description is a comment, not jsonmap's fallback (the name in backticks)."""
    return bool(description) and not description.startswith("`")


def test_schemas_are_deterministic_and_named_by_direction() -> None:
    run, create = cls("workshop.v1.Run"), cls("workshop.v1.CreateRunRequest")
    variant: dict[str, Any] = {"rename": {"id": "run_id"}, "exclude": ["mode"]}
    calls: list[tuple[Any, jsonmap.Direction, dict[str, Any]]] = [
        (run, "response", {}),
        (create, "request", {}),
        (run, "request", {}),
        (create, "response", {}),
        (create.DESCRIPTOR, "request", variant),
    ]
    first, second = SchemaSet(), SchemaSet()
    refs = [first.ref(message, direction=d, **options) for message, d, options in calls]
    assert [ref["$ref"].rsplit("/", 1)[1] for ref in refs] == [
        "workshop.v1.Run",
        "workshop.v1.CreateRunRequest",
        "workshop.v1.Run-request",
        "workshop.v1.CreateRunRequest-response",
        "workshop.v1.CreateRunRequest-run_id.as.id-without.mode",
    ]
    for message, direction, options in reversed(calls):
        second.ref(message, direction=direction, **options)
    assert json.dumps(first.components()) == json.dumps(second.components())


def test_schema_shapes() -> None:
    schemas = SchemaSet()
    schemas.ref(cls("workshop.v1.CreateRunRequest"), direction="response")
    schemas.ref(cls("workshop.v1.Step"), direction="request")
    schemas.ref(cls("jsonmaptest.v1.Kinds", synthetic_pool()), direction="response")
    components = schemas.components()
    response = components["workshop.v1.CreateRunRequest-response"]
    assert response["additionalProperties"] is False
    assert response["required"] == [
        "run_id",
        "workflow_id",
        "runtime_id",
        "revision",
        "mode",
        "validate_only",
    ]
    assert response["properties"]["image_limit"]["maximum"] == 2**32 - 1
    assert response["properties"]["revision"]["format"] == "int64"
    assert response["properties"]["mode"]["$ref"] == "#/components/schemas/workshop.v1.RunMode"
    assert response["properties"]["workflow_id"]["description"] == "Workflow to run."
    mode = components["workshop.v1.RunMode"]
    assert mode["enum"] == ["unspecified", "test", "full"]
    assert "\n- `test`: " in mode["description"]
    # Step is named for responses; asked for as a request, it gets a suffix.
    assert "workshop.v1.Step" not in components
    request_step = components["workshop.v1.Step-request"]
    assert "required" not in request_step
    assert request_step["properties"]["label"]["type"] == ["string", "null"]
    assert request_step["properties"]["sample"]["anyOf"][1] == {"type": "null"}
    kinds_schema = components["jsonmaptest.v1.Kinds"]
    assert (
        kinds_schema["properties"]["child"]["$ref"] == "#/components/schemas/jsonmaptest.v1.Kinds"
    )
    assert kinds_schema["properties"]["when"]["format"] == "date-time"
    assert kinds_schema["properties"]["a_bytes"]["format"] == "byte"
    assert kinds_schema["properties"]["took"]["type"] == "number"
    assert kinds_schema["properties"]["a_int32"]["minimum"] == -(2**31)
    assert "maybe_int" not in kinds_schema["required"]
    assert "a_int32" in kinds_schema["required"]


def test_the_schemas_refuse_bad_bodies() -> None:
    schemas = SchemaSet()
    ref = schemas.ref(cls("workshop.v1.CreateRunRequest"), direction="response")
    good = to_json(cls("workshop.v1.CreateRunRequest")(run_id="r1"))
    components = schemas.components()
    assert schema_errors(good, ref, components) == []
    for bad in [
        {**good, "extra": 1},
        {**good, "revision": "1"},
        {**good, "mode": "fast"},
        {**good, "image_limit": -1},
        {k: v for k, v in good.items() if k != "run_id"},
    ]:
        assert schema_errors(bad, ref, components) != [], bad
    step = schemas.ref(cls("workshop.v1.Step"), direction="request")
    both: dict[str, Any] = {"input": {}, "sample": {}}
    assert schema_errors(both, step, schemas.components()) != []
    assert schema_errors({"input": {}, "sample": None}, step, schemas.components()) == []


# --- known examples -----------------------------------------------------------------------------


def test_create_run_body_with_a_rename() -> None:
    body = {
        "id": "r1",
        "workflow_id": "night",
        "runtime_id": "workshop-abc",
        "revision": 746,
        "mode": "test",
        "image_limit": 20,
    }
    create = cls("workshop.v1.CreateRunRequest")
    request = from_json(body, create, rename={"id": "run_id"})
    expected = create(
        run_id="r1",
        workflow_id="night",
        runtime_id="workshop-abc",
        revision=746,
        mode=1,
        image_limit=20,
    )
    assert request == expected
    assert to_json(request, rename={"id": "run_id"}) == {**body, "validate_only": False}
    with pytest.raises(JsonInvalid) as caught:
        from_json({**body, "run_id": "r1"}, create, rename={"id": "run_id"})
    assert caught.value.violations == [FieldViolation("run_id", "unknown field")]


def test_responses_hold_defaults_and_omit_what_is_unset() -> None:
    assert to_json(cls("workshop.v1.CreateRunRequest")()) == {
        "run_id": "",
        "workflow_id": "",
        "runtime_id": "",
        "revision": 0,
        "mode": "unspecified",
        "validate_only": False,
    }
    refusal = cls("workshop.v1.Refusal")(code=3, metadata={"k": "v"})
    assert to_json(refusal) == {"code": 3, "message": "", "reason": "", "metadata": {"k": "v"}}
    step = to_json(cls("workshop.v1.Step")(step_id="s", sample={"interval_seconds": 0.5}))
    assert step == {"step_id": "s", "label": "", "sample": {"interval_seconds": 0.5}}
    assert to_json(kinds(maybe_int=0, a_bytes=b"\xff\x00"))["maybe_int"] == 0
    assert to_json(kinds(a_bytes=b"\xff\x00", blobs=[b"a"]))["a_bytes"] == "/wA="
    assert to_json(kinds())["many_ints"] == []
    assert to_json(kinds())["weights"] == {}


@pytest.mark.parametrize(
    ("seconds", "nanos", "text"),
    [
        (1_796_040_000, 0, "2026-11-30T12:00:00Z"),
        (1_796_040_000, 123_456_789, "2026-11-30T12:00:00.123456789Z"),
        (1_796_040_000, 120_000_000, "2026-11-30T12:00:00.120Z"),
        (1_796_040_000, 5_000, "2026-11-30T12:00:00.000005Z"),
        (-62_135_596_800, 0, "0001-01-01T00:00:00Z"),
        (253_402_300_799, 999_999_999, "9999-12-31T23:59:59.999999999Z"),
    ],
)
def test_timestamps(seconds: int, nanos: int, text: str) -> None:
    message = kinds(when={"seconds": seconds, "nanos": nanos})
    assert to_json(message)["when"] == text
    assert from_json({"when": text}, type(message)) == message


@pytest.mark.parametrize(
    ("text", "seconds", "nanos"),
    [
        ("2026-11-30T14:00:00+02:00", 1_796_040_000, 0),
        ("2026-11-30t11:30:00.5-00:30", 1_796_040_000, 500_000_000),
        ("2026-11-30T12:00:00.1z", 1_796_040_000, 100_000_000),
    ],
)
def test_timestamps_with_offsets_are_converted_to_utc(text: str, seconds: int, nanos: int) -> None:
    message = from_json({"when": text}, type(kinds()))
    assert (message.when.seconds, message.when.nanos) == (seconds, nanos)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "description"),
    [
        ("2026-11-30T12:00:00", "has no UTC offset: end it with Z or +hh:mm"),
        ("2026-11-30T12:00:00.25", "has no UTC offset: end it with Z or +hh:mm"),
        ("2026-11-30 12:00:00Z", "expected an RFC 3339 date-time like 2026-11-30T12:00:00Z"),
        (
            "2026-11-30T12:00:00.1234567890Z",
            "expected an RFC 3339 date-time like 2026-11-30T12:00:00Z",
        ),
        ("0000-01-01T00:00:00Z", "is not a date from 0001-01-01 to 9999-12-31"),
        ("2026-02-30T00:00:00Z", "is not a date from 0001-01-01 to 9999-12-31"),
        ("2026-12-31T23:59:60Z", "is not a time of day (leap seconds are not accepted)"),
        ("2026-12-31T24:00:00Z", "is not a time of day (leap seconds are not accepted)"),
        ("2026-12-31T12:00:00+24:00", "has an offset that is not +-hh:mm up to 23:59"),
        ("0001-01-01T00:00:00+00:01", "is outside years 0001..9999 once in UTC"),
        ("9999-12-31T23:59:59-00:01", "is outside years 0001..9999 once in UTC"),
        ("2026-11-30T12:00:00Z\n", "expected an RFC 3339 date-time like 2026-11-30T12:00:00Z"),
        ("\uff12026-11-30T12:00:00Z", "expected an RFC 3339 date-time like 2026-11-30T12:00:00Z"),
        (1_796_040_000, "expected an RFC 3339 date-time string, got 1796040000"),
    ],
)
def test_bad_timestamps(text: object, description: str) -> None:
    assert violations({"when": text}) == [FieldViolation("when", description)]


@pytest.mark.parametrize(
    ("number", "seconds", "nanos"),
    [
        (1.5, 1, 500_000_000),
        (3600, 3600, 0),
        (-0.25, 0, -250_000_000),
        (-1.5, -1, -500_000_000),
        (0.1 + 0.2, 0, 300_000_000),  # 0.30000000000000004 rounds to the nanosecond
        (4_000_000.123456789, 4_000_000, 123_456_789),  # every nanosecond, 46 days in
        (315_576_000_000, 315_576_000_000, 0),
        (-315_575_999_999.125, -315_575_999_999, -125_000_000),
    ],
)
def test_durations(number: float, seconds: int, nanos: int) -> None:
    message = from_json({"took": number}, type(kinds()))
    assert (message.took.seconds, message.took.nanos) == (seconds, nanos)  # type: ignore[attr-defined]
    if number != 0.1 + 0.2:
        assert to_json(message)["took"] == number
        assert type(to_json(message)["took"]) is type(number)


@pytest.mark.parametrize(
    ("number", "description"),
    [
        (315_576_000_000.5, "315576000000.5 is out of range -315576000000..315576000000"),
        (-(10**400), "is out of range"),
        ("1h", "expected a number of seconds, got a string"),
        (True, "expected a number of seconds, got true"),
        (math.inf, "expected a finite number of seconds, got inf"),
    ],
)
def test_bad_durations(number: object, description: str) -> None:
    [violation] = violations({"took": number})
    assert violation.field == "took"
    assert description in violation.description


def test_non_finite_floats_leave_as_null_and_match_the_response_schema() -> None:
    """NaN and the infinities (held only by rows an earlier release stored) are null, as
    JavaScript writes them; the response schema admits it, the request schema does not."""
    message = kinds(a_double=math.nan, a_float=math.inf, weights={"w": -math.inf, "v": 0.5})
    body = as_json(to_json(message))
    assert (body["a_double"], body["a_float"], body["weights"]) == (
        None,
        None,
        {"w": None, "v": 0.5},
    )
    assert_matches_schema(body, type(message), "response")
    schemas = SchemaSet()
    ref = schemas.ref(type(message), direction="request")
    assert schema_errors({"weights": {"w": None}}, ref, schemas.components()) != []


def test_values_json_cannot_carry_never_leave() -> None:
    for message in [
        kinds(when={"seconds": 253_402_300_800}),
        kinds(took={"seconds": 315_576_000_000, "nanos": 1}),
        kinds(took={"seconds": 1, "nanos": -1}),
    ]:
        with pytest.raises(ValueError):  # noqa: PT011 (each is a different value)
            to_json(message)


# --- enums ---------------------------------------------------------------------------------


def test_enum_names() -> None:
    create = cls("workshop.v1.CreateRunRequest")
    assert to_json(create(mode=1))["mode"] == "test"
    decision = descriptor_pool.Default().FindEnumTypeByName("workshop.v1.ReviewDecision")
    assert (
        jsonmap.enum_word(decision, decision.values_by_name["REVIEW_DECISION_CONFIRM"].number)
        == "confirm"
    )
    assert to_json(kinds(color=2))["color"] == "dark_blue"
    # An enum whose values do not all carry the prefix keeps the whole names.
    assert to_json(kinds(odd=1))["odd"] == "odd_one"
    assert to_json(kinds())["odd"] == "not_prefixed"
    assert from_json({"odd": "odd_one"}, type(kinds())) == kinds(odd=1)
    assert violations({"odd": "one"})[0].description == (
        'unknown value "one"; expected one of not_prefixed, odd_one'
    )


def test_values_quoted_in_violations_are_shortened() -> None:
    [violation] = violations({"color": "x" * 1000})
    assert violation.description.startswith(f'unknown value "{"x" * 200}…"; expected one of')
    [violation] = violations({"weights": {"k" * 300: "heavy"}})
    assert violation.field == f'weights["{"k" * 200}…"]'


def test_every_contract_enum_has_the_usual_prefix() -> None:
    seen = 0
    for name in contract_names():
        for field in cls(name).DESCRIPTOR.fields:
            enum = field.enum_type
            if enum is None:
                continue
            prefix = jsonmap._upper_snake(enum.name) + "_"
            stripped = [value.name.removeprefix(prefix).lower() for value in enum.values]
            assert list(jsonmap._enum_numbers(enum)) == stripped, enum.full_name
            assert stripped[0] == "unspecified", enum.full_name
            seen += 1
    assert seen > 20


def test_an_unknown_enum_number_says_unspecified() -> None:
    create = cls("workshop.v1.CreateRunRequest")
    assert to_json(create(mode=77))["mode"] == "unspecified"
    assert to_json(kinds(odd=5))["odd"] == "not_prefixed"  # the zero value's name
    assert to_json(kinds(colors=[1, 99]))["colors"] == ["red", "unspecified"]


def test_unspecified_in_requests_means_absent() -> None:
    create = cls("workshop.v1.CreateRunRequest")
    assert from_json({"mode": "unspecified"}, create) == create()
    progress = from_json({"phase": "unspecified"}, cls("workshop.v1.ReportProgressRequest"))
    assert not progress.HasField("phase")
    assert not from_json({"tint": "unspecified"}, type(kinds())).HasField("tint")
    # Inside an array or a map it is the zero value: an element cannot be absent.
    assert from_json({"colors": ["unspecified", "red"]}, type(kinds())) == kinds(colors=[0, 1])
    assert from_json({"color_by_name": {"a": "unspecified"}}, type(kinds())) == kinds(
        color_by_name={"a": 0}
    )


# --- violations --------------------------------------------------------------------------------


def violations(body: object, name: str = "jsonmaptest.v1.Kinds") -> list[FieldViolation]:
    message_class = cls(name, synthetic_pool() if name.startswith("jsonmaptest") else None)
    with pytest.raises(JsonInvalid) as caught:
        from_json(body, message_class)
    return caught.value.violations


@dataclasses.dataclass(frozen=True)
class Case:
    """A body of workshop.v1.<message> with one violation; `untold` when the request schema
    cannot refuse it (a lone surrogate, NaN, or 1.0, which JSON Schema counts an integer)."""

    message: str
    body: dict[str, Any]
    field: str
    description: str
    untold: bool = False


INT32 = "-2147483648..2147483647"
UINT64 = f"0..{2**64 - 1}"
INT64 = f"{-(2**63)}..{2**63 - 1}"
MODES = "expected one of unspecified, test, full"
NOT_BASE64 = "is not standard base64 (A-Z, a-z, 0-9, +, / padded with =)"
LONE = "is not valid Unicode (a lone surrogate)"
STEPS = "set one of input, sample, model, rule, output, do_nothing"
INSTANT = "2026-11-30T12:00:00Z"
CASES = [
    Case("CreateRunRequest", {"nope": 1}, "nope", "unknown field"),
    Case("CreateRunRequest", {"a b": 1}, '["a b"]', "unknown field"),
    Case("CreateRunRequest", {"workflow_id": 5}, "workflow_id", "expected a string, got 5"),
    Case("CreateRunRequest", {"run_id": ["x"]}, "run_id", "expected a string, got an array"),
    Case("CalendarDate", {"year": 2**31}, "year", f"2147483648 is out of range {INT32}"),
    Case("CalendarDate", {"year": -(2**31) - 1}, "year", f"-2147483649 is out of range {INT32}"),
    Case(
        "CreateRunRequest", {"image_limit": -1}, "image_limit", "-1 is out of range 0..4294967295"
    ),
    Case(
        "CreateRunRequest",
        {"image_limit": 2**32},
        "image_limit",
        "4294967296 is out of range 0..4294967295",
    ),
    Case(
        "CreateRunRequest",
        {"revision": 2**63},
        "revision",
        f"{2**63} is out of range {-(2**63)}..{2**63 - 1}",
    ),
    Case(
        "CreateRunRequest", {"revision": -(2**100)}, "revision", f"a number is out of range {INT64}"
    ),
    Case("ExportBucketResponse", {"items": -1}, "items", f"-1 is out of range {UINT64}"),
    Case("ExportBucketResponse", {"items": 2**64}, "items", f"{2**64} is out of range {UINT64}"),
    Case(
        "CreateRunRequest",
        {"revision": 1.0},
        "revision",
        "expected an integer, got 1.0",
        untold=True,
    ),
    Case("CreateRunRequest", {"revision": 1.5}, "revision", "expected an integer, got 1.5"),
    Case("CreateRunRequest", {"revision": True}, "revision", "expected an integer, got true"),
    Case("CreateRunRequest", {"revision": "7"}, "revision", "expected an integer, got a string"),
    Case(
        "SampleStep",
        {"interval_seconds": False},
        "interval_seconds",
        "expected a number, got false",
    ),
    Case(
        "SampleStep",
        {"interval_seconds": math.nan},
        "interval_seconds",
        "expected a finite number, got nan",
        untold=True,
    ),
    Case(
        "SampleStep",
        {"interval_seconds": -math.inf},
        "interval_seconds",
        "expected a finite number, got -inf",
        untold=True,
    ),
    Case("Box", {"score": 1e39}, "score", "1e+39 is out of range for a 32-bit float"),
    Case(
        "PinnedModel",
        {"resolved_from_latest": "y"},
        "resolved_from_latest",
        "expected true or false, got a string",
    ),
    Case(
        "PinnedModel",
        {"resolved_from_latest": 1},
        "resolved_from_latest",
        "expected true or false, got 1",
    ),
    Case("CreateRunRequest", {"mode": "fast"}, "mode", f'unknown value "fast"; {MODES}'),
    Case("CreateRunRequest", {"mode": "TEST"}, "mode", f'unknown value "TEST"; {MODES}'),
    Case("CreateRunRequest", {"mode": 1}, "mode", f"{MODES}; got 1"),
    Case("CreateRunRequest", {"workflow_id": "a\ud800"}, "workflow_id", LONE, untold=True),
    Case("PublishPreviewRequest", {"image": "abc"}, "image", NOT_BASE64),
    Case("PublishPreviewRequest", {"image": "-_8="}, "image", NOT_BASE64),
    Case("PublishPreviewRequest", {"image": "QQ"}, "image", NOT_BASE64),
    Case("PublishPreviewRequest", {"image": 5}, "image", "expected a base64 string, got 5"),
    Case("Step", {"input": {}, "sample": {}}, "sample", f"input is set too: {STEPS}"),
    Case("AdvanceClockRequest", {"to": INSTANT, "by": 1}, "by", "to is set too: set one of by, to"),
    Case(
        "PutRecordingRequest",
        {"start": INSTANT[:-1]},
        "start",
        "has no UTC offset: end it with Z or +hh:mm",
    ),
    Case(
        "CreateSessionRequest", {"ttl": "1h"}, "ttl", "expected a number of seconds, got a string"
    ),
    Case(
        "PublishModelVersionRequest", {"input_shape": 3}, "input_shape", "expected an array, got 3"
    ),
    Case(
        "PublishModelVersionRequest",
        {"input_shape": [1, None]},
        "input_shape[1]",
        "expected a value, got null",
    ),
    Case(
        "PublishModelVersionRequest",
        {"input_shape": [1, 1.5]},
        "input_shape[1]",
        "expected an integer, got 1.5",
    ),
    Case("Refusal", {"metadata": []}, "metadata", "expected an object, got an array"),
    Case("Refusal", {"metadata": {"k": 1}}, 'metadata["k"]', "expected a string, got 1"),
    Case("Refusal", {"metadata": {"k": None}}, 'metadata["k"]', "expected a value, got null"),
    Case("Refusal", {"metadata": {"\ud800": "v"}}, 'metadata["\\ud800"]', LONE, untold=True),
    Case("Refusal", {"metadata": {'a"b': 1}}, 'metadata["a\\"b"]', "expected a string, got 1"),
    Case("SaveWorkflowRequest", {"spec": []}, "spec", "expected an object, got an array"),
    Case(
        "SaveWorkflowRequest",
        {"spec": {"graph": {"steps": [{}, {}, {"sample": {"interval_seconds": "x"}}]}}},
        "spec.graph.steps[2].sample.interval_seconds",
        "expected a number, got a string",
    ),
    Case(
        "SaveWorkflowRequest",
        {"spec": {"graph": {"steps": [{"nope": 1}]}}},
        "spec.graph.steps[0].nope",
        "unknown field",
    ),
    Case(
        "SaveWorkflowRequest",
        {"spec": {"graph": {"steps": [None]}}},
        "spec.graph.steps[0]",
        "expected a value, got null",
    ),
]


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c.message}:{c.field}:{c.description[:30]}" for c in CASES]
)
def test_each_violation(case: Case) -> None:
    assert violations(case.body, f"workshop.v1.{case.message}") == [
        FieldViolation(case.field, case.description)
    ]
    schemas = SchemaSet()
    ref = schemas.ref(cls(f"workshop.v1.{case.message}"), direction="request")
    # The request schema refuses the same body, but for what JSON Schema cannot say
    # (NaN, lone surrogates, 1.0 for an integer).
    if not case.untold:
        assert schema_errors(case.body, ref, schemas.components()) != []


def test_null_means_absent() -> None:
    create = cls("workshop.v1.CreateRunRequest")
    body = dict.fromkeys(["run_id", "workflow_id", "revision", "mode", "image_limit"])
    assert from_json(body, create) == create()
    assert not from_json({"image_limit": None}, create).HasField("image_limit")
    step = from_json({"input": None, "sample": {}}, cls("workshop.v1.Step"))
    assert step.WhichOneof("kind") == "sample"
    assert from_json({"child": None, "when": None, "colors": None}, type(kinds())) == kinds()


def test_empty_objects_and_default_oneof_members_are_set() -> None:
    step = from_json({"do_nothing": {}}, cls("workshop.v1.Step"))
    assert step.WhichOneof("kind") == "do_nothing"
    message = from_json({"text": "", "maybe_int": 0, "child": {}}, type(kinds()))
    assert message.WhichOneof("choice") == "text"
    assert message.HasField("maybe_int")
    assert message.HasField("child")


def test_all_violations_are_collected_in_one_error() -> None:
    body = {"run_id": 1, "revision": 1.5, "mode": "fast", "extra": True, "image_limit": -1}
    with pytest.raises(JsonInvalid) as caught:
        from_json(body, cls("workshop.v1.CreateRunRequest"))
    error = caught.value
    assert [v.field for v in error.violations] == [
        "run_id",
        "revision",
        "mode",
        "extra",
        "image_limit",
    ]
    assert error.message == (
        "5 problems: run_id: expected a string, got 1; revision: expected an integer, got 1.5; "
        'mode: unknown value "fast"; expected one of unspecified, test, full; and 2 more'
    )
    assert isinstance(error, InvalidArgument)
    assert error.reason == "INVALID_FIELD"
    assert error.metadata == {"field": "run_id"}
    with pytest.raises(JsonInvalid) as single:
        from_json({"run_id": 1}, cls("workshop.v1.CreateRunRequest"))
    assert single.value.message == "run_id: expected a string, got 1"


@pytest.mark.parametrize("body", [[], "x", None, 3, True, [{"run_id": "r"}]])
def test_the_top_level_must_be_an_object(body: object) -> None:
    [violation] = violations(body, "workshop.v1.CreateRunRequest")
    assert violation.field == ""
    assert violation.description.startswith("expected a JSON object, got ")
    with pytest.raises(JsonInvalid, match=r"^body: expected a JSON object"):
        from_json(body, cls("workshop.v1.CreateRunRequest"))


def _nested_body(levels: int) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for _ in range(levels - 1):
        body = {"child": body}
    return body


def test_nesting_is_bounded() -> None:
    kinds_class = type(kinds())
    assert from_json(_nested_body(jsonmap.MAX_DEPTH), kinds_class).HasField("child")
    path = ".".join(["child"] * jsonmap.MAX_DEPTH)
    expected = FieldViolation(path, "nested deeper than 32 objects")
    assert violations(_nested_body(jsonmap.MAX_DEPTH + 1)) == [expected]
    # Far deeper than the stack allows, through arrays and maps as well: one violation.
    deep: dict[str, Any] = {}
    for level in range(5000):
        deep = {"children": [deep]} if level % 2 else {"by_name": {"k": deep}}
    [violation] = violations(deep)
    assert violation.description == "nested deeper than 32 objects"
    assert violation.field.startswith('children[0].by_name["k"].children[0]')
    assert violation.field.count(".") == jsonmap.MAX_DEPTH - 1


# --- rename and exclude ---------------------------------------------------------------------------


def test_excluded_and_renamed_away_fields_are_unknown() -> None:
    create = cls("workshop.v1.CreateRunRequest")
    options: dict[str, Any] = {"rename": {"id": "run_id"}, "exclude": {"runtime_id"}}
    with pytest.raises(JsonInvalid) as caught:
        from_json({"runtime_id": "x", "run_id": "r", "id": 5}, create, **options)
    assert caught.value.violations == [
        FieldViolation("runtime_id", "unknown field"),
        FieldViolation("run_id", "unknown field"),
        FieldViolation("id", "expected a string, got 5"),
    ]
    body = to_json(create(run_id="r", runtime_id="x"), **options)
    assert "runtime_id" not in body
    assert body["id"] == "r"
    schemas = SchemaSet()
    ref = schemas.ref(create, direction="request", **options)
    properties = schemas.components()[ref["$ref"].rsplit("/", 1)[1]]["properties"]
    assert "id" in properties
    assert "run_id" not in properties
    assert "runtime_id" not in properties


def test_renames_apply_to_the_top_level_only() -> None:
    body = {"id": "w", "spec": {"name": "n"}}
    message = from_json(body, workshop_pb2.SaveWorkflowRequest, rename={"id": "workflow_id"})
    assert message.workflow_id == "w"
    assert message.spec.name == "n"


@pytest.mark.parametrize(
    "options",
    [
        {"exclude": ["nope"]},
        {"rename": {"id": "nope"}},
        {"rename": {"workflow_id": "run_id"}},  # collides with workflow_id itself
        {"rename": {"id": "run_id", "other": "run_id"}},
        {"rename": {"id": "run_id"}, "exclude": ["run_id"]},
        {"rename": {"bad key": "run_id"}},
    ],
)
def test_bad_rename_or_exclude_arguments(options: dict[str, Any]) -> None:
    create = cls("workshop.v1.CreateRunRequest")
    with pytest.raises(ValueError, match="CreateRunRequest"):
        from_json({}, create, **options)
    with pytest.raises(ValueError, match="CreateRunRequest"):
        SchemaSet().ref(create, direction="request", **options)


def test_a_rename_onto_an_excluded_name_is_fine() -> None:
    create = cls("workshop.v1.CreateRunRequest")
    options: dict[str, Any] = {"rename": {"workflow_id": "run_id"}, "exclude": ["workflow_id"]}
    assert from_json({"workflow_id": "r"}, create, **options) == create(run_id="r")


# --- what has no mapping -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["jsonmaptest.v1.Wrapped", "jsonmaptest.v1.IntKeys"])
def test_types_without_a_mapping_are_refused_up_front(name: str) -> None:
    message_class = cls(name, synthetic_pool())
    with pytest.raises(TypeError):
        to_json(message_class())
    with pytest.raises(TypeError):
        from_json({}, message_class)
    with pytest.raises(TypeError):
        SchemaSet().ref(message_class, direction="response")


def test_a_well_known_value_is_not_a_body() -> None:
    with pytest.raises(TypeError):
        to_json(timestamp_pb2.Timestamp())
