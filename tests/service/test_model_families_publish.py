"""`publish --onnx` with YOLO-family models on the real Triton and coordinator: the check on a
synthetic frame before anything is written, the version Triton then serves (planted boxes come
out exactly), the pin the coordinator records, and each refusal with nothing written or
recorded (docs/bring-your-own-model.md)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc.aio as grpcclient
from onnx import TensorProto, helper

from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.triton import TritonServer
from testbed.yolo_models import Planted, planted_model, yolov5_head, yolov8_head
from workshop.kit.model_io import CONTRACT_OUTPUTS, LETTERBOX_INPUT
from workshop.kit.model_repository import served_classes, served_weights_sha256
from workshop.v1 import operator_pb2 as op

pytestmark = pytest.mark.triton

NAMES = "{0: 'person', 1: 'car', 2: 'dog'}"
PLANTED = [
    Planted(1, 0.8, 100.0, 150.0, 300.0, 400.0),
    Planted(0, 0.6, 10.0, 20.0, 50.0, 60.0),
    Planted(1, 0.7, 110.0, 150.0, 310.0, 400.0),  # overlaps the first, same class: suppressed
]


async def publish(
    triton: TritonServer, repo: Path, model: Path, *args: str, coordinator: Any = None
) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKSHOP_")}
    if coordinator is not None:
        env["WORKSHOP_COORDINATOR"] = f"127.0.0.1:{coordinator.port}"
        env["WORKSHOP_KEY"] = dict(coordinator.admin)["authorization"].removeprefix("Bearer ")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.model_repository",
        "publish",
        *("--repository", str(repo), "--onnx", str(model), "--triton", triton.grpc_url),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def infer(
    client: grpcclient.InferenceServerClient, name: str, version: int, frames: Any
) -> dict[str, Any]:
    images = grpcclient.InferInput(LETTERBOX_INPUT, list(frames.shape), "UINT8")
    images.set_data_from_numpy(frames)
    result = await client.infer(
        name,
        [images],
        model_version=str(version),
        outputs=[grpcclient.InferRequestedOutput(n) for n in CONTRACT_OUTPUTS],
    )
    return {n: result.as_numpy(n) for n in CONTRACT_OUTPUTS}


def found(outputs: dict[str, Any], frame: int = 0) -> list[tuple[int, float, list[float]]]:
    return [
        (
            int(outputs["det_classes"][frame, k]),
            round(float(outputs["det_scores"][frame, k]), 5),
            [float(v) for v in outputs["det_boxes"][frame, k]],
        )
        for k in range(int(outputs["num_dets"][frame, 0]))
    ]


async def loaded_models(client: grpcclient.InferenceServerClient) -> set[str]:
    index = await client.get_model_repository_index(as_json=True)
    return {m["name"] for m in index.get("models", []) if m.get("state") == "READY"}


async def test_a_yolov8_export_is_checked_written_registered_and_served(
    coordinator: CoordinatorHarness, triton_server: TritonServer, tmp_path: Path
) -> None:
    c, repo = coordinator, triton_server.model_repository
    source = planted_model(yolov8_head(PLANTED, 3, 8400), names=NAMES)
    model = tmp_path / "yolov8n.onnx"
    model.write_bytes(source)
    name = f"yolo_{os.getpid()}_{id(tmp_path) % 10_000}"

    code, out, err = await publish(
        triton_server, repo, model, "--name", name, "--version", "1", coordinator=c
    )

    assert code == 0, err
    printed = json.loads(out)
    assert printed["family"] == "yolov8"
    assert printed["classes"] == ["person", "car", "dog"]
    assert printed["input_shape"] == [640, 640, 3]
    assert printed["source_sha256"] == hashlib.sha256(source).hexdigest()
    assert printed["weights_sha256"] == served_weights_sha256(repo, name, 1)
    assert printed["weights_sha256"] != printed["source_sha256"]  # the served graph is pinned
    assert (printed["confidence_threshold"], printed["iou_threshold"]) == (0.25, 0.45)
    assert printed["registered"] == "created"
    assert served_classes(repo, name, 1) == ("person", "car", "dog")
    config = (repo / name / "config.pbtxt").read_text()
    # A fixed batch of 1 (Ultralytics' default export) is served unbatched.
    assert "max_batch_size: 0" in config
    assert '{ name: "letterboxed_images" data_type: TYPE_UINT8 dims: [ 1, 640, 640, 3 ] }' in config
    assert json.loads((repo / name / "1" / "workshop.json").read_text())["family"] == "yolov8"
    [version] = (
        await c.operator.ListModelVersions(op.ListModelVersionsRequest(name=name), metadata=c.admin)
    ).model_versions
    assert (version.family, version.source_sha256) == ("yolov8", printed["source_sha256"])
    assert (version.confidence_threshold, version.iou_threshold) == (0.25, 0.45)
    assert (version.max_detections, list(version.input_shape)) == (100, [640, 640, 3])

    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    try:
        assert not any(m.startswith("workshop-check-") for m in await loaded_models(client))
        await client.load_model(name)
        frames = np.full((1, 640, 640, 3), 114, np.uint8)
        assert found(await infer(client, name, 1, frames)) == [
            (1, 0.8, [100.0, 150.0, 300.0, 400.0]),
            (0, 0.6, [10.0, 20.0, 50.0, 60.0]),
        ]
        # A processor that does not letterbox (release 0.1 sends `images`) is refused.
        stale = grpcclient.InferInput("images", [1, 640, 640, 3], "UINT8")
        stale.set_data_from_numpy(frames)
        with pytest.raises(Exception, match="images"):
            await client.infer(name, [stale], model_version="1")

        # The same file again: nothing changes; other thresholds are other served weights.
        code, out, err = await publish(
            triton_server, repo, model, "--name", name, "--version", "1", coordinator=c
        )
        assert (code, json.loads(out)["registered"]) == (0, "already registered"), err
        code, out, err = await publish(
            triton_server, repo, model, "--name", name, "--version", "1", "--iou", "0.6"
        )
        assert code == 1
        assert "already holds other weights or classes; publish a new version" in err
    finally:
        await client.unload_model(name)
        await client.close()


async def test_a_dynamic_yolov5_export_is_letterboxed_to_the_input_size_and_batched(
    triton_server: TritonServer, tmp_path: Path
) -> None:
    repo = triton_server.model_repository
    first = [Planted(2, 0.9, 10.0, 10.0, 100.0, 90.0)]
    second = [Planted(0, 0.5, 1.0, 2.0, 3.0, 4.0)]
    model = tmp_path / "yolov5s.onnx"
    model.write_bytes(
        planted_model(
            yolov5_head(first, 3, 6300),
            second=yolov5_head(second, 3, 6300),
            size=(None, None),
            batch=None,
            opset=12,
        )
    )
    name = f"yolov5_{os.getpid()}"
    code, out, err = await publish(
        triton_server, repo, model, "--name", name, "--version", "1", "--classes", "a,b,c"
    )
    assert code == 1
    assert "dynamic height and width" in err
    assert "--input-size" in err
    assert not (repo / name).exists()

    code, out, err = await publish(
        triton_server,
        repo,
        model,
        *("--name", name, "--version", "1", "--classes", "a,b,c", "--input-size", "320"),
    )
    assert code == 0, err
    assert json.loads(out)["input_shape"] == [320, 320, 3]
    config = (repo / name / "config.pbtxt").read_text()
    assert "max_batch_size: 8" in config
    assert "dynamic_batching" in config
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    try:
        await client.load_model(name)
        frames = np.zeros((2, 320, 320, 3), np.uint8)
        frames[1, 0, 0, 0] = 255
        outputs = await infer(client, name, 1, frames)
        assert found(outputs, 0) == [(2, 0.9, [10.0, 10.0, 100.0, 90.0])]
        assert found(outputs, 1) == [(0, 0.5, [1.0, 2.0, 3.0, 4.0])]
    finally:
        await client.unload_model(name)
        await client.close()


def _tensorrt_nms_model() -> bytes:
    """What `export format=engine nms=True`-style graphs hold: TensorRT's EfficientNMS plugin,
    which onnxruntime (and so Triton's CPU backends) cannot run."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["images"], ["pooled"], axes=[1], keepdims=0),
            helper.make_node("Reshape", ["pooled", "box_shape"], ["boxes"]),
            helper.make_node("Reshape", ["pooled", "score_shape"], ["scores"]),
            helper.make_node(
                "EfficientNMS_TRT",
                ["boxes", "scores"],
                list(CONTRACT_OUTPUTS),
                domain="TRT",
                max_output_boxes=100,
            ),
        ],
        "trt_nms",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
        [
            helper.make_tensor_value_info("num_dets", TensorProto.INT32, [1, 1]),
            helper.make_tensor_value_info("det_boxes", TensorProto.FLOAT, [1, 100, 4]),
            helper.make_tensor_value_info("det_scores", TensorProto.FLOAT, [1, 100]),
            helper.make_tensor_value_info("det_classes", TensorProto.INT32, [1, 100]),
        ],
        initializer=[
            helper.make_tensor("box_shape", TensorProto.INT64, [3], [1, 1024, 4]),
            helper.make_tensor("score_shape", TensorProto.INT64, [3], [1, 4096, 1]),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 12), helper.make_opsetid("TRT", 1)]
    )
    model.ir_version = 8
    return model.SerializeToString()


def _contract_model_naming_class(index: int) -> bytes:
    """A float NCHW model emitting the contract with one detection of class `index`."""
    constants: dict[str, tuple[list[int], int, list[float]]] = {
        "num_dets": ([1, 1], TensorProto.INT32, [1]),
        "det_boxes": ([1, 1, 4], TensorProto.FLOAT, [1.0, 2.0, 3.0, 4.0]),
        "det_scores": ([1, 1], TensorProto.FLOAT, [0.9]),
        "det_classes": ([1, 1], TensorProto.INT32, [index]),
    }
    graph = helper.make_graph(
        [helper.make_node("Identity", [f"{n}_value"], [n]) for n in CONTRACT_OUTPUTS],
        "contract",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info(n, t, dims) for n, (dims, t, _) in constants.items()],
        initializer=[
            helper.make_tensor(f"{n}_value", t, dims, values)
            for n, (dims, t, values) in constants.items()
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


@pytest.mark.parametrize(
    ("model", "args", "message"),
    [
        (
            _tensorrt_nms_model(),
            ("--classes", "a,b"),
            "Triton at .* cannot load the model: .*EfficientNMS_TRT",
        ),
        (
            _contract_model_naming_class(5),
            ("--classes", "a,b,c"),
            "the model answered class index 5, but it has 3 class names",
        ),
        (
            planted_model(yolov8_head(PLANTED, 3, 8400)),
            ("--classes", "a,b"),
            "2 class names, but the yolov8 output output0 holds 3 class scores",
        ),
        (
            planted_model(yolov8_head(PLANTED, 3, 8400)),
            (),
            "no class names: the ONNX metadata has no 'names'",
        ),
        (
            planted_model(np.zeros((1, 84), np.float32), names=NAMES),
            (),
            r"unsupported output layout: output0 \[1, 84\]",
        ),
    ],
    ids=["triton-cannot-load", "class-out-of-range", "class-count", "no-names", "layout"],
)
async def test_refusals_write_and_record_nothing(
    coordinator: CoordinatorHarness,
    triton_server: TritonServer,
    tmp_path: Path,
    model: bytes,
    args: tuple[str, ...],
    message: str,
) -> None:
    repo = tmp_path / "repo"
    path = tmp_path / "model.onnx"
    path.write_bytes(model)
    code, out, err = await publish(
        triton_server,
        repo,
        path,
        *("--name", "refused", "--version", "1", *args),
        coordinator=coordinator,
    )
    assert code == 1, (out, err)
    assert err.startswith("cannot publish: ")
    assert re.search(message, err), err
    assert not repo.exists()
    reply = await coordinator.operator.ListModelVersions(
        op.ListModelVersionsRequest(), metadata=coordinator.admin
    )
    assert list(reply.model_versions) == []
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    try:
        assert not any(m.startswith("workshop-check-") for m in await loaded_models(client))
    finally:
        await client.close()


async def test_a_triton_that_does_not_answer_is_named(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(planted_model(yolov8_head(PLANTED, 3, 8400), names=NAMES))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.model_repository",
        "publish",
        *("--repository", str(tmp_path / "repo"), "--onnx", str(path)),
        *("--name", "m", "--version", "1", "--triton", "127.0.0.1:1"),
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    assert process.returncode == 1
    assert "Triton at 127.0.0.1:1 did not answer" in err.decode()
    assert not (tmp_path / "repo").exists()
