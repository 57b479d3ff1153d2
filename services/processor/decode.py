"""Decode the frames a job samples from a recording.

The flow for one job: `probe` the recording, map the slots to frame indices
with `slot_frames`, pick a decoder with `choose_decoder`, and pull resized RGB
frames from `Decoder.chunks` (bounded memory) or `Decoder.decode` (all at once).
`choose_decoder` hands out one decoder per kind for the whole process, so DALI
pipelines are built once and reused by every job.

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
- Each run decodes from the keyframe before its first requested frame: a run
  does not continue where the previous one stopped. So runs are cut at GOP
  boundaries where they can be (`plan_chunks`); runs of 16 frames cut inside
  128-frame GOPs cost 2.5 times the CPU of one run over the same frames.
- `fn.resize` on CPU costs about 3.5 ms per 640x360 output frame even when the
  size does not change (measured: DALI decode alone matches PyAV, about 2 ms per
  sampled frame, and the identity resize tripled it), so the pipeline resizes
  only when the stream's size differs from the requested one.

Letterboxing (docs/bring-your-own-model.md): a model that takes letterboxed frames gets the
picture resized with its aspect kept and padded with 114 gray to the model's size, with
Ultralytics' geometry (`letterbox`). In DALI it is `fn.resize` then `fn.slice` with a
negative start and `out_of_bounds_policy="pad"`, in the same pipeline, so on a GPU the
padded frame is made on the device that decoded it.
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

from workshop.kit.letterbox import PAD_VALUE, Placement, stretch

Source = str | os.PathLike[str] | bytes
Frames = NDArray[np.uint8]

# Frames held per pipeline run / yielded per chunk: at most MAX_FRAMES_PER_CHUNK, and
# at most CHUNK_BYTES of decoded RGB at the larger of the stream's and the output's
# size (a 1080p frame is about 6 MB: 10 per chunk; 640x360: 64). Larger chunks mean
# fewer DALI runs (each re-reads the container and restarts at a keyframe) and more
# batches per model pass; three jobs in flight hold three chunks.
MAX_FRAMES_PER_CHUNK = 64
CHUNK_BYTES = 64 * 1024 * 1024

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
        raise DecodeError(_ffmpeg_message(error)) from error
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
    """Decodes selected frames to uint8 RGB arrays of shape [n, out_height, out_width, 3]:
    stretched to that size, or placed as `placement` says (a letterbox). A decoder that
    subclasses it writes `chunks` and inherits `decode`."""

    def chunks(
        self,
        source: Source,
        frame_indices: Sequence[int],
        *,
        out_height: int,
        out_width: int,
        placement: Placement | None = None,
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
        placement: Placement | None = None,
    ) -> Frames:
        """All requested frames at once; prefer `chunks` for long requests."""
        chunks = self.chunks(
            source, frame_indices, out_height=out_height, out_width=out_width, placement=placement
        )
        return _collect(chunks, out_height, out_width)


def _collect(chunks: Iterator[Frames], out_height: int, out_width: int) -> Frames:
    parts = list(chunks)
    if not parts:
        return np.empty((0, out_height, out_width, 3), dtype=np.uint8)
    return np.concatenate(parts)


def _check_request(
    frame_indices: Sequence[int], out_height: int, out_width: int, placement: Placement | None
) -> Placement:
    if out_height <= 0 or out_width <= 0:
        raise ValueError(f"output size must be positive, got {out_width}x{out_height}")
    if placement is None:
        placement = stretch(out_height, out_width)
    if (placement.out_height, placement.out_width) != (out_height, out_width):
        raise ValueError("the placement is for another output size")
    if any(index < 0 for index in frame_indices):
        raise ValueError("frame indices must be non-negative")
    return placement


def frames_per_chunk(pixels: int, limit: int = MAX_FRAMES_PER_CHUNK) -> int:
    """How many RGB frames of `pixels` pixels one chunk may hold."""
    return max(1, min(limit, CHUNK_BYTES // (pixels * 3)))


def plan_chunks(
    frame_indices: Sequence[int], keyframes: Sequence[int], limit: int
) -> Iterator[list[int]]:
    """The request cut into consecutive runs of at most `limit` frames, at GOP boundaries
    where that is possible.

    `keyframes` are the sorted indices of the stream's keyframes (empty: unknown). The
    request is taken in its own order; neighbouring requested frames of one GOP stay in one
    chunk unless the GOP alone asks for more than `limit`.
    """
    chunk: list[int] = []
    for group in _gop_runs(frame_indices, keyframes):
        if chunk and len(chunk) + len(group) > limit:
            yield chunk
            chunk = []
        while len(group) > limit:
            yield group[:limit]
            group = group[limit:]
        chunk += group
    if chunk:
        yield chunk


def _gop_runs(frame_indices: Sequence[int], keyframes: Sequence[int]) -> Iterator[list[int]]:
    """Maximal runs of consecutive requested frames that need the same keyframe."""
    run: list[int] = []
    current = None
    for index in frame_indices:
        gop = bisect.bisect_right(keyframes, index)
        if run and gop != current:
            yield run
            run = []
        current = gop
        run.append(index)
    if run:
        yield run


@dataclass(frozen=True)
class _Layout:
    """What planning needs from the container: the coded size and the keyframes' indices."""

    height: int
    width: int
    keyframes: tuple[int, ...]


def _layout(source: Source) -> _Layout | None:
    """Demuxes (no decoding); None when PyAV cannot read it: DALI then says what is wrong."""
    try:
        with _open(source) as container:
            if not container.streams.video:
                return None
            stream = container.streams.video[0]
            pts, keyframe_pts = _demux_index(container, stream)
            height, width = stream.codec_context.height, stream.codec_context.width
    except (av.error.FFmpegError, OSError):
        return None
    keyframes = tuple(bisect.bisect_left(pts, key) for key in keyframe_pts)
    return _Layout(height, width, keyframes)


# A DALI pipeline's output: the size it resizes to (None: the stream's own) and the
# letterbox it pads to (None: no padding).
_Shape = tuple[tuple[int, int] | None, Placement | None]


class DaliDecoder(Decoder):
    """NVIDIA DALI `fn.decoders.video`, with `fn.resize` in the same pipeline when the
    stream's size is not the requested one.

    `device="cpu"` handles VP8/VP9/MJPEG; `device="gpu"` decodes on NVDEC (adds
    H.264/HEVC/AV1) and resizes on the GPU. Safe for concurrent use: each run takes an
    idle pipeline of its output shape (or builds one) and puts it back afterwards, so a
    process builds about as many pipelines as it runs jobs at once, and reuses them.
    """

    def __init__(
        self,
        device: Literal["cpu", "gpu"],
        *,
        num_threads: int = 1,
        max_chunk_frames: int = MAX_FRAMES_PER_CHUNK,
    ) -> None:
        self.device = device
        # batch_size is 1 (one recording per run), so more threads than one stay idle.
        self.num_threads = num_threads
        self.max_chunk_frames = max_chunk_frames
        self._idle: dict[_Shape, list[Any]] = {}
        self._lock = threading.Lock()

    def chunks(
        self,
        source: Source,
        frame_indices: Sequence[int],
        *,
        out_height: int,
        out_width: int,
        placement: Placement | None = None,
    ) -> Iterator[Frames]:
        place = _check_request(frame_indices, out_height, out_width, placement)
        if not frame_indices:
            return
        encoded = _encoded_bytes(source)
        layout = _layout(source)
        same_size = layout is not None and (layout.height, layout.width) == (
            place.height,
            place.width,
        )
        resize = None if same_size else (place.height, place.width)
        shape: _Shape = (resize, place if place.padded else None)
        largest = max(out_height * out_width, layout.height * layout.width if layout else 0)
        limit = frames_per_chunk(largest, self.max_chunk_frames)
        for batch in plan_chunks(frame_indices, layout.keyframes if layout else (), limit):
            yield self._run(encoded, batch, shape)

    def _run(self, encoded: Frames, batch: list[int], resize: _Shape) -> Frames:
        pipeline = self._take(resize)
        try:
            pipeline.feed_input("encoded", [encoded])
            pipeline.feed_input("frames", [np.asarray(batch, dtype=np.int32)])
            (video,) = pipeline.run()
        except RuntimeError as error:
            # A failed DALI pipeline refuses every later run: it is not put back.
            raise DecodeError(_dali_message(str(error))) from error
        if self.device == "gpu":
            video = video.as_cpu()
        frames: Frames = np.array(video[0], dtype=np.uint8)
        self._put_back(resize, pipeline)
        return frames

    def _take(self, resize: _Shape) -> Any:
        with self._lock:
            idle = self._idle.get(resize)
            if idle:
                return idle.pop()
        return self._build(resize)

    def _put_back(self, resize: _Shape, pipeline: Any) -> None:
        with self._lock:
            self._idle.setdefault(resize, []).append(pipeline)

    def _build(self, shape: _Shape) -> Any:
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
            video: Any = fn.decoders.video(
                encoded, frames=indices, device="mixed" if gpu else "cpu", pad_mode="none"
            )
            resize, pad = shape
            if resize is not None:
                video = fn.resize(video, resize_x=resize[1], resize_y=resize[0])
            if pad is not None:  # the letterbox: a window larger than the picture, padded
                video = fn.slice(
                    video,
                    start=[-pad.top, -pad.left],
                    shape=[pad.out_height, pad.out_width],
                    axis_names="HW",
                    out_of_bounds_policy="pad",
                    fill_values=PAD_VALUE,
                )
            pipeline.set_outputs(video)
        pipeline.build()
        return pipeline


def _encoded_bytes(source: Source) -> Frames:
    if isinstance(source, bytes):
        return np.frombuffer(source, dtype=np.uint8)
    try:
        return np.fromfile(os.fspath(source), dtype=np.uint8)
    except OSError as error:
        raise DecodeError(str(error)) from error


def _ffmpeg_message(error: av.error.FFmpegError) -> str:
    """FFmpeg's own words, with the file name when there is one (not PyAV's errno prefix)."""
    message = error.strerror or str(error)
    name = error.filename
    return f"{message}: {name}" if name and name != "<none>" else message


def _dali_message(text: str) -> str:
    """The operator's complaint, without DALI's pipeline traceback and C++ context."""
    _, marker, after = text.partition("encountered:")
    body = after if marker else text
    body = body.split("C++ context:")[0]
    return " ".join(body.split()) or text.strip()


class PyAvDecoder(Decoder):
    """FFmpeg through PyAV: any codec FFmpeg decodes, on CPU.

    Seeks to the nearest keyframe before a requested frame when that skips
    decoding, and scales/converts with libswscale (`VideoFrame.reformat`).
    Stateless between calls, so one instance serves every job.

    `threads` is FFmpeg's decoding threads per recording. One by default: the processor
    decodes up to three recordings at once on a busy machine, and one thread per
    recording decoded the sampled 640x360 H.264 and VP9 here with 17-28 % less CPU than
    FFmpeg's automatic frame threading, at the same speed per recording.
    """

    def __init__(self, *, max_chunk_frames: int = MAX_FRAMES_PER_CHUNK, threads: int = 1) -> None:
        self.max_chunk_frames = max_chunk_frames
        self.threads = threads

    def chunks(
        self,
        source: Source,
        frame_indices: Sequence[int],
        *,
        out_height: int,
        out_width: int,
        placement: Placement | None = None,
    ) -> Iterator[Frames]:
        place = _check_request(frame_indices, out_height, out_width, placement)
        try:
            with _open(source) as container:
                reader = _FrameReader(container, place, self.threads)
                # The reader decodes forward and keeps its place, so chunks need no GOP cuts.
                limit = frames_per_chunk(out_height * out_width, self.max_chunk_frames)
                for offset in range(0, len(frame_indices), limit):
                    yield reader.read(frame_indices[offset : offset + limit])
        except av.error.FFmpegError as error:
            raise DecodeError(_ffmpeg_message(error)) from error


class _FrameReader:
    """Forward decoding of one open container, seeking only to jump ahead or back."""

    def __init__(self, container: Any, placement: Placement, threads: int) -> None:
        if not container.streams.video:
            raise DecodeError("the recording has no video stream")
        self._container = container
        self._stream = container.streams.video[0]
        if threads == 1:
            self._stream.thread_count = 1
        else:
            self._stream.thread_type = "AUTO"
            self._stream.thread_count = threads
        self._pts, self._keyframes = _demux_index(container, self._stream)
        self._place = placement
        self._frames: Iterator[Any] | None = None
        self._position: int | None = None  # pts of the last decoded frame

    def read(self, batch: Sequence[int]) -> Frames:
        place = self._place
        shape = (len(batch), place.out_height, place.out_width, 3)
        result = (
            np.full(shape, PAD_VALUE, dtype=np.uint8) if place.padded else np.empty(shape, np.uint8)
        )
        rows = slice(place.top, place.top + place.height)
        columns = slice(place.left, place.left + place.width)
        for index in sorted(set(batch)):
            frame = self._frame_at(index)
            image = frame.to_ndarray(
                width=place.width, height=place.height, format="rgb24", interpolation="BILINEAR"
            )
            for slot, wanted in enumerate(batch):
                if wanted == index:
                    result[slot, rows, columns] = image
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


_shared: dict[DecoderName, Decoder] = {}


def choose_decoder(codec: str, gpu_available: bool) -> tuple[Decoder, DecoderName]:
    """The decoder for `codec` (PyAV's codec name) and its name for the job result.

    One instance per kind for the process: DALI pipelines are built once, not per job.
    """
    if gpu_available and codec in DALI_GPU_CODECS:
        name: DecoderName = "dali-gpu"
    elif codec in DALI_CPU_CODECS:
        name = "dali-cpu"
    else:
        name = "pyav"
    decoder = _shared.get(name)
    if decoder is None:
        decoder = _shared[name] = _new_decoder(name)
    return decoder, name


def _new_decoder(name: DecoderName) -> Decoder:
    if name == "dali-gpu":
        return DaliDecoder("gpu")
    if name == "dali-cpu":
        return DaliDecoder("cpu")
    return PyAvDecoder()
