"""Hypothesis strategies for the bytes of any request, derived from protobuf descriptors.

The strategies write the wire format themselves instead of building messages, so
they can send what no protobuf library would: invalid UTF-8 in a string field, enum
numbers outside the enum, several members of one oneof, unknown fields, repeated
fields with tens of thousands of elements, truncated messages and random bytes.

`RequestStrategies(pools).request(descriptor, examples)` is the strategy for one
RPC's request: well-formed messages (every field type, nested messages to
`MAX_DEPTH`, repeated, packed and unpacked, maps, oneofs) whose values mix
boundary numbers, random text and the `pools` of values the test's world knows
(real ids, a live lease's token, a real JPEG), so some requests reach past the
field checks; `examples` (valid requests of the world) overridden field by field;
and the broken kinds above.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping, Sequence

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

Bytes = st.SearchStrategy[bytes]

MAX_DEPTH = 3
# Sizes of the huge cases: a long id, past the 64 KiB request limit, past the 4 MiB image limit.
HUGE_TEXT = (8_000, 70_000)
HUGE_BYTES = (70_000, 5_000_000)
HUGE_REPEAT = (1_000, 20_000)
# A huge repeated field is at most this big (its elements may be large themselves).
HUGE_REPEAT_MAX_BYTES = 3_000_000
INT_BOUNDARIES = (
    0,
    1,
    -1,
    2,
    100,
    101,
    2**31 - 1,
    -(2**31),
    2**32 - 1,
    2**32,
    2**53 + 1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
)
FLOAT_SPECIALS = (0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, 3e38, float("inf"), float("-inf"))
DOUBLE_SPECIALS = (*FLOAT_SPECIALS, 1e-300, 1e300)
NAN_BITS = (struct.pack("<f", float("nan")), struct.pack("<d", float("nan")))
# Invalid UTF-8: a lone continuation byte, a bad sequence, an encoded surrogate, an overlong
# encoding, a 5-byte form, and valid text with a stray byte at its end.
INVALID_UTF8 = (
    b"\x80",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"\xc0\xaf",
    b"\xf8\x88\x80\x80\x80",
    b"run-\xff",
)
# Text that looks like an id to a careless check.
TRICKY_TEXT = ("", " ", "nl\n", "a\nb", "a" * 129, "-leading", "photo-x", "..", "é", "\x00", "%s")

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_VARINT_TYPES = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_BOOL,
    FieldDescriptor.TYPE_ENUM,
}
_ZIGZAG_TYPES = {FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64}
_FIXED32_TYPES = {
    FieldDescriptor.TYPE_FIXED32,
    FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_FLOAT,
}
_FIXED64_TYPES = {
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
    FieldDescriptor.TYPE_DOUBLE,
}


# wire format --------------------------------------------------------------------------------


def varint(value: int) -> bytes:
    """A base-128 varint; negative numbers as their 64-bit two's complement (10 bytes)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63) if value < 0 else value << 1


def tag(number: int, wire_type: int) -> bytes:
    return varint((number << 3) | wire_type)


def delimited(number: int, payload: bytes) -> bytes:
    return tag(number, LENGTH) + varint(len(payload)) + payload


def _wire_type(field: FieldDescriptor) -> int:
    if field.type in _FIXED32_TYPES:
        return FIXED32
    if field.type in _FIXED64_TYPES:
        return FIXED64
    if field.type in _VARINT_TYPES or field.type in _ZIGZAG_TYPES:
        return VARINT
    return LENGTH


def _is_map(field: FieldDescriptor) -> bool:
    entry = field.message_type
    return field.is_repeated and entry is not None and entry.GetOptions().map_entry


# strategies ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pools:
    """Values the world knows, offered first (so shrinking prefers them): by field name,
    and for every string field of any name."""

    by_field: Mapping[str, Sequence[object]] = dataclasses.field(default_factory=dict)
    strings: Sequence[str] = ()


class RequestStrategies:
    """Strategies for request bytes (see the module docstring); one per descriptor and depth,
    built once."""

    def __init__(self, pools: Pools) -> None:
        self.pools = pools
        self._messages: dict[tuple[str, int], Bytes] = {}

    def request(self, descriptor: Descriptor, examples: Sequence[bytes] = ()) -> Bytes:
        """Any bytes a client could send as a request of this type."""
        well_formed = self.message(descriptor)
        base = st.one_of(st.sampled_from(examples), well_formed) if examples else well_formed
        fields = [self.field(field, 0) for field in descriptor.fields] or [st.just(b"")]
        overridden = st.tuples(base, st.one_of(fields)).map(b"".join)  # last one wins
        broken_text = self.invalid_utf8(descriptor)
        return st.one_of(
            base,
            overridden,
            *([st.tuples(base, broken_text).map(b"".join)] if broken_text is not None else []),
            st.tuples(base, unknown_fields()).map(b"".join),
            base.map(lambda data: data + delimited(19_999, b"u" * HUGE_BYTES[0])),
            base.flatmap(truncated),
            st.binary(max_size=48),
        )

    def invalid_utf8(self, descriptor: Descriptor) -> Bytes | None:
        """A string field of the request, or of a message field of it, holding bytes that are
        not UTF-8 (None when the request has no string field that deep)."""
        paths: list[tuple[int, ...]] = []
        for field in descriptor.fields:
            if field.type == FieldDescriptor.TYPE_STRING:
                paths.append((field.number,))
            elif field.message_type is not None and not _is_map(field):
                paths += [
                    (field.number, inner.number)
                    for inner in field.message_type.fields
                    if inner.type == FieldDescriptor.TYPE_STRING
                ]
        if not paths:
            return None
        return st.tuples(st.sampled_from(paths), st.sampled_from(INVALID_UTF8)).map(_nested)

    def message(self, descriptor: Descriptor, depth: int = 0) -> Bytes:
        """A message of this type, well-formed on the wire (its values need not be sane)."""
        key = (descriptor.full_name, depth)
        found = self._messages.get(key)
        if found is None:
            found = self._build_message(descriptor, depth)
            self._messages[key] = found
        return found

    def _build_message(self, descriptor: Descriptor, depth: int) -> Bytes:
        if depth > MAX_DEPTH:
            return st.just(b"")
        parts: list[Bytes] = []
        in_oneof: set[str] = set()
        for oneof in descriptor.oneofs:
            members = [self.field(field, depth) for field in oneof.fields]
            in_oneof.update(field.name for field in oneof.fields)
            one = st.one_of(members)
            # none, one member, or (what a careless client sends) two of them
            parts.append(st.one_of(st.just(b""), one, st.tuples(one, one).map(b"".join)))
        for field in descriptor.fields:
            if field.name not in in_oneof:
                parts.append(st.one_of(st.just(b""), self.field(field, depth)))
        return st.tuples(*parts).map(b"".join) if parts else st.just(b"")

    def field(self, field: FieldDescriptor, depth: int) -> Bytes:
        """One field, encoded with its tag: a single value, or a repeated or map field's
        elements (some of them packed, some a huge run of copies)."""
        if _is_map(field):
            assert field.message_type is not None
            entry = self.message(field.message_type, depth + 1)
            return st.lists(entry, max_size=3).map(
                lambda entries: b"".join(delimited(field.number, item) for item in entries)
            )
        single = self.value(field, depth)
        wire = _wire_type(field)
        if wire == LENGTH:
            one = single.map(lambda payload: delimited(field.number, payload))
        else:
            one = single.map(lambda payload: tag(field.number, wire) + payload)
        if not field.is_repeated:
            return st.one_of(one, st.tuples(one, one).map(b"".join))
        many = st.lists(one, max_size=4).map(b"".join)
        if depth > 0:  # huge cases at the top only: nested in lists, they would multiply
            return many
        huge = st.tuples(one, st.sampled_from(HUGE_REPEAT)).map(_repeated)
        if wire == LENGTH:
            return st.one_of(many, huge)
        packed = st.lists(single, min_size=1, max_size=4).map(
            lambda values: delimited(field.number, b"".join(values))
        )
        return st.one_of(many, packed, huge)

    def value(self, field: FieldDescriptor, depth: int) -> Bytes:
        """One value of the field's type, without its tag (nor its length, where delimited)."""
        known = self.pools.by_field.get(field.name, ())
        if field.message_type is not None:
            return self.message(field.message_type, depth + 1)
        if field.type == FieldDescriptor.TYPE_GROUP:
            return st.just(b"")  # no groups in proto3 contracts
        if field.type == FieldDescriptor.TYPE_STRING:
            return self._text(known)
        if field.type == FieldDescriptor.TYPE_BYTES:
            return _binary(known, huge=depth == 0)
        if field.type in _FIXED32_TYPES:
            return _fixed(field, 4)
        if field.type in _FIXED64_TYPES:
            return _fixed(field, 8)
        numbers = _integers(known)
        if field.enum_type is not None:
            defined = st.sampled_from([value.number for value in field.enum_type.values])
            numbers = st.one_of(defined, defined, defined, numbers)  # 1 in 4 outside the enum
        if field.type in _ZIGZAG_TYPES:
            return numbers.map(lambda number: varint(zigzag(number)))
        return numbers.map(varint)

    def _text(self, known: Sequence[object]) -> Bytes:
        pooled = [value for value in known if isinstance(value, str)] + list(self.pools.strings)
        texts: list[st.SearchStrategy[str]] = []
        if pooled:
            texts.append(st.sampled_from(pooled))
            texts.append(st.sampled_from(pooled).map(lambda value: value + "\n"))
        texts += [
            st.sampled_from(TRICKY_TEXT),
            st.text(max_size=24),
            st.sampled_from(HUGE_TEXT).map(lambda size: "x" * size),
        ]
        # surrogates are not UTF-8: invalid_utf8() sends those on purpose, here they'd be noise
        return st.one_of(texts).map(lambda text: text.encode("utf-8", "replace"))


def _integers(known: Sequence[object]) -> st.SearchStrategy[int]:
    pooled = [value for value in known if isinstance(value, int) and not isinstance(value, bool)]
    choices: list[st.SearchStrategy[int]] = [st.sampled_from(pooled)] if pooled else []
    choices += [
        st.sampled_from(INT_BOUNDARIES),
        st.integers(min_value=-5, max_value=120),
        st.integers(min_value=-(2**63), max_value=2**64 - 1),
    ]
    return st.one_of(choices)


def _nested(pair: tuple[tuple[int, ...], bytes]) -> bytes:
    """`payload` as the innermost field of the path of field numbers."""
    path, payload = pair
    for number in reversed(path):
        payload = delimited(number, payload)
    return payload


def _repeated(pair: tuple[bytes, int]) -> bytes:
    element, count = pair
    return element * max(1, min(count, HUGE_REPEAT_MAX_BYTES // max(len(element), 1)))


def _binary(known: Sequence[object], *, huge: bool) -> Bytes:
    pooled = [value for value in known if isinstance(value, bytes)]
    choices: list[Bytes] = [st.sampled_from(pooled)] if pooled else []
    choices.append(st.binary(max_size=32))
    if huge:
        choices.append(st.sampled_from(HUGE_BYTES).map(lambda size: b"\xff" * size))
    return st.one_of(choices)


def _fixed(field: FieldDescriptor, size: int) -> Bytes:
    floating = field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE)
    raw = st.binary(min_size=size, max_size=size)
    if not floating:
        return raw
    code = "<f" if size == 4 else "<d"
    values = FLOAT_SPECIALS if size == 4 else DOUBLE_SPECIALS
    specials = st.sampled_from(values).map(lambda value: struct.pack(code, value))
    nan = st.just(NAN_BITS[0] if size == 4 else NAN_BITS[1])
    return st.one_of(specials, nan, raw)


def unknown_fields() -> Bytes:
    """Fields no contract defines, of every wire type (numbers far above any in use)."""
    number = st.integers(min_value=9_000, max_value=2**29 - 1)
    return st.one_of(
        st.tuples(number, st.integers(min_value=0, max_value=2**64 - 1)).map(
            lambda pair: tag(pair[0], VARINT) + varint(pair[1])
        ),
        st.tuples(number, st.binary(max_size=16)).map(lambda pair: delimited(*pair)),
        st.tuples(number, st.binary(min_size=8, max_size=8)).map(
            lambda pair: tag(pair[0], FIXED64) + pair[1]
        ),
        st.tuples(number, st.binary(min_size=4, max_size=4)).map(
            lambda pair: tag(pair[0], FIXED32) + pair[1]
        ),
    )


def truncated(data: bytes) -> Bytes:
    """`data` cut short, when there is something to cut."""
    if len(data) < 2:
        return st.just(data[:0])
    return st.integers(min_value=1, max_value=len(data) - 1).map(lambda cut: data[:cut])
