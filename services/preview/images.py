"""Recognises the images the preview service stores: JPEG and PNG, complete and sized.

Pure and dependency-free: it reads only headers and markers (PNG IHDR, JPEG
SOFn segments) and checks that the image is not cut short (PNG ends with its
IEND chunk, JPEG with its EOI marker after a scan). It does not decode pixels:
the processor encoded the frame, and a reader's browser decodes it; this check
keeps other formats, truncated uploads and random bytes out of the bucket.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib

JPEG = "image/jpeg"
PNG = "image/png"
CONTENT_TYPES = (JPEG, PNG)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
PNG_MAX_SIDE = 2**31 - 1

JPEG_SOI = b"\xff\xd8"
JPEG_EOI = b"\xff\xd9"
MARKER_SOS = 0xDA
# Start-of-frame markers carry the dimensions; C4 (DHT), C8 (JPG) and CC (DAC) do not.
MARKERS_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE})
MARKERS_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RST0-7: no length


class ImageError(ValueError):
    """Why bytes are not an image we accept; the message is shown to the caller."""


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    content_type: str
    width: int
    height: int


def inspect_image(data: bytes) -> ImageInfo:
    """The format and dimensions of a complete JPEG or PNG; ImageError otherwise."""
    if data.startswith(PNG_SIGNATURE):
        return _inspect_png(data)
    if data.startswith(JPEG_SOI):
        return _inspect_jpeg(data)
    raise ImageError("The image is neither a JPEG nor a PNG.")


def _inspect_png(data: bytes) -> ImageInfo:
    # signature, then IHDR: length 13, type, width, height, 5 bytes of fields, CRC
    header = data[8:33]
    if len(header) < 25:
        raise ImageError("The PNG is truncated before its IHDR chunk.")
    length, kind, width, height = struct.unpack(">I4sII", header[:16])
    if kind != b"IHDR" or length != 13:
        raise ImageError("The PNG does not start with an IHDR chunk.")
    (crc,) = struct.unpack(">I", header[21:25])
    if zlib.crc32(header[4:21]) != crc:
        raise ImageError("The PNG's IHDR chunk is corrupt (CRC mismatch).")
    if not (0 < width <= PNG_MAX_SIDE and 0 < height <= PNG_MAX_SIDE):
        raise ImageError(f"The PNG has invalid dimensions {width}x{height}.")
    if not data.endswith(PNG_IEND) or len(data) < 33 + len(PNG_IEND):
        raise ImageError("The PNG is truncated: it does not end with an IEND chunk.")
    return ImageInfo(PNG, width, height)


def _inspect_jpeg(data: bytes) -> ImageInfo:
    size: tuple[int, int] | None = None
    position = len(JPEG_SOI)
    while True:
        marker, position = _next_marker(data, position)
        if marker in MARKERS_STANDALONE:
            continue
        if position + 2 > len(data):
            raise ImageError("The JPEG is truncated inside its headers.")
        (length,) = struct.unpack_from(">H", data, position)
        if length < 2 or position + length > len(data):
            raise ImageError("The JPEG is truncated inside its headers.")
        if marker in MARKERS_SOF:
            size = _sof_size(data, position, length)
        elif marker == MARKER_SOS:
            break
        position += length
    if size is None:
        raise ImageError("The JPEG has no frame header (SOFn) before its scan.")
    if not data.endswith(JPEG_EOI) or len(data) < position + length + len(JPEG_EOI):
        raise ImageError("The JPEG is truncated: it does not end with an EOI marker.")
    width, height = size
    return ImageInfo(JPEG, width, height)


def _next_marker(data: bytes, position: int) -> tuple[int, int]:
    """The marker at `position` (0xFF, fill bytes, the code) and where its segment starts."""
    if position >= len(data) or data[position] != 0xFF:
        raise ImageError("The JPEG is malformed or truncated: expected a marker.")
    while position < len(data) and data[position] == 0xFF:
        position += 1
    if position >= len(data):
        raise ImageError("The JPEG is truncated inside its headers.")
    return data[position], position + 1


def _sof_size(data: bytes, position: int, length: int) -> tuple[int, int]:
    # length(2), precision(1), height(2), width(2), components(1)
    if length < 8:
        raise ImageError("The JPEG's frame header is too short.")
    height, width = struct.unpack_from(">HH", data, position + 3)
    if width == 0 or height == 0:
        raise ImageError(f"The JPEG has no decodable dimensions ({width}x{height}).")
    return width, height


def jpeg_dimensions(prefix: bytes) -> tuple[int, int] | None:
    """Width and height from the first bytes of a JPEG (its SOFn segment), without the
    rest of it; None when they are not within `prefix` or it is no JPEG's start."""
    if not prefix.startswith(JPEG_SOI):
        return None
    position = len(JPEG_SOI)
    try:
        while True:
            marker, position = _next_marker(prefix, position)
            if marker in MARKERS_STANDALONE:
                continue
            if position + 2 > len(prefix):
                return None
            (length,) = struct.unpack_from(">H", prefix, position)
            if marker in MARKERS_SOF:
                if position + length > len(prefix):
                    return None
                return _sof_size(prefix, position, length)
            if marker == MARKER_SOS or length < 2:
                return None
            position += length
    except ImageError:
        return None
