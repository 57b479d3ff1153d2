"""What can be proved of the images without a container engine: the Dockerfile lints,
each target installs its own lock and nothing else, and each service's lock alone,
installed into a fresh virtualenv the way its image installs it, runs that service."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from testbed.harness.processes import GATEWAY_ALONE, PROCESSOR_ALONE, prefixed
from testbed.harness.s3 import S3Server

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


def installed(service: str, root: Path) -> Path:
    """A new virtualenv holding only requirements/<service>.txt and this project (no deps),
    installed from the package index pip is configured with; its python."""
    python3_11 = shutil.which("python3.11")
    if python3_11 is None:
        pytest.skip("python3.11 is not on PATH")
    venv = root / "venv"
    source = root / "source"
    for name in PROJECT:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, source / name)
    lock = ROOT / "requirements" / f"{service}.txt"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps"]
    env = clean_env()
    for command in (
        [python3_11, "-m", "venv", str(venv)],
        [*pip, "--require-hashes", "-r", str(lock)],
        [*pip, "--no-build-isolation", str(source)],
    ):
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=300, check=False, env=env, cwd=root
        )
        assert done.returncode == 0, done.stderr[-3000:]
    return venv / "bin" / "python"


def clean_env(extra: Mapping[str, str] = {}) -> dict[str, str]:
    """This environment without what would let the repository or another venv leak in."""
    dropped = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
    return {
        **{key: value for key, value in os.environ.items() if key not in dropped},
        "PIP_NO_CACHE_DIR": "1",
        **extra,
    }


@contextlib.contextmanager
def serving(python: Path, service: str, env: Mapping[str, str], root: Path) -> Iterator[int]:
    """`python -m services.<service>` from the venv, outside the repository; its gRPC port
    once it announces `serving`. Stopped with SIGTERM, which must end it with status 0."""
    log = (root / f"{service}.log").open("wb")
    process = subprocess.Popen(
        [str(python), "-I", "-m", f"services.{service}"],
        cwd=root,
        env=clean_env(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == "serving":
                    yield int(event["port"])
                    break
        else:
            log.flush()
            pytest.fail(f"{service} exited: {(root / f'{service}.log').read_text()[-3000:]}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
        log.close()


def check_serving(port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def assert_only_its_extra(python: Path, absent: list[str]) -> None:
    """The venv's `services` is its own installed copy, and other extras are absent."""
    probe = (
        "import importlib.util, json, services; print(json.dumps([services.__file__, "
        f"[m for m in {absent!r} if importlib.util.find_spec(m)]]))"
    )
    done = subprocess.run(
        [str(python), "-I", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=clean_env(),
        cwd=python.parent,
    )
    location, present = json.loads(done.stdout)
    assert location.startswith(str(python.parent.parent)), location
    assert present == []


@pytest.mark.slow
def test_gateway_runs_from_its_lock_alone(tmp_path: Path) -> None:
    started = time.monotonic()
    python = installed("gateway", tmp_path)
    print(f"gateway lock installed in {time.monotonic() - started:.1f} s")
    assert_only_its_extra(python, ["asyncpg", "minio", "nvidia", "tritonclient"])
    env = prefixed("GATEWAY", {**GATEWAY_ALONE, **COMMON})
    with serving(python, "gateway", env, tmp_path) as port:
        check_serving(port)


@pytest.mark.slow
def test_coordinator_migrates_and_runs_from_its_lock_alone(pg_dsn: str, tmp_path: Path) -> None:
    python = installed("coordinator", tmp_path)
    assert_only_its_extra(python, ["minio", "starlette", "nvidia", "tritonclient"])
    env = prefixed("COORDINATOR", {**COMMON, "DATABASE_URL": pg_dsn})
    migrated = subprocess.run(
        [str(python), "-I", "-m", "services.coordinator", "migrate"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=clean_env(env),
        cwd=tmp_path,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout.splitlines()[-1])["event"] == "migrated"
    with serving(python, "coordinator", env, tmp_path) as port:
        check_serving(port)


@pytest.mark.slow
def test_preview_runs_from_its_lock_alone(s3_server: S3Server, tmp_path: Path) -> None:
    python = installed("preview", tmp_path)
    assert_only_its_extra(python, ["asyncpg", "starlette", "nvidia", "tritonclient"])
    env = prefixed(
        "PREVIEW",
        {
            **COMMON,
            "S3_ENDPOINT": s3_server.endpoint,
            "S3_ACCESS_KEY": s3_server.access_key,
            "S3_SECRET_KEY": s3_server.secret_key,
            "BUCKET": "workshop-image-test",
            "SERVICE_KEY": "wk_not_used_here.unused",
            "CLEANUP_INTERVAL_SECONDS": "0",
        },
    )
    with serving(python, "preview", env, tmp_path) as port:
        check_serving(port)


@pytest.mark.slow
@pytest.mark.timeout(600)  # 1.3 GB of wheels (DALI): over two minutes on a busy 2-core machine
def test_processor_runs_from_its_lock_alone(tmp_path: Path) -> None:
    python = installed("processor", tmp_path)
    assert_only_its_extra(python, ["asyncpg", "starlette"])
    env = prefixed("PROCESSOR", {**PROCESSOR_ALONE, **COMMON})
    with serving(python, "processor", env, tmp_path) as port:
        check_serving(port)
