"""Bytes rather than JSON: run images (previews and bucket items) and dataset exports.

An image answers with its own Content-Type, a strong ETag (its SHA-256, so a page that
has it gets 304), and Cache-Control `private` (images are per-user) with a max-age that
never outlives a preview. An expired preview is 404 (reason EXPIRED) like any unknown one.
An export relays the preview service's tar stream as a chunked download: its first
chunk is read before the answer starts, so a refusal (unknown bucket, bad filter) is
still a JSON error with its status; a failure mid-stream (an image whose bytes changed)
aborts the transfer, so a truncated archive never looks complete.

A dataset version's archive is the same bytes every time, so its download can resume:
`Range: bytes=N-` is answered 206 with `Content-Range: bytes N-(T-1)/T` (the preview
service lays the archive out first to know T), `If-Range` with another ETag gets the
whole archive (200), and the ETag names the version and format. A live export cannot
resume: a Range on it is refused (409 NOT_RESUMABLE), as is any range form but `N-` (400).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from services.gateway.upstream import Upstream
from workshop.kit import errors
from workshop.v1 import preview_pb2

ITEM_MAX_AGE_SECONDS = 3600
OPEN_RANGE = re.compile(r"bytes=(\d{1,18})-")


async def image(
    upstream: Upstream, request: Request, read: preview_pb2.ReadImageRequest, secret: str
) -> Response:
    answer = await upstream.call("preview", "ReadImage", read, secret)
    etag = f'"{hashlib.sha256(answer.image).hexdigest()}"'
    max_age = ITEM_MAX_AGE_SECONDS
    if answer.HasField("expires_at"):
        left = answer.expires_at.ToDatetime(tzinfo=UTC) - datetime.now(UTC)
        max_age = max(0, min(max_age, int(left.total_seconds())))
    headers = {"ETag": etag, "Cache-Control": f"private, max-age={max_age}"}
    if etag in _etags(request.headers.get("if-none-match", "")):
        return Response(status_code=304, headers=headers)
    return Response(answer.image, media_type=answer.content_type, headers=headers)


def _etags(header: str) -> set[str]:
    return {tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()}


async def export(
    upstream: Upstream,
    export_request: preview_pb2.ExportBucketRequest,
    secret: str,
    request: Request | None = None,
) -> Response:
    headers = request.headers if request is not None else {}
    version = export_request.dataset_version_id
    etag = f'"{version}-{export_request.format}"' if version else ""
    offset = _range_start(headers.get("range"), headers.get("if-range"), etag)
    if offset is not None:
        export_request.offset = offset
        export_request.with_size = True
    chunks = upstream.stream("preview", "ExportBucket", export_request, secret)
    first = await anext(chunks)

    async def body() -> AsyncIterator[bytes]:
        try:
            if first.data:
                yield first.data
            async for chunk in chunks:
                if chunk.data:
                    yield chunk.data
        finally:
            await chunks.aclose()

    name = first.file_name or f"{export_request.bucket_id}.tar"
    answer_headers = {
        "Content-Disposition": f'attachment; filename="{_safe(name)}"',
        "Cache-Control": "no-store",
    }
    if version:
        answer_headers["Accept-Ranges"] = "bytes"
        answer_headers["ETag"] = etag
    status = 200
    if offset is not None and first.HasField("total_bytes"):
        total = first.total_bytes
        status = 206
        answer_headers["Content-Range"] = f"bytes {offset}-{total - 1}/{total}"
        answer_headers["Content-Length"] = str(total - offset)
    return StreamingResponse(
        body(), status_code=status, media_type="application/x-tar", headers=answer_headers
    )


def _range_start(header: str | None, if_range: str | None, etag: str) -> int | None:
    """Where a `Range: bytes=N-` asks the archive to start (None: the whole archive, also
    when If-Range names another representation); a range of another form is refused."""
    if header is None:
        return None
    if if_range is not None and etag and if_range.strip() != etag:
        return None
    match = OPEN_RANGE.fullmatch(header.strip())
    if match is None:
        raise errors.InvalidArgument(
            f"Range {header[:80]!r} is not supported: resume an export with "
            "`Range: bytes=<offset>-` (one open range).",
            reason="INVALID_FIELD",
            metadata={"field": "Range"},
        )
    return int(match.group(1))


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:200]
