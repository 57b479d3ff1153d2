"""The image check of the preview service (pure): JPEG and PNG, complete, with dimensions."""

from __future__ import annotations

import struct

import pytest

from services.preview.images import JPEG, PNG, ImageError, ImageInfo, inspect_image
from testbed.harness.preview import jpeg_bytes, png_bytes

GIF = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00!\xf9\x04\x00\x00\x00\x00\x00,"


def test_a_jpeg_has_its_frame_size() -> None:
    assert inspect_image(jpeg_bytes(64, 48)) == ImageInfo(JPEG, 64, 48)
    assert inspect_image(jpeg_bytes(320, 240, seed=3)) == ImageInfo(JPEG, 320, 240)


def test_a_jpeg_with_large_segments_before_its_frame_header_is_read_to_its_end() -> None:
    padded = jpeg_bytes(64, 48, size=300_000)
    assert len(padded) >= 300_000
    assert inspect_image(padded) == ImageInfo(JPEG, 64, 48)


def test_a_png_has_its_header_size() -> None:
    assert inspect_image(png_bytes(8, 6)) == ImageInfo(PNG, 8, 6)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (GIF, "neither a JPEG nor a PNG"),
        (bytes(range(256)) * 4, "neither a JPEG nor a PNG"),
        (b"", "neither a JPEG nor a PNG"),
        (jpeg_bytes()[:-1], "EOI"),
        (jpeg_bytes()[: len(jpeg_bytes()) // 2], "EOI"),
        (jpeg_bytes()[:40], "truncated inside its headers"),
        (b"\xff\xd8\xff\xd9", "truncated inside its headers"),
        (png_bytes()[:-12], "IEND"),
        (png_bytes()[:20], "truncated before its IHDR"),
    ],
)
def test_other_formats_and_truncated_images_are_refused(data: bytes, problem: str) -> None:
    with pytest.raises(ImageError, match=problem):
        inspect_image(data)


def test_a_jpeg_without_a_frame_header_or_with_zero_height_is_refused() -> None:
    data = jpeg_bytes()
    start = data.index(b"\xff\xc0")
    zero_height = data[: start + 5] + struct.pack(">H", 0) + data[start + 7 :]
    with pytest.raises(ImageError, match="no decodable dimensions"):
        inspect_image(zero_height)
    as_huffman_table = data[: start + 1] + b"\xc4" + data[start + 2 :]
    with pytest.raises(ImageError, match="no frame header"):
        inspect_image(as_huffman_table)


def test_a_png_with_a_corrupt_header_is_refused() -> None:
    data = bytearray(png_bytes())
    data[16:20] = struct.pack(">I", 9)  # width changed, CRC not
    with pytest.raises(ImageError, match="CRC"):
        inspect_image(bytes(data))
