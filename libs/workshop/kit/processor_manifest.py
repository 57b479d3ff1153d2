"""The processor's runtime identity (docs/concepts.md): its manifest, code_sha256 and the
RegisterRuntime request for its code.

`code_sha256` covers every source file of the processor package (`services/processor`,
sorted relative paths and contents), so any change to processor code changes the runtime
id and needs a new runtime registration. The processor (`workshop-manifest`,
`register-runtime`, the runtime it claims for) and the `workshop` command line (`runtimes
register`, `doctor`'s runtime check) must compute the same id, so this lives in the kit:
tools never import a service (docs/architecture.md, "Import rules"). The package is found
by name (`find_spec`), which locates its files without running any processor code: they
are hashed as data, never imported from here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from workshop.kit.hashing import runtime_id, runtime_manifest, tree_sha256
from workshop.v1 import operator_pb2

PACKAGE = "services.processor"
ENGINE = "workshop-processor"
# Capabilities of the processor's code: it tracks objects across frames.
CAPABILITIES = ("workshop-v3",)
_SKIPPED_DIRS = frozenset({"__pycache__"})
_SKIPPED_SUFFIXES = frozenset({".pyc", ".pyo"})


def package_root() -> Path:
    """The directory of the installed processor package, found without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"{PACKAGE} is not installed beside workshop: no processor code")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def source_files(root: Path) -> list[Path]:
    """Every file of the package at `root` except caches."""
    return [
        path
        for path in root.rglob("*")
        if path.is_file()
        and not _SKIPPED_DIRS.intersection(path.relative_to(root).parts)
        and path.suffix not in _SKIPPED_SUFFIXES
    ]


def code_sha256(root: Path | None = None) -> str:
    """The digest of the processor's code (of the package at `root`, for tests)."""
    root = root or package_root()
    return tree_sha256(root, source_files(root))


def manifest_for(device_id: str, root: Path | None = None) -> dict[str, str]:
    """The manifest, plus the runtime id it yields."""
    digest = code_sha256(root)
    manifest = runtime_manifest(engine=ENGINE, device_id=device_id, code_sha256=digest)
    return {
        **manifest,
        "runtime_id": runtime_id(engine=ENGINE, device_id=device_id, code_sha256=digest),
    }


def registration(device_id: str, root: Path | None = None) -> operator_pb2.RegisterRuntimeRequest:
    """The RegisterRuntime request for this code on `device_id`."""
    return operator_pb2.RegisterRuntimeRequest(
        device_id=device_id,
        engine=ENGINE,
        code_sha256=code_sha256(root),
        capabilities=CAPABILITIES,
    )
