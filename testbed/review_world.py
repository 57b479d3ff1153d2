"""Builders for review tests: full runs whose jobs commit chosen frames and boxes.

The world: cameras cam-a and cam-b, each with three one-minute recordings from 08:00 on
DAY (one job each), model `detector` (person, vehicle), buckets `yard` and `lot`, and
workflow `watch` sampling every second from 08:00 to 08:03, saving frames whose boxes
match the rule into `yard` (step `save`) and the others into `lot` (step `keep`). A test
says which frames each job saved and with which boxes; the coordinator checks the result
like any other.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_leases import Setup, complete_request, empty_result, stage_upload
from testbed.coordinator_world import (
    CODE,
    DAY,
    build_world,
    put_recording,
    run_request,
    save_workflow,
)
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import upload_request
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2, preview_pb2_grpc, workflow_pb2
from workshop.v1 import operator_pb2 as op

CAMERAS = ("cam-a", "cam-b")
RECORDINGS_PER_CAMERA = 3
SLOTS_PER_JOB = 60
CLASSES = ("person", "vehicle")


@dataclasses.dataclass(frozen=True)
class Frame:
    """What one output step saved for one slot."""

    slot: int
    step: str  # "save" (bucket yard) or "keep" (bucket lot)
    boxes: tuple[common_pb2.Box, ...]


def box(class_name: str, x: float, y: float, w: float, h: float = 0.1) -> common_pb2.Box:
    return common_pb2.Box(class_name=class_name, score=0.9, x=x, y=y, w=w, h=h)


def watch_spec(cameras: Sequence[str] = CAMERAS) -> workflow_pb2.WorkflowSpec:
    next_ = workflow_pb2.EDGE_BRANCH_NEXT
    steps = [
        workflow_pb2.Step(
            step_id="in",
            input=workflow_pb2.InputStep(
                camera_ids=list(cameras),
                day=workflow_pb2.INPUT_DAY_DATE,
                date=common_pb2.CalendarDate(year=DAY.year, month=DAY.month, day=DAY.day),
                window_start=common_pb2.TimeOfDay(hours=8),
                window_end=common_pb2.TimeOfDay(hours=8, minutes=RECORDINGS_PER_CAMERA),
            ),
        ),
        workflow_pb2.Step(step_id="sample", sample=workflow_pb2.SampleStep(interval_seconds=1)),
        workflow_pb2.Step(step_id="detect", model=workflow_pb2.ModelStep(model_name="detector")),
        workflow_pb2.Step(
            step_id="rule", rule=workflow_pb2.RuleStep(class_names=["person"], min_score=0.5)
        ),
        workflow_pb2.Step(step_id="save", output=workflow_pb2.OutputStep(bucket_id="yard")),
        workflow_pb2.Step(step_id="keep", output=workflow_pb2.OutputStep(bucket_id="lot")),
    ]
    edges = [
        workflow_pb2.Edge(from_step_id="in", to_step_id="sample", branch=next_),
        workflow_pb2.Edge(from_step_id="sample", to_step_id="detect", branch=next_),
        workflow_pb2.Edge(from_step_id="detect", to_step_id="rule", branch=next_),
        workflow_pb2.Edge(
            from_step_id="rule", to_step_id="save", branch=workflow_pb2.EDGE_BRANCH_MATCH
        ),
        workflow_pb2.Edge(
            from_step_id="rule", to_step_id="keep", branch=workflow_pb2.EDGE_BRANCH_NO_MATCH
        ),
    ]
    return workflow_pb2.WorkflowSpec(
        name="watch", graph=workflow_pb2.WorkflowGraph(steps=steps, edges=edges)
    )


async def review_world(c: CoordinatorHarness) -> Setup:
    """The world of testbed/coordinator_world.py (device, runtimes, cameras, model, bucket
    yard) with one-minute recordings, bucket lot and workflow watch."""
    world = await build_world(c, recordings_per_camera=0)
    for camera in CAMERAS:
        for index in range(RECORDINGS_PER_CAMERA):
            start = DAY + timedelta(hours=8, minutes=index)
            await put_recording(c, f"{camera}-{index}", camera, start, timedelta(minutes=1))
    await c.operator.CreateBucket(op.CreateBucketRequest(bucket_id="lot"), metadata=c.admin)
    await save_workflow(c, "watch", watch_spec())
    secret = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="processor")
    service = await c.key(Grant(ScopeName.SERVICE), name="preview-service")
    return Setup(world, bearer_metadata(secret), bearer_metadata(service), secret)


async def start_run(c: CoordinatorHarness, s: Setup, run_id: str) -> list[jobs_pb2.ClaimedJob]:
    """A full run of `watch` with every job leased, by camera and start: cam-a's three
    recordings, then cam-b's."""
    await c.workshop.CreateRun(
        run_request(run_id, "watch", s.world.tracking_runtime, mode=common_pb2.RUN_MODE_FULL),
        metadata=c.admin,
    )
    jobs: list[jobs_pb2.ClaimedJob] = []
    while len(jobs) < len(CAMERAS) * RECORDINGS_PER_CAMERA:
        reply = await c.jobs.Claim(
            jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE),
            metadata=s.processor,
        )
        assert reply.HasField("job"), "every job of the run is claimable"
        jobs.append(reply.job)
    return sorted(
        jobs, key=lambda job: (job.input.recording.camera_id, job.input.recording.start.seconds)
    )


# Stages the upload of one slot and answers its key and SHA-256.
Stager = Callable[[jobs_pb2.ClaimedJob, int], Awaitable[tuple[str, str]]]


async def commit(
    c: CoordinatorHarness,
    s: Setup,
    job: jobs_pb2.ClaimedJob,
    frames: Sequence[Frame],
    stage: Stager | None = None,
) -> jobs_pb2.CompleteResponse:
    """Completes `job` with `frames` saved: one upload per slot with a frame, staged by
    `stage` (default: made-up bytes staged through the coordinator's StageObject, so
    nothing is in object storage)."""

    async def made_up(job: jobs_pb2.ClaimedJob, slot: int) -> tuple[str, str]:
        data = hashlib.sha256(f"{job.lease.run_id}/{job.lease.job_id}/{slot}".encode()).digest()
        return await stage_upload(c, s, job, slot, data)

    result = empty_result(job)
    for slot in sorted({frame.slot for frame in frames}):
        key, digest = await (stage or made_up)(job, slot)
        entry = result.slots[slot]
        entry.outcome = common_pb2.SLOT_OUTCOME_FRAME
        entry.frame_time.CopyFrom(job.input.slots[slot].start)
        for frame in frames:
            if frame.slot == slot:
                entry.boxes.extend(frame.boxes)
                entry.outputs.add(step_id=frame.step, boxes=list(frame.boxes))
        entry.upload_key = key
        entry.upload_sha256 = digest
    response: jobs_pb2.CompleteResponse = await c.jobs.Complete(
        complete_request(job, result), metadata=s.processor
    )
    return response


async def commit_images(
    c: CoordinatorHarness,
    s: Setup,
    preview: preview_pb2_grpc.PreviewServiceAsyncStub,
    job: jobs_pb2.ClaimedJob,
    frames: Sequence[Frame],
    images: Mapping[int, bytes],
) -> jobs_pb2.CompleteResponse:
    """Completes `job` like `commit`, but each slot's upload is a real image (`images[slot]`,
    JPEG or PNG) staged through the preview service's StageUpload, so its bytes are in
    object storage."""

    async def real(job: jobs_pb2.ClaimedJob, slot: int) -> tuple[str, str]:
        request = upload_request(job, slot, images[slot])
        request.content_type = ""  # the service tells a JPEG from a PNG
        staged = await preview.StageUpload(request, metadata=s.processor)
        return staged.object_key, staged.sha256

    return await commit(c, s, job, frames, real)


# Every box of every bucket item with its sighting and review, one row each (box_index
# -1: an item without boxes), read from the items' per-box arrays as review reads them:
# what sighting_boxes held before migration 0003 (docs/review.md, "Storage").
BOXES = """
(SELECT bi.item_id, b.box_index, bi.run_id, bi.bucket_id, bi.camera_id, bi.frame_time,
        b.class_name, coalesce(bi.box_sightings[b.box_position], '') AS sighting_id,
        coalesce(bi.box_states[b.box_position], 'pending') AS review_state,
        bi.box_relabels[b.box_position] AS relabel_class,
        bi.box_decided_by[b.box_position] AS decided_by,
        bi.box_decided_at[b.box_position] AS decided_at
 FROM bucket_items bi CROSS JOIN LATERAL bucket_item_boxes_of_v1(bi.boxes) b)
"""

# The sightings rows that disagree with the items' box sightings (bucket, camera, class,
# first and last frame time, item count), or that no box names, or a grouped box's
# sighting that has no row: none when the sightings table is exact.
SIGHTINGS_MISMATCHED = f"""
WITH found AS (
    SELECT sb.run_id, sb.sighting_id, min(sb.bucket_id) AS bucket_id,
           min(sb.camera_id) AS camera_id, min(sb.class_name) AS class_name,
           min(sb.frame_time) AS first_frame_time, max(sb.frame_time) AS last_frame_time,
           count(*)::integer AS item_count
    FROM {BOXES} sb WHERE sb.sighting_id <> '' GROUP BY 1, 2
)
SELECT coalesce(f.sighting_id, s.sighting_id) AS sighting_id
FROM found f FULL JOIN sightings s USING (run_id, sighting_id)
WHERE (f.bucket_id, f.camera_id, f.class_name, f.first_frame_time, f.last_frame_time,
       f.item_count)
      IS DISTINCT FROM (s.bucket_id, s.camera_id, s.class_name, s.first_frame_time,
                        s.last_frame_time, s.item_count)
ORDER BY 1
"""
