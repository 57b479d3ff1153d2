"""PublicationService: the preview service's fenced calls into the coordinator."""

from __future__ import annotations

from services.coordinator import convert
from services.coordinator.identity.auth import Principal, ScopeName, require
from services.coordinator.platform.errors import InvalidField
from services.coordinator.platform.fields import bounded, page_size
from services.coordinator.previews.publication import (
    MAX_RECORD_BATCH,
    PreviewRecord,
    PublicationApi,
    Sweep,
)
from services.coordinator.review.datasets import DatasetsApi
from services.coordinator.review.reviews import FIRST_KEY, PageKey, ReviewApi
from services.coordinator.servicers import views
from services.coordinator.servicers.common import Authenticator, Context
from services.coordinator.servicers.dataset_views import frozen_boxes, version
from services.coordinator.servicers.views import (
    lease,
    preview_record,
    previews_boxes,
    previews_response,
    recorded_preview,
)
from workshop.kit import limits
from workshop.kit.auth import bearer_secret
from workshop.kit.errors import WorkshopError
from workshop.v1 import common_pb2, publication_pb2_grpc
from workshop.v1 import publication_pb2 as pb

ON_BEHALF_OF = "workshop-on-behalf-of"
MODES = {"test": common_pb2.RUN_MODE_TEST, "full": common_pb2.RUN_MODE_FULL}
KINDS = {"workflow": common_pb2.RUN_KIND_WORKFLOW, "photo": common_pb2.RUN_KIND_PHOTO}
OBJECT_KINDS = {common_pb2.OBJECT_KIND_PREVIEW: "preview", common_pb2.OBJECT_KIND_UPLOAD: "upload"}


class PublicationServicer(publication_pb2_grpc.PublicationServiceServicer):
    def __init__(
        self,
        api: PublicationApi,
        reviews: ReviewApi,
        authenticate: Authenticator,
        datasets: DatasetsApi | None = None,
    ) -> None:
        self.api = api
        self.review = reviews
        self.datasets = datasets
        self.who = authenticate

    async def _callers(
        self, context: Context, *, cached: bool = False
    ) -> tuple[Principal, Principal]:
        """The calling service and the principal it calls for.

        `cached` for CheckLease, StageObject and RecordPreview(s) only: their SQL checks
        both keys again (the service's with key_live, the processor's with fence 4).
        """
        who = self.who.cached if cached else self.who
        service = await who(context)
        # Only a service key may speak for someone else: refuse before reading
        # the forwarded credential.
        require(service, ScopeName.SERVICE)
        forwarded = [
            (key, value)
            for key, value in context.invocation_metadata() or ()
            if key.lower() == ON_BEHALF_OF
        ]
        secret = bearer_secret([("authorization", value) for _, value in forwarded])
        principal = self.who.cached_principal if cached else self.who.principal
        return service, await principal(secret)

    async def CheckLease(
        self, request: pb.CheckLeaseRequest, context: Context
    ) -> pb.CheckLeaseResponse:
        # Both principals may be cached: job_check_lease checks both keys again.
        service, processor = await self._callers(context, cached=True)
        facts = await self.api.check_lease(
            service, processor, lease(request.lease), request.code_sha256
        )
        return pb.CheckLeaseResponse(
            lease_expires_at=convert.ts(facts.lease_expires_at),
            mode=MODES[facts.mode],
            kind=KINDS[facts.kind],
            camera_id=facts.camera_id,
            slot_count=facts.slot_count,
            checked_at=convert.ts(self.api.clock.now()),
        )

    async def StageObject(
        self, request: pb.StageObjectRequest, context: Context
    ) -> pb.StageObjectResponse:
        service, processor = await self._callers(context, cached=True)
        kind = OBJECT_KINDS.get(request.kind)
        if kind is None:
            raise InvalidField("kind must be PREVIEW or UPLOAD.")
        staged = await self.api.stage(
            service,
            processor,
            lease(request.lease),
            code_sha256=request.code_sha256,
            kind=kind,
            slot=request.slot_index,
            sha256=request.sha256,
            byte_size=request.byte_size,
            content_type=request.content_type,
        )
        return pb.StageObjectResponse(
            object_key=staged.object_key,
            collectable_after=convert.ts(staged.collectable_after),
        )

    async def RecordPreview(
        self, request: pb.RecordPreviewRequest, context: Context
    ) -> pb.RecordPreviewResponse:
        service, processor = await self._callers(context, cached=True)
        [outcome] = await self.api.record_previews(service, processor, [preview_record(request)])
        if isinstance(outcome, WorkshopError):
            raise outcome
        return recorded_preview(outcome)

    async def RecordPreviews(
        self, request: pb.RecordPreviewsRequest, context: Context
    ) -> pb.RecordPreviewsResponse:
        service, processor = await self._callers(context, cached=True)
        if not 1 <= len(request.previews) <= MAX_RECORD_BATCH:
            raise InvalidField(f"Give 1..{MAX_RECORD_BATCH} previews per call.")
        previews: list[PreviewRecord | WorkshopError] = []
        boxes = previews_boxes(request.previews)
        for one, one_boxes in zip(request.previews, boxes, strict=True):
            try:
                previews.append(preview_record(one, one_boxes))
            except WorkshopError as error:
                previews.append(error)
        valid = [preview for preview in previews if isinstance(preview, PreviewRecord)]
        answers = iter(await self.api.record_previews(service, processor, valid) if valid else [])
        return previews_response(
            preview if isinstance(preview, WorkshopError) else next(answers) for preview in previews
        )

    async def ListCollectableObjects(
        self, request: pb.ListCollectableObjectsRequest, context: Context
    ) -> pb.ListCollectableObjectsResponse:
        who = await self.who(context)  # the credential before the request's fields
        kind = OBJECT_KINDS.get(request.kind)
        if kind is None:
            raise InvalidField("kind must be PREVIEW or UPLOAD.")
        rows, more, sweeps = await self.api.claim_collectable(
            who, kind, bounded("limit", request.limit, limits.COLLECTABLE)
        )
        return pb.ListCollectableObjectsResponse(
            objects=[
                pb.CollectableObject(
                    object_key=row.object_key,
                    kind=request.kind,
                    byte_size=row.byte_size,
                    collectable_since=convert.ts(row.collectable_at),
                )
                for row in rows
            ],
            has_more=more,
            sweeps=[
                pb.Sweep(run_id=sweep.run_id, job_index=sweep.job_index, prefix=sweep.prefix)
                for sweep in sweeps
            ],
        )

    async def SettleSweep(
        self, request: pb.SettleSweepRequest, context: Context
    ) -> pb.SettleSweepResponse:
        sweep = request.sweep
        recorded = await self.api.settle_sweep(
            await self.who(context),
            Sweep(sweep.run_id, sweep.job_index, sweep.prefix),
            [(found.object_key, found.byte_size) for found in request.objects],
            done=request.done,
        )
        return pb.SettleSweepResponse(recorded=recorded)

    async def MarkObjectsDeleted(
        self, request: pb.MarkObjectsDeletedRequest, context: Context
    ) -> pb.MarkObjectsDeletedResponse:
        marked, released = await self.api.mark_deleted(
            await self.who(context), list(request.object_keys), list(request.not_deleted_keys)
        )
        return pb.MarkObjectsDeletedResponse(marked=marked, released=released)

    async def AuthorizeImageRead(
        self, request: pb.AuthorizeImageReadRequest, context: Context
    ) -> pb.AuthorizeImageReadResponse:
        service, reader = await self._callers(context)
        image = await self.api.authorize_read(service, reader, request.run_id, request.item_id)
        return pb.AuthorizeImageReadResponse(
            object_key=image.object_key,
            content_type=image.content_type,
            boxes=convert.boxes(image.boxes),
            frame_time=convert.ts(image.frame_time),
            camera_id=image.camera_id,
            sha256=image.sha256,
            expires_at=convert.opt_ts(image.readable_until),
        )

    async def ListExportItems(
        self, request: pb.ListExportItemsRequest, context: Context
    ) -> pb.ListExportItemsResponse:
        _, reader = await self._callers(context)
        if request.dataset_version_id:
            return await self._version_items(reader, request)
        wanted = views.item_filter(request.filter)
        scope = wanted.fingerprint(request.bucket_id)
        after = views.page_key(request.page_token, scope)
        page = await self.review.export_items(
            reader,
            request.bucket_id,
            wanted,
            after,
            page_size(request.page_size, limits.EXPORT_PAGE),
        )
        response = pb.ListExportItemsResponse(
            next_page_token=views.page_token(scope, page.next_key), classes=page.classes
        )
        for row in page.items:
            item = response.items.add(
                item_id=row.item.item_id,
                object_key=row.object_key,
                sha256=row.sha256,
                camera_id=row.item.camera_id,
                frame_time=convert.ts(row.item.frame_time),
                review_state=views.STATES[row.item.review_state],
            )
            for box in page.boxes.get(row.item.item_id, ()):
                views.fill_box_row(item.boxes.add(), box)
        return response

    async def _version_items(
        self, reader: Principal, request: pb.ListExportItemsRequest
    ) -> pb.ListExportItemsResponse:
        """A page of a dataset version's frozen items (docs/datasets.md), by ordinal."""
        if self.datasets is None:
            raise InvalidField("dataset versions are not served here")  # not reached: app.py
        if request.HasField("filter"):
            raise InvalidField(
                "filter must be unset with dataset_version_id: a version's items are frozen.",
                metadata={"field": "filter"},
            )
        scope = f"v{request.dataset_version_id[3:19]}"
        key = views.page_key(request.page_token, scope)
        after = _ordinal(key.item_id) if key else 0
        limit = page_size(request.page_size, limits.EXPORT_PAGE)
        row, items = await self.datasets.items(reader, request.dataset_version_id, after, limit + 1)
        if request.bucket_id and request.bucket_id != row.bucket_id:
            raise InvalidField(
                f"Dataset version {row.version_id} is of bucket {row.bucket_id!r}, not "
                f"{request.bucket_id!r}.",
                metadata={"field": "bucket_id"},
            )
        more = len(items) > limit
        items = items[:limit]
        response = pb.ListExportItemsResponse(
            next_page_token=views.page_token(
                scope, PageKey(FIRST_KEY.frame_time, str(items[-1].ordinal)) if more else None
            )
        )
        if after == 0:
            response.classes.extend(row.classes)
            response.version.CopyFrom(version(row))
        for item in items:
            response.items.add(
                item_id=item.item_id,
                object_key=item.object_key,
                sha256=item.sha256,
                camera_id=item.camera_id,
                frame_time=convert.ts(item.frame_time),
                boxes=frozen_boxes(item.boxes),
                split=item.split,
            )
        return response


def _ordinal(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidField("page_token is malformed.", metadata={"field": "page_token"}) from None
