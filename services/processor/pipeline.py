"""One job's frames: fetch and probe, decode, infer, route, track, publish (docs/runs-and-jobs.md).

Owns what happens to a claimed job between its claim and its result, and nothing about
its lease: `FramePipeline.run` fetches the recording (its checksum checked), picks the
frames of the job's slots, decodes them chunk by chunk off the event loop, has every
model of the snapshot look at each chunk (one model pass at a time for all the jobs in
flight, behind one lock), routes each frame through the workflow graph (tracks
included, routing.py), has the publisher store the frames that reach an output, and
answers the job's result and the decoder's name. It reports progress every
PROGRESS_STEP percent through the callback the lease loop hands it, which sends only the
reports of a job still running after PROCESSOR_PROGRESS_AFTER_SECONDS (leases.py).

Failures are sorted for the lease loop: the job's own problems (a missing or altered
recording, a file the decoder cannot read, the model) raise `JobFailed` with the
decoder's or model's own message; the recording's store or Triton out of reach raises
`ServiceUnavailable`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from services.processor import decode, metrics
from services.processor.calls import JobFailed, ServiceUnavailable
from services.processor.decode import DecodeError, StreamInfo
from services.processor.images import encode_jpeg
from services.processor.inference import (
    Detection,
    ModelServer,
    ModelUnavailable,
    Pin,
    TritonUnreachable,
)
from services.processor.publishing import Publisher
from services.processor.recordings import (
    RecordingStore,
    RecordingUnavailable,
    StorageUnreachable,
)
from services.processor.routing import JobRouter, Routed, Router, empty_slot_result, to_slot_result
from services.processor.tracking import Box, box_to_proto
from workshop.kit.letterbox import Placement, stretch
from workshop.v1 import common_pb2, jobs_pb2

PROGRESS_STEP = 10  # percent between progress reports
# A photo's frame: no model and no output step; it is published as the job's preview.
PHOTO_FRAME = Routed("frame", (), ())

Progress = Callable[[int], Awaitable[None]]  # reports a job's percent done (renews its lease)


class FramePipeline:
    """Turns a claimed job into its result (see the module)."""

    def __init__(
        self,
        code_sha256: str,
        recordings: RecordingStore,
        models: ModelServer,
        publisher: Publisher,
        *,
        gpu: bool = False,
    ) -> None:
        self.code_sha256 = code_sha256
        self.recordings = recordings
        self.models = models
        self.publisher = publisher
        self.gpu = gpu
        self._model_turn = asyncio.Lock()

    async def run(
        self, job: jobs_pb2.ClaimedJob, progress: Progress
    ) -> tuple[jobs_pb2.JobResult, str]:
        """The job's result and the name of the decoder that read its recording."""
        snapshot, recording = job.snapshot, job.input.recording
        if snapshot.code_sha256 != self.code_sha256:
            raise JobFailed(
                f"The run's snapshot names code {snapshot.code_sha256}; this processor runs "
                f"{self.code_sha256}."
            )
        try:
            data = await self.recordings.fetch(recording.object_key, recording.sha256)
            info = await asyncio.to_thread(decode.probe, data)
            indices = decode.slot_frames(
                info,
                recording.start.ToDatetime(tzinfo=UTC),
                [slot.start.ToDatetime(tzinfo=UTC) for slot in job.input.slots],
                [slot.end.ToDatetime(tzinfo=UTC) for slot in job.input.slots],
            )
            served = [
                await self.models.ensure(Pin(m.name, m.version, m.weights_sha256))
                for m in snapshot.models
            ]
        except DecodeError as error:
            raise JobFailed(f"Cannot read recording {recording.recording_id}: {error}") from None
        except (RecordingUnavailable, ModelUnavailable) as error:
            raise JobFailed(str(error)) from None
        except (StorageUnreachable, TritonUnreachable) as error:
            raise ServiceUnavailable(str(error)) from None
        decoder, decoder_name = decode.choose_decoder(info.codec, self.gpu)
        # Every model of the run looks at the same decoded frames: one size, one placement.
        placement = (
            served[0].placement(info.height, info.width)
            if served
            else stretch(info.height, info.width)
        )
        for other in served[1:]:
            if other.placement(info.height, info.width) != placement:
                raise JobFailed(
                    f"Models {served[0].pin.name} v{served[0].pin.version} and "
                    f"{other.pin.name} v{other.pin.version} take frames of different sizes or "
                    "placements (letterboxed or not); one run decodes its frames once."
                )
        photo = snapshot.kind == common_pb2.RUN_KIND_PHOTO
        router = None if photo else JobRouter(Router(snapshot.workflow, snapshot.models))
        full = snapshot.mode == common_pb2.RUN_MODE_FULL
        slots: dict[int, jobs_pb2.SlotResult] = {
            index: empty_slot_result(index) for index, frame in enumerate(indices) if frame is None
        }
        wanted = [(index, frame) for index, frame in enumerate(indices) if frame is not None]
        reported = 0
        async for batch, frames in self._frames(decoder, data, wanted, placement):
            detections = await self._detect(served, frames, placement)
            for position, (index, frame_index) in enumerate(batch):
                moment = _frame_time(info, recording.start.ToDatetime(tzinfo=UTC), frame_index)
                by_step = {
                    model.step_id: [_box(d) for d in found[position]]
                    for model, found in zip(snapshot.models, detections, strict=True)
                }
                routed = router.route(by_step) if router else PHOTO_FRAME
                slots[index] = await self._publish(
                    job, index, moment, _picture(frames[position], placement), routed, full
                )
                if routed.outcome == "frame":  # it was published
                    metrics.FRAMES_PUBLISHED.inc()
            done = len(slots) * 100 // max(1, len(indices))
            if done >= reported + PROGRESS_STEP:
                reported = done
                await progress(min(done, 99))
        await self.publisher.settle(job.lease)  # every preview recorded before Complete
        result = jobs_pb2.JobResult(slots=[slots[index] for index in range(len(indices))])
        return result, decoder_name

    async def _frames(
        self,
        decoder: decode.Decoder,
        data: bytes,
        wanted: list[tuple[int, int]],
        placement: Placement,
    ) -> AsyncIterator[tuple[list[tuple[int, int]], Any]]:
        """Decoded frames chunk by chunk, off the event loop, with their slots."""
        chunks: Iterator[Any] = decoder.chunks(
            data,
            [frame for _, frame in wanted],
            out_height=placement.out_height,
            out_width=placement.out_width,
            placement=placement,
        )
        taken = 0
        while True:
            started = time.perf_counter()
            try:
                chunk = await asyncio.to_thread(next, chunks, None)
            except DecodeError as error:
                raise JobFailed(str(error)) from None
            if chunk is None:
                return
            metrics.DECODE_SECONDS.observe(time.perf_counter() - started)
            metrics.FRAMES_DECODED.inc(len(chunk))
            batch = wanted[taken : taken + len(chunk)]
            taken += len(chunk)
            yield batch, chunk

    async def _detect(
        self, served: list[Any], frames: Any, placement: Placement
    ) -> list[list[list[Detection]]]:
        """Each model's detections for each frame; one model pass at a time."""
        found = []
        async with self._model_turn:
            for model in served:
                try:
                    with metrics.INFERENCE_SECONDS.labels(model.pin.name).time():
                        found.append(await self.models.infer(model, frames, placement))
                except ModelUnavailable as error:
                    raise JobFailed(str(error)) from None
                except TritonUnreachable as error:
                    raise ServiceUnavailable(str(error)) from None
        metrics.FRAMES_INFERRED.inc(len(frames))
        return found

    async def _publish(
        self,
        job: jobs_pb2.ClaimedJob,
        index: int,
        moment: datetime,
        frame: Any,
        routed: Routed,
        full: bool,
    ) -> jobs_pb2.SlotResult:
        """A frame that reaches an output: its preview, which in full runs is also its upload."""
        if routed.outcome != "frame":
            return to_slot_result(index, moment, routed)
        image = await asyncio.to_thread(encode_jpeg, frame)
        boxes = [box_to_proto(box) for _, found in routed.outputs for box in found]
        key, digest = await self.publisher.publish(job, index, _timestamp(moment), image, boxes)
        if not full or not routed.outputs:
            return to_slot_result(index, moment, routed)
        # The preview is recorded with `boxes`: with one output, its item's boxes exactly,
        # which a coordinator that takes recorded boxes then copies instead of receiving.
        recorded = job.takes_recorded_boxes and len(routed.outputs) == 1
        return to_slot_result(
            index, moment, routed, upload_key=key, upload_sha256=digest, boxes_recorded=recorded
        )


def _picture(frame: Any, placement: Placement) -> Any:
    """The picture without a letterbox's padding: what a preview shows and boxes measure."""
    if not placement.padded:
        return frame
    return np.ascontiguousarray(
        frame[
            placement.top : placement.top + placement.height,
            placement.left : placement.left + placement.width,
        ]
    )


def _frame_time(info: StreamInfo, recording_start: datetime, frame_index: int) -> datetime:
    """Wall-clock time of a frame: the recording's start plus its offset from the first frame."""
    offset = (info.frame_pts[frame_index] - info.frame_pts[0]) * info.time_base
    return recording_start + timedelta(microseconds=round(offset * 1_000_000))


def _box(detection: Detection) -> Box:
    return Box(
        class_name=detection.class_name,
        score=detection.score,
        x=detection.x,
        y=detection.y,
        w=detection.w,
        h=detection.h,
    )


def _timestamp(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp
