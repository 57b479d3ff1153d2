"""The HTTP API as a table: each operation is one RPC, with where its fields come from.

Every operation is served twice: under `/api` for the website (the session cookie) and
under `/v1` for Agent keys (the bearer header), unless `prefixes` says otherwise. The
request message is built from the path parameters, the query parameters and the JSON
body (see `services.gateway.dispatch`); the answer is the response message as JSON
(`workshop.kit.jsonmap`). The OpenAPI documents are generated from this table, so a
route exists in them exactly when it is served.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from workshop.v1 import dataset_pb2, identity_pb2, operator_pb2, preview_pb2, workshop_pb2

SERVICES = {
    "workshop": workshop_pb2.DESCRIPTOR.services_by_name["WorkshopService"],
    "operator": operator_pb2.DESCRIPTOR.services_by_name["OperatorService"],
    "identity": identity_pb2.DESCRIPTOR.services_by_name["IdentityService"],
    "preview": preview_pb2.DESCRIPTOR.services_by_name["PreviewService"],
    "datasets": dataset_pb2.DESCRIPTOR.services_by_name["DatasetService"],
}
API, V1 = "api", "v1"
JSON, IMAGE, TAR = "json", "image", "tar"
BOTH = (API, V1)

# Statuses every operation may answer: a malformed query or body, no or a rejected
# credential, a missing scope, a transport failure behind the gateway (502), a service
# that cannot be reached now (503).
COMMON_ERRORS = (400, 401, 403, 502, 503)


@dataclasses.dataclass(frozen=True)
class Operation:
    """One route: `method path` under each prefix, answered by `service.rpc`."""

    name: str  # operationId (prefixed by api_/v1_ in the documents)
    method: str
    path: str  # below the prefix; {placeholders} are request field names
    service: str
    rpc: str
    tag: str
    body: bool = False
    query: Mapping[str, str] = dataclasses.field(default_factory=dict)  # param -> field path
    rename: Mapping[str, str] = dataclasses.field(default_factory=dict)  # body name -> field
    errors: tuple[int, ...] = ()
    prefixes: tuple[str, ...] = BOTH
    answer: str = JSON  # JSON, IMAGE (the image bytes) or TAR (a streamed archive)

    @cached_property
    def descriptor(self) -> MethodDescriptor:
        method: MethodDescriptor = SERVICES[self.service].methods_by_name[self.rpc]
        return method

    @property
    def request_type(self) -> Descriptor:
        return self.descriptor.input_type

    @property
    def response_type(self) -> Descriptor:
        return self.descriptor.output_type

    def field(self, path: str) -> FieldDescriptor:
        """The request field at a dotted path ("filter.camera_id")."""
        message = self.request_type
        *parents, last = path.split(".")
        for part in parents:
            nested = message.fields_by_name[part].message_type
            assert nested is not None, f"{path}: {part} is not a message"
            message = nested
        return message.fields_by_name[last]

    def request_class(self) -> type[Message]:
        return GetMessageClass(self.request_type)

    @property
    def path_fields(self) -> tuple[str, ...]:
        return tuple(part[1:-1] for part in self.path.split("/") if part.startswith("{"))

    @property
    def body_exclude(self) -> tuple[str, ...]:
        """Request fields a body may not name: they come from the path or the query."""
        top = {path.split(".")[0] for path in self.query.values()}
        return tuple(sorted(set(self.path_fields) | top))

    @property
    def writes(self) -> bool:
        return self.method in ("POST", "PUT", "PATCH", "DELETE")

    def statuses(self) -> tuple[int, ...]:
        extra = (413,) if self.body else ()
        return tuple(sorted({*COMMON_ERRORS, *extra, *self.errors}))


def _op(
    name: str, method: str, path: str, service: str, rpc: str, tag: str, **kw: Any
) -> Operation:
    return Operation(name, method, path, service, rpc, tag, **kw)


PAGE = {"page_size": "page_size", "page_token": "page_token"}
# The item and the sighting filters take the same parameters (BucketItemFilter,
# SightingFilter).
ITEM_FILTER = SIGHTING_FILTER = {
    "review_state": "filter.review_states",
    "class_name": "filter.class_name",
    "camera_id": "filter.camera_id",
    "run_id": "filter.run_id",
    "from": "filter.frame_time_from",
    "to": "filter.frame_time_to",
    "min_score": "filter.min_score",
    "max_score": "filter.max_score",
}

OPERATIONS: tuple[Operation, ...] = (
    # workflows
    _op(
        "listWorkflows",
        "GET",
        "/workshop/workflows",
        "workshop",
        "ListWorkflows",
        "workflows",
        query=PAGE,
    ),
    _op(
        "getWorkflow",
        "GET",
        "/workshop/workflows/{workflow_id}",
        "workshop",
        "GetWorkflow",
        "workflows",
        errors=(404,),
    ),
    _op(
        "saveWorkflow",
        "PUT",
        "/workshop/workflows/{workflow_id}",
        "workshop",
        "SaveWorkflow",
        "workflows",
        body=True,
        errors=(409, 422),
    ),
    _op(
        "deleteWorkflow",
        "DELETE",
        "/workshop/workflows/{workflow_id}",
        "workshop",
        "DeleteWorkflow",
        "workflows",
        query={"expected_revision": "expected_revision"},
        errors=(404, 409),
    ),
    _op(
        "validateWorkflow",
        "POST",
        "/workshop/workflows/validate",
        "workshop",
        "ValidateWorkflow",
        "workflows",
        body=True,
    ),
    _op(
        "chooseRuntime",
        "GET",
        "/workshop/workflows/{workflow_id}/runtime",
        "workshop",
        "ChooseRuntime",
        "runtimes",
        query={"choice": "choice"},
        errors=(404, 409),
    ),
    _op("getCatalog", "GET", "/workshop/catalog", "workshop", "GetCatalog", "workflows"),
    # devices and runtimes
    _op(
        "listDevices", "GET", "/workshop/devices", "operator", "ListDevices", "runtimes", query=PAGE
    ),
    _op(
        "listRuntimes",
        "GET",
        "/workshop/runtimes",
        "operator",
        "ListRuntimes",
        "runtimes",
        query={**PAGE, "device_id": "device_id"},
    ),
    _op(
        "registerRuntime",
        "POST",
        "/workshop/runtimes",
        "operator",
        "RegisterRuntime",
        "runtimes",
        body=True,
        errors=(404, 409),
    ),
    # cameras' recordings
    _op(
        "listRecordings",
        "GET",
        "/workshop/recordings",
        "operator",
        "ListRecordings",
        "cameras",
        query={
            **PAGE,
            "camera_id": "camera_id",
            "from": "overlaps_from",
            "to": "overlaps_until",
        },
    ),
    # runs
    _op(
        "createRun",
        "POST",
        "/workshop/runs",
        "workshop",
        "CreateRun",
        "runs",
        body=True,
        rename={"id": "run_id"},
        errors=(404, 409, 422, 429),
    ),
    _op(
        "listRuns",
        "GET",
        "/workshop/runs",
        "workshop",
        "ListRuns",
        "runs",
        query={**PAGE, "workflow": "workflow_id", "status": "status", "mode": "mode"},
    ),
    _op(
        "getRun",
        "GET",
        "/workshop/runs/{run_id}",
        "workshop",
        "GetRun",
        "runs",
        query={"job_limit": "job_limit"},
        errors=(404,),
    ),
    _op(
        "cancelRun",
        "POST",
        "/workshop/runs/{run_id}/cancel",
        "workshop",
        "CancelRun",
        "runs",
        errors=(404,),
    ),
    _op(
        "getRunSnapshot",
        "GET",
        "/workshop/runs/{run_id}/snapshot",
        "workshop",
        "GetRunSnapshot",
        "runs",
        query=PAGE,
        errors=(404,),
    ),
    _op(
        "getRunTimeline",
        "GET",
        "/workshop/runs/{run_id}/timeline",
        "workshop",
        "GetRunTimeline",
        "runs",
        query=PAGE,
        errors=(404,),
    ),
    # review and summary
    _op(
        "getReview",
        "GET",
        "/workshop/runs/{run_id}/review",
        "workshop",
        "GetReview",
        "review",
        query=PAGE,
        errors=(404,),
    ),
    _op(
        "decideSighting",
        "POST",
        "/workshop/runs/{run_id}/sightings/{sighting_id}/decision",
        "workshop",
        "DecideSighting",
        "review",
        body=True,
        errors=(404, 409),
    ),
    _op(
        "correctItemBoxes",
        "POST",
        "/workshop/items/{item_id}/correction",
        "workshop",
        "CorrectItemBoxes",
        "review",
        body=True,
        errors=(404, 409),
    ),
    _op(
        "undoItemCorrection",
        "DELETE",
        "/workshop/items/{item_id}/correction",
        "workshop",
        "UndoItemCorrection",
        "review",
        query={"expected_revision": "expected_revision"},
        errors=(404, 409),
    ),
    _op(
        "decideItem",
        "POST",
        "/workshop/items/{item_id}/decision",
        "workshop",
        "DecideItem",
        "review",
        body=True,
        errors=(404, 409),
    ),
    _op(
        "clearItemDecision",
        "DELETE",
        "/workshop/items/{item_id}/decision",
        "workshop",
        "ClearItemDecision",
        "review",
        query={"expected_revision": "expected_revision"},
        errors=(404, 409),
    ),
    _op(
        "getSummary",
        "GET",
        "/workshop/summary",
        "workshop",
        "GetSummary",
        "review",
        query={"time_zone": "time_zone", "days": "days"},
    ),
    # buckets as datasets
    _op(
        "listBucketItems",
        "GET",
        "/workshop/buckets/{bucket_id}/items",
        "workshop",
        "ListBucketItems",
        "buckets",
        query={**PAGE, **ITEM_FILTER},
        errors=(404,),
    ),
    _op(
        "getBucketItem",
        "GET",
        "/workshop/items/{item_id}",
        "workshop",
        "GetBucketItem",
        "buckets",
        errors=(404,),
    ),
    _op(
        "getReviewQueue",
        "GET",
        "/workshop/buckets/{bucket_id}/queue",
        "workshop",
        "GetReviewQueue",
        "review",
        query={**PAGE, "order": "order", **SIGHTING_FILTER},
        errors=(404,),
    ),
    _op(
        "bulkDecideSightings",
        "POST",
        "/workshop/buckets/{bucket_id}/bulk-decisions",
        "workshop",
        "BulkDecideSightings",
        "review",
        body=True,
        errors=(404, 409),
    ),
    _op(
        "undoBulkDecision",
        "DELETE",
        "/workshop/bulk-decisions/{action_id}",
        "workshop",
        "UndoBulkDecision",
        "review",
        errors=(404, 409),
    ),
    _op(
        "exportBucket",
        "GET",
        "/workshop/buckets/{bucket_id}/export",
        "preview",
        "ExportBucket",
        "buckets",
        query={"format": "format", **ITEM_FILTER},
        errors=(404, 409),
        answer=TAR,
    ),
    # images
    _op(
        "getPreviewImage",
        "GET",
        "/workshop/runs/{run_id}/previews/{item_id}/image",
        "preview",
        "ReadImage",
        "images",
        errors=(404,),
        answer=IMAGE,
    ),
    _op(
        "getItemImage",
        "GET",
        "/workshop/runs/{run_id}/items/{item_id}/image",
        "preview",
        "ReadImage",
        "images",
        errors=(404,),
        answer=IMAGE,
    ),
    # photos
    _op(
        "requestPhoto",
        "POST",
        "/workshop/photos",
        "workshop",
        "RequestPhoto",
        "photos",
        body=True,
        errors=(404, 409, 422),
    ),
    _op(
        "getPhoto",
        "GET",
        "/workshop/photos/{photo_id}",
        "workshop",
        "GetPhoto",
        "photos",
        errors=(404,),
    ),
    # the caller
    _op("whoAmI", "GET", "/workshop/me", "identity", "WhoAmI", "keys"),
    # a user's own Agent keys (a website session only: a key cannot mint keys)
    _op(
        "listOwnKeys",
        "GET",
        "/workshop/keys",
        "identity",
        "ListOwnKeys",
        "keys",
        query={**PAGE, "include_revoked": "include_revoked"},
    ),
    _op(
        "createOwnKey",
        "POST",
        "/workshop/keys",
        "identity",
        "CreateOwnKey",
        "keys",
        body=True,
        errors=(404,),
    ),
    _op(
        "revokeOwnKey",
        "DELETE",
        "/workshop/keys/{key_id}",
        "identity",
        "RevokeOwnKey",
        "keys",
        errors=(404,),
    ),
    # dataset versions (docs/datasets.md)
    _op(
        "createDatasetVersion",
        "POST",
        "/workshop/buckets/{bucket_id}/versions",
        "datasets",
        "CreateDatasetVersion",
        "datasets",
        body=True,
        errors=(404,),
    ),
    _op(
        "listDatasetVersions",
        "GET",
        "/workshop/buckets/{bucket_id}/versions",
        "datasets",
        "ListDatasetVersions",
        "datasets",
        query=PAGE,
        errors=(404,),
    ),
    _op(
        "getDatasetVersion",
        "GET",
        "/workshop/versions/{version_id}",
        "datasets",
        "GetDatasetVersion",
        "datasets",
        errors=(404,),
    ),
    _op(
        "diffDatasetVersions",
        "GET",
        "/workshop/versions/{to_version_id}/diff",
        "datasets",
        "DiffDatasetVersions",
        "datasets",
        query={**PAGE, "from": "from_version_id"},
        errors=(404,),
    ),
    _op(
        "listItemVersions",
        "GET",
        "/workshop/items/{item_id}/versions",
        "datasets",
        "ListItemVersions",
        "datasets",
        query=PAGE,
        errors=(404,),
    ),
    _op(
        "exportDatasetVersion",
        "GET",
        "/workshop/versions/{dataset_version_id}/export",
        "preview",
        "ExportBucket",
        "datasets",
        query={"format": "format"},
        errors=(404, 409, 416),
        answer=TAR,
    ),
)
