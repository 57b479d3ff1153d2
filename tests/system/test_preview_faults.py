"""Object storage faults: a store that is down or stalled makes a publish UNAVAILABLE within
a few seconds and records nothing (the coordinator has no row for the preview's key); a
restart of the store loses no committed image. A coordinator that cannot reach its
database, or fails to answer, is UNAVAILABLE to the processor too."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.preview.coordinator import refused
from testbed.coordinator_leases import Setup, claim, create_run, setup
from testbed.coordinator_world import error_reason
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.postgres import PostgresDatabase, stopped
from testbed.harness.preview import (
    S3_TIMEOUT_SECONDS,
    PreviewHarness,
    publish_request,
    upload_request,
)
from testbed.harness.s3 import S3Server
from workshop.kit import errors
from workshop.kit.auth import bearer_metadata
from workshop.kit.status import status_for
from workshop.v1 import jobs_pb2
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

# One request and its retry, each bounded by the timeout, plus the backoff and slack.
STALLED_BOUND_S = 2 * S3_TIMEOUT_SECONDS + 1.5
DOWN_BOUND_S = 2.0


@pytest.fixture
async def started(
    coordinator: CoordinatorHarness,
) -> tuple[Setup, jobs_pb2.ClaimedJob]:
    s = await setup(coordinator)
    await create_run(coordinator, s, full=False)
    job = await claim(coordinator, s)
    assert job is not None
    return s, job


async def unavailable_within(call: Awaitable[object], seconds: float) -> None:
    began = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    elapsed = time.monotonic() - began
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()
    assert error_reason(caught.value)[1] == "UNAVAILABLE"
    assert elapsed < seconds, f"UNAVAILABLE after {elapsed:.1f} s"


async def published_slots(c: CoordinatorHarness) -> list[int]:
    reply = await c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin)
    return sorted(image.slot_index for image in reply.detail.recent_images)


async def recorded_kinds(c: CoordinatorHarness, *, slot: int) -> list[str]:
    """Kinds of the objects the coordinator has a row for in a slot, none published."""
    async with c.db.connection() as connection:
        rows = await connection.fetch(
            "SELECT kind, published_at FROM staged_objects WHERE slot_index = $1 ORDER BY kind",
            slot,
        )
    assert all(row["published_at"] is None for row in rows)
    return [row["kind"] for row in rows]


@contextmanager
def stalled(server: S3Server) -> Iterator[None]:
    """SIGSTOP the store's process group: connections open, nothing answers."""
    assert server.pid is not None
    os.killpg(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(server.pid, signal.SIGCONT)


async def test_with_the_store_down_a_publish_is_unavailable_and_a_restart_loses_nothing(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    started: tuple[Setup, jobs_pb2.ClaimedJob],
) -> None:
    c, p = coordinator, preview
    s, job = started
    committed = await p.stub.PublishPreview(publish_request(job, 0), metadata=s.processor)
    agent = bearer_metadata(await c.key(Grant(ScopeName.WORKSHOP), name="agent"))
    read = pb.ReadImageRequest(run_id="r1", item_id=committed.item_id)
    server = p.bucket.server
    server.kill()
    try:
        await unavailable_within(
            p.stub.PublishPreview(publish_request(job, 1), metadata=s.processor), DOWN_BOUND_S
        )
        await unavailable_within(
            p.stub.StageUpload(upload_request(job, 1), metadata=s.processor), DOWN_BOUND_S
        )
        assert await published_slots(c) == [0]
        # the preview's bytes were never written, so nothing was recorded for its key; the
        # upload was staged before its write: the cleanup loop's once the lease ends
        assert await recorded_kinds(c, slot=1) == ["upload"]
        await unavailable_within(p.stub.ReadImage(read, metadata=agent), DOWN_BOUND_S)
    finally:
        await asyncio.to_thread(server.start)
    image = await p.stub.ReadImage(read, metadata=agent)
    assert image.image == publish_request(job, 0).image
    retried = await p.stub.PublishPreview(publish_request(job, 1), metadata=s.processor)
    assert retried.object_key.endswith("/1.jpg")
    assert await published_slots(c) == [0, 1]


async def test_with_the_store_stalled_a_publish_is_unavailable_within_its_timeouts(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    started: tuple[Setup, jobs_pb2.ClaimedJob],
) -> None:
    s, job = started
    with stalled(preview.bucket.server):
        await unavailable_within(
            preview.stub.PublishPreview(publish_request(job, 0), metadata=s.processor),
            STALLED_BOUND_S,
        )
    assert await published_slots(coordinator) == []
    # the stalled store may still finish the write once it resumes: those bytes are the
    # sweep's (test_preview_sweeps.py); no row was written for them
    assert await recorded_kinds(coordinator, slot=0) == []
    published = await preview.stub.PublishPreview(publish_request(job, 0), metadata=s.processor)
    assert await preview.object_bytes(published.object_key) == publish_request(job, 0).image


async def test_with_the_coordinators_database_down_a_publish_is_unavailable(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    started: tuple[Setup, jobs_pb2.ClaimedJob],
    pg_database: PostgresDatabase,
) -> None:
    """The coordinator answers UNAVAILABLE for its stopped database and the preview service
    passes that on (it passed INTERNAL on as COORDINATOR_FAILED, INTERNAL); the same publish
    goes through once the database is back."""
    s, job = started
    async with stopped(pg_database.cluster):
        await unavailable_within(
            preview.stub.PublishPreview(publish_request(job, 0), metadata=s.processor), 10.0
        )
    published = await preview.stub.PublishPreview(publish_request(job, 0), metadata=s.processor)
    assert await published_slots(coordinator) == [0]
    assert await preview.object_bytes(published.object_key) == publish_request(job, 0).image


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN])
def test_a_coordinator_that_failed_to_answer_is_unavailable_to_the_caller(
    code: grpc.StatusCode,
) -> None:
    """INTERNAL or UNKNOWN is the coordinator's own trouble, not a verdict on the request:
    to the processor it is no answer (UNAVAILABLE, asked again), never INTERNAL."""
    error = refused(pub.Refusal(code=code.value[0], message="boom", reason="INTERNAL"))
    assert isinstance(error, errors.Unavailable)
    assert status_for(error).grpc_code == grpc.StatusCode.UNAVAILABLE
    assert error.reason == "UNAVAILABLE"
    assert "boom" in error.message
