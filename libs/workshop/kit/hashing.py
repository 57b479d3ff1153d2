"""Canonical JSON and SHA-256 helpers, and the runtime id (docs/concepts.md).

The runtime id must be reproducible by anyone holding the manifest, so the JSON
form is fixed: sorted keys, no insignificant whitespace, UTF-8, no ASCII escaping.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RUNTIME_ID_PREFIX = "workshop-"
RUNTIME_ID_HEX_CHARS = 32


def canonical_json(value: Any) -> bytes:
    """Serialize `value` as canonical JSON bytes (sorted keys, no spaces, UTF-8)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    """Lower-case hex SHA-256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def runtime_manifest(*, engine: str, device_id: str, code_sha256: str) -> dict[str, str]:
    """The manifest a runtime id is computed from (docs/concepts.md)."""
    return {"engine": engine, "device_id": device_id, "code_sha256": code_sha256}


def runtime_id(*, engine: str, device_id: str, code_sha256: str) -> str:
    """`workshop-` + the first 32 hex chars of SHA-256 over the canonical manifest JSON."""
    manifest = runtime_manifest(engine=engine, device_id=device_id, code_sha256=code_sha256)
    return RUNTIME_ID_PREFIX + sha256_hex(canonical_json(manifest))[:RUNTIME_ID_HEX_CHARS]


def tree_sha256(root: Path, files: Iterable[Path]) -> str:
    """SHA-256 over files given by path, in sorted relative-path order.

    Each file contributes its POSIX relative path, a NUL, its length in decimal,
    a NUL and its bytes, so that moving bytes from one file to the next, or
    renaming a file, changes the digest.
    """
    digest = hashlib.sha256()
    for relative in sorted(path.relative_to(root).as_posix() for path in files):
        content = (root / relative).read_bytes()
        digest.update(relative.encode("utf-8") + b"\0")
        digest.update(str(len(content)).encode("ascii") + b"\0")
        digest.update(content)
    return digest.hexdigest()
