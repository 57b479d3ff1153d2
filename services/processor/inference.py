"""Inference through Triton (gRPC, asyncio) on the run's pinned model versions.

Before a job uses a model, `ensure` makes the pinned version servable with the
repository API (explicit model control) and refuses to run when the weights the
repository serves for that version differ from the pin: a run never gets labels
from other weights than the ones its snapshot names. Frames go in as uint8 NHWC
at the model's resolution (normalisation happens inside the model), in batches
of at most the model's max batch size. Outputs follow the EfficientNMS-style
contract: num_dets [N,1], det_boxes [N,K,4] (x1, y1, x2, y2 pixels),
det_scores [N,K], det_classes [N,K].

The model's input name says how its frames are made: `images`, resized to the model's size
(the aspect may change); `letterboxed_images`, letterboxed (aspect kept, padded with 114 gray:
the served graph of a YOLO-family model, docs/bring-your-own-model.md). Boxes are mapped back
through the frames' placement to fractions of the original frame, clipped to it.

One `infer` call splits its frames into as many batches as the model has instances
(at least), and keeps that many requests in flight: on 2 CPU cores two instances of
one onnxruntime thread each served 230-290 frames/s, one request at a time 107-207.

Transport: with Triton on the same host (`shared_memory="auto"` and a loopback target,
or `"on"`), frames travel through system shared-memory regions, one per instance and
model, registered with Triton when the model is first ensured; the request then carries
only the region's name. Measured here (batch 8, 640x360): the client's CPU per frame fell
from about 2 ms to 0.2 ms and Triton's by about a third. When Triton cannot map the
regions (another host, or a sidecar that does not share /dev/shm), "auto" falls back to
sending the frames in the gRPC request and says so in the log; "on" fails the job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as triton
from tritonclient.utils import InferenceServerException

from services.processor.metrics import DETECTIONS_DROPPED
from workshop.kit.letterbox import Placement, letterbox, stretch
from workshop.kit.model_io import (
    CONTRACT_OUTPUTS,
    INPUTS,
    LETTERBOX_INPUT,
    STRETCH_INPUT,
    UNREACHABLE_STATUSES,
)
from workshop.kit.model_repository import RepositoryError, served_classes, served_weights_sha256
from workshop.kit.shared_memory import (
    UNREGISTER_ATTEMPTS,
    UNREGISTER_PAUSE_S,
    Region,
    is_loopback,
    still_in_use,
)

log = logging.getLogger(__name__)

INPUT = STRETCH_INPUT  # frames resized to the model's size
OUTPUTS = CONTRACT_OUTPUTS
REGION_PREFIX = "workshop-processor"

SharedMemoryMode = Literal["auto", "on", "off"]
Transport = Literal["shared-memory", "grpc"]


class ModelUnavailable(RuntimeError):
    """The pinned model version cannot be served as pinned; the job fails."""


class TritonUnreachable(RuntimeError):
    """Triton did not answer (down, restarting, too slow); the job is handed back."""


def triton_error(error: InferenceServerException) -> ModelUnavailable | TritonUnreachable:
    if error.status() in UNREACHABLE_STATUSES:
        return TritonUnreachable(f"Triton did not answer: {error.message()}")
    return ModelUnavailable(f"Triton: {error.message()}")


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
    instances: int = 1
    transport: Transport = "grpc"
    input_name: str = INPUT
    # Whether the batch is part of the input's dims (max_batch_size 0: one frame a request).
    unbatched: bool = False

    @property
    def letterboxed(self) -> bool:
        return self.input_name == LETTERBOX_INPUT

    def placement(self, frame_height: int, frame_width: int) -> Placement:
        """Where a frame of that size lies in this model's input."""
        if self.letterboxed:
            return letterbox(frame_height, frame_width, self.height, self.width)
        return stretch(self.height, self.width)


Lanes = asyncio.Queue[Region | None]  # one entry per request that may be in flight


class ModelServer:
    def __init__(
        self, url: str, repository: Path, *, shared_memory: SharedMemoryMode = "auto"
    ) -> None:
        self._client = triton.InferenceServerClient(url)
        self._repository = repository
        self._shared_memory = shared_memory == "on" or (
            shared_memory == "auto" and is_loopback(url)
        )
        self._required = shared_memory == "on"
        self._served: dict[tuple[str, int], Served] = {}
        self._lanes: dict[tuple[str, int], Lanes] = {}
        self._ensuring: dict[tuple[str, int], asyncio.Lock] = {}
        self._regions: list[Region] = []

    async def close(self) -> None:
        for region in self._regions:
            await self._unregister(region)
            region.close()
        self._regions.clear()
        await self._client.close()

    async def _unregister(self, region: Region) -> None:
        """Triton answers a request before it lets go of the request's region ("currently
        in use" for a few milliseconds more), so unregistering waits a little for that."""
        for _ in range(UNREGISTER_ATTEMPTS):
            try:
                await self._client.unregister_system_shared_memory(region.name)
                return
            except InferenceServerException as error:
                if not still_in_use(error.message()):
                    log.info("unregistering %s: %s", region.name, error.message())
                    return
            await asyncio.sleep(UNREGISTER_PAUSE_S)
        log.warning("Triton still uses region %s; left registered", region.name)

    async def ensure(self, pin: Pin) -> Served:
        """Makes `pin` servable; ModelUnavailable when its weights are not the pinned ones."""
        key = (pin.name, pin.version)
        async with self._ensuring.setdefault(key, asyncio.Lock()):
            found = self._served.get(key)
            if found is None:
                found = await self._serve(pin)
            return found

    async def _serve(self, pin: Pin) -> Served:
        try:
            # Hashing the weights reads the whole file: off the event loop.
            recorded = await asyncio.to_thread(
                served_weights_sha256, self._repository, pin.name, pin.version
            )
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
            raise triton_error(error) from None
        found = [item for item in config["input"] if item["name"] in INPUTS]
        if not found:
            names = ", ".join(item["name"] for item in config["input"])
            raise ModelUnavailable(
                f"{pin.name} v{version} takes {names}; this processor sends frames as "
                f"{' or '.join(INPUTS)}."
            )
        unbatched = int(config.get("max_batch_size", 0)) == 0
        dims = [int(d) for d in found[0]["dims"]]
        if unbatched:
            dims = dims[1:]  # the model's own batch dimension, 1
        height, width = dims[0], dims[1]
        max_batch_size = max(1, int(config.get("max_batch_size", 0)))
        instances = _instance_count(config)
        lanes, transport = await self._open_lanes(
            pin, instances, max_batch_size * height * width * 3
        )
        served = Served(
            pin,
            classes,
            max_batch_size,
            height,
            width,
            instances,
            transport,
            input_name=found[0]["name"],
            unbatched=unbatched,
        )
        log.info(
            "serving %s v%s: %d instance(s), batches of up to %d, frames by %s",
            pin.name,
            version,
            instances,
            max_batch_size,
            transport,
        )
        key = (pin.name, pin.version)
        self._served[key] = served
        self._lanes[key] = lanes
        return served

    async def _open_lanes(
        self, pin: Pin, instances: int, byte_size: int
    ) -> tuple[Lanes, Transport]:
        """One lane per instance: a registered region each, or plain gRPC."""
        lanes: Lanes = asyncio.Queue()
        if self._shared_memory:
            try:
                for _ in range(instances):
                    lanes.put_nowait(await self._register(byte_size))
                return lanes, "shared-memory"
            except (OSError, InferenceServerException) as error:
                message = error.message() if isinstance(error, InferenceServerException) else error
                if self._required:
                    raise ModelUnavailable(
                        f"Triton cannot read this processor's shared memory: {message}"
                    ) from None
                log.warning(
                    "%s v%d: Triton cannot read this processor's shared memory (%s); "
                    "sending frames over gRPC",
                    pin.name,
                    pin.version,
                    message,
                )
                lanes = asyncio.Queue()
        for _ in range(instances):
            lanes.put_nowait(None)
        return lanes, "grpc"

    async def _register(self, byte_size: int) -> Region:
        region = Region.create(f"{REGION_PREFIX}-{os.getpid()}", byte_size)
        try:
            await self._client.register_system_shared_memory(region.name, region.key, byte_size)
        except BaseException:
            region.close()
            raise
        # Triton has mapped it: the name is no longer needed, and a crash leaves no file.
        region.release_name()
        self._regions.append(region)
        return region

    async def infer(
        self, served: Served, frames: Frames, placement: Placement | None = None
    ) -> list[list[Detection]]:
        """Detections for each frame (uint8 [n, height, width, 3], the picture placed in it as
        `placement` says: by default stretched over all of it), as fractions of the picture.

        A refusal of a model this client had served may only mean that Triton restarted
        since (the model no longer loaded, "unknown model ... not found", or the regions
        unknown): the model is served again and the frames tried once more, so a restart
        fails no job. A second refusal is the model's own (ModelUnavailable)."""
        place = placement or stretch(served.height, served.width)
        try:
            return await self._infer(served, frames, place)
        except ModelUnavailable as error:
            log.warning(
                "%s v%s refused (%s): serving it again", served.pin.name, served.pin.version, error
            )
        return await self._infer(await self.ensure(served.pin), frames, place)

    async def _infer(
        self, served: Served, frames: Frames, placement: Placement
    ) -> list[list[Detection]]:
        lanes = self._lanes[(served.pin.name, served.pin.version)]

        async def on_a_lane(start: int, stop: int) -> list[list[Detection]]:
            lane = await lanes.get()
            try:
                return await self._infer_batch(served, frames[start:stop], lane, placement)
            finally:
                lanes.put_nowait(lane)

        spans = batch_spans(len(frames), served.max_batch_size, served.instances)
        parts = await asyncio.gather(*(on_a_lane(start, stop) for start, stop in spans))
        return [found for part in parts for found in part]

    async def _infer_batch(
        self, served: Served, batch: Frames, lane: Region | None, placement: Placement
    ) -> list[list[Detection]]:
        request = triton.InferInput(served.input_name, list(batch.shape), "UINT8")
        if lane is None:
            request.set_data_from_numpy(np.ascontiguousarray(batch))
        else:
            request.set_shared_memory(lane.name, lane.write(batch))
        try:
            reply = await self._client.infer(
                served.pin.name,
                [request],
                model_version=str(served.pin.version),
                outputs=[triton.InferRequestedOutput(name) for name in OUTPUTS],
            )
        except InferenceServerException as error:
            # Triton may have restarted (models unloaded, regions unknown): the next job
            # ensures the model again instead of failing the same way.
            self._forget(served)
            raise triton_error(error) from None
        counts, boxes, scores, classes = (_output(reply, name) for name in OUTPUTS)
        return [
            [
                _detection(served, placement, boxes[i, k], float(scores[i, k]), int(classes[i, k]))
                for k in finite_detections(
                    int(counts[i].reshape(-1)[0]), boxes[i], scores[i], served.pin.name
                )
            ]
            for i in range(len(batch))
        ]

    def _forget(self, served: Served) -> None:
        key = (served.pin.name, served.pin.version)
        if self._served.get(key) is served:
            del self._served[key]


def batch_spans(count: int, max_batch_size: int, instances: int) -> list[tuple[int, int]]:
    """[start, stop) of each batch: balanced, at most max_batch_size, at least one per
    instance when there are frames enough, so every instance works on a pass."""
    if count == 0:
        return []
    batches = max(-(-count // max_batch_size), min(instances, count))
    size, extra = divmod(count, batches)
    spans, start = [], 0
    for index in range(batches):
        stop = start + size + (1 if index < extra else 0)
        spans.append((start, stop))
        start = stop
    return spans


def _instance_count(config: dict[str, Any]) -> int:
    groups = config.get("instance_group") or []
    return max(1, sum(int(group.get("count", 1)) for group in groups))


Frames = npt.NDArray[np.uint8]


def _output(reply: triton.InferResult, name: str) -> npt.NDArray[Any]:
    value: npt.NDArray[Any] | None = reply.as_numpy(name)
    if value is None:
        raise ModelUnavailable(f"The model's answer lacks output {name!r}.")
    return value


def finite_detections(
    count: int, boxes: npt.NDArray[Any], scores: npt.NDArray[Any], model: str
) -> list[int]:
    """The indexes of an image's first `count` detections whose score and box are finite
    numbers. The others are left out and counted: nothing downstream can store or show a
    NaN or an infinity (the coordinator refuses a box holding one, and would refuse the
    job's whole result), and a model that answers one for a box says nothing about it."""
    finite = np.isfinite(boxes[:count]).all(axis=-1) & np.isfinite(scores[:count])
    kept: list[int] = np.flatnonzero(finite).tolist()
    if len(kept) < count:
        DETECTIONS_DROPPED.labels(model).inc(count - len(kept))
        log.warning(
            "%s answered %d detection(s) with a NaN or infinite value: left out",
            model,
            count - len(kept),
        )
    return kept


def _detection(
    served: Served,
    placement: Placement,
    box: npt.NDArray[Any],
    score: float,
    class_index: int,
) -> Detection:
    x1, y1, x2, y2 = (float(value) for value in box)
    if placement.padded:
        # Into the picture's own pixels, clipped to it (a box may reach into the padding).
        x, y, w, h = placement.to_picture(x1, y1, x2, y2)
    else:
        width, height = served.width, served.height
        x, y, w, h = x1 / width, y1 / height, (x2 - x1) / width, (y2 - y1) / height
    return Detection(class_name=served.classes[class_index], score=score, x=x, y=y, w=w, h=h)
