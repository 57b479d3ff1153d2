"""Inference through Triton (gRPC, asyncio) on the run's pinned model versions.

Before a job uses a model, `ensure` makes the pinned version servable with the
repository API (explicit model control) and refuses to run when the weights the
repository serves for that version differ from the pin: a run never gets labels
from other weights than the ones its snapshot names. Frames go in as uint8 NHWC
at the model's resolution (normalisation happens inside the model), in batches
of at most the model's max batch size. Outputs follow the EfficientNMS-style
contract: num_dets [N,1], det_boxes [N,K,4] (x1, y1, x2, y2 pixels),
det_scores [N,K], det_classes [N,K].
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as triton
from tritonclient.utils import InferenceServerException

from workshop.models.layout import RepositoryError, served_classes, served_weights_sha256

INPUT = "images"
OUTPUTS = ("num_dets", "det_boxes", "det_scores", "det_classes")


class ModelUnavailable(RuntimeError):
    """The pinned model version cannot be served as pinned; the job fails."""


@dataclasses.dataclass(frozen=True)
class Pin:
    name: str
    version: int
    weights_sha256: str


@dataclasses.dataclass(frozen=True)
class Detection:
    class_name: str
    score: float
    x: float  # left edge, fraction of the frame width
    y: float  # top edge, fraction of the frame height
    w: float
    h: float


@dataclasses.dataclass(frozen=True)
class Served:
    pin: Pin
    classes: tuple[str, ...]
    max_batch_size: int
    height: int
    width: int


class ModelServer:
    def __init__(self, url: str, repository: Path) -> None:
        self._client = triton.InferenceServerClient(url)
        self._repository = repository
        self._served: dict[tuple[str, int], Served] = {}

    async def close(self) -> None:
        await self._client.close()

    async def ensure(self, pin: Pin) -> Served:
        """Makes `pin` servable; ModelUnavailable when its weights are not the pinned ones."""
        key = (pin.name, pin.version)
        found = self._served.get(key)
        if found is not None:
            return found
        try:
            recorded = served_weights_sha256(self._repository, pin.name, pin.version)
            classes = served_classes(self._repository, pin.name, pin.version)
        except (OSError, RepositoryError) as error:
            raise ModelUnavailable(
                f"{pin.name} version {pin.version} is not in the model repository: {error}"
            ) from None
        if recorded != pin.weights_sha256:
            raise ModelUnavailable(
                f"{pin.name} version {pin.version} serves weights {recorded}, but the run "
                f"pinned {pin.weights_sha256}."
            )
        version = str(pin.version)
        try:
            if not await self._client.is_model_ready(pin.name, version):
                await self._client.load_model(pin.name)
            if not await self._client.is_model_ready(pin.name, version):
                raise ModelUnavailable(f"Triton did not make {pin.name} v{version} ready.")
            config = (await self._client.get_model_config(pin.name, version, as_json=True))[
                "config"
            ]
        except InferenceServerException as error:
            raise ModelUnavailable(f"Triton: {error.message()}") from None
        dims = next(item for item in config["input"] if item["name"] == INPUT)["dims"]
        served = Served(
            pin=pin,
            classes=classes,
            max_batch_size=max(1, int(config.get("max_batch_size", 0))),
            height=int(dims[0]),
            width=int(dims[1]),
        )
        self._served[key] = served
        return served

    async def infer(self, served: Served, frames: Frames) -> list[list[Detection]]:
        """Detections for each frame (uint8 [n, height, width, 3])."""
        results: list[list[Detection]] = []
        for start in range(0, len(frames), served.max_batch_size):
            batch = np.ascontiguousarray(frames[start : start + served.max_batch_size])
            results += await self._infer_batch(served, batch)
        return results

    async def _infer_batch(self, served: Served, batch: Frames) -> list[list[Detection]]:
        request = triton.InferInput(INPUT, list(batch.shape), "UINT8")
        request.set_data_from_numpy(batch)
        try:
            reply = await self._client.infer(
                served.pin.name,
                [request],
                model_version=str(served.pin.version),
                outputs=[triton.InferRequestedOutput(name) for name in OUTPUTS],
            )
        except InferenceServerException as error:
            raise ModelUnavailable(f"Triton: {error.message()}") from None
        counts, boxes, scores, classes = (_output(reply, name) for name in OUTPUTS)
        return [
            [
                _detection(served, boxes[i, k], float(scores[i, k]), int(classes[i, k]))
                for k in range(int(counts[i].reshape(-1)[0]))
            ]
            for i in range(len(batch))
        ]


Frames = npt.NDArray[np.uint8]


def _output(reply: triton.InferResult, name: str) -> npt.NDArray[Any]:
    value: npt.NDArray[Any] | None = reply.as_numpy(name)
    if value is None:
        raise ModelUnavailable(f"The model's answer lacks output {name!r}.")
    return value


def _detection(served: Served, box: npt.NDArray[Any], score: float, class_index: int) -> Detection:
    x1, y1, x2, y2 = (float(value) for value in box)
    return Detection(
        class_name=served.classes[class_index],
        score=score,
        x=x1 / served.width,
        y=y1 / served.height,
        w=(x2 - x1) / served.width,
        h=(y2 - y1) / served.height,
    )
