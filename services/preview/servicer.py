"""PreviewService: the caller's credential from metadata, then the preview API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from services.preview.cleanup import Cleanup
from services.preview.coordinator import CoordinatorClient
from services.preview.exporting import BucketExports
from services.preview.publishing import PreviewApi
from workshop.kit.auth import bearer_secret
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import preview_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]


def credential(context: Context) -> str:
    """The caller's bearer secret, forwarded to the coordinator; UNAUTHENTICATED if absent."""
    return bearer_secret(context.invocation_metadata())


class PreviewServicer(preview_pb2_grpc.PreviewServiceServicer):
    def __init__(
        self,
        api: PreviewApi,
        cleanup: Cleanup,
        coordinator: CoordinatorClient,
        exports: BucketExports,
    ) -> None:
        self.api = api
        self.cleanup = cleanup
        self.coordinator = coordinator
        self.exports = exports

    async def PublishPreview(
        self, request: pb.PublishPreviewRequest, context: Context
    ) -> pb.PublishPreviewResponse:
        return await self.api.publish_preview(credential(context), request)

    async def StageUpload(
        self, request: pb.StageUploadRequest, context: Context
    ) -> pb.StageUploadResponse:
        return await self.api.stage_upload(credential(context), request)

    async def GrantPreviewWrites(
        self, request: pb.GrantPreviewWritesRequest, context: Context
    ) -> pb.GrantPreviewWritesResponse:
        return await self.api.grants.grant(credential(context), request)

    async def RecordWrittenPreviews(
        self, request: pb.RecordWrittenPreviewsRequest, context: Context
    ) -> pb.RecordWrittenPreviewsResponse:
        return await self.api.grants.record(credential(context), request)

    async def ReadImage(
        self, request: pb.ReadImageRequest, context: Context
    ) -> pb.ReadImageResponse:
        return await self.api.read_image(credential(context), request.run_id, request.item_id)

    async def RunCleanup(
        self, request: pb.RunCleanupRequest, context: Context
    ) -> pb.RunCleanupResponse:
        await self.coordinator.require_admin(credential(context))
        report = await self.cleanup.run_pass()
        return pb.RunCleanupResponse(
            previews_deleted=report.previews_deleted,
            uploads_deleted=report.uploads_deleted,
            bytes_deleted=report.bytes_deleted,
            uploads_remaining=report.uploads_remaining,
            unrecorded_previews_found=report.unrecorded_previews_found,
        )

    async def ExportBucket(
        self, request: pb.ExportBucketRequest, context: Context
    ) -> AsyncIterator[pb.ExportBucketResponse]:
        async for response in self.exports.export(credential(context), request):
            yield response
