"""Photos (docs/photos.md): a one-frame test with no model that skips the run queue."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest

from services.coordinator.leases.maintenance import Maintenance
from services.coordinator.platform.errors import NO_MEDIA_MESSAGE
from testbed.coordinator_leases import (
    Setup,
    claim,
    complete_request,
    create_run,
    empty_result,
    on_behalf,
    record_request,
    setup,
)
from testbed.coordinator_world import DAY, error_reason, put_recording, stamp
from testbed.harness.coordinator import CoordinatorHarness
from testbed.session_jobs import JOB_TRANSPORTS
from workshop.v1 import common_pb2
from workshop.v1 import workshop_pb2 as ws

AT = DAY + timedelta(hours=8, minutes=30, seconds=15)


@pytest.fixture(params=JOB_TRANSPORTS)
def job_transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs twice: on JobService's unary calls and on a Session stream."""
    return str(request.param)


async def seen(c: CoordinatorHarness, runtime_id: str) -> None:
    async with c.db.connection() as connection:
        await connection.execute(
            "UPDATE runtimes SET last_seen_at = $2 WHERE runtime_id = $1",
            runtime_id,
            c.clock.now(),
        )


@pytest.fixture
async def s(coordinator: CoordinatorHarness) -> Setup:
    built = await setup(coordinator)
    await seen(coordinator, built.world.tracking_runtime)
    return built


def request(camera: str = "cam-a") -> ws.RequestPhotoRequest:
    return ws.RequestPhotoRequest(camera_id=camera, time=stamp(AT))


async def test_same_request_within_the_hour_is_the_same_photo(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    first = await c.workshop.RequestPhoto(request(), metadata=c.admin)
    assert first.created
    photo = first.photo
    assert photo.photo_id.startswith("photo-")
    assert (photo.camera_id, photo.recording_id) == ("cam-a", "cam-a-0")
    assert photo.status == common_pb2.RUN_STATUS_QUEUED
    c.clock.advance(timedelta(minutes=20))  # 12:20, still the 12:00 hour
    again = await c.workshop.RequestPhoto(request(), metadata=c.admin)
    assert not again.created
    assert again.photo.photo_id == photo.photo_id
    c.clock.advance(timedelta(minutes=45))  # 13:05: a new hour makes a new photo
    later = await c.workshop.RequestPhoto(request(), metadata=c.admin)
    assert later.created
    assert later.photo.photo_id != photo.photo_id


async def test_the_newest_covering_recording_is_chosen(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    c.clock.advance(timedelta(minutes=1))  # put after cam-a-0, also covering the instant
    await put_recording(c, "cam-a-late", "cam-a", DAY + timedelta(hours=8, minutes=15))
    reply = await c.workshop.RequestPhoto(request(), metadata=c.admin)
    assert reply.photo.recording_id == "cam-a-late"


async def test_photos_skip_the_queue_and_complete_with_their_frame(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    await create_run(c, s)  # a run is queued first ...
    photo = (await c.workshop.RequestPhoto(request(), metadata=c.admin)).photo
    job = await claim(c, s)  # ... but the photo is claimed first
    assert job is not None
    assert job.lease.run_id == photo.photo_id
    assert len(job.input.slots) == 1
    assert job.input.slots[0].start == stamp(AT)
    assert job.snapshot.kind == common_pb2.RUN_KIND_PHOTO
    data = b"\xff\xd8photo\xff\xd9"
    # a photo is a test: its preview lives under the test prefix, recorded in one call
    record = record_request(job, 0, test=True, data=data)
    assert record.object_key == f"workshop-tests/previews/{photo.photo_id}/j0/1/0.jpg"
    record.frame_time.CopyFrom(stamp(AT + timedelta(milliseconds=20)))
    published = await c.publication.RecordPreview(record, metadata=on_behalf(s))
    assert published.expires_at == photo.expires_at
    result = empty_result(job)
    result.slots[0].outcome = common_pb2.SLOT_OUTCOME_FRAME
    result.slots[0].frame_time.CopyFrom(stamp(AT + timedelta(milliseconds=20)))
    await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    done = (
        await c.workshop.GetPhoto(ws.GetPhotoRequest(photo_id=photo.photo_id), metadata=c.admin)
    ).photo
    assert done.status == common_pb2.RUN_STATUS_COMPLETED
    assert done.item_id == published.item_id
    assert done.frame_time == stamp(AT + timedelta(milliseconds=20))
    # never listed with runs
    listed = await c.workshop.ListRuns(ws.ListRunsRequest(), metadata=c.admin)
    assert [entry.run.run_id for entry in listed.runs] == ["r1"]


async def test_a_photo_lasts_an_hour(coordinator: CoordinatorHarness, s: Setup) -> None:
    c = coordinator
    photo = (await c.workshop.RequestPhoto(request(), metadata=c.admin)).photo
    assert photo.expires_at == stamp(c.clock.now() + timedelta(hours=1))
    c.clock.advance(timedelta(hours=1, seconds=1))
    await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.GetPhoto(ws.GetPhotoRequest(photo_id=photo.photo_id), metadata=c.admin)
    assert error_reason(caught.value)[:2] == (grpc.StatusCode.NOT_FOUND, "EXPIRED")
    assert await claim(c, s) is None


async def test_photo_refusals(coordinator: CoordinatorHarness, s: Setup) -> None:
    c = coordinator
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.RequestPhoto(request("nope"), metadata=c.admin)
    assert error_reason(caught.value)[:2] == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    at_night = ws.RequestPhotoRequest(camera_id="cam-a", time=stamp(DAY + timedelta(hours=3)))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.RequestPhoto(at_night, metadata=c.admin)
    code, reason, _ = error_reason(caught.value)
    assert (code, reason, caught.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "NO_MEDIA",
        NO_MEDIA_MESSAGE,
    )
    assert await c.count("runs") == 0
