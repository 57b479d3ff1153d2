"""Reading a Triton model repository: what a version serves (no ONNX needed).

The processor reads these files from the repository it shares with Triton to
check that the version it will call is the one its run pinned.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

MODEL_FILE = "model.onnx"
LABELS_FILE = "labels.txt"
WEIGHTS_SHA256_FILE = "weights.sha256"


class RepositoryError(RuntimeError):
    """The repository does not hold what it should."""


def served_weights_sha256(repo: Path, name: str, version: int, *, verify: bool = True) -> str:
    """The weights pin recorded for a version; with `verify`, also checked against the file."""
    version_dir = repo / name / str(version)
    recorded = (version_dir / WEIGHTS_SHA256_FILE).read_text().strip()
    if verify:
        actual = hashlib.sha256((version_dir / MODEL_FILE).read_bytes()).hexdigest()
        if actual != recorded:
            raise RepositoryError(
                f"{name} version {version}: model.onnx has SHA-256 {actual}, "
                f"but {recorded} was published"
            )
    return recorded


def served_classes(repo: Path, name: str, version: int) -> tuple[str, ...]:
    """The class list of a version; `det_classes` values index into it."""
    text = (repo / name / str(version) / LABELS_FILE).read_text()
    return tuple(line for line in text.splitlines() if line)
