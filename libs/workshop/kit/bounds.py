"""Bounds on what an error carries back to the caller.

An error travels in the call's trailers twice: as `grpc-message` (percent-encoded,
so up to 3 bytes on the wire per byte of UTF-8) and inside `grpc-status-details-bin`
(base64 of a google.rpc.Status holding the message again and the ErrorInfo). Clients
cap the trailer block (grpc's default is 16 KiB); past it the caller sees
RESOURCE_EXHAUSTED "Stream removed" instead of the error. Messages quote what the
caller sent, which may be huge, so every error is cut here before it leaves:

- a quoted value ('...' or "...") longer than `QUOTED_VALUE_MAX_CHARS` keeps its
  first characters and an ellipsis;
- the message is at most `MESSAGE_MAX_BYTES` of UTF-8;
- an ErrorInfo metadata value is a value too when it is one token (an id, a
  number): shortened the same way; a longer text (the JSON of a workflow's
  problems) has its quoted values shortened;
- ErrorInfo metadata has at most `METADATA_MAX_ENTRIES` entries and
  `METADATA_MAX_BYTES` of keys and values together.

So `grpc-message` is at most 3 KiB on the wire and the other trailers, with
`grpc-status-details-bin`, at most `TRAILERS_MAX_BYTES` (9 KiB): 12 KiB in all,
inside the 16 KiB a client accepts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

QUOTED_VALUE_MAX_CHARS = 200
MESSAGE_MAX_BYTES = 1024
METADATA_MAX_ENTRIES = 16
METADATA_MAX_BYTES = 5 * 1024
METADATA_KEY_MAX_BYTES = 64
# What follows for the trailers a client reads (keys and values; grpc-message aside):
# grpc-status-details-bin is base64 of at most about 6.3 KiB of Status.
TRAILERS_MAX_BYTES = 9 * 1024
ELLIPSIS = "…"

# A quoted value starts at a quote that does not follow a letter or digit (so the
# apostrophe of "doesn't" starts nothing) and runs to its closing quote, escapes included.
_QUOTED = re.compile(r"""(?<!\w)'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*\"""", re.DOTALL)


def shortened(value: str, max_chars: int = QUOTED_VALUE_MAX_CHARS) -> str:
    """`value` with at most `max_chars` characters, an ellipsis marking a cut."""
    return value if len(value) <= max_chars else value[:max_chars] + ELLIPSIS


def _shorten_quoted(match: re.Match[str]) -> str:
    quoted = match.group(0)
    inner = quoted[1:-1]
    if len(inner) <= QUOTED_VALUE_MAX_CHARS:
        return quoted
    return quoted[0] + shortened(inner) + quoted[-1]


def cut_to_bytes(text: str, max_bytes: int) -> str:
    """`text` in at most `max_bytes` of UTF-8, cut on a character boundary with an ellipsis
    (a lone surrogate, which UTF-8 cannot carry, becomes '?')."""
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= max_bytes:
        return encoded.decode("utf-8")
    room = max(max_bytes - len(ELLIPSIS.encode()), 0)
    return encoded[:room].decode("utf-8", "ignore") + ELLIPSIS


def bounded_text(text: str, max_bytes: int) -> str:
    """`text` with long quoted values shortened, then cut to `max_bytes` of UTF-8."""
    return cut_to_bytes(_QUOTED.sub(_shorten_quoted, text), max_bytes)


def bounded_message(message: str) -> str:
    """An error message as it may leave the server (see the module docstring)."""
    return bounded_text(message, MESSAGE_MAX_BYTES)


def bounded_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """ErrorInfo metadata as it may leave the server (see the module docstring).

    The budget goes to the smallest entries first, so the facts a program reads (a
    revision, a count) survive next to a large one, which gets what is left; an entry
    that no longer fits at all is left out. The entries keep their order.
    """
    entries = list(metadata.items())[:METADATA_MAX_ENTRIES]
    by_size = sorted(range(len(entries)), key=lambda index: _size(*entries[index]))
    kept: dict[int, tuple[str, str]] = {}
    left = METADATA_MAX_BYTES
    for index in by_size:
        key, value = entries[index]
        name = cut_to_bytes(key, METADATA_KEY_MAX_BYTES)
        room = left - _size(name, "")
        if room <= len(ELLIPSIS.encode()):
            break
        single = not any(character.isspace() for character in value)
        text = cut_to_bytes(shortened(value), room) if single else bounded_text(value, room)
        kept[index] = (name, text)
        left = room - _size("", text)
    return dict(kept[index] for index in sorted(kept))


def _size(key: str, value: str) -> int:
    return len(key.encode("utf-8", "replace")) + len(value.encode("utf-8", "replace"))
