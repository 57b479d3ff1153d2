"""Bytes rather than JSON: run images (previews and bucket items) and dataset exports.

An image answers with its own Content-Type, a strong ETag (its SHA-256, so a page that
has it gets 304), and Cache-Control `private` (images are per-user) with a max-age that
never outlives a preview. An expired preview is 404 (reason EXPIRED) like any unknown one.
An export relays the preview service's tar stream as a chunked download: its first
chunk is read before the answer starts, so a refusal (unknown bucket, bad filter) is
still a JSON error with its status; a failure mid-stream (an image whose bytes changed)
aborts the transfer, so a truncated archive never looks complete.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from services.gateway.upstream import Upstream
from workshop.v1 import preview_pb2

ITEM_MAX_AGE_SECONDS = 3600


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
    upstream: Upstream, export_request: preview_pb2.ExportBucketRequest, secret: str
) -> Response:
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
    return StreamingResponse(
        body(),
        media_type="application/x-tar",
        headers={
            "Content-Disposition": f'attachment; filename="{_safe(name)}"',
            "Cache-Control": "no-store",
        },
    )


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:200]
