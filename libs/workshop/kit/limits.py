"""The defaults and bounds of the request fields that size an answer: every `page_size`,
`GetRun`/`WatchRun` `job_limit`, `CreateRun` `image_limit` and `ListCollectableObjects`
`limit`, in one place.

The coordinator reads them here; the proto comments say `Limit.phrase` word for word, and
the gateway's JSON Schemas (OpenAPI and the MCP tools' input schemas) take `minimum`,
`maximum` and `default` from `FIELDS`; tests/service/test_limits_source.py fails when a comment,
a schema or a page of docs/ says otherwise. A value above the maximum is refused
(INVALID_FIELD naming the field), never quietly lowered, so what a schema publishes is
what the server takes.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Limit:
    """`default` is what an unset field means (0, or absent for a proto3 `optional`);
    set, the value must be within `minimum`..`maximum`."""

    default: int
    maximum: int
    minimum: int = 0
    optional: bool = False  # a proto3 `optional` field: absent, not 0, means the default

    def phrase(self) -> str:
        """How the proto comments and docs/ state the limit."""
        if self.optional:
            return f"{self.minimum:,} to {self.maximum:,}, absent means {self.default:,}"
        return f"0 means {self.default:,}, at most {self.maximum:,}"

    def resolve(self, requested: int) -> int:
        """The value to use for a field that is set (or 0): the default for 0."""
        return requested or self.default

    def allows(self, requested: int) -> bool:
        return self.minimum <= requested <= self.maximum


# A page of any list: devices, runtimes, cameras, recordings, models, buckets, keys,
# workflows, runs, a run's snapshot recordings, a bucket's items.
PAGE = Limit(default=100, maximum=1000)
# The review page shows every item up to its maximum at once.
REVIEW_PAGE = Limit(default=1000, maximum=1000)
# A bucket's review queue: a few sightings at a time, each complete with its item ids.
QUEUE_PAGE = Limit(default=10, maximum=100)
# Internal (preview service): export pages and collectable objects per call.
EXPORT_PAGE = Limit(default=500, maximum=1000)
COLLECTABLE = Limit(default=500, maximum=1000)
# Jobs in a run detail. Not all of a 10,000-job run by default: every live message
# (the run page, `runs watch`) carries the whole detail up to this many jobs.
JOB_LIMIT = Limit(default=100, maximum=10_000)
# Expected slots of a test run.
IMAGE_LIMIT = Limit(default=20, maximum=100, minimum=1, optional=True)

# Every limited request field, by full proto name.
FIELDS: dict[str, Limit] = {
    **{
        f"workshop.v1.{message}.page_size": PAGE
        for message in (
            "ListWorkflowsRequest",
            "ListRunsRequest",
            "GetRunSnapshotRequest",
            "GetRunTimelineRequest",
            "ListBucketItemsRequest",
            "ListDevicesRequest",
            "ListRuntimesRequest",
            "ListCamerasRequest",
            "ListRecordingsRequest",
            "ListModelVersionsRequest",
            "ListBucketsRequest",
            "ListKeysRequest",
            "ListOwnKeysRequest",
        )
    },
    "workshop.v1.GetReviewRequest.page_size": REVIEW_PAGE,
    "workshop.v1.GetReviewQueueRequest.page_size": QUEUE_PAGE,
    "workshop.v1.ListExportItemsRequest.page_size": EXPORT_PAGE,
    "workshop.v1.ListCollectableObjectsRequest.limit": COLLECTABLE,
    "workshop.v1.GetRunRequest.job_limit": JOB_LIMIT,
    "workshop.v1.WatchRunRequest.job_limit": JOB_LIMIT,
    "workshop.v1.CreateRunRequest.image_limit": IMAGE_LIMIT,
}
