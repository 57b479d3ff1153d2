"""What `recordings import` reads from a video file: duration, frame rate, the start time it
may carry (container `creation_time`), and its SHA-256 and size."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

import av

# `<camera>_<YYYYMMDD>T<HHMMSS>Z.<ext>`: the camera and the first frame's instant (UTC).
FILENAME = re.compile(r"(?P<camera>[A-Za-z0-9][A-Za-z0-9._-]*)_(?P<start>\d{8}T\d{6}Z)\.\w+")
FILENAME_TIME = "%Y%m%dT%H%M%SZ"


class BadMedia(ValueError):
    """The file is not a video PyAV can read, or lacks what a recording needs."""


@dataclasses.dataclass(frozen=True)
class Probe:
    duration: timedelta
    fps: float
    creation_time: datetime | None  # from the container's metadata, when it has one


@dataclasses.dataclass(frozen=True)
class Digest:
    sha256: str
    byte_size: int


def probe(path: Path) -> Probe:
    """The video's duration and nominal frame rate, and its metadata's creation time."""
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise BadMedia(f"{path} has no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            if container.duration:
                seconds = Fraction(container.duration, av.time_base)
            elif stream.duration and stream.time_base:
                seconds = stream.duration * stream.time_base
            else:
                raise BadMedia(f"{path} does not say how long it is")
            created = container.metadata.get("creation_time") or stream.metadata.get(
                "creation_time"
            )
    except av.FFmpegError as error:
        raise BadMedia(f"{path} is not a readable video: {error}") from None
    if not rate or rate <= 0:
        raise BadMedia(f"{path} does not say its frame rate")
    return Probe(timedelta(seconds=float(seconds)), float(rate), _instant(created))


def _instant(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def from_filename(path: Path) -> tuple[str, datetime] | None:
    """(camera, start) when the name follows `<camera>_<YYYYMMDD>T<HHMMSS>Z.<ext>`."""
    match = FILENAME.fullmatch(path.name)
    if match is None:
        return None
    start = datetime.strptime(match["start"], FILENAME_TIME).replace(tzinfo=UTC)
    return match["camera"], start


def digest(path: Path) -> Digest:
    """SHA-256 and size, read in chunks (recordings can be large)."""
    sha, size = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
    return Digest(sha.hexdigest(), size)
