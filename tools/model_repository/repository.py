"""Publishing model versions into a Triton model repository (explicit model control).

Layout written for model `name`, version `v`::

    <repo>/<name>/config.pbtxt          model-level: backend, tensors, instances, all versions
    <repo>/<name>/<v>/model.onnx        the weights (immutable once published)
    <repo>/<name>/<v>/model.py          python backend only: serves model.onnx via onnxruntime
    <repo>/<name>/<v>/labels.txt        the class list, one per line, index = det_classes value
    <repo>/<name>/<v>/weights.sha256    SHA-256 of model.onnx, the pin a run records

`config.pbtxt` declares `version_policy: { all: {} }`, so `load_model(name)` after publishing a
new version makes it servable while the versions already loaded keep serving. (Triton 2.51
also reloads the loaded versions then, because the model directory changed, but in the
background: each keeps serving until its replacement is ready, at the cost of a second stub
process for a moment.) The config is only rewritten when its text changes, since a config
change that needs a reload reloads every version.

Tensors are read from the ONNX graph, so any model that follows the output contract plugs in;
with batching (max_batch_size > 0) each tensor's first dimension must be the dynamic batch.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import onnx
from onnx import TensorProto

from workshop.kit.model_repository import (
    LABELS_FILE,
    MODEL_FILE,
    WEIGHTS_SHA256_FILE,
    RepositoryError,
    served_classes,
    served_weights_sha256,
)

Backend = Literal["python", "onnxruntime"]
# Where Triton places instances. The python wrapper runs onnxruntime's CPU provider either
# way; KIND_GPU pays with the onnxruntime (or TensorRT) backend of a GPU build of Triton.
InstanceKind = Literal["KIND_CPU", "KIND_GPU"]

PYTHON_MODEL_FILE = "model.py"
CONFIG_FILE = "config.pbtxt"

_CONFIG_TYPES: dict[int, str] = {
    TensorProto.BOOL: "TYPE_BOOL",
    TensorProto.UINT8: "TYPE_UINT8",
    TensorProto.UINT16: "TYPE_UINT16",
    TensorProto.UINT32: "TYPE_UINT32",
    TensorProto.UINT64: "TYPE_UINT64",
    TensorProto.INT8: "TYPE_INT8",
    TensorProto.INT16: "TYPE_INT16",
    TensorProto.INT32: "TYPE_INT32",
    TensorProto.INT64: "TYPE_INT64",
    TensorProto.FLOAT16: "TYPE_FP16",
    TensorProto.FLOAT: "TYPE_FP32",
    TensorProto.DOUBLE: "TYPE_FP64",
}


# Reading lives in layout.py (no ONNX import) for the processor; re-exported here.
__all__ = [
    "ModelFiles",
    "RepositoryError",
    "VersionConflictError",
    "VersionPlan",
    "check_version",
    "plan_version",
    "publish_version",
    "served_classes",
    "served_weights_sha256",
    "write_version",
]


class VersionConflictError(RepositoryError):
    """A version already exists with other weights; published versions are immutable."""


@dataclass(frozen=True)
class Tensor:
    name: str
    config_type: str
    # Without the batch dimension when the model batches; -1 marks a dynamic dimension.
    dims: tuple[int, ...]


@dataclass(frozen=True)
class ModelFiles:
    """One published version: its directory, weight pin and input shape (without the batch)."""

    path: Path
    weights_sha256: str
    input_shape: tuple[int, ...]
    classes: tuple[str, ...]


@dataclass(frozen=True)
class VersionPlan:
    """What publishing a version writes: its files, the model's config and its signature."""

    name: str
    version: int
    config: str
    signature: tuple[str, ...]
    files: dict[str, bytes]
    backend: Backend
    max_batch_size: int
    input_name: str
    # The input's dims as the config declares them (with the batch when max_batch_size is 0).
    input_dims: tuple[int, ...]
    weights_sha256: str
    classes: tuple[str, ...]

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One frame's shape: the input's dims without the batch."""
        return self.input_dims if self.max_batch_size > 0 else self.input_dims[1:]


def publish_version(
    repo: Path,
    name: str,
    version: int,
    onnx_bytes: bytes,
    *,
    classes: Sequence[str],
    max_batch_size: int = 8,
    instances: int = 1,
    threads: int = 1,
    backend: Backend = "python",
    max_queue_delay_microseconds: int | None = None,
    instance_kind: InstanceKind = "KIND_CPU",
    extra_files: dict[str, bytes] | None = None,
) -> ModelFiles:
    """Write version `version` of model `name` and (re)write the model's config.

    Publishing identical bytes again is a no-op for the version; other bytes raise
    `VersionConflictError`. A config whose tensors or backend differ from the existing one's
    raises `RepositoryError`, since the versions already there could not be served by it.
    """
    plan = plan_version(
        name,
        version,
        onnx_bytes,
        classes=classes,
        max_batch_size=max_batch_size,
        instances=instances,
        threads=threads,
        backend=backend,
        max_queue_delay_microseconds=max_queue_delay_microseconds,
        instance_kind=instance_kind,
        extra_files=extra_files,
    )
    return write_version(repo, plan)


def plan_version(
    name: str,
    version: int,
    onnx_bytes: bytes,
    *,
    classes: Sequence[str],
    max_batch_size: int = 8,
    instances: int = 1,
    threads: int = 1,
    backend: Backend = "python",
    max_queue_delay_microseconds: int | None = None,
    instance_kind: InstanceKind = "KIND_CPU",
    extra_files: dict[str, bytes] | None = None,
) -> VersionPlan:
    """The files and config of a version, checked, without writing anything."""
    _check_arguments(name, version, classes, max_batch_size, instances, threads)
    inputs, outputs = _signature(onnx_bytes, batched=max_batch_size > 0)
    config = _render_config(
        name,
        backend=backend,
        inputs=inputs,
        outputs=outputs,
        max_batch_size=max_batch_size,
        instances=instances,
        threads=threads,
        max_queue_delay_microseconds=max_queue_delay_microseconds,
        instance_kind=instance_kind,
    )
    digest = hashlib.sha256(onnx_bytes).hexdigest()
    files = {
        MODEL_FILE: onnx_bytes,
        LABELS_FILE: "".join(f"{label}\n" for label in classes).encode(),
        WEIGHTS_SHA256_FILE: f"{digest}\n".encode(),
        **(extra_files or {}),
    }
    if backend == "python":
        files[PYTHON_MODEL_FILE] = PYTHON_MODEL_SOURCE.encode()
    return VersionPlan(
        name=name,
        version=version,
        config=config,
        signature=tuple(_signature_lines(backend, inputs, outputs)),
        files=files,
        backend=backend,
        max_batch_size=max_batch_size,
        input_name=inputs[0].name,
        input_dims=inputs[0].dims,
        weights_sha256=digest,
        classes=tuple(classes),
    )


def check_version(repo: Path, plan: VersionPlan) -> None:
    """Refuses, writing nothing, what `write_version` would refuse: a config of other
    tensors or backend, or other weights or classes under a published version."""
    model_dir = repo / plan.name
    _check_signature(model_dir / CONFIG_FILE, list(plan.signature))
    version_dir = model_dir / str(plan.version)
    if version_dir.exists():
        _check_same_version(version_dir, plan.files)


def write_version(repo: Path, plan: VersionPlan) -> ModelFiles:
    """Writes the planned version (staged, then renamed into place) and the model's config."""
    model_dir = repo / plan.name
    model_dir.mkdir(parents=True, exist_ok=True)
    _check_signature(model_dir / CONFIG_FILE, list(plan.signature))
    version_dir = model_dir / str(plan.version)
    _write_version(version_dir, plan.files)
    _write_if_changed(model_dir / CONFIG_FILE, plan.config)
    return ModelFiles(
        path=version_dir,
        weights_sha256=plan.weights_sha256,
        input_shape=plan.input_shape,
        classes=plan.classes,
    )


def _check_arguments(
    name: str,
    version: int,
    classes: Sequence[str],
    max_batch_size: int,
    instances: int,
    threads: int,
) -> None:
    if not name or name.startswith(".") or "/" in name or '"' in name or name != name.strip():
        raise ValueError(f"invalid model name {name!r}")
    if version < 1:
        raise ValueError("model versions start at 1")
    if not classes or any(not c or "\n" in c for c in classes):
        raise ValueError("classes must be non-empty names without line breaks")
    if max_batch_size < 0 or instances < 1 or threads < 1:
        raise ValueError("need max_batch_size >= 0, instances >= 1 and threads >= 1")


def _signature(onnx_bytes: bytes, *, batched: bool) -> tuple[list[Tensor], list[Tensor]]:
    graph = onnx.load_from_string(onnx_bytes).graph
    initializers = {init.name for init in graph.initializer}
    inputs = [_tensor(v, batched) for v in graph.input if v.name not in initializers]
    outputs = [_tensor(v, batched) for v in graph.output]
    if not inputs or not outputs:
        raise RepositoryError("the model declares no inputs or no outputs")
    return inputs, outputs


def _tensor(value: onnx.ValueInfoProto, batched: bool) -> Tensor:
    tensor_type = value.type.tensor_type
    if tensor_type.elem_type not in _CONFIG_TYPES:
        raise RepositoryError(f"tensor {value.name!r} has an unsupported element type")
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
    if batched:
        if not dims or dims[0] != -1:
            raise RepositoryError(f"tensor {value.name!r} has no dynamic batch dimension")
        dims = dims[1:]
    return Tensor(value.name, _CONFIG_TYPES[tensor_type.elem_type], tuple(dims))


def _signature_lines(backend: Backend, inputs: list[Tensor], outputs: list[Tensor]) -> list[str]:
    """The part of the config every version must agree with."""
    engine = 'backend: "python"' if backend == "python" else 'platform: "onnxruntime_onnx"'
    return [engine, *_render_tensors("input", inputs), *_render_tensors("output", outputs)]


def _render_config(
    name: str,
    *,
    backend: Backend,
    inputs: list[Tensor],
    outputs: list[Tensor],
    max_batch_size: int,
    instances: int,
    threads: int,
    max_queue_delay_microseconds: int | None,
    instance_kind: InstanceKind,
) -> str:
    # The python wrapper reads `intra_op_threads`; the onnxruntime backend its own key.
    thread_key = "intra_op_threads" if backend == "python" else "intra_op_thread_count"
    lines = [
        f'name: "{name}"',
        *_signature_lines(backend, inputs, outputs),
        f"max_batch_size: {max_batch_size}",
        # Every version on disk is servable, so a new one loads next to those serving.
        "version_policy: { all: {} }",
        f"instance_group [ {{ kind: {instance_kind} count: {instances} }} ]",
        "parameters {",
        f'  key: "{thread_key}"',
        f'  value {{ string_value: "{threads}" }}',
        "}",
    ]
    if max_queue_delay_microseconds is not None and max_batch_size > 0:
        lines.append(
            f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_microseconds} }}"
        )
    return "\n".join(lines) + "\n"


def _render_tensors(kind: str, tensors: list[Tensor]) -> list[str]:
    entries = [
        f'  {{ name: "{t.name}" data_type: {t.config_type} '
        f"dims: [ {', '.join(str(d) for d in t.dims)} ] }}"
        for t in tensors
    ]
    return [f"{kind} [", ",\n".join(entries), "]"]


def _check_signature(config_path: Path, signature: list[str]) -> None:
    if not config_path.exists():
        return
    if "\n".join(signature) not in config_path.read_text():
        raise RepositoryError(
            f"{config_path} declares another backend or other tensors than this version; "
            "publish it under a new model name"
        )


def _write_version(version_dir: Path, files: dict[str, bytes]) -> None:
    """Stage the whole version, then rename it into place, so Triton never sees half of it."""
    if version_dir.exists():
        _check_same_version(version_dir, files)
        return
    staging = version_dir.with_name(f".staging-{version_dir.name}-{secrets.token_hex(4)}")
    staging.mkdir()
    try:
        for file_name, content in files.items():
            (staging / file_name).write_bytes(content)
        try:
            staging.rename(version_dir)
        except OSError:
            # Another publisher got there first: fine if it published the same weights.
            if not version_dir.exists():
                raise
            _check_same_version(version_dir, files)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_same_version(version_dir: Path, files: dict[str, bytes]) -> None:
    for file_name in (MODEL_FILE, LABELS_FILE):
        existing = version_dir / file_name
        if not existing.is_file() or existing.read_bytes() != files[file_name]:
            raise VersionConflictError(
                f"{version_dir} already holds other weights or classes; "
                "publish a new version instead"
            )


def _write_if_changed(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    temporary.write_text(text)
    os.replace(temporary, path)


# The python backend's `<version>/model.py`: serves the `model.onnx` next to it with onnxruntime
# and joins all requests of one execute() into one run. It runs inside Triton's python stub and
# may import only what the stub's interpreter sees (numpy, onnxruntime, pb_utils).
PYTHON_MODEL_SOURCE = '''\
"""Triton python-backend model: serves the model.onnx next to it with onnxruntime.

Written by tools.model_repository.repository; do not edit, publish a new version instead.
"""

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Joins all requests of one execute() into a single onnxruntime run."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self._batched = int(config.get("max_batch_size", 0)) > 0
        self._input_names = [str(spec["name"]) for spec in config["input"]]
        self._output_names = [str(spec["name"]) for spec in config["output"]]
        onnx_path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self._session = ort.InferenceSession(
            str(onnx_path), sess_options=_session_options(config),
            providers=["CPUExecutionProvider"],
        )

    def execute(self, requests):
        try:
            if self._batched:
                return self._execute_joined(requests)
            return [self._respond(self._run(self._inputs_of(r))) for r in requests]
        except Exception as error:  # every request must get an answer, even a failed one
            message = str(error)
            return [
                pb_utils.InferenceResponse(error=pb_utils.TritonError(message)) for _ in requests
            ]

    def finalize(self):
        del self._session

    def _execute_joined(self, requests):
        if len(requests) == 1:  # the usual case: no joining copy of the batch
            return [self._respond(self._run(self._inputs_of(requests[0])))]
        per_request = [self._inputs_of(r) for r in requests]
        sizes = [len(inputs[self._input_names[0]]) for inputs in per_request]
        joined = {
            name: np.concatenate([inputs[name] for inputs in per_request])
            for name in self._input_names
        }
        outputs = self._run(joined)
        bounds = np.cumsum(sizes)[:-1]
        split = {name: np.split(outputs[name], bounds) for name in self._output_names}
        return [
            self._respond({name: split[name][i] for name in self._output_names})
            for i in range(len(requests))
        ]

    def _inputs_of(self, request):
        return {
            name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            for name in self._input_names
        }

    def _run(self, feed):
        values = self._session.run(self._output_names, feed)
        return dict(zip(self._output_names, values))

    def _respond(self, outputs):
        tensors = [
            pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in outputs.items()
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)


def _session_options(config):
    """Thread counts come from the model config, so deployments tune them per host."""
    parameters = config.get("parameters", {})
    threads = int(parameters.get("intra_op_threads", {}).get("string_value", "1"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return options
'''
