"""The demo's synthetic footage: one recording per camera, VP9 for one and H.264 for the other,
so both decoders (DALI and the PyAV fallback on a CPU-only host) get a job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tools.demo.scenes import Codec, RecordingInfo, Scene, random_scene, write_recording

SECONDS = 30
FPS = 10
# camera id -> (codec, scene seed)
CAMERAS: dict[str, tuple[Codec, int]] = {"cam-a": ("vp9", 11), "cam-b": ("h264", 12)}
_EXTENSIONS: dict[Codec, str] = {"vp9": "webm", "h264": "mp4"}


@dataclass(frozen=True)
class Footage:
    camera_id: str
    codec: Codec
    path: Path
    scene: Scene
    info: RecordingInfo


def make_footage(directory: Path) -> list[Footage]:
    """Encode every camera's recording into `directory` (a few seconds of CPU each)."""
    directory.mkdir(parents=True, exist_ok=True)
    made = []
    for camera_id, (codec, seed) in CAMERAS.items():
        scene = random_scene(seed, seconds=SECONDS)
        path = directory / f"{camera_id}.{_EXTENSIONS[codec]}"
        info = write_recording(path, scene, seconds=SECONDS, fps=FPS, codec=codec)
        made.append(Footage(camera_id, codec, path, scene, info))
    return made
