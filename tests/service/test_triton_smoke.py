"""The bundled Triton loads, serves and unloads an ONNX model built in the test."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc.aio as grpcclient
from onnx import TensorProto, helper, numpy_helper

from testbed.harness.triton import (
    PythonModelConfig,
    TensorSpec,
    TritonServer,
    write_onnx_python_model,
)
from tests.processor_gates import until

pytestmark = pytest.mark.triton

MODEL = "smoke_affine"
JOINED_MODEL = "smoke_affine_joined"


def affine_onnx() -> bytes:
    """y = float(x) * 2 + 1 for uint8 x of shape [batch, 4]."""
    graph = helper.make_graph(
        nodes=[
            helper.make_node("Cast", ["x"], ["x_float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x_float", "two"], ["doubled"]),
            helper.make_node("Add", ["doubled", "one"], ["y"]),
        ],
        name="affine",
        inputs=[helper.make_tensor_value_info("x", TensorProto.UINT8, ["batch", 4])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[
            numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
            numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # onnxruntime reads IR versions up to its own release; pin one every release reads.
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


AFFINE_CONFIG = PythonModelConfig(
    inputs=(TensorSpec("x", "UINT8", (4,)),),
    outputs=(TensorSpec("y", "FP32", (4,)),),
    max_batch_size=8,
)


def affine_input(batch: np.ndarray[Any, np.dtype[np.uint8]]) -> grpcclient.InferInput:
    x = grpcclient.InferInput("x", list(batch.shape), "UINT8")
    x.set_data_from_numpy(batch)
    return x


async def wait_until_unloaded(client: grpcclient.InferenceServerClient, name: str) -> None:
    """Unloading returns at once; the python stub takes about a second to go away."""
    for _ in range(200):
        index = await client.get_model_repository_index(as_json=True)
        states = {(m["name"], m.get("state"), m.get("reason")) for m in index["models"]}
        if (name, "UNAVAILABLE", "unloaded") in states:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"{name} was not unloaded within 10 s: {index}")


async def test_bundled_triton_serves_onnx_model_over_grpc(triton_server: TritonServer) -> None:
    write_onnx_python_model(triton_server.model_repository, MODEL, 1, affine_onnx(), AFFINE_CONFIG)
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    try:
        await client.load_model(MODEL)
        assert await client.is_model_ready(MODEL, "1")
        metadata = await client.get_model_metadata(MODEL, as_json=True)
        assert metadata["versions"] == ["1"]

        batch = np.array([[0, 1, 2, 3], [100, 127, 254, 255]], dtype=np.uint8)
        result = await client.infer(
            MODEL,
            [affine_input(batch)],
            model_version="1",
            outputs=[grpcclient.InferRequestedOutput("y")],
        )
        y = result.as_numpy("y")

        assert y.dtype == np.float32
        assert y.tolist() == [[1.0, 3.0, 5.0, 7.0], [201.0, 255.0, 509.0, 511.0]]

        await client.unload_model(MODEL)
        assert not await client.is_model_ready(MODEL, "1")
        await wait_until_unloaded(client, MODEL)
    finally:
        await client.close()


async def test_python_model_splits_a_joined_batch_back_per_request(
    triton_server: TritonServer,
) -> None:
    """Dynamic batching hands three requests to one execute(); each gets its own rows back."""
    config = replace(AFFINE_CONFIG, max_queue_delay_microseconds=500_000)
    write_onnx_python_model(triton_server.model_repository, JOINED_MODEL, 1, affine_onnx(), config)
    batches = [np.full((rows, 4), rows * 10, dtype=np.uint8) for rows in (1, 2, 3)]
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    try:
        await client.load_model(JOINED_MODEL)
        results = await asyncio.gather(
            *(client.infer(JOINED_MODEL, [affine_input(batch)]) for batch in batches)
        )
        # Triton counts a batch after its responses are sent: wait until it has (its JSON
        # leaves a zero count out, which failed once under a loaded clean-clone CI run).
        stats: dict[str, Any] = {}

        async def counted() -> bool:
            stats.update(await client.get_inference_statistics(JOINED_MODEL, "1", as_json=True))
            return "inference_count" in stats["model_stats"][0]

        await until(counted, "Triton's statistics count the batch")
        await client.unload_model(JOINED_MODEL)
        await wait_until_unloaded(client, JOINED_MODEL)
    finally:
        await client.close()

    assert [r.as_numpy("y").tolist() for r in results] == [
        [[21.0] * 4],
        [[41.0] * 4] * 2,
        [[61.0] * 4] * 3,
    ]
    (model_stats,) = stats["model_stats"]
    assert int(model_stats["inference_count"]) == 6
    assert int(model_stats["execution_count"]) == 1
