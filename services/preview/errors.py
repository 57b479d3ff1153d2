"""The preview service's errors: kit classes with the reasons of `workshop.v1.ErrorReason`."""

from __future__ import annotations

from workshop.kit import errors


class InvalidField(errors.InvalidArgument):
    """A request field is missing or malformed; metadata "field" names it."""

    reason = "INVALID_FIELD"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, metadata={"field": field})


class ImageTooLarge(errors.PayloadTooLarge):
    reason = "PAYLOAD_TOO_LARGE"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"The image is {size} bytes; at most {limit} bytes are accepted.",
            metadata={"limit_bytes": str(limit)},
        )


class StorageUnavailable(errors.Unavailable):
    """Object storage did not answer in time or refused the connection; safe to retry."""


class StorageMisconfigured(StorageUnavailable):
    """Object storage refuses the service's keys or bucket: a configuration error. Still
    UNAVAILABLE, so a processor hands its job back instead of failing it, and the job
    succeeds once an operator has fixed the settings."""


class ImageMissing(errors.NotFound):
    """The coordinator knows the image but its bytes are gone from object storage."""

    reason = "NOT_FOUND"


class ImageCorrupted(errors.WorkshopError):
    """Stored bytes whose digest differs from the one recorded (INTERNAL: never served)."""

    reason = "IMAGE_CORRUPTED"


class ImageChanged(errors.DataLoss):
    """An exported item's bytes are gone from object storage or differ from their digest:
    the archive would not hold the image that was reviewed, so the export stops."""

    reason = "IMAGE_CHANGED"

    def __init__(self, item_id: str, message: str) -> None:
        super().__init__(message, metadata={"item_id": item_id})


class ImageNotExportable(errors.FailedPrecondition):
    """An exported item's bytes are intact but no complete JPEG (a PNG preview named as the
    upload, say): the archive's images/<item id>.jpg could not hold them."""

    reason = "IMAGE_NOT_JPEG"

    def __init__(self, item_id: str, message: str) -> None:
        super().__init__(message, metadata={"item_id": item_id})


class NotResumable(errors.FailedPrecondition):
    """An offset (or a size) asked of an export that is not a dataset version's: the bucket
    changes under a live export, so its bytes cannot be resumed."""

    reason = "NOT_RESUMABLE"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, metadata={"field": field})


class OffsetPastEnd(errors.InvalidArgument):
    """A resumed export's offset is at or past the archive's end (HTTP 416)."""

    reason = "OFFSET_PAST_END"

    def __init__(self, offset: int, total: int) -> None:
        super().__init__(
            f"offset {offset} is at or past the end of the archive ({total} bytes).",
            metadata={"field": "offset", "total_bytes": str(total)},
        )


class LayoutMismatch(errors.Unavailable):
    """A resumed export's stored layout (docs/datasets.md) did not match the archive it
    wrote: the layout object is deleted, so asking again lays the archive out anew."""

    def __init__(self, version_id: str) -> None:
        super().__init__(
            f"The stored layout of version {version_id}'s archive did not match its images; "
            "it is deleted. Retry: the export lays the archive out again.",
        )
