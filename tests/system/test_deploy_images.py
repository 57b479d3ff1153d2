"""What is checked of the Dockerfile without building it: it lints, its bases are
arguments pinned by exact tag, and each target installs its own lock and nothing else and
runs unprivileged. That each image runs its service from that lock alone is
tests/system/test_images_stack.py's (the images built and run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"
SERVICES = ("coordinator", "preview", "gateway", "processor")
# What pyproject.toml packages: the image's COPY lines and the test's copy alike.
PROJECT = ("pyproject.toml", "README.md", "libs", "services", "tools", "testbed")
COMMON = {"HOST": "127.0.0.1", "PORT": "0", "DRAIN_SECONDS": "0", "GRACE_SECONDS": "1"}


def targets() -> dict[str, str]:
    """Each build stage's name and its instructions."""
    stages = re.split(r"^FROM ", DOCKERFILE.read_text(), flags=re.MULTILINE)[1:]
    return {stage.split("\n", 1)[0].split(" AS ")[-1].strip(): stage for stage in stages}


def test_dockerfile_passes_hadolint() -> None:
    linted = subprocess.run(
        [str(HADOLINT), str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def base_defaults() -> dict[str, str]:
    """The Dockerfile's `ARG NAME=default` lines before its first FROM: the bases."""
    head = DOCKERFILE.read_text().split("\nFROM ", 1)[0]
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", head, flags=re.MULTILINE))


def test_bases_are_arguments_pinned_by_exact_tag() -> None:
    """`make images` passes a local base as BASE and PROCESSOR_BASE; the defaults are the
    registry bases, pinned by exact tag."""
    bases = base_defaults()
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", bases["BASE"]), bases
    assert re.fullmatch(r"[\w./-]+:\d[\w.-]*", bases["PROCESSOR_BASE"]), bases
    stages = {name: stage.split("\n", 1)[0].split(" AS ")[0] for name, stage in targets().items()}
    assert stages["python"] == "${BASE}"
    assert stages["processor"] == "${PROCESSOR_BASE}"


@pytest.mark.parametrize("service", [*SERVICES, "triton"])
def test_each_target_installs_its_own_lock_and_runs_unprivileged(service: str) -> None:
    stage = targets()[service]
    base = stage.split("\n", 1)[0].split(" AS ")[0]
    assert base in ("python", "${PROCESSOR_BASE}"), base
    locks = re.findall(r"requirements/(\w+)\.txt", stage)
    assert locks == [service]
    assert "--no-deps --require-hashes -r /tmp/requirements.txt" in stage
    # the host's pip settings and CA bundle only as build secrets, for the install alone
    assert "--mount=type=secret,id=pip.conf --mount=type=secret,id=ca-certificates.crt" in stage
    assert "PIP_CONFIG_FILE=/run/secrets/pip.conf" in stage
    assert "\nUSER 10001:10001\n" in stage
    if service == "triton":  # the bundled server; no Workshop code in it
        assert 'CMD ["tritonserver", ' in stage
        assert "/tmp/workshop" not in stage
        return
    assert "--no-deps --no-build-isolation /tmp/workshop" in stage
    assert f'CMD ["python", "-m", "services.{service}"]' in stage
