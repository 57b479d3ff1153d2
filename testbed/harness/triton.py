"""Session-wide Triton: the real `tritonserver` that nvidia-pytriton bundles, started on demand.

The launcher lives in `tools.localstack.triton`; models are published with
`tools.model_repository.repository.publish_version`, the same code the processor's repository uses.
`write_onnx_python_model` is the shorthand for test models that declare their tensors.

Every model a test leaves loaded in the session's server is unloaded after it
(`models_unloaded_after_each_test`): each loaded model instance of the python backend is a
stub process of about 250 MB, and a worker's server gathered a dozen of them by the end of
a run (four workers: 12 GB of a 24 GB machine, which a CI run ran out of once). A model a
module-scoped fixture loaded is loaded before the test begins, so it stays.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from tools.localstack.triton import (
    TritonServer,
    TritonStartError,
    TritonUnavailable,
    running_triton,
)
from tools.model_repository.repository import CONFIG_FILE, publish_version

__all__ = [
    "PythonModelConfig",
    "TensorSpec",
    "TritonServer",
    "TritonStartError",
    "write_onnx_python_model",
]

# Triton client datatype names (as InferInput uses them) -> model config names.
_CONFIG_TYPES = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
}
# publish_version writes labels.txt for detectors; these test models have no classes.
_NO_CLASSES = ("unused",)


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output. `dims` excludes the batch dimension when batching."""

    name: str
    datatype: str
    dims: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.datatype not in _CONFIG_TYPES:
            raise ValueError(f"unknown Triton datatype {self.datatype!r}")

    def config_entry(self) -> str:
        """How the model's config.pbtxt declares this tensor."""
        dims = ", ".join(str(d) for d in self.dims)
        return (
            f'{{ name: "{self.name}" data_type: {_CONFIG_TYPES[self.datatype]} dims: [ {dims} ] }}'
        )


@dataclass(frozen=True)
class PythonModelConfig:
    """What a test expects `config.pbtxt` to declare for an ONNX model on the python backend."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 8
    instance_count: int = 1
    intra_op_threads: int = 1
    # None: no dynamic batching; otherwise the scheduler's queue delay.
    max_queue_delay_microseconds: int | None = None


def write_onnx_python_model(
    repo: Path, name: str, version: int, onnx_bytes: bytes, config: PythonModelConfig
) -> Path:
    """Publish `<repo>/<name>/<version>` (python backend) and check the declared tensors
    against the config read from the ONNX graph; returns the model's directory."""
    publish_version(
        repo,
        name,
        version,
        onnx_bytes,
        classes=_NO_CLASSES,
        max_batch_size=config.max_batch_size,
        instances=config.instance_count,
        threads=config.intra_op_threads,
        backend="python",
        max_queue_delay_microseconds=config.max_queue_delay_microseconds,
    )
    model_dir = repo / name
    written = (model_dir / CONFIG_FILE).read_text()
    for spec in (*config.inputs, *config.outputs):
        if spec.config_entry() not in written:
            raise ValueError(f"{name}: the ONNX graph does not declare {spec.config_entry()}")
    return model_dir


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """The bundled Triton on loopback ports with an empty repository (explicit model control)."""
    with ExitStack() as stack:
        try:
            server = stack.enter_context(running_triton(tmp_path_factory.mktemp("triton")))
        except TritonUnavailable as missing:
            pytest.skip(str(missing))
        yield server


@pytest.fixture(autouse=True)
def models_unloaded_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Unloads, once a test that used the session's server ends, the models it loaded."""
    if "triton_server" not in request.fixturenames:
        yield
        return
    server: TritonServer = request.getfixturevalue("triton_server")
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        before = _loaded_models(client)
        yield
        for name in sorted(_loaded_models(client) - before):
            client.unload_model(name)


def _loaded_models(client: grpcclient.InferenceServerClient) -> set[str]:
    index = client.get_model_repository_index(as_json=True)
    return {model["name"] for model in index.get("models", []) if model.get("state") == "READY"}
