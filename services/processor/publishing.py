"""Where a routed frame's preview goes: one `Publisher`, chosen once at start-up.

Owns the route a frame's encoded image takes to the preview service
(docs/previews-and-uploads.md), behind one narrow interface: `publish` stores a slot's
preview and answers its object key and SHA-256 (which in a full run also name the slot's
upload in Complete), `settle` waits until a lease's previews are recorded (before its
Complete). Two routes, picked by `publisher_for` from the `direct_writes` setting:
- `GrantPublisher` (the default): the bytes go straight to object storage with a grant
  and the records are batched, on the coordinator's session where the calls about jobs
  use one, else through the preview service (direct_writes.py);
- `RelayPublisher`: the bytes go through the preview service's PublishPreview.
Every preview service this release runs beside (the baseline in
`deploy/releases/previous` included) grants writes and answers a preview's digest, so
neither route falls back to another at run time (only the records of GrantPublisher do:
from the session to the preview service, against a coordinator that does not take them).
"""

from __future__ import annotations

from typing import Protocol

from google.protobuf.timestamp_pb2 import Timestamp

from services.processor.calls import (
    Caller,
    JobCalls,
    ServiceUnavailable,
    refusal_error,
)
from services.processor.direct_writes import DirectPreviews, WriteFailed, WriteUnavailable
from services.processor.images import JPEG
from workshop.kit.hashing import sha256_hex
from workshop.v1 import common_pb2, jobs_pb2, preview_pb2, preview_pb2_grpc


class Publisher(Protocol):
    async def publish(
        self,
        job: jobs_pb2.ClaimedJob,
        slot: int,
        frame_time: Timestamp,
        image: bytes,
        boxes: list[common_pb2.Box],
    ) -> tuple[str, str]:
        """Stores the slot's JPEG preview with its boxes; answers (object key, SHA-256)."""
        ...

    async def settle(self, lease: common_pb2.LeaseRef) -> None:
        """Waits until every preview of the lease is recorded; raises its first refusal."""
        ...


class GrantPublisher:
    """Previews written with grants, their records batched (direct_writes.py)."""

    def __init__(
        self,
        previews: preview_pb2_grpc.PreviewServiceAsyncStub,
        call: Caller,
        code_sha256: str,
        jobs: JobCalls | None = None,
    ) -> None:
        # the records go on the session when the calls about jobs do (direct_writes.py):
        # SessionJobs has RecordPreviews (so does a test's wrapper of it), UnaryJobs none
        records = getattr(jobs, "RecordPreviews", None)
        self._direct = DirectPreviews(
            previews,
            call,
            refusal_error,
            code_sha256,
            records=records,
            retry_seconds=call.retry_seconds,
        )

    async def publish(
        self,
        job: jobs_pb2.ClaimedJob,
        slot: int,
        frame_time: Timestamp,
        image: bytes,
        boxes: list[common_pb2.Box],
    ) -> tuple[str, str]:
        digest = sha256_hex(image)
        try:
            key = await self._direct.publish(job, slot, frame_time, image, JPEG, boxes, digest)
        except (WriteUnavailable, WriteFailed) as error:
            raise ServiceUnavailable(str(error)) from None
        return key, digest

    async def settle(self, lease: common_pb2.LeaseRef) -> None:
        await self._direct.settle(lease)


class RelayPublisher:
    """Previews sent through the preview service (PublishPreview), one call each."""

    def __init__(
        self,
        previews: preview_pb2_grpc.PreviewServiceAsyncStub,
        call: Caller,
        code_sha256: str,
    ) -> None:
        self._previews = previews
        self._call = call
        self._code = code_sha256

    async def publish(
        self,
        job: jobs_pb2.ClaimedJob,
        slot: int,
        frame_time: Timestamp,
        image: bytes,
        boxes: list[common_pb2.Box],
    ) -> tuple[str, str]:
        published = await self._call(
            self._previews.PublishPreview,
            preview_pb2.PublishPreviewRequest(
                lease=job.lease,
                code_sha256=self._code,
                slot_index=slot,
                frame_time=frame_time,
                image=image,
                content_type=JPEG,
                boxes=boxes,
            ),
        )
        return published.object_key, published.sha256

    async def settle(self, lease: common_pb2.LeaseRef) -> None:
        """Nothing to wait for: each PublishPreview answered once its preview was recorded."""


def publisher_for(
    direct_writes: bool,
    previews: preview_pb2_grpc.PreviewServiceAsyncStub,
    call: Caller,
    code_sha256: str,
    jobs: JobCalls | None = None,
) -> Publisher:
    """The route the `direct_writes` setting names, for the processor's whole life; with
    grants, the records go on the session of `jobs` where it is one."""
    if direct_writes:
        return GrantPublisher(previews, call, code_sha256, jobs)
    return RelayPublisher(previews, call, code_sha256)
