"""Builders for lease tests: a processor key, a claimed job, and results for it."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Awaitable

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.leases.results import result_digest
from testbed.coordinator_world import (
    CODE,
    World,
    build_world,
    error_reason,
    run_request,
    save_workflow,
    workflow_spec,
)
from testbed.harness.coordinator import CoordinatorHarness
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import publication_pb2 as pub

Metadata = tuple[tuple[str, str], ...]


@dataclasses.dataclass
class Setup:
    world: World
    processor: Metadata  # a workshop:run key for gpu-box
    service: Metadata  # the preview service's key
    processor_secret: str


async def refused(call: Awaitable[object]) -> tuple[grpc.StatusCode, str]:
    """The status code and ErrorInfo reason of a call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    code, reason, _ = error_reason(caught.value)
    return code, reason


async def claimed(c: CoordinatorHarness, s: Setup) -> jobs_pb2.ClaimedJob:
    """The next job claimed with the processor's key; fails when there is none."""
    job = await claim(c, s)
    assert job is not None
    return job


async def setup(c: CoordinatorHarness, *, spec_kwargs: dict[str, object] | None = None) -> Setup:
    world = await build_world(c)
    await save_workflow(c, "yard", workflow_spec(**(spec_kwargs or {})))  # type: ignore[arg-type]
    secret = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="processor")
    service = await c.key(Grant(ScopeName.SERVICE), name="preview-service")
    return Setup(world, bearer_metadata(secret), bearer_metadata(service), secret)


async def create_run(
    c: CoordinatorHarness, s: Setup, run_id: str = "r1", *, full: bool = True
) -> None:
    mode = common_pb2.RUN_MODE_FULL if full else common_pb2.RUN_MODE_TEST
    await c.workshop.CreateRun(
        run_request(run_id, "yard", s.world.tracking_runtime, mode=mode), metadata=c.admin
    )


async def leased(c: CoordinatorHarness, *, full: bool = True) -> tuple[Setup, jobs_pb2.ClaimedJob]:
    """The usual world, run r1 (full or test) and its first job leased by the processor."""
    s = await setup(c)
    await create_run(c, s, full=full)
    return s, await claimed(c, s)


async def claim(c: CoordinatorHarness, s: Setup) -> jobs_pb2.ClaimedJob | None:
    reply = await c.jobs.Claim(
        jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE),
        metadata=s.processor,
    )
    return reply.job if reply.HasField("job") else None


def empty_result(job: jobs_pb2.ClaimedJob) -> jobs_pb2.JobResult:
    return jobs_pb2.JobResult(
        slots=[
            jobs_pb2.SlotResult(slot_index=slot.index, outcome=common_pb2.SLOT_OUTCOME_EMPTY)
            for slot in job.input.slots
        ]
    )


def complete_request(
    job: jobs_pb2.ClaimedJob, result: jobs_pb2.JobResult, *, code: str = CODE
) -> jobs_pb2.CompleteRequest:
    return jobs_pb2.CompleteRequest(
        lease=job.lease,
        code_sha256=code,
        result=result,
        result_sha256=result_digest(result),
        decoder="pyav",
    )


async def stage_upload(
    c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, slot: int, data: bytes
) -> tuple[str, str]:
    """Stages an upload for a slot through PublicationService; returns (key, sha256)."""
    digest = hashlib.sha256(data).hexdigest()
    reply = await c.publication.StageObject(
        pub.StageObjectRequest(
            lease=job.lease,
            code_sha256=CODE,
            kind=common_pb2.OBJECT_KIND_UPLOAD,
            slot_index=slot,
            sha256=digest,
            byte_size=len(data),
            content_type="image/jpeg",
        ),
        metadata=on_behalf(s),
    )
    return reply.object_key, digest


def on_behalf(s: Setup) -> Metadata:
    return (*s.service, ("workshop-on-behalf-of", f"Bearer {s.processor_secret}"))


def preview_key(
    job: jobs_pb2.ClaimedJob, slot: int, *, test: bool, generation: int = 0, ext: str = "jpg"
) -> str:
    """A lease's preview key for a slot, spelled out as publication.proto names it
    (`generation`: another than the lease's, when not 0)."""
    prefix = "workshop-tests/" if test else ""
    lease = job.lease
    attempt = generation or lease.generation
    return f"{prefix}previews/{lease.run_id}/{lease.job_id}/{attempt}/{slot}.{ext}"


def record_request(
    job: jobs_pb2.ClaimedJob, slot: int, *, test: bool, data: bytes = b"preview"
) -> pub.RecordPreviewRequest:
    """RecordPreview of `data` written under the lease's key for `slot`, with one box."""
    return pub.RecordPreviewRequest(
        lease=job.lease,
        code_sha256=CODE,
        slot_index=slot,
        object_key=preview_key(job, slot, test=test),
        frame_time=job.input.slots[slot].start,
        boxes=[common_pb2.Box(class_name="person", score=0.9, x=0.1, y=0.1, w=0.2, h=0.3)],
        byte_size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        content_type="image/jpeg",
    )


async def frame_result(
    c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob, frames: int = 2
) -> jobs_pb2.JobResult:
    """The first `frames` slots are frames that reach the `save` output (uploads staged)."""
    result = empty_result(job)
    for slot in result.slots[:frames]:
        key, digest = await stage_upload(c, s, job, slot.slot_index, b"jpeg-%d" % slot.slot_index)
        slot.outcome = common_pb2.SLOT_OUTCOME_FRAME
        slot.frame_time.CopyFrom(job.input.slots[slot.slot_index].start)
        box = common_pb2.Box(class_name="person", score=0.9, x=0.1, y=0.1, w=0.2, h=0.3)
        slot.boxes.append(box)
        slot.outputs.add(step_id="save", boxes=[box])
        slot.upload_key = key
        slot.upload_sha256 = digest
    return result
