"""Decode the frames a job samples from a recording.

The flow for one job: `probe` the recording, map the slots to frame indices
with `slot_frames`, pick a decoder with `choose_decoder`, and pull resized RGB
frames from `Decoder.chunks` (bounded memory) or `Decoder.decode` (all at once).

Frame index N is the N-th frame in presentation order, counted from 0. DALI,
PyAV and `slot_frames` all use that numbering: DALI indexes frames by sorted
presentation timestamp, PyAV emits decoded frames in presentation order, and
`probe` records every frame's timestamp from the demuxer. Working from the
recorded timestamps (not `index / fps`) keeps the mapping right even when a
recorder drifts from its nominal frame rate; `StreamInfo.fps` is informational.

DALI facts this module is built on (nvidia-dali 2.x):
- `fn.decoders.video(encoded, frames=[...])` decodes selected frames of an
  in-memory video. On CPU its bundled FFmpeg decodes VP8, VP9 and MJPEG only;
  H.264/HEVC/AV1 need `device="mixed"` (NVDEC), so CPU-only hosts use PyAV.
- With the default `pad_mode` an out-of-range index silently yields a black
  frame; `pad_mode="none"` turns it into an error, which is what we want.
- After any error the pipeline object is dead and must be rebuilt.
"""

from __future__ import annotations

import bisect
import importlib
import io
import math
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any, Literal, Protocol

import av
import numpy as np
from numpy.typing import NDArray

Source = str | os.PathLike[str] | bytes
Frames = NDArray[np.uint8]

# Frames held per pipeline run / yielded per chunk. A decoded 1080p frame is
# about 6 MB before resizing, so 16 keeps a run's working set near 100 MB.
MAX_FRAMES_PER_CHUNK = 16

# Codecs DALI's bundled FFmpeg decodes on CPU; everything else needs NVDEC or PyAV.
DALI_CPU_CODECS = frozenset({"vp8", "vp9", "mjpeg"})
DALI_GPU_CODECS = DALI_CPU_CODECS | {"h264", "hevc", "av1", "mpeg4"}

DecoderName = Literal["dali-gpu", "dali-cpu", "pyav"]


class DecodeError(Exception):
    """The recording cannot be decoded; the message is the decoder's own."""


class RecordingTooShort(DecodeError):
    """The recording ends before the start of its last scheduled slot."""


@dataclass(frozen=True)
class StreamInfo:
    """What `probe` learnt about a recording's first video stream.

    `start_time` and `duration` are in seconds (exact fractions of the time
    base); `frame_pts` holds every frame's presentation timestamp in time-base
    units, sorted, so `frame_pts[i]` is the timestamp of frame index i.
    """

    codec: str
    width: int
    height: int
    fps: Fraction
    time_base: Fraction
    start_time: Fraction
    duration: Fraction
    frame_count: int
    frame_pts: tuple[int, ...] = ()

    @property
    def end_time(self) -> Fraction:
        """When the last frame stops being shown, in stream seconds."""
        return self.start_time + self.duration


# --- probing ---------------------------------------------------------------


def probe(source: Source) -> StreamInfo:
    """Read the stream's parameters and every frame's timestamp (demux only, no decode)."""
    try:
        with _open(source) as container:
            if not container.streams.video:
                raise DecodeError("the recording has no video stream")
            stream = container.streams.video[0]
            pts, _keyframes = _demux_index(container, stream)
            codec = stream.codec_context.name
            width, height = stream.codec_context.width, stream.codec_context.height
            time_base = Fraction(stream.time_base)
            nominal = stream.average_rate or stream.guessed_rate
    except av.error.FFmpegError as error:
        raise DecodeError(str(error)) from error
    if not pts:
        raise DecodeError("the video stream holds no frames")
    fps = Fraction(nominal) if nominal else _measured_fps(pts, time_base)
    start = pts[0] * time_base
    # The last frame is shown for one frame interval past its timestamp.
    last_frame_seconds = 1 / fps
    duration = (pts[-1] - pts[0]) * time_base + last_frame_seconds
    return StreamInfo(
        codec=codec,
        width=width,
        height=height,
        fps=fps,
        time_base=time_base,
        start_time=start,
        duration=duration,
        frame_count=len(pts),
        frame_pts=tuple(pts),
    )


def _open(source: Source) -> Any:
    if isinstance(source, bytes):
        return av.open(io.BytesIO(source), "r")
    return av.open(os.fspath(source), "r")


def _demux_index(container: Any, stream: Any) -> tuple[list[int], list[int]]:
    """Sorted presentation timestamps of all frames, and of the keyframes."""
    pts: list[int] = []
    keyframes: list[int] = []
    for packet in container.demux(stream):
        if packet.size == 0 or packet.pts is None:
            continue  # the demuxer's final flush packet, or a packet without timing
        pts.append(packet.pts)
        if packet.is_keyframe:
            keyframes.append(packet.pts)
    pts.sort()
    keyframes.sort()
    return pts, keyframes


def _measured_fps(pts: Sequence[int], time_base: Fraction) -> Fraction:
    if len(pts) < 2:
        raise DecodeError("cannot tell the frame rate of a one-frame stream without a rate")
    return (len(pts) - 1) / ((pts[-1] - pts[0]) * time_base)


# --- slots -> frames -------------------------------------------------------


def slot_frames(
    info: StreamInfo,
    recording_start: datetime,
    slot_starts: Sequence[datetime],
    slot_ends: Sequence[datetime],
) -> list[int | None]:
    """The frame index to take for each slot, or None for a slot without a frame (EMPTY).

    A slot takes the first frame whose presentation time is at or after the
    slot start and before the slot end. `recording_start` is the wall-clock
    time of the stream's first frame. Raises `RecordingTooShort` when the
    stream ends (last frame's time plus one frame interval) at or before the
    last slot's start.
    """
    if len(slot_starts) != len(slot_ends):
        raise ValueError("slot_starts and slot_ends differ in length")
    pts = info.frame_pts or _cfr_pts(info)
    if slot_starts:
        last_start = _seconds(max(slot_starts) - recording_start)
        if info.duration <= last_start:
            raise RecordingTooShort(
                f"the recording ends {float(info.duration):.3f} s after its start, "
                f"before the last slot starts at {float(last_start):.3f} s"
            )
    first_pts = pts[0]
    indices: list[int | None] = []
    for start, end in zip(slot_starts, slot_ends, strict=True):
        if end <= start:
            raise ValueError(f"slot ends at {end} before it starts at {start}")
        # Exact rational arithmetic in time-base ticks: no float rounding at slot edges.
        start_ticks = first_pts + _seconds(start - recording_start) / info.time_base
        end_ticks = first_pts + _seconds(end - recording_start) / info.time_base
        index = bisect.bisect_left(pts, math.ceil(start_ticks))
        indices.append(index if index < len(pts) and pts[index] < end_ticks else None)
    return indices


def _cfr_pts(info: StreamInfo) -> tuple[int, ...]:
    """Timestamps of a constant-rate stream (muxers round to the nearest tick)."""
    first = info.start_time / info.time_base
    step = 1 / (info.fps * info.time_base)
    return tuple(round(first + i * step) for i in range(info.frame_count))


def _seconds(delta: timedelta) -> Fraction:
    return Fraction(delta.days * 86_400 + delta.seconds) + Fraction(delta.microseconds, 1_000_000)


# --- decoders --------------------------------------------------------------


class Decoder(Protocol):
    """Decodes selected frames to uint8 RGB arrays of shape [n, out_height, out_width, 3]."""

    def chunks(
        self,
        source: Source,
        frame_indices: Sequence[int],
        *,
        out_height: int,
        out_width: int,
    ) -> Iterator[Frames]:
        """The requested frames in request order, at most MAX_FRAMES_PER_CHUNK at a time."""
        ...

    def decode(
        self,
        source: Source,
        frame_indices: Sequence[int],
        *,
        out_height: int,
        out_width: int,
    ) -> Frames:
        """All requested frames at once; prefer `chunks` for long requests."""
        ...


def _collect(chunks: Iterator[Frames], out_height: int, out_width: int) -> Frames:
    parts = list(chunks)
    if not parts:
        return np.empty((0, out_height, out_width, 3), dtype=np.uint8)
    return np.concatenate(parts)


def _check_request(frame_indices: Sequence[int], out_height: int, out_width: int) -> None:
    if out_height <= 0 or out_width <= 0:
        raise ValueError(f"output size must be positive, got {out_width}x{out_height}")
    if any(index < 0 for index in frame_indices):
        raise ValueError("frame indices must be non-negative")


def _batches(frame_indices: Sequence[int]) -> Iterator[list[int]]:
    for offset in range(0, len(frame_indices), MAX_FRAMES_PER_CHUNK):
        yield list(frame_indices[offset : offset + MAX_FRAMES_PER_CHUNK])


class DaliDecoder:
    """NVIDIA DALI `fn.decoders.video` with `fn.resize` in the same pipeline.

    `device="cpu"` handles VP8/VP9/MJPEG; `device="gpu"` decodes on NVDEC
    (adds H.264/HEVC/AV1) and resizes on the GPU. Not safe for concurrent use
    from several threads on one instance: calls are serialized by a lock.
    """

    def __init__(self, device: Literal["cpu", "gpu"], *, num_threads: int = 2) -> None:
        self.device = device
        self.num_threads = num_threads
        self._pipelines: dict[tuple[int, int], Any] = {}
        self._lock = threading.Lock()

    def chunks(
        self,
        source: Source,
        frame_indices: Sequence[int],
        *,
        out_height: int,
        out_width: int,
    ) -> Iterator[Frames]:
        _check_request(frame_indices, out_height, out_width)
        encoded = _encoded_bytes(source)
        for batch in _batches(frame_indices):
            yield self._run(encoded, batch, out_height, out_width)

    def decode(
        self,
        source: Source,
        frame_indices: Sequence[int],
        *,
        out_height: int,
        out_width: int,
    ) -> Frames:
        chunks = self.chunks(source, frame_indices, out_height=out_height, out_width=out_width)
        return _collect(chunks, out_height, out_width)

    def _run(self, encoded: Frames, batch: list[int], out_height: int, out_width: int) -> Frames:
        key = (out_height, out_width)
        with self._lock:
            pipeline = self._pipelines.get(key) or self._build(out_height, out_width)
            self._pipelines[key] = pipeline
            try:
                pipeline.feed_input("encoded", [encoded])
                pipeline.feed_input("frames", [np.asarray(batch, dtype=np.int32)])
                (video,) = pipeline.run()
            except RuntimeError as error:
                # A failed DALI pipeline refuses every later run; start afresh next time.
                del self._pipelines[key]
                raise DecodeError(_dali_message(str(error))) from error
        if self.device == "gpu":
            video = video.as_cpu()
        frames: Frames = np.array(video[0], dtype=np.uint8)
        return frames

    def _build(self, out_height: int, out_width: int) -> Any:
        from nvidia.dali import fn
        from nvidia.dali.pipeline import Pipeline
        from nvidia.dali.types import DALIDataType

        gpu = self.device == "gpu"
        # Synchronous, unpipelined execution: every run is fed explicitly and
        # nothing is prefetched, so a run's output belongs to its own input.
        # device_id=None is what a CPU-only host needs.
        pipeline: Any = Pipeline(  # type: ignore[no-untyped-call]
            batch_size=1,
            num_threads=self.num_threads,
            device_id=0 if gpu else None,
            exec_async=False,
            exec_pipelined=False,
            prefetch_queue_depth=1,
        )
        with pipeline:
            encoded = fn.external_source(name="encoded", dtype=DALIDataType.UINT8, ndim=1)
            indices = fn.external_source(name="frames", dtype=DALIDataType.INT32, ndim=1)
            video = fn.decoders.video(
                encoded, frames=indices, device="mixed" if gpu else "cpu", pad_mode="none"
            )
            pipeline.set_outputs(fn.resize(video, resize_x=out_width, resize_y=out_height))
        pipeline.build()
        return pipeline


def _encoded_bytes(source: Source) -> Frames:
    if isinstance(source, bytes):
        return np.frombuffer(source, dtype=np.uint8)
    try:
        return np.fromfile(os.fspath(source), dtype=np.uint8)
    except OSError as error:
        raise DecodeError(str(error)) from error


def _dali_message(text: str) -> str:
    """The operator's complaint, without DALI's pipeline traceback and C++ context."""
    _, marker, after = text.partition("encountered:")
    body = after if marker else text
    body = body.split("C++ context:")[0]
    return " ".join(body.split()) or text.strip()


class PyAvDecoder:
    """FFmpeg through PyAV: any codec FFmpeg decodes, on CPU.

    Seeks to the nearest keyframe before a requested frame when that skips
    decoding, and scales/converts with libswscale (`VideoFrame.reformat`).
    """

    def chunks(
        self,
        source: Source,
        frame_indices: Sequence[int],
        *,
        out_height: int,
        out_width: int,
    ) -> Iterator[Frames]:
        _check_request(frame_indices, out_height, out_width)
        try:
            with _open(source) as container:
                reader = _FrameReader(container, out_height, out_width)
                for batch in _batches(frame_indices):
                    yield reader.read(batch)
        except av.error.FFmpegError as error:
            raise DecodeError(str(error)) from error

    def decode(
        self,
        source: Source,
        frame_indices: Sequence[int],
        *,
        out_height: int,
        out_width: int,
    ) -> Frames:
        chunks = self.chunks(source, frame_indices, out_height=out_height, out_width=out_width)
        return _collect(chunks, out_height, out_width)


class _FrameReader:
    """Forward decoding of one open container, seeking only to jump ahead or back."""

    def __init__(self, container: Any, out_height: int, out_width: int) -> None:
        if not container.streams.video:
            raise DecodeError("the recording has no video stream")
        self._container = container
        self._stream = container.streams.video[0]
        self._stream.thread_type = "AUTO"
        self._pts, self._keyframes = _demux_index(container, self._stream)
        self._out = (out_height, out_width)
        self._frames: Iterator[Any] | None = None
        self._position: int | None = None  # pts of the last decoded frame

    def read(self, batch: Sequence[int]) -> Frames:
        out_height, out_width = self._out
        result = np.empty((len(batch), out_height, out_width, 3), dtype=np.uint8)
        for index in sorted(set(batch)):
            frame = self._frame_at(index)
            image = frame.to_ndarray(
                width=out_width, height=out_height, format="rgb24", interpolation="BILINEAR"
            )
            for slot, wanted in enumerate(batch):
                if wanted == index:
                    result[slot] = image
        return result

    def _frame_at(self, index: int) -> Any:
        if index >= len(self._pts):
            raise DecodeError(f"frame {index} requested; the stream has {len(self._pts)} frames")
        target = self._pts[index]
        keyframe = self._keyframe_before(target)
        position = self._position
        if self._frames is None or position is None or not keyframe <= position < target:
            self._seek(keyframe)
        assert self._frames is not None
        for frame in self._frames:
            if frame.pts is None:
                raise DecodeError("a decoded frame carries no presentation timestamp")
            self._position = frame.pts
            if frame.pts == target:
                return frame
            if frame.pts > target:
                break
        raise DecodeError(f"frame {index} (pts {target}) could not be decoded")

    def _keyframe_before(self, target: int) -> int:
        at = bisect.bisect_right(self._keyframes, target)
        return self._keyframes[at - 1] if at else self._pts[0]

    def _seek(self, keyframe_pts: int) -> None:
        self._container.seek(keyframe_pts, stream=self._stream, backward=True, any_frame=False)
        self._frames = iter(self._container.decode(self._stream))
        self._position = None


# --- choosing --------------------------------------------------------------


def gpu_available() -> bool:
    """Whether DALI sees a CUDA device; False on CPU-only hosts, never raises."""
    try:
        backend: Any = importlib.import_module("nvidia.dali.backend")
        return int(backend.GetCUDADeviceCount()) > 0
    except Exception:  # no driver, no libcuda, or a DALI build without CUDA
        return False


def choose_decoder(codec: str, gpu_available: bool) -> tuple[Decoder, DecoderName]:
    """The decoder for `codec` (PyAV's codec name) and its name for the job result."""
    if gpu_available and codec in DALI_GPU_CODECS:
        return DaliDecoder("gpu"), "dali-gpu"
    if codec in DALI_CPU_CODECS:
        return DaliDecoder("cpu"), "dali-cpu"
    return PyAvDecoder(), "pyav"
