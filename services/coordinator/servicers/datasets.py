"""DatasetService: dataset versions (docs/datasets.md), and the messages that show them."""

from __future__ import annotations

import hashlib
from typing import Any

from services.coordinator.platform.errors import InvalidField
from services.coordinator.platform.fields import page_size
from services.coordinator.review.datasets import (
    ChangeRow,
    DatasetsApi,
    DiffCounts,
    VersionKey,
    VersionsPage,
    check_name,
    check_split,
)
from services.coordinator.review.reviews import FIRST_KEY, PageKey
from services.coordinator.servicers import views
from services.coordinator.servicers.common import Authenticator, Context
from services.coordinator.servicers.dataset_views import frozen_boxes, version
from workshop.v1 import dataset_pb2 as pb
from workshop.v1 import dataset_pb2_grpc

KINDS = {
    "added": pb.DATASET_CHANGE_KIND_ADDED,
    "removed": pb.DATASET_CHANGE_KIND_REMOVED,
    "relabelled": pb.DATASET_CHANGE_KIND_RELABELLED,
    "boxes_changed": pb.DATASET_CHANGE_KIND_BOXES_CHANGED,
}


class DatasetServicer(dataset_pb2_grpc.DatasetServiceServicer):
    def __init__(self, api: DatasetsApi, authenticate: Authenticator) -> None:
        self.api = api
        self.who = authenticate

    async def CreateDatasetVersion(
        self, request: pb.CreateDatasetVersionRequest, context: Context
    ) -> pb.CreateDatasetVersionResponse:
        who = await self.who(context)
        DatasetsApi.check_freezer(who)  # the credential before the request's fields
        wanted = views.item_filter(request.filter)
        name = check_name(request.name)
        val_fraction = check_split(
            request.seed, request.val_fraction if request.HasField("val_fraction") else None
        )
        row, created = await self.api.freeze(
            who, request.bucket_id, name, wanted, request.seed, val_fraction
        )
        return pb.CreateDatasetVersionResponse(version=version(row), created=created)

    async def GetDatasetVersion(
        self, request: pb.GetDatasetVersionRequest, context: Context
    ) -> pb.GetDatasetVersionResponse:
        who = await self.who(context)
        return pb.GetDatasetVersionResponse(
            version=version(await self.api.get(who, request.version_id))
        )

    async def ListDatasetVersions(
        self, request: pb.ListDatasetVersionsRequest, context: Context
    ) -> pb.ListDatasetVersionsResponse:
        who = await self.who(context)
        scope = _scope("versions", request.bucket_id)
        page = await self.api.versions(
            who,
            request.bucket_id,
            _version_key(request.page_token, scope),
            page_size(request.page_size),
        )
        return pb.ListDatasetVersionsResponse(**_versions_page(page, scope))

    async def ListItemVersions(
        self, request: pb.ListItemVersionsRequest, context: Context
    ) -> pb.ListItemVersionsResponse:
        who = await self.who(context)
        scope = _scope("item", request.item_id)
        page = await self.api.item_versions(
            who,
            request.item_id,
            _version_key(request.page_token, scope),
            page_size(request.page_size),
        )
        return pb.ListItemVersionsResponse(**_versions_page(page, scope))

    async def DiffDatasetVersions(
        self, request: pb.DiffDatasetVersionsRequest, context: Context
    ) -> pb.DiffDatasetVersionsResponse:
        who = await self.who(context)
        scope = _scope("diff", request.from_version_id, request.to_version_id)
        key = views.page_key(request.page_token, scope)
        diff = await self.api.diff(
            who,
            request.from_version_id,
            request.to_version_id,
            key.item_id if key else None,
            page_size(request.page_size),
        )
        response = pb.DiffDatasetVersionsResponse(
            changes=[change(row) for row in diff.changes],
            next_page_token=views.page_token(
                scope, PageKey(FIRST_KEY.frame_time, diff.next_item) if diff.next_item else None
            ),
        )
        if diff.counts is not None:
            response.counts.CopyFrom(counts(diff.counts))
        return response


def _scope(*parts: str) -> str:
    """What a page token is bound to (no '|' in it, whatever the ids hold)."""
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def _version_key(token: str, scope: str) -> VersionKey | None:
    key = views.page_key(token, scope)
    return VersionKey(key.frame_time, key.item_id) if key else None


def _versions_page(page: VersionsPage, scope: str) -> dict[str, Any]:
    key = page.next_key
    return {
        "versions": [version(row) for row in page.versions],
        "next_page_token": views.page_token(
            scope, PageKey(key.created_at, key.version_id) if key else None
        ),
    }


def change(row: ChangeRow) -> pb.DatasetItemChange:
    if row.kind not in KINDS:
        raise InvalidField(f"unknown change {row.kind!r}")  # not reached: the SQL's four
    return pb.DatasetItemChange(
        item_id=row.item_id,
        kind=KINDS[row.kind],
        before=frozen_boxes(row.before),
        after=frozen_boxes(row.after),
    )


def counts(row: DiffCounts) -> pb.DatasetDiffCounts:
    return pb.DatasetDiffCounts(
        added=row.added,
        removed=row.removed,
        relabelled=row.relabelled,
        boxes_changed=row.boxes_changed,
        unchanged=row.unchanged,
    )
