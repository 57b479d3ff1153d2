"""Triton python-backend model that serves the `model.onnx` next to it with onnxruntime.

The test harness copies this file to `<repo>/<name>/<version>/model.py`. It runs inside
Triton's python stub, so it may import only what the stub's interpreter can see (the venv).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]


class TritonPythonModel:
    """Joins all requests of one `execute()` into a single onnxruntime run."""

    def initialize(self, args: dict[str, str]) -> None:
        config: dict[str, Any] = json.loads(args["model_config"])
        self._batched = int(config.get("max_batch_size", 0)) > 0
        self._input_names = [str(spec["name"]) for spec in config["input"]]
        self._output_names = [str(spec["name"]) for spec in config["output"]]
        onnx_path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self._session = ort.InferenceSession(
            str(onnx_path),
            sess_options=_session_options(config),
            providers=["CPUExecutionProvider"],
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        try:
            if self._batched:
                return self._execute_joined(requests)
            return [self._respond(self._run(self._inputs_of(r))) for r in requests]
        except Exception as error:  # every request must get an answer, even a failed one
            message = str(error)
            return [
                pb_utils.InferenceResponse(error=pb_utils.TritonError(message)) for _ in requests
            ]

    def finalize(self) -> None:
        del self._session

    def _execute_joined(self, requests: list[Any]) -> list[Any]:
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

    def _inputs_of(self, request: Any) -> dict[str, np.ndarray[Any, Any]]:
        return {
            name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            for name in self._input_names
        }

    def _run(self, feed: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        values = self._session.run(self._output_names, feed)
        return dict(zip(self._output_names, values, strict=True))

    def _respond(self, outputs: dict[str, np.ndarray[Any, Any]]) -> Any:
        tensors = [
            pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in outputs.items()
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)


def _session_options(config: dict[str, Any]) -> ort.SessionOptions:
    """Thread counts come from the model config, so deployments can tune them per host."""
    parameters: dict[str, dict[str, str]] = config.get("parameters", {})
    threads = int(parameters.get("intra_op_threads", {}).get("string_value", "1"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return options
