"""Publishing previews, staging uploads and reading images (docs/previews-and-uploads.md).

Writes follow publication.proto. A preview: the lease is checked (kept a few
seconds, see leases.py), the bytes are written under the lease's key for the
slot, then the coordinator records them under the fences, batched with other
publishes of the same processor (recorder.py). Processors that write their bytes
themselves get grants and record in batches instead (grants.py). An upload: the coordinator stages
it under the fences and names its key, then the bytes are written. Whatever is
refused after the bytes are written stays in the bucket until the cleanup loop
deletes it; nothing is published that the store did not acknowledge.
"""

from __future__ import annotations

import logging

from services.preview.coordinator import CoordinatorClient
from services.preview.errors import ImageCorrupted, ImageTooLarge, InvalidField
from services.preview.grants import WriteGrants
from services.preview.images import CONTENT_TYPES, ImageError, inspect_image
from services.preview.leases import LeaseChecks
from services.preview.recorder import PreviewRecorder
from services.preview.storage import ObjectStore
from workshop.kit.box_values import refuse_non_finite
from workshop.kit.hashing import sha256_hex
from workshop.kit.object_keys import object_key
from workshop.v1 import common_pb2
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import publication_pb2 as pub

log = logging.getLogger(__name__)


class PreviewApi:
    def __init__(
        self,
        coordinator: CoordinatorClient,
        store: ObjectStore,
        *,
        max_image_bytes: int,
        lease_check_seconds: float,
        lease_attestation_key: str = "",
        grant_seconds: int = 60,
    ) -> None:
        self.coordinator = coordinator
        self.store = store
        self.max_image_bytes = max_image_bytes
        self.leases = LeaseChecks(
            coordinator, seconds=lease_check_seconds, attestation_key=lease_attestation_key
        )
        self.recorder = PreviewRecorder(coordinator)
        self.grants = WriteGrants(
            store,
            self.leases,
            self.recorder,
            grant_seconds=grant_seconds,
            max_image_bytes=max_image_bytes,
        )

    def checked_image(self, image: bytes, content_type: str) -> str:
        """The image's content type, after checking its size, format and completeness."""
        if len(image) > self.max_image_bytes:
            raise ImageTooLarge(len(image), self.max_image_bytes)
        if content_type and content_type not in CONTENT_TYPES:
            raise InvalidField(
                "content_type", f"content_type must be one of {', '.join(CONTENT_TYPES)}."
            )
        if not image:
            raise InvalidField("image", "image is empty.")
        try:
            info = inspect_image(image)
        except ImageError as error:
            raise InvalidField("image", str(error)) from None
        if content_type and content_type != info.content_type:
            raise InvalidField(
                "content_type",
                f"content_type is {content_type} but the image is {info.content_type}.",
            )
        return info.content_type

    async def publish_preview(
        self, processor: str, request: pb.PublishPreviewRequest
    ) -> pb.PublishPreviewResponse:
        content_type = self.checked_image(request.image, request.content_type)
        if not request.HasField("frame_time"):
            raise InvalidField("frame_time", "frame_time is required.")
        refuse_non_finite(request.boxes)  # the coordinator would refuse the record, once written
        lease = request.lease
        facts = await self.leases.facts(processor, lease, request.code_sha256)
        if request.slot_index >= facts.slot_count:
            raise InvalidField(
                "slot_index",
                f"Slot {request.slot_index} is not an expected slot of job {lease.job_id} "
                f"(it has {facts.slot_count}).",
            )
        key = object_key(
            "preview",
            lease.run_id,
            lease.job_id,
            lease.generation,
            request.slot_index,
            test=facts.mode != common_pb2.RUN_MODE_FULL,
            content_type=content_type,
        )
        digest = sha256_hex(request.image)
        await self.store.put(key, request.image, content_type)
        recorded = await self.recorder.record(
            processor,
            pub.RecordPreviewRequest(
                lease=lease,
                code_sha256=request.code_sha256,
                slot_index=request.slot_index,
                object_key=key,
                frame_time=request.frame_time,
                boxes=request.boxes,
                byte_size=len(request.image),
                sha256=digest,
                content_type=content_type,
            ),
        )
        published = pb.PublishPreviewResponse(
            item_id=recorded.item_id, object_key=key, sha256=digest
        )
        if recorded.HasField("expires_at"):
            published.expires_at.CopyFrom(recorded.expires_at)
        return published

    async def stage_upload(
        self, processor: str, request: pb.StageUploadRequest
    ) -> pb.StageUploadResponse:
        content_type = self.checked_image(request.image, request.content_type)
        digest = sha256_hex(request.image)
        if request.sha256 and request.sha256.lower() != digest:
            raise InvalidField(
                "sha256", "sha256 differs from the digest of the image bytes received."
            )
        staged = await self.coordinator.stage_object(
            pub.StageObjectRequest(
                lease=request.lease,
                code_sha256=request.code_sha256,
                kind=common_pb2.OBJECT_KIND_UPLOAD,
                slot_index=request.slot_index,
                sha256=digest,
                byte_size=len(request.image),
                content_type=content_type,
            ),
            processor,
        )
        await self.store.put(staged.object_key, request.image, content_type)
        return pb.StageUploadResponse(
            object_key=staged.object_key, sha256=digest, byte_size=len(request.image)
        )

    async def read_image(self, reader: str, run_id: str, item_id: str) -> pb.ReadImageResponse:
        if not run_id:
            raise InvalidField("run_id", "run_id is required.")
        if not item_id:
            raise InvalidField("item_id", "item_id is required.")
        where = await self.coordinator.authorize_read(run_id, item_id, reader)
        image = await self.store.get(where.object_key)
        if sha256_hex(image) != where.sha256:
            log.error("stored bytes of %s differ from their recorded sha256", where.object_key)
            raise ImageCorrupted(
                "The stored image does not match its recorded digest; it is not served."
            )
        read = pb.ReadImageResponse(
            image=image,
            content_type=where.content_type,
            boxes=where.boxes,
            frame_time=where.frame_time,
            camera_id=where.camera_id,
        )
        if where.HasField("expires_at"):
            read.expires_at.CopyFrom(where.expires_at)
        return read
