"""Publishing detector versions into a Triton model repository, on disk and on the real server."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcclient

from testbed.harness.triton import TritonServer
from tools.demo.scenes import Box, ground_truth, random_scene, render_frame
from tools.model_repository.detector import CLASSES, OUTPUT_NAMES, Thresholds, build_detector
from tools.model_repository.repository import (
    PYTHON_MODEL_SOURCE,
    RepositoryError,
    VersionConflictError,
    publish_version,
    served_classes,
    served_weights_sha256,
)

HEIGHT, WIDTH = 360, 640


@pytest.fixture(scope="module")
def v1() -> bytes:
    return build_detector(HEIGHT, WIDTH)


@pytest.fixture(scope="module")
def v2() -> bytes:
    return build_detector(HEIGHT, WIDTH, thresholds=Thresholds(high=0.55, low=0.3))


def test_publish_writes_version_files_and_config(tmp_path: Path, v1: bytes) -> None:
    files = publish_version(tmp_path, "detector", 1, v1, classes=CLASSES, instances=2, threads=3)

    version_dir = tmp_path / "detector" / "1"
    assert files.path == version_dir
    assert files.input_shape == (HEIGHT, WIDTH, 3)
    assert files.classes == CLASSES
    assert (version_dir / "model.onnx").read_bytes() == v1
    assert (version_dir / "model.py").read_text() == PYTHON_MODEL_SOURCE
    assert served_weights_sha256(tmp_path, "detector", 1) == files.weights_sha256
    assert served_classes(tmp_path, "detector", 1) == CLASSES
    config = (tmp_path / "detector" / "config.pbtxt").read_text()
    for expected in (
        'name: "detector"',
        'backend: "python"',
        "max_batch_size: 8",
        "version_policy: { all: {} }",
        "count: 2",
        'string_value: "3"',
        '{ name: "images" data_type: TYPE_UINT8 dims: [ 360, 640, 3 ] }',
        '{ name: "num_dets" data_type: TYPE_INT32 dims: [ 1 ] }',
        '{ name: "det_boxes" data_type: TYPE_FP32 dims: [ 3, 4 ] }',
        '{ name: "det_scores" data_type: TYPE_FP32 dims: [ 3 ] }',
        '{ name: "det_classes" data_type: TYPE_INT32 dims: [ 3 ] }',
    ):
        assert expected in config
    # The staging directory is gone: Triton sees only whole versions.
    assert sorted(p.name for p in (tmp_path / "detector").iterdir()) == ["1", "config.pbtxt"]


def test_onnxruntime_backend_has_a_platform_and_no_wrapper(tmp_path: Path, v1: bytes) -> None:
    publish_version(tmp_path, "ort", 1, v1, classes=CLASSES, backend="onnxruntime")

    config = (tmp_path / "ort" / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in config
    assert "backend:" not in config
    assert 'key: "intra_op_thread_count"' in config
    assert not (tmp_path / "ort" / "1" / "model.py").exists()


def test_versions_are_immutable_but_republishing_is_idempotent(
    tmp_path: Path, v1: bytes, v2: bytes
) -> None:
    first = publish_version(tmp_path, "detector", 1, v1, classes=CLASSES)
    config = tmp_path / "detector" / "config.pbtxt"
    config_mtime = config.stat().st_mtime_ns

    again = publish_version(tmp_path, "detector", 1, v1, classes=CLASSES)
    with pytest.raises(VersionConflictError):
        publish_version(tmp_path, "detector", 1, v2, classes=CLASSES)
    with pytest.raises(VersionConflictError):
        publish_version(tmp_path, "detector", 1, v1, classes=("person", "animal", "vehicle"))

    assert again == first
    # An unchanged config is left alone (Triton compares timestamps).
    assert config.stat().st_mtime_ns == config_mtime
    assert (tmp_path / "detector" / "1" / "model.onnx").read_bytes() == v1
    assert sorted(p.name for p in (tmp_path / "detector").iterdir()) == ["1", "config.pbtxt"]


def test_versions_of_one_model_must_share_tensors_and_backend(tmp_path: Path, v1: bytes) -> None:
    publish_version(tmp_path, "detector", 1, v1, classes=CLASSES)
    smaller = build_detector(180, 320)

    with pytest.raises(RepositoryError, match="other tensors"):
        publish_version(tmp_path, "detector", 2, smaller, classes=CLASSES)
    with pytest.raises(RepositoryError, match="backend"):
        publish_version(tmp_path, "detector", 2, v1, classes=CLASSES, backend="onnxruntime")
    assert not (tmp_path / "detector" / "2").exists()


def test_served_sha256_detects_replaced_weights(tmp_path: Path, v1: bytes, v2: bytes) -> None:
    publish_version(tmp_path, "detector", 1, v1, classes=CLASSES)
    (tmp_path / "detector" / "1" / "model.onnx").write_bytes(v2)

    with pytest.raises(RepositoryError, match="SHA-256"):
        served_weights_sha256(tmp_path, "detector", 1)


@pytest.mark.parametrize(
    ("name", "version", "classes"),
    [("", 1, CLASSES), ("a/b", 1, CLASSES), ("ok", 0, CLASSES), ("ok", 1, ())],
)
def test_publish_rejects_bad_arguments(
    tmp_path: Path, v1: bytes, name: str, version: int, classes: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError, match=r"name|version|classes"):
        publish_version(tmp_path, name, version, v1, classes=classes)


def test_python_model_source_compiles() -> None:
    compile(PYTHON_MODEL_SOURCE, "model.py", "exec")


async def infer(
    client: grpcclient.InferenceServerClient, name: str, version: int, frames: Any
) -> dict[str, Any]:
    images = grpcclient.InferInput("images", list(frames.shape), "UINT8")
    images.set_data_from_numpy(frames)
    result = await client.infer(
        name,
        [images],
        model_version=str(version),
        outputs=[grpcclient.InferRequestedOutput(n) for n in OUTPUT_NAMES],
    )
    return {n: result.as_numpy(n) for n in OUTPUT_NAMES}


def boxes_of(outputs: dict[str, Any], frame: int, classes: tuple[str, ...]) -> dict[str, Box]:
    count = int(outputs["num_dets"][frame, 0])
    found = {}
    for slot in range(count):
        name = classes[int(outputs["det_classes"][frame, slot])]
        x1, y1, x2, y2 = (float(v) for v in outputs["det_boxes"][frame, slot])
        found[name] = Box(name, x1, y1, x2 - x1, y2 - y1)
    return found


async def wait_until_unloaded(client: grpcclient.InferenceServerClient, name: str) -> None:
    """Unloading returns at once; the python stubs take about a second to go away."""
    for _ in range(200):
        index = await client.get_model_repository_index(as_json=True)
        states = {(m["name"], m.get("state")) for m in index["models"]}
        if (name, "READY") not in states:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"{name} was not unloaded within 10 s: {index}")


@pytest.mark.triton
async def test_triton_serves_a_new_version_next_to_the_old_one(
    triton_server: TritonServer, v1: bytes, v2: bytes
) -> None:
    repo = triton_server.model_repository
    name = f"detector_{secrets.token_hex(4)}"
    scene = random_scene(5)
    frames = np.stack([render_frame(scene, t) for t in (0.0, 1.0)])
    truth = [{b.class_name: b for b in ground_truth(scene, t)} for t in (0.0, 1.0)]
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    try:
        first = publish_version(repo, name, 1, v1, classes=CLASSES)
        await client.load_model(name)
        assert await client.is_model_ready(name, "1")
        served_v1 = await infer(client, name, 1, frames)
        assert [boxes_of(served_v1, i, CLASSES) for i in range(2)] == truth

        second = publish_version(repo, name, 2, v2, classes=CLASSES)
        assert second.weights_sha256 != first.weights_sha256
        # Version 1 keeps serving while version 2 loads: no restart, no downtime.
        loading = asyncio.ensure_future(client.load_model(name))
        served_during_load = 0
        while not loading.done():
            outputs = await infer(client, name, 1, frames[:1])
            assert boxes_of(outputs, 0, CLASSES) == truth[0]
            served_during_load += 1
        await loading
        assert served_during_load > 1

        assert await client.is_model_ready(name, "1")
        assert await client.is_model_ready(name, "2")
        metadata = await client.get_model_metadata(name, as_json=True)
        assert sorted(metadata["versions"]) == ["1", "2"]
        for version in (1, 2):
            outputs = await infer(client, name, version, frames)
            assert [boxes_of(outputs, i, CLASSES) for i in range(2)] == truth
        assert served_weights_sha256(repo, name, 2) == second.weights_sha256
    finally:
        await client.unload_model(name)
        await wait_until_unloaded(client, name)
        await client.close()
