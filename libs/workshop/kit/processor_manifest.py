"""The processor's runtime identity (docs/concepts.md).

`code_sha256` covers every source file of this package (sorted relative paths
and contents), so any change to processor code changes the runtime id and needs
a new runtime registration.
"""

from __future__ import annotations

from pathlib import Path

from workshop.kit.hashing import runtime_id, runtime_manifest, tree_sha256
from workshop.v1 import operator_pb2

PACKAGE_ROOT = Path(__file__).resolve().parent
ENGINE = "workshop-processor"
# Capabilities of this code: it tracks objects across frames.
CAPABILITIES = ("workshop-v3",)
_SKIPPED_DIRS = frozenset({"__pycache__"})
_SKIPPED_SUFFIXES = frozenset({".pyc", ".pyo"})


def source_files(root: Path = PACKAGE_ROOT) -> list[Path]:
    """Every file of the processor package except caches."""
    return [
        path
        for path in root.rglob("*")
        if path.is_file()
        and not _SKIPPED_DIRS.intersection(path.relative_to(root).parts)
        and path.suffix not in _SKIPPED_SUFFIXES
    ]


def code_sha256(root: Path = PACKAGE_ROOT) -> str:
    return tree_sha256(root, source_files(root))


def manifest_for(device_id: str, root: Path = PACKAGE_ROOT) -> dict[str, str]:
    """The manifest, plus the runtime id it yields."""
    digest = code_sha256(root)
    manifest = runtime_manifest(engine=ENGINE, device_id=device_id, code_sha256=digest)
    return {
        **manifest,
        "runtime_id": runtime_id(engine=ENGINE, device_id=device_id, code_sha256=digest),
    }


def registration(device_id: str, root: Path = PACKAGE_ROOT) -> operator_pb2.RegisterRuntimeRequest:
    """The RegisterRuntime request for this code on `device_id`."""
    return operator_pb2.RegisterRuntimeRequest(
        device_id=device_id,
        engine=ENGINE,
        code_sha256=code_sha256(root),
        capabilities=CAPABILITIES,
    )
