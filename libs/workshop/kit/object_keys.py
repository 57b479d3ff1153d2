"""Object keys in the preview service's bucket (publication.proto), shared by the
coordinator (which checks and records them) and the preview service (which writes
the bytes before the coordinator records them).

`[workshop-tests/]previews|uploads/<run>/<job>/<generation>/<slot>.<ext>`: unique per
run, job, lease generation, slot and kind, so a retry under the same lease writes the
same key and a new lease never overwrites an old one's bytes. Test and photo runs live
under `workshop-tests/`, where an optional lifecycle rule may expire them.
"""

from __future__ import annotations

import dataclasses
import re

TEST_PREFIX = "workshop-tests/"
EXTENSIONS = {"image/jpeg": "jpg", "image/png": "png"}
CONTENT_TYPES = {extension: content_type for content_type, extension in EXTENSIONS.items()}
UNKNOWN_CONTENT_TYPE = "application/octet-stream"
_ATTEMPT_OBJECT = re.compile(r"(\d+)/(\d+)\.([a-z]+)")


def job_prefix(kind: str, run_id: str, job_id: str, *, test: bool) -> str:
    """`[workshop-tests/]<kind>s/<run>/<job>/`: every attempt's objects of that kind."""
    return f"{TEST_PREFIX if test else ''}{kind}s/{run_id}/{job_id}/"


def object_key(
    kind: str,
    run_id: str,
    job_id: str,
    generation: int,
    slot: int,
    *,
    test: bool,
    content_type: str,
) -> str:
    """The key of one slot's object of `kind` ("preview" or "upload") under one lease."""
    extension = EXTENSIONS[content_type]
    return f"{job_prefix(kind, run_id, job_id, test=test)}{generation}/{slot}.{extension}"


@dataclasses.dataclass(frozen=True)
class KeyParts:
    generation: int
    slot: int
    content_type: str


def parts_under(prefix: str, key: str) -> KeyParts | None:
    """Generation, slot and content type of a key under a job prefix; None if the key has
    some other shape (an object someone else put there)."""
    match = _ATTEMPT_OBJECT.fullmatch(key.removeprefix(prefix))
    if match is None or match.group(3) not in CONTENT_TYPES:
        return None
    return KeyParts(int(match.group(1)), int(match.group(2)), CONTENT_TYPES[match.group(3)])
