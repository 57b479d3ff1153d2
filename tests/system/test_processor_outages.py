"""Outages a processor rides out on the real components (docs/limits-and-errors.md): the
preview service and the coordinator restarting mid-job, an outage longer than the processor
waits, and object storage down when a recording is fetched.

None of these is the job's fault, so none may fail it: a call that gets no answer is asked
again under the same lease (every write is idempotent under its lease), and when the outage
outlasts `retry_seconds`, or the recording cannot be fetched, the job is handed back with
Release (no attempt spent) and claimed again later. Each outage is made at a gate (a held
call), so it happens mid-job by construction, and every retry is seen in the call log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.processor.calls import TRANSPORTS, JobCalls, Transport
from testbed.coordinator_world import run_request, save_workflow
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from testbed.harness.preview import PreviewHarness, running_preview
from testbed.harness.s3 import S3Bucket
from testbed.harness.triton import TritonServer
from tests.processor_gates import Call, Spy, rows, until, within
from tests.processor_world import (
    SECONDS,
    build_world,
    finished,
    job_calls,
    one_camera_run,
    put_recording,
    run_detail,
    running_processor,
    yard_spec,
)
from workshop.kit.channels import open_channel
from workshop.v1 import common_pb2, preview_pb2_grpc

pytestmark = pytest.mark.triton
SLOTS = SECONDS // 2  # slots per job: every 2 s of a SECONDS-long recording
FULL = common_pb2.RUN_MODE_FULL
DOWN_SECONDS = 3.0  # longer than the channel's own retries (5 attempts, about 1.5 s of backoff)


# Starts a harness (it has `.port`) on a port; 0 picks a free one.
Starter = Callable[[int], AbstractAsyncContextManager[Any]]


class Restartable:
    """A service in this process that a test stops and starts again on the same port."""

    def __init__(self, start: Starter) -> None:
        self._start = start
        self._stack: AsyncExitStack | None = None
        self.port = 0

    async def up(self) -> None:
        assert self._stack is None
        stack = AsyncExitStack()
        started = await stack.enter_async_context(self._start(self.port))
        self.port = started.port
        self._stack = stack

    async def down(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.aclose()


@asynccontextmanager
async def restartable(start: Starter) -> AsyncIterator[Restartable]:
    service = Restartable(start)
    await service.up()
    try:
        yield service
    finally:
        await service.down()


@asynccontextmanager
async def restartable_preview(
    c: CoordinatorHarness, bucket: S3Bucket
) -> AsyncIterator[tuple[Restartable, Any]]:
    """A preview service the test restarts, and a processor's channel to its port."""
    async with (
        restartable(lambda port: running_preview(c, bucket, port=port)) as service,
        open_channel(f"127.0.0.1:{service.port}") as channel,
    ):
        yield service, channel


@asynccontextmanager
async def restartable_replica(
    c: CoordinatorHarness, dsn: str
) -> AsyncIterator[tuple[Restartable, Any]]:
    """A second coordinator on `c`'s database and clock that the test restarts, and a
    processor's channel to its port."""
    async with (
        restartable(lambda port: running_coordinator(dsn, clock=c.clock, port=port)) as replica,
        open_channel(f"127.0.0.1:{replica.port}") as channel,
    ):
        yield replica, channel


# How a preview reaches the coordinator: written with a grant and recorded in batches (the
# processor's own path), or relayed through PublishPreview (processors before grants).
PATHS = {"direct": "RecordWrittenPreviews", "relay": "PublishPreview"}


def holds_preview(method: str, slot: int, generation: int | None = None) -> Any:
    """A Spy hold for the call that records slot `slot`'s preview (alone or in a batch)."""

    def hold(called: str, request: Any) -> bool:
        batch = list(request.previews) if hasattr(request, "previews") else [request]
        return called == method and any(
            each.slot_index == slot and generation in (None, each.lease.generation)
            for each in batch
        )

    return hold


def outcomes(log: list[Call], method: str, slot: int | None = None) -> list[str]:
    return [call.outcome for call in log if call.method == method and call.slot == slot]


async def assert_completed_once(c: CoordinatorHarness, generation: int) -> None:
    detail = await run_detail(c, "r1")
    assert detail.run.status == common_pb2.RUN_STATUS_COMPLETED, detail
    (job,) = detail.jobs
    assert (job.state, job.generation) == (common_pb2.JOB_STATE_COMPLETED, generation)
    assert (detail.run.counts.slots_frame, detail.run.counts.items_saved) == (SLOTS, SLOTS)
    items = await rows(c, "SELECT slot_index FROM bucket_items WHERE run_id = 'r1'")
    assert sorted(item["slot_index"] for item in items) == list(range(SLOTS))
    receipts = await rows(c, "SELECT generation FROM receipts WHERE run_id = 'r1'")
    assert receipts == [{"generation": generation}]
    assert await rows(c, "SELECT lapses FROM jobs WHERE run_id = 'r1'") == [{"lapses": 0}]


@pytest.mark.parametrize("path", PATHS)
async def test_the_preview_service_restarting_mid_job_fails_nothing(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
    path: str,
) -> None:
    """The processor's preview service goes down while slot 2's preview is held, for longer
    than the channel retries; the preview is asked again until the service is back, and the
    job completes under its first lease with every slot once. Direct: the held call is the
    batch that records slot 2 (the job writes on meanwhile; its records wait in line), at
    the preview service: the job calls go unary, so the records go there (on the session
    they go to the coordinator and never meet the preview service)."""
    c = coordinator
    method, direct = PATHS[path], path == "direct"
    runtime_id = (await one_camera_run(c, preview, triton_server, tmp_path)).runtime_id
    log: list[Call] = []
    async with restartable_preview(c, s3_bucket) as (service, channel):
        previews = Spy(
            preview_pb2_grpc.PreviewServiceStub(channel),
            log,
            hold=holds_preview(method, 2),
        )
        async with running_processor(
            c,
            preview,
            triton_server,
            runtime_id,
            previews=previews,
            direct_writes=direct,
            transport="unary",
        ) as processor:
            await within(previews.held.wait(), "slot 2's preview")
            await service.down()
            previews.gate.set()
            await until(lambda: "UNAVAILABLE" in outcomes(log, method, 2), "a miss")
            await asyncio.sleep(DOWN_SECONDS)
            await service.up()
            await finished(c, "r1")
            await until(lambda: processor.completed == 1, "the processor to count it")
            assert (processor.failed, processor.handed_back) == (0, 0)

    slot_2 = outcomes(log, method, 2)
    assert slot_2[-1] == "ok"
    assert set(slot_2[:-1]) == {"UNAVAILABLE"}  # asked again until the service was back
    published = [call.slot for call in log if call.method == method and call.outcome == "ok"]
    assert published == list(range(SLOTS))  # in slot order, each once
    await assert_completed_once(c, generation=1)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_coordinator_restarting_at_completion_fails_nothing(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    pg_dsn: str,
    triton_server: TritonServer,
    tmp_path: Path,
    transport: Transport,
) -> None:
    """The processor's coordinator (a second replica on the same database and clock) goes
    down while the Complete is held; the Complete is asked again until it is back, and the
    result commits once under the first lease."""
    c = coordinator
    runtime_id = (await one_camera_run(c, preview, triton_server, tmp_path)).runtime_id
    log: list[Call] = []
    async with restartable_replica(c, pg_dsn) as (replica, channel):
        jobs = Spy(
            job_calls(channel, transport),
            log,
            hold=lambda method, _request: method == "Complete",
        )
        async with running_processor(c, preview, triton_server, runtime_id, jobs=jobs) as processor:
            await within(jobs.held.wait(), "the completion")
            await replica.down()
            jobs.gate.set()
            await until(lambda: "UNAVAILABLE" in outcomes(log, "Complete"), "a miss")
            await asyncio.sleep(DOWN_SECONDS)
            await replica.up()
            await until(lambda: processor.completed == 1, "the completion")
            assert (processor.failed, processor.handed_back) == (0, 0)

    completes = outcomes(log, "Complete")
    assert completes[-1] == "ok"
    assert set(completes[:-1]) == {"UNAVAILABLE"}
    await assert_completed_once(c, generation=1)


@pytest.mark.parametrize("path", PATHS)
async def test_an_outage_longer_than_the_processor_waits_hands_the_job_back(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
    path: str,
) -> None:
    """With retry_seconds=1 the preview service stays down past it: the job is released
    (queued again at once, no attempt spent, not failed), and once the service is back the
    processor claims it again and completes it under generation 2. (Unary job calls, so
    that the direct path's records go through the preview service.)"""
    c = coordinator
    method, direct = PATHS[path], path == "direct"
    runtime_id = (await one_camera_run(c, preview, triton_server, tmp_path)).runtime_id
    log: list[Call] = []
    async with restartable_preview(c, s3_bucket) as (service, channel):
        jobs = Spy(job_calls(c.channel, "unary"), log)
        previews = Spy(
            preview_pb2_grpc.PreviewServiceStub(channel),
            log,
            hold=holds_preview(method, 1, generation=1),
        )
        async with running_processor(
            c,
            preview,
            triton_server,
            runtime_id,
            jobs=jobs,
            previews=previews,
            retry_seconds=1.0,
            direct_writes=direct,
        ) as processor:
            await within(previews.held.wait(), "slot 1's preview")
            await service.down()
            previews.gate.set()
            released = Call("Release", "r1/j0", None, "ok")
            await until(lambda: released in log, "the hand-back")
            assert processor.handed_back == 1
            assert "UNAVAILABLE" in outcomes(log, method, 1)
            await service.up()
            await finished(c, "r1")
            await until(lambda: processor.completed == 1, "the processor to count it")
            assert processor.failed == 0

    await assert_completed_once(c, generation=2)


async def test_object_storage_down_at_download_hands_the_job_back(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """SeaweedFS is down when the processor fetches the recording: the job is released, not
    failed, and claimed again (after a growing pause) until the store is back; then it
    completes, with no lapse or failure on record."""
    c = coordinator
    runtime_id = (await one_camera_run(c, preview, triton_server, tmp_path)).runtime_id
    log: list[Call] = []
    jobs = Spy(job_calls(c.channel), log)
    server = s3_bucket.server
    server.kill()
    try:
        async with running_processor(c, preview, triton_server, runtime_id, jobs=jobs) as processor:
            await until(lambda: processor.handed_back >= 2, "two hand-backs")
            await asyncio.to_thread(server.start)
            detail = await finished(c, "r1")
            await until(lambda: processor.completed == 1, "the processor to count it")
            assert processor.failed == 0
    finally:
        if server.pid is None:
            await asyncio.to_thread(server.start)

    (job,) = detail.jobs
    releases = [call for call in log if call.method == "Release"]
    assert len(releases) == processor.handed_back
    assert {release.outcome for release in releases} == {"ok"}
    await assert_completed_once(c, generation=job.generation)
    assert job.generation == processor.handed_back + 1


async def test_a_hand_back_whose_release_gets_no_answer_is_asked_again(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    s3_bucket: S3Bucket,
    pg_dsn: str,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """SeaweedFS is down at the download, so the job is handed back; the processor's
    coordinator is down too when that Release is sent. The Release is asked again until the
    coordinator is back, so the job is queued again without a lapse (no attempt spent) and
    completes under generation 2 once the store is back."""
    c = coordinator
    runtime_id = (await one_camera_run(c, preview, triton_server, tmp_path)).runtime_id
    log: list[Call] = []
    server = s3_bucket.server
    async with restartable_replica(c, pg_dsn) as (replica, channel):
        jobs = Spy(
            job_calls(channel),
            log,
            hold=lambda method, _request: method == "Release",
        )
        server.kill()
        try:
            async with running_processor(
                c, preview, triton_server, runtime_id, jobs=jobs
            ) as processor:
                await within(jobs.held.wait(), "the hand-back's Release")
                await replica.down()
                jobs.gate.set()
                await until(lambda: "UNAVAILABLE" in outcomes(log, "Release"), "a miss")
                await asyncio.sleep(DOWN_SECONDS)
                await asyncio.to_thread(server.start)
                await replica.up()
                await finished(c, "r1")
                await until(lambda: processor.completed == 1, "the processor to count it")
                assert (processor.failed, processor.handed_back) == (0, 1)
        finally:
            if server.pid is None:
                await asyncio.to_thread(server.start)

    releases = outcomes(log, "Release")
    assert releases[-1] == "ok"
    assert set(releases[:-1]) == {"UNAVAILABLE"}
    await assert_completed_once(c, generation=2)


class Unanswered:
    """The processor's real JobService stub, except that `method` gets no answer the first
    `times` calls: the call is sent and its answer replaced by `code` (`sent`), or it is not
    sent at all. Every call of `method` and of Release is logged as (method, outcome)."""

    def __init__(
        self,
        stub: JobCalls,
        method: str,
        code: grpc.StatusCode,
        *,
        times: int,
        sent: bool,
    ) -> None:
        self._stub = stub
        self._method = method
        self._code = code
        self._left = times
        self._sent = sent
        self.log: list[tuple[str, str]] = []

    def answer(self) -> None:
        """From now on every call gets its real answer."""
        self._left = 0

    def __getattr__(self, method: str) -> Any:
        send = getattr(self._stub, method)
        if method not in (self._method, "Release"):
            return send

        async def call(request: Any, **kwargs: Any) -> Any:
            if method == self._method and self._left > 0:
                self._left -= 1
                if self._sent:
                    await send(request, **kwargs)
                self.log.append((method, self._code.name))
                empty = grpc.aio.Metadata()
                raise grpc.aio.AioRpcError(self._code, empty, empty, details="no answer (test)")
            try:
                reply = await send(request, **kwargs)
            except grpc.aio.AioRpcError as error:
                self.log.append((method, error.code().name))
                raise
            self.log.append((method, "ok"))
            return reply

        return call


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN])
async def test_a_completion_answered_internal_is_asked_again_not_failed(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
    code: grpc.StatusCode,
    transport: Transport,
) -> None:
    """The Complete commits and its answer is INTERNAL (a coordinator that failed after the
    commit): that is no answer, so the processor asks again under the same lease and the
    receipt settles it. Before, INTERNAL reached the processor's catch-all, which sent Fail
    (refused: the job had completed) and counted the job as failed."""
    c = coordinator
    runtime_id = (await one_camera_run(c, preview, triton_server, tmp_path)).runtime_id
    jobs = Unanswered(job_calls(c.channel, transport), "Complete", code, times=1, sent=True)
    async with running_processor(c, preview, triton_server, runtime_id, jobs=jobs) as processor:
        await until(lambda: processor.completed == 1, "the completion")
        assert (processor.failed, processor.handed_back) == (0, 0)
    assert jobs.log == [("Complete", code.name), ("Complete", "ok")]
    await assert_completed_once(c, generation=1)


async def test_a_fail_that_gets_no_answer_hands_the_job_back(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """cam-a's recording cannot be decoded (the job's own problem: it must fail), and its
    Fail gets no answer for longer than the processor asks (retry_seconds=1). The job is
    handed back with Release instead of being left leased until its lease lapses (five
    minutes, an attempt spent); claimed again, it fails under generation 2, no lapse."""
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path, cameras=["cam-a"])
    corrupt = tmp_path / "corrupt.vp9"
    corrupt.write_bytes(world.files["cam-a"].read_bytes()[:64] + bytes(range(256)) * 400)
    await put_recording(c, preview, "cam-a-0", "cam-a", corrupt)
    await save_workflow(c, "yard", yard_spec(world.model, ["cam-a"]))
    await c.workshop.CreateRun(
        run_request("r1", "yard", world.runtime_id, mode=FULL), metadata=c.admin
    )
    jobs = Unanswered(
        job_calls(c.channel),
        "Fail",
        grpc.StatusCode.UNAVAILABLE,
        times=1_000,
        sent=False,
    )
    async with running_processor(
        c, preview, triton_server, world.runtime_id, jobs=jobs, retry_seconds=1.0
    ) as processor:
        await until(lambda: ("Release", "ok") in jobs.log, "the hand-back")
        jobs.answer()  # the coordinator answers again
        detail = await finished(c, "r1")
    assert processor.handed_back == 1
    first_release = jobs.log.index(("Release", "ok"))
    assert {outcome for _, outcome in jobs.log[:first_release]} == {"UNAVAILABLE"}
    assert jobs.log[-1] == ("Fail", "ok")
    (job,) = detail.jobs
    assert (job.state, job.failure_reason, job.generation) == (
        common_pb2.JOB_STATE_FAILED,
        common_pb2.FAILURE_REASON_PROCESSOR_FAILED,
        2,
    )
    assert job.failure_message.startswith("Cannot read recording cam-a-0: ")
    assert await rows(c, "SELECT lapses FROM jobs WHERE run_id = 'r1'") == [{"lapses": 0}]
