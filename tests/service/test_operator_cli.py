"""The operator command lines against a real coordinator: publishing a model version into a
Triton repository and registering it, and registering the processor's runtime."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from testbed.harness.coordinator import CoordinatorHarness
from tools.model_repository.detector import CLASSES, build_detector, weights_sha256
from workshop.kit.model_repository import served_weights_sha256
from workshop.kit.processor_manifest import manifest_for
from workshop.v1 import operator_pb2 as op
from workshop.v1 import resources_pb2


async def _cli(c: CoordinatorHarness, *args: str) -> tuple[int, str, str]:
    """Runs `python -m <args>` with the coordinator and the admin key in the environment."""
    key = dict(c.admin)["authorization"].removeprefix("Bearer ")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        *args,
        env={
            **os.environ,
            "WORKSHOP_COORDINATOR": f"127.0.0.1:{c.port}",
            "WORKSHOP_KEY": key,
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def _versions(c: CoordinatorHarness) -> list[resources_pb2.ModelVersion]:
    reply = await c.operator.ListModelVersions(op.ListModelVersionsRequest(), metadata=c.admin)
    return list(reply.model_versions)


async def test_publish_writes_the_version_and_registers_it_once(
    coordinator: CoordinatorHarness, tmp_path: Path
) -> None:
    c = coordinator
    publish = ("tools.model_repository", "publish", "--repository", str(tmp_path), "--name", "det")
    code, out, err = await _cli(c, *publish, "--version", "1", "--demo-detector")
    assert code == 0, err
    printed = json.loads(out)
    expected = weights_sha256(build_detector(360, 640))
    assert printed["weights_sha256"] == expected
    assert printed["registered"] == "created"
    assert served_weights_sha256(tmp_path, "det", 1) == expected
    [version] = await _versions(c)
    assert (version.name, version.version, version.weights_sha256) == ("det", 1, expected)
    assert list(version.classes) == list(CLASSES)
    assert list(version.input_shape) == [360, 640, 3]

    code, out, err = await _cli(c, *publish, "--version", "1", "--demo-detector")
    assert code == 0, err
    assert json.loads(out)["registered"] == "already registered"

    # Other weights under the published version: refused, nothing changes anywhere.
    other = tmp_path / "other.onnx"
    other.write_bytes(build_detector(180, 320))
    classes = ",".join(CLASSES)
    code, out, err = await _cli(
        c,
        *publish,
        *("--version", "1", "--onnx", str(other), "--classes", classes),
        "--skip-triton-check",
    )
    assert code == 1
    assert "cannot publish" in err
    assert served_weights_sha256(tmp_path, "det", 1) == expected
    assert len(await _versions(c)) == 1


async def test_publish_refuses_bad_arguments_before_writing(
    coordinator: CoordinatorHarness, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    base = ("tools.model_repository", "publish", "--repository", str(repo), "--name", "det")
    code, _, err = await _cli(coordinator, *base, "--version", "1", "--onnx", "x.onnx")
    assert code == 2
    assert "cannot read x.onnx" in err
    model = tmp_path / "model.onnx"
    model.write_bytes(build_detector(360, 640))
    code, _, err = await _cli(coordinator, *base, "--version", "1", "--onnx", str(model))
    assert code == 2
    assert "--onnx needs --triton HOST:PORT" in err
    code, _, err = await _cli(coordinator, *base, "--version", "0", "--demo-detector")
    assert code == 1
    assert "versions start at 1" in err
    assert not repo.exists()
    assert await _versions(coordinator) == []


async def test_publish_without_a_coordinator_only_writes_files(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.model_repository",
        "publish",
        *("--repository", str(tmp_path), "--name", "det", "--version", "2"),
        *("--demo-detector", "--backend", "onnxruntime"),
        env={k: v for k, v in os.environ.items() if not k.startswith("WORKSHOP_")},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    assert process.returncode == 0
    assert "registered" not in json.loads(out)
    assert 'platform: "onnxruntime_onnx"' in (tmp_path / "det" / "config.pbtxt").read_text()


async def test_register_runtime_registers_this_code_on_a_registered_device(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    code, _, err = await _cli(c, "services.processor", "register-runtime", "--device", "gpu-box")
    assert code == 1
    assert "NOT_FOUND" in err
    await c.operator.RegisterDevice(op.RegisterDeviceRequest(device_id="gpu-box"), metadata=c.admin)

    code, out, err = await _cli(c, "services.processor", "register-runtime", "--device", "gpu-box")
    assert code == 0, err
    printed = json.loads(out)
    assert printed["runtime_id"] == manifest_for("gpu-box")["runtime_id"]
    assert printed["created"] is True
    reply = await c.operator.ListRuntimes(op.ListRuntimesRequest(), metadata=c.admin)
    [runtime] = reply.runtimes
    assert runtime.runtime_id == printed["runtime_id"]
    assert list(runtime.capabilities) == ["workshop-v3"]

    code, out, _ = await _cli(c, "services.processor", "register-runtime", "--device", "gpu-box")
    assert code == 0
    assert json.loads(out)["created"] is False


@pytest.mark.parametrize("missing", ["WORKSHOP_COORDINATOR", "WORKSHOP_KEY"])
async def test_register_runtime_needs_address_and_key(missing: str) -> None:
    env = {**os.environ, "WORKSHOP_COORDINATOR": "127.0.0.1:1", "WORKSHOP_KEY": "k"}
    del env[missing]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "services.processor", "register-runtime", "--device", "d"),
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    assert process.returncode == 2
    assert b"--coordinator" in err
