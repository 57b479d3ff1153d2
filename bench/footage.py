"""The synthetic footage the processor benchmarks run on, and the frames a run samples.

Scenes come from `tools.demo.scenes` (seeds 1..n), encoded once into a cache folder
whose name covers every input of the bytes (codec, size, rate, length, PyAV and the scene
module), so reruns and both benchmarks share the same files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from datetime import timedelta
from pathlib import Path

import av

import tools.demo.scenes as scenes_module
from services.coordinator.runs.planning import interval_ms, slot_time
from services.coordinator.workflows.validation import MILLISECOND_TOLERANCE
from services.processor import decode
from testbed.coordinator_world import DAY
from tools.demo.scenes import random_scene, write_recording

WIDTH, HEIGHT, FPS = 640, 360, 10
START = DAY + timedelta(hours=8)  # every recording starts here
DEFAULT_CACHE = Path.home() / ".cache" / "workshop-bench" / "processor_throughput"


@dataclasses.dataclass(frozen=True)
class Recording:
    camera: str
    path: Path
    sha256: str
    byte_size: int


def cached_recordings(cache: Path, count: int, seconds: int, codec: str) -> list[Recording]:
    """Scenes 1..count encoded once; the directory name covers every input of the bytes."""
    source = Path(scenes_module.__file__).read_bytes()
    version = f"{av.__version__}-{hashlib.sha256(source).hexdigest()[:12]}"
    folder = cache / f"{codec}-{WIDTH}x{HEIGHT}-{FPS}fps-{seconds}s-{version}"
    folder.mkdir(parents=True, exist_ok=True)
    suffix = "webm" if codec == "vp9" else "mp4"
    made = 0
    began = time.perf_counter()
    found = []
    for seed in range(1, count + 1):
        path = folder / f"scene-{seed:03d}.{suffix}"
        if not path.exists():
            partial = path.with_suffix(".partial")
            scene = random_scene(seed, width=WIDTH, height=HEIGHT, seconds=seconds)
            write_recording(partial, scene, seconds=seconds, fps=FPS, codec=codec)  # type: ignore[arg-type]
            partial.rename(path)
            made += 1
        data = path.read_bytes()
        found.append(
            Recording(f"cam-{seed:03d}", path, hashlib.sha256(data).hexdigest(), len(data))
        )
    note = f"encoded {made} in {time.perf_counter() - began:.1f} s" if made else "all cached"
    what = f"{count} x {seconds} s {codec} {WIDTH}x{HEIGHT} {FPS} fps"
    print(f"recordings: {what} in {folder} ({note})", flush=True)
    return found


def whole_ms(interval: float) -> bool:
    return abs(interval * 1000 - interval_ms(interval)) <= MILLISECOND_TOLERANCE


def sampled_frames(recordings: list[Recording], seconds: int, interval: float) -> list[list[int]]:
    """The frame index of each slot, as the processor maps them (set-up, not measured).

    Slots are on the coordinator's grid, in exact integer milliseconds (slot k of 0.5 s
    starts k * 500 ms after the recording), one per grid point in the recording."""
    step = interval_ms(interval)
    count = -(-seconds * 1000 // step)  # grid points in [0, seconds)
    starts = [slot_time(START, step, k) for k in range(count)]
    ends = [start + timedelta(milliseconds=step) for start in starts]
    found = []
    for recording in recordings:
        info = decode.probe(recording.path)
        indices = decode.slot_frames(info, START, starts, ends)
        found.append([index for index in indices if index is not None])
    return found
