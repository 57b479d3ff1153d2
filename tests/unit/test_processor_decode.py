"""Decode layer: slot → frame mapping, DALI (CPU) and PyAV decoders, on recordings made here.

Every synthetic frame shows its own index in binary as eight vertical bars
(bar b is white when bit b is set), which survives lossy coding and resizing,
so a test can tell which frame a decoder returned.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from numpy.typing import NDArray

from services.processor.decode import (
    CHUNK_BYTES,
    MAX_FRAMES_PER_CHUNK,
    DaliDecoder,
    DecodeError,
    PyAvDecoder,
    RecordingTooShort,
    StreamInfo,
    choose_decoder,
    frames_per_chunk,
    gpu_available,
    plan_chunks,
    probe,
    slot_frames,
)

WIDTH, HEIGHT, FPS, SECONDS, BARS = 320, 180, 10, 4, 8
FRAME_COUNT = FPS * SECONDS
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def synthetic_frame(index: int) -> NDArray[np.uint8]:
    image = np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint8)
    bar = WIDTH // BARS
    for bit in range(BARS):
        if (index >> bit) & 1:
            image[:, bit * bar : (bit + 1) * bar] = 255
    return image


def frame_number(image: NDArray[np.uint8]) -> int:
    bar = image.shape[1] / BARS
    margin = max(1, int(bar / 4))  # skip the blurred bar edges
    number = 0
    for bit in range(BARS):
        left, right = int(bit * bar) + margin, int((bit + 1) * bar) - margin
        if image[:, left:right].mean() > 128:
            number |= 1 << bit
    return number


def write_recording(path: Path, codec: str, *, gop: int | None = None) -> Path:
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=FPS)
        assert isinstance(stream, av.VideoStream)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        if gop is not None:
            stream.codec_context.gop_size = gop
        for index in range(FRAME_COUNT):
            frame = av.VideoFrame.from_ndarray(synthetic_frame(index), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


@pytest.fixture(scope="module")
def vp9(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_recording(tmp_path_factory.mktemp("rec") / "clip.webm", "libvpx-vp9")


@pytest.fixture(scope="module")
def vp9_short_gops(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A keyframe every 10 frames: four GOPs."""
    return write_recording(tmp_path_factory.mktemp("rec") / "gops.webm", "libvpx-vp9", gop=10)


@pytest.fixture(scope="module")
def h264(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_recording(tmp_path_factory.mktemp("rec") / "clip.mp4", "libx264")


def numbers(frames: NDArray[np.uint8]) -> list[int]:
    return [frame_number(frame) for frame in frames]


def every(seconds: float, count: int, *, offset: float = 0.0) -> tuple[list[datetime], ...]:
    starts = [T0 + timedelta(seconds=offset + i * seconds) for i in range(count)]
    return starts, [start + timedelta(seconds=seconds) for start in starts]


# --- probe -----------------------------------------------------------------


@pytest.mark.parametrize(("fixture", "codec"), [("vp9", "vp9"), ("h264", "h264")])
def test_probe_reads_stream_parameters(
    fixture: str, codec: str, request: pytest.FixtureRequest
) -> None:
    info = probe(request.getfixturevalue(fixture))

    assert (info.codec, info.width, info.height) == (codec, WIDTH, HEIGHT)
    assert info.fps == FPS
    assert info.frame_count == FRAME_COUNT == len(info.frame_pts)
    assert info.start_time == 0
    assert info.duration == SECONDS
    # Timestamps are exact multiples of the frame interval in the stream's time base.
    first_times = [pts * info.time_base for pts in info.frame_pts[:3]]
    assert first_times == [0, Fraction(1, 10), Fraction(1, 5)]


def test_probe_accepts_bytes(vp9: Path) -> None:
    assert probe(vp9.read_bytes()).frame_count == FRAME_COUNT


# --- slot_frames -----------------------------------------------------------


def test_one_second_slots_take_the_frame_at_each_slot_start(h264: Path) -> None:
    info = probe(h264)  # time base 1/10240: frame times are not round in ticks

    assert slot_frames(info, T0, *every(1.0, 4)) == [0, 10, 20, 30]


def test_slot_starting_between_frames_takes_the_next_frame(vp9: Path) -> None:
    info = probe(vp9)
    starts, ends = every(1.0, 3, offset=0.25)

    assert slot_frames(info, T0, starts, ends) == [3, 13, 23]


def test_slot_without_a_frame_is_empty() -> None:
    # A 2 fps stream sampled every 0.2 s: frames at 0, 0.5, 1.0, 1.5 s; the rest are EMPTY.
    info = StreamInfo(
        codec="h264",
        width=WIDTH,
        height=HEIGHT,
        fps=Fraction(2),
        time_base=Fraction(1, 1000),
        start_time=Fraction(0),
        duration=Fraction(3),
        frame_count=6,
        frame_pts=(0, 500, 1000, 1500, 2000, 2500),
    )

    got = slot_frames(info, T0, *every(0.2, 10))

    assert got == [0, None, 1, None, None, 2, None, 3, None, None]


def test_slot_end_is_exclusive(vp9: Path) -> None:
    info = probe(vp9)
    starts = [T0 + timedelta(seconds=0.25)]

    assert slot_frames(info, T0, starts, [T0 + timedelta(seconds=0.3)]) == [None]
    assert slot_frames(info, T0, starts, [T0 + timedelta(seconds=0.31)]) == [3]


def test_constant_rate_info_without_timestamps_maps_the_same(vp9: Path) -> None:
    info = probe(vp9)
    bare = StreamInfo(**{**info.__dict__, "frame_pts": ()})
    slots = every(0.35, 11)

    assert slot_frames(bare, T0, *slots) == slot_frames(info, T0, *slots)


def test_recording_that_ends_before_the_last_slot_is_too_short(vp9: Path) -> None:
    info = probe(vp9)  # 40 frames at 10 fps: shown until 4.0 s

    with pytest.raises(RecordingTooShort, match="before the last slot"):
        slot_frames(info, T0, *every(1.0, 5))
    # A last slot that starts within the final frame's interval is merely empty.
    starts, ends = [T0 + timedelta(seconds=3.95)], [T0 + timedelta(seconds=4.95)]
    assert slot_frames(info, T0, starts, ends) == [None]


def test_recording_start_offsets_the_slots(vp9: Path) -> None:
    info = probe(vp9)
    starts, ends = every(1.0, 2)

    assert slot_frames(info, T0 - timedelta(seconds=2), starts, ends) == [20, 30]


# --- decoders --------------------------------------------------------------


def test_dali_cpu_decodes_the_selected_vp9_frames(vp9: Path) -> None:
    wanted = [0, 5, 3, 39, 17, 17]

    dali = DaliDecoder("cpu").decode(vp9, wanted, out_height=HEIGHT, out_width=WIDTH)
    pyav = PyAvDecoder().decode(vp9, wanted, out_height=HEIGHT, out_width=WIDTH)

    assert dali.shape == (len(wanted), HEIGHT, WIDTH, 3)
    assert dali.dtype == np.uint8
    assert numbers(dali) == wanted == numbers(pyav)
    difference = np.abs(dali.astype(np.int16) - pyav.astype(np.int16))
    assert difference.mean() < 4  # same frames; colour conversion differs slightly


def test_dali_resizes_in_the_pipeline_and_accepts_bytes(vp9: Path) -> None:
    decoder = DaliDecoder("cpu")

    frames = decoder.decode(vp9.read_bytes(), [7, 8], out_height=90, out_width=160)

    assert frames.shape == (2, 90, 160, 3)
    assert numbers(frames) == [7, 8]


def test_dali_yields_bounded_chunks(vp9: Path) -> None:
    wanted = list(range(FRAME_COUNT))

    decoder = DaliDecoder("cpu", max_chunk_frames=16)
    chunks = list(decoder.chunks(vp9, wanted, out_height=36, out_width=64))

    assert [len(chunk) for chunk in chunks] == [16, 16, 8]
    assert numbers(np.concatenate(chunks)) == wanted


def test_dali_cuts_chunks_at_keyframes(vp9_short_gops: Path) -> None:
    """GOPs of 10 frames, 5 wanted from each: chunks hold whole GOPs (10 frames, not 12)."""
    keyframes = [index for index, key in enumerate(_keyframe_flags(vp9_short_gops)) if key]
    assert keyframes == [0, 10, 20, 30]
    wanted = [i for start in keyframes for i in range(start + 1, start + 10, 2)][:16]

    decoder = DaliDecoder("cpu", max_chunk_frames=12)
    chunks = list(decoder.chunks(vp9_short_gops, wanted, out_height=HEIGHT, out_width=WIDTH))

    assert [len(chunk) for chunk in chunks] == [10, 6]
    assert numbers(np.concatenate(chunks)) == wanted


def _keyframe_flags(path: Path) -> list[bool]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = sorted(
            (packet.pts, packet.is_keyframe) for packet in container.demux(stream) if packet.size
        )
    return [key for _, key in packets]


def test_plan_chunks_keeps_gops_together_and_the_request_order() -> None:
    keyframes = [0, 10, 20, 30]

    assert list(plan_chunks([1, 3, 11, 13, 15, 21, 23], keyframes, 4)) == [
        [1, 3],
        [11, 13, 15],
        [21, 23],
    ]
    assert list(plan_chunks([1, 3, 11, 13], keyframes, 4)) == [[1, 3, 11, 13]]
    # One GOP asking for more than a chunk holds is split; unknown keyframes: by count.
    assert list(plan_chunks(list(range(10)), keyframes, 4)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert list(plan_chunks([5, 1, 30, 2], [], 3)) == [[5, 1, 30], [2]]
    # Going back to an earlier GOP starts a new run.
    assert list(plan_chunks([11, 1, 12], keyframes, 8)) == [[11, 1, 12]]
    assert list(plan_chunks([11, 12, 1, 2, 13], keyframes, 3)) == [[11, 12], [1, 2, 13]]


def test_chunk_size_follows_the_byte_budget() -> None:
    assert frames_per_chunk(640 * 360) == MAX_FRAMES_PER_CHUNK
    assert frames_per_chunk(1920 * 1080) == CHUNK_BYTES // (1920 * 1080 * 3) < 16
    assert frames_per_chunk(10_000 * 10_000) == 1


def test_dali_without_resizing_gives_the_same_frames(vp9: Path) -> None:
    """The stream's own size skips fn.resize; the frames are the ones a resize to another
    size and back would give, up to rounding."""
    decoder = DaliDecoder("cpu")

    native = decoder.decode(vp9, [3, 21], out_height=HEIGHT, out_width=WIDTH)
    halved = decoder.decode(vp9, [3, 21], out_height=HEIGHT // 2, out_width=WIDTH // 2)

    assert native.shape == (2, HEIGHT, WIDTH, 3)
    assert halved.shape == (2, HEIGHT // 2, WIDTH // 2, 3)
    assert numbers(native) == numbers(halved) == [3, 21]
    assert set(decoder._idle) == {(None, None), ((HEIGHT // 2, WIDTH // 2), None)}  # one each


def test_pyav_decodes_h264_in_any_order_with_bounded_chunks(h264: Path) -> None:
    wanted = [39, 0, 12, 12, 1, *range(20, 35)]

    chunks = list(
        PyAvDecoder(max_chunk_frames=16).chunks(h264, wanted, out_height=72, out_width=128)
    )

    assert [len(chunk) for chunk in chunks] == [16, len(wanted) - 16]
    assert all(chunk.shape[1:] == (72, 128, 3) for chunk in chunks)
    assert numbers(np.concatenate(chunks)) == wanted


def test_no_frames_requested_gives_an_empty_array(h264: Path) -> None:
    assert PyAvDecoder().decode(h264, [], out_height=9, out_width=16).shape == (0, 9, 16, 3)


@pytest.mark.parametrize("decoder", [DaliDecoder("cpu"), PyAvDecoder()], ids=["dali", "pyav"])
def test_frame_past_the_end_is_an_error_not_a_black_frame(
    decoder: DaliDecoder | PyAvDecoder, vp9: Path
) -> None:
    with pytest.raises(DecodeError, match="40"):
        decoder.decode(vp9, [1, FRAME_COUNT], out_height=HEIGHT, out_width=WIDTH)


def test_dali_recovers_after_a_failed_run(vp9: Path) -> None:
    decoder = DaliDecoder("cpu")
    with pytest.raises(DecodeError):
        decoder.decode(b"not a video at all" * 20, [0], out_height=HEIGHT, out_width=WIDTH)

    frames = decoder.decode(vp9, [4], out_height=HEIGHT, out_width=WIDTH)

    assert numbers(frames) == [4]


def test_dali_cpu_cannot_decode_h264(h264: Path) -> None:
    with pytest.raises(DecodeError, match="Failed to create video decoder"):
        DaliDecoder("cpu").decode(h264, [0], out_height=HEIGHT, out_width=WIDTH)


def test_truncated_mp4_raises_the_decoders_message(h264: Path, tmp_path: Path) -> None:
    truncated = tmp_path / "cut.mp4"
    truncated.write_bytes(h264.read_bytes()[: h264.stat().st_size // 2])

    with pytest.raises(DecodeError, match="Invalid data"):
        probe(truncated)
    with pytest.raises(DecodeError, match="Invalid data"):
        PyAvDecoder().decode(truncated, [0], out_height=HEIGHT, out_width=WIDTH)


def test_truncated_webm_has_fewer_frames_and_refuses_lost_ones(vp9: Path) -> None:
    data = vp9.read_bytes()
    truncated = data[: len(data) // 2]

    info = probe(truncated)

    assert 0 < info.frame_count < FRAME_COUNT
    with pytest.raises(RecordingTooShort):
        slot_frames(info, T0, *every(1.0, SECONDS))
    with pytest.raises(DecodeError, match="valid frame indices"):
        DaliDecoder("cpu").decode(truncated, [FRAME_COUNT - 1], out_height=90, out_width=160)


def test_garbage_is_a_decode_error(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"\x00\x01 definitely not a recording " * 50)

    with pytest.raises(DecodeError, match=r"\w"):
        probe(garbage)
    with pytest.raises(DecodeError, match=r"\w"):
        PyAvDecoder().decode(garbage, [0], out_height=HEIGHT, out_width=WIDTH)


def test_missing_file_is_a_decode_error(tmp_path: Path) -> None:
    with pytest.raises(DecodeError, match="No such file"):
        DaliDecoder("cpu").decode(tmp_path / "gone.webm", [0], out_height=9, out_width=16)


# --- choosing --------------------------------------------------------------


def test_choose_decoder_by_codec_and_gpu() -> None:
    h264_cpu, h264_cpu_name = choose_decoder("h264", gpu_available=False)
    vp9_cpu, vp9_cpu_name = choose_decoder("vp9", gpu_available=False)
    h264_gpu, h264_gpu_name = choose_decoder("h264", gpu_available=True)

    assert (isinstance(h264_cpu, PyAvDecoder), h264_cpu_name) == (True, "pyav")
    assert isinstance(vp9_cpu, DaliDecoder)
    assert (vp9_cpu.device, vp9_cpu_name) == ("cpu", "dali-cpu")
    assert isinstance(h264_gpu, DaliDecoder)
    assert (h264_gpu.device, h264_gpu_name) == ("gpu", "dali-gpu")
    assert choose_decoder("prores", gpu_available=True)[1] == "pyav"
    # One decoder per kind for the process: jobs share built pipelines.
    assert choose_decoder("vp8", gpu_available=False)[0] is vp9_cpu
    assert choose_decoder("hevc", gpu_available=False)[0] is h264_cpu


def test_concurrent_dali_runs_reuse_their_pipelines(vp9: Path) -> None:
    decoder = DaliDecoder("cpu")
    wanted = [[1, 2], [30, 31], [17], [5, 39]]

    def run(indices: list[int]) -> list[int]:
        return numbers(decoder.decode(vp9, indices, out_height=HEIGHT, out_width=WIDTH))

    with ThreadPoolExecutor(max_workers=2) as pool:
        for _ in range(3):
            assert list(pool.map(run, wanted)) == wanted
    assert 1 <= len(decoder._idle[(None, None)]) <= 2


def test_gpu_detection_is_safe_anywhere() -> None:
    assert isinstance(gpu_available(), bool)
