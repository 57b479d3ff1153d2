"""A preview image's size limits, and the check of a preview that a processor wrote into
object storage itself (with a grant of the preview service) before it is recorded.

Two services record such previews and must refuse the same ones: the preview service
(RecordWrittenPreviews) and the coordinator (a Session's `record_previews`). The bytes
pass neither, so what is checked is what the record says of them; the grant bound their
key, content type and size at the store (docs/previews-and-uploads.md).
"""

from __future__ import annotations

import re
from typing import NoReturn

from workshop.kit import errors
from workshop.kit.object_keys import EXTENSIONS
from workshop.v1 import preview_pb2, publication_pb2

MIB = 1024 * 1024
# The largest preview image by default: the preview service's PREVIEW_MAX_IMAGE_BYTES
# (what PublishPreview and StageUpload take and what a grant allows) and the
# coordinator's COORDINATOR_MAX_IMAGE_BYTES (what a Session records), which is set to it.
MAX_IMAGE_BYTES = 4 * MIB
# ... and at most: servers and channels take 16 MiB messages; an image leaves room for
# the rest.
MAX_IMAGE_BYTES_LIMIT = 15 * MIB
SHA256_HEX = re.compile(r"[0-9a-f]{64}")

WrittenPreview = preview_pb2.WrittenPreview | publication_pb2.RecordPreviewRequest


def check_written_preview(preview: WrittenPreview, max_image_bytes: int) -> None:
    """Refuses (INVALID_ARGUMENT, reason INVALID_FIELD, metadata "field") a written
    preview whose record no grant could have allowed: a content type other than JPEG or
    PNG, a size outside 1..max_image_bytes, a SHA-256 that is not 64 lower-case hex
    digits, or no frame time."""
    if preview.content_type not in EXTENSIONS:
        _refuse("content_type", f"content_type must be one of {', '.join(EXTENSIONS)}.")
    if not 1 <= preview.byte_size <= max_image_bytes:
        _refuse("byte_size", f"byte_size must be 1..{max_image_bytes}, as the grant allows.")
    if not SHA256_HEX.fullmatch(preview.sha256):
        _refuse("sha256", "sha256 must be 64 lower-case hex characters (a SHA-256 digest).")
    if not preview.HasField("frame_time"):
        _refuse("frame_time", "frame_time is required.")


def _refuse(field: str, message: str) -> NoReturn:
    raise errors.InvalidArgument(message, reason="INVALID_FIELD", metadata={"field": field})
