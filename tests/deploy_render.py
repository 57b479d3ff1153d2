"""Rendering deploy/k8s with kustomize, for the offline checks of the manifests.

The renderer is `kubectl kustomize` (kustomize v5, kubectl 1.27 or newer) from PATH. No
wheel on the package index ships kubectl, and Debian 12's `kubernetes-client` is kubectl
1.20 with kustomize v2, which knows neither `labels`, `replicas` nor inline patches; the
tests that render skip with the reason when no such kubectl is found
(docs/deployment.md, "Validating offline").
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("base", "overlays/dev", "overlays/prod-gpu")
MIN_KUSTOMIZE = (5, 0)

Document = dict[str, Any]


@functools.cache
def kubectl() -> str | None:
    """Path of a kubectl whose kustomize renders these manifests, else None."""
    path = shutil.which("kubectl")
    if path is None:
        return None
    shown = subprocess.run(
        [path, "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if shown.returncode != 0:
        return None
    version = json.loads(shown.stdout).get("kustomizeVersion", "")
    found = re.match(r"v?(\d+)\.(\d+)", version)
    if found is None or (int(found[1]), int(found[2])) < MIN_KUSTOMIZE:
        return None
    return path


def require_kubectl() -> str:
    path = kubectl()
    if path is None:
        pytest.skip(
            "no kubectl with kustomize v5 on PATH (kubectl 1.27+; Debian 12's "
            "kubernetes-client 1.20 is too old): the manifests are not rendered"
        )
    return path


@functools.cache
def rendered(overlay: str) -> tuple[Document, ...]:
    """Every document `kubectl kustomize deploy/k8s/<overlay>` prints."""
    done = subprocess.run(
        [require_kubectl(), "kustomize", str(K8S / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def of_kind(documents: tuple[Document, ...], *kinds: str) -> list[Document]:
    return [doc for doc in documents if doc["kind"] in kinds]


def named(documents: tuple[Document, ...], kind: str, name: str) -> Document:
    matches = [d for d in of_kind(documents, kind) if d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} documents"
    return matches[0]


def pod_spec(workload: Document) -> Document:
    spec: Document = workload["spec"]["template"]["spec"]
    return spec


def containers(spec: Document) -> list[Document]:
    """The pod's containers, init containers (native sidecars) included."""
    return [*spec.get("initContainers", []), *spec["containers"]]


WORKLOADS = ("Deployment", "StatefulSet", "Job", "DaemonSet")
