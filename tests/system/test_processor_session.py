"""A processor's calls about jobs on its session stream (services/processor/calls.py),
on the real components: a run completes with every JobService call on one Session stream
(none unary, as the coordinator's per-method counts show); the stream broken mid-job, a
Complete's and a progress report's answers lost with it, loses nothing and spends no
attempt; against a coordinator without Session (UNIMPLEMENTED, as release 0.1 answers it)
the processor falls back to unary once and completes; and `unary` still works. The
records of the previews it writes go on the stream too (the preview service's
RecordWrittenPreviews is never called), and through the preview service where the
coordinator does not take them (one from before record_previews). The transport against
a scripted service: tests/service/test_processor_session.py."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from services.processor.calls import SESSION_CALLS, SessionJobs, Transport, job_transport
from testbed.coordinator_world import run_request, save_workflow
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.processor_gates import rows, until
from tests.processor_world import build_world, finished, running_processor, yard_spec
from workshop.kit.metrics import REGISTRY
from workshop.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc

pytestmark = pytest.mark.triton
FULL = common_pb2.RUN_MODE_FULL
JOB_METHODS = tuple(SESSION_CALLS)  # Claim, Heartbeat, ReportProgress, Complete, Fail, Release


class Counting:
    """The coordinator's JobService stub, each method the transport takes from it counted
    (Session once per stream it opens; a unary method once per call)."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub
        self.used: Counter[str] = Counter()

    def __getattr__(self, method: str) -> Any:
        self.used[method] += 1
        return getattr(self._stub, method)


class BreaksAfter(Counting):
    """As Counting, except that the Session stream on which each of `calls` (SessionRequest
    fields) is first sent is cancelled right after that message went out: the call may
    have been done or not, and its answer is lost with the stream."""

    def __init__(self, stub: Any, calls: set[str]) -> None:
        super().__init__(stub)
        self._left = set(calls)
        self.broken: list[str] = []
        # streams cancelled: two of `calls` sent within the 10 ms share one stream's break
        self.streams_broken = 0

    def Session(self, requests: Any, **kwargs: Any) -> Any:
        self.used["Session"] += 1
        opened: list[Any] = []
        breaking = False

        async def watched() -> AsyncIterator[jobs_pb2.SessionRequest]:
            nonlocal breaking
            async for request in requests:
                yield request
                kind = request.WhichOneof("call")
                if kind in self._left:  # resumed once the message is written
                    self._left.discard(kind)
                    self.broken.append(kind)
                    if not breaking:
                        breaking = True
                        self.streams_broken += 1
                        asyncio.get_running_loop().call_later(0.01, opened[0].cancel)

        call = self._stub.Session(watched(), **kwargs)
        opened.append(call)
        return call


class WithoutSession(Counting):
    """The coordinator's JobService stub, its Session asked under a method name the
    coordinator does not serve: the real server answers UNIMPLEMENTED, as a coordinator of
    release 0.1 (deploy/releases/previous) answers Session."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(jobs_pb2_grpc.JobServiceStub(channel))
        self._session = channel.stream_stream(
            "/workshop.v1.JobService/SessionOfALaterRelease",
            request_serializer=jobs_pb2.SessionRequest.SerializeToString,
            response_deserializer=jobs_pb2.SessionResponse.FromString,
        )

    def Session(self, requests: Any, **kwargs: Any) -> Any:
        self.used["Session"] += 1
        return self._session(requests, **kwargs)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


class WithoutRecords(Counting):
    """The coordinator's JobService stub, a record_previews on its Session sent as a call
    of a later release (an unknown field): the real coordinator reads it as a coordinator
    from before record_previews reads the message, a request without a call."""

    def Session(self, requests: Any, **kwargs: Any) -> Any:
        self.used["Session"] += 1

        async def rewritten() -> AsyncIterator[jobs_pb2.SessionRequest]:
            async for request in requests:
                if request.WhichOneof("call") != "record_previews":
                    yield request
                    continue
                payload = request.record_previews.SerializeToString()
                later = jobs_pb2.SessionRequest(request_id=request.request_id)
                field = _varint(99 << 3 | 2) + _varint(len(payload)) + payload  # field 99
                yield jobs_pb2.SessionRequest.FromString(later.SerializeToString() + field)

        return self._stub.Session(rewritten(), **kwargs)


def as_stub(wrapper: Counting) -> jobs_pb2_grpc.JobServiceAsyncStub:
    return cast("jobs_pb2_grpc.JobServiceAsyncStub", wrapper)


def served(method: str) -> float:
    """Calls of `method` (a metric's method label) this process's services answered."""
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        for sample in metric.samples
        if sample.name == "workshop_rpc_requests_total" and sample.labels.get("method") == method
    )


RECORDED_BY_PREVIEW = "workshop.v1.PreviewService/RecordWrittenPreviews"
RECORDED_ON_SESSION = "workshop.v1.JobService/Session/RecordPreviews"


def previews_recorded() -> float:
    """Previews this process's coordinators recorded so far (refusals not counted)."""
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        for sample in metric.samples
        if sample.name == "workshop_coordinator_previews_recorded_total"
    )


def unary_job_calls_served() -> float:
    """JobService's unary calls about jobs this process's coordinators answered so far."""
    total = 0.0
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            method = sample.labels.get("method", "")
            if sample.name == "workshop_rpc_requests_total" and method in {
                f"workshop.v1.JobService/{name}" for name in JOB_METHODS
            }:
                total += sample.value
    return total


async def two_job_run(
    c: CoordinatorHarness, preview: PreviewHarness, triton: TritonServer, tmp: Path
) -> str:
    """cam-a's and cam-b's world, workflow `yard` and full run r1 (two jobs); the runtime."""
    world = await build_world(c, preview, triton, tmp)
    await save_workflow(c, "yard", yard_spec(world.model))
    await c.workshop.CreateRun(
        run_request("r1", "yard", world.runtime_id, mode=FULL), metadata=c.admin
    )
    return world.runtime_id


async def assert_completed_once(c: CoordinatorHarness) -> None:
    """r1 completed, each job under its first lease, none lapsed, one receipt each."""
    detail = await finished(c, "r1")
    assert detail.run.status == common_pb2.RUN_STATUS_COMPLETED, detail
    assert detail.run.counts.slots_frame == 20
    assert {(job.state, job.generation) for job in detail.jobs} == {
        (common_pb2.JOB_STATE_COMPLETED, 1)
    }
    assert await rows(c, "SELECT lapses FROM jobs WHERE run_id = 'r1' AND lapses > 0") == []
    receipts = await rows(c, "SELECT generation FROM receipts WHERE run_id = 'r1'")
    assert receipts == [{"generation": 1}] * 2


@pytest.mark.parametrize("transport", ["session", "unary"])
async def test_a_run_completes_on_the_chosen_transport(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
    transport: Transport,
) -> None:
    """On the session (the default), every call about the run's jobs is a message on one
    stream: the transport takes nothing from the stub but Session, once while the run
    goes on (the stop gives up the Claim waiting for more work, which ends that stream,
    and asks that Claim again on a second one to release what it may have leased), and
    the coordinator answers no unary JobService call meanwhile. With `unary`, no stream."""
    c = coordinator
    runtime_id = await two_job_run(c, preview, triton_server, tmp_path)
    stub = Counting(jobs_pb2_grpc.JobServiceStub(c.channel))
    jobs = job_transport(transport, as_stub(stub))
    unary_served = unary_job_calls_served()
    by_preview, on_session = served(RECORDED_BY_PREVIEW), served(RECORDED_ON_SESSION)
    recorded = previews_recorded()
    async with running_processor(c, preview, triton_server, runtime_id, jobs=jobs) as processor:
        await until(lambda: processor.completed == 2, "both completions")
        assert (processor.failed, processor.handed_back) == (0, 0)
        used_by_the_run = dict(stub.used)
    await assert_completed_once(c)
    await jobs.close()
    assert previews_recorded() - recorded == 20  # one per frame slot
    if transport == "session":
        assert isinstance(jobs, SessionJobs)
        assert used_by_the_run == {"Session": 1}, used_by_the_run
        assert set(stub.used) == {"Session"}
        assert jobs.streams_opened == stub.used["Session"] in (1, 2)
        assert not jobs.unary
        assert jobs.records
        assert unary_job_calls_served() == unary_served
        # the records went on the stream: none through the preview service
        assert served(RECORDED_BY_PREVIEW) == by_preview
        assert served(RECORDED_ON_SESSION) > on_session
    else:
        assert served(RECORDED_BY_PREVIEW) > by_preview
        assert served(RECORDED_ON_SESSION) == on_session
        assert "Session" not in stub.used
        assert {"Claim", "Complete"} <= set(stub.used) <= set(JOB_METHODS), stub.used
        assert unary_job_calls_served() > unary_served


async def test_a_stream_broken_mid_job_loses_nothing(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """The stream breaks right after a progress report and again right after a Complete
    went out (done or not, their answers are lost): each is asked again on a new stream,
    the Complete's receipt settles it, and no job is failed, handed back or lapsed. (The
    jobs are short: with a delay of 0 they report progress, as long ones do.)"""
    c = coordinator
    runtime_id = await two_job_run(c, preview, triton_server, tmp_path)
    stub = BreaksAfter(jobs_pb2_grpc.JobServiceStub(c.channel), {"report_progress", "complete"})
    jobs = SessionJobs(as_stub(stub))
    async with running_processor(
        c, preview, triton_server, runtime_id, jobs=jobs, progress_after_seconds=0
    ) as processor:
        await until(lambda: processor.completed == 2, "both completions")
        assert (processor.failed, processor.handed_back) == (0, 0)
    await assert_completed_once(c)
    await jobs.close()
    assert sorted(stub.broken) == ["complete", "report_progress"]
    # every broken stream was replaced (both calls on one stream when 10 ms apart or less)
    assert stub.streams_broken in (1, 2)
    assert jobs.streams_opened == stub.used["Session"] >= 1 + stub.streams_broken
    assert set(stub.used) == {"Session"}  # nothing went unary


async def test_without_session_the_processor_goes_unary_and_completes(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The coordinator answers the stream UNIMPLEMENTED (release 0.1 has no Session): the
    processor logs it once, asks the calls that waited on the stream unary, makes every
    later call unary and completes the run; it never asks for a stream again."""
    c = coordinator
    runtime_id = await two_job_run(c, preview, triton_server, tmp_path)
    stub = WithoutSession(c.channel)
    jobs = SessionJobs(as_stub(stub))
    with caplog.at_level(logging.WARNING, "services.processor.calls"):
        async with running_processor(c, preview, triton_server, runtime_id, jobs=jobs) as processor:
            await until(lambda: processor.completed == 2, "both completions")
            assert (processor.failed, processor.handed_back) == (0, 0)
    await assert_completed_once(c)
    await jobs.close()
    assert jobs.unary
    assert stub.used["Session"] == 1
    assert {"Claim", "Complete"} <= set(stub.used)
    fallbacks = [r for r in caplog.records if "does not serve JobService.Session" in r.message]
    assert len(fallbacks) == 1


async def test_without_record_previews_the_records_go_through_the_preview_service(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A coordinator from before record_previews ends the stream on the first records (a
    request without a call it knows): the processor records them, and every later batch,
    through the preview service, asks the calls that were on that stream again on a new
    one, and completes the run with every preview recorded; its other calls stay on the
    session."""
    c = coordinator
    runtime_id = await two_job_run(c, preview, triton_server, tmp_path)
    stub = WithoutRecords(jobs_pb2_grpc.JobServiceStub(c.channel))
    jobs = SessionJobs(as_stub(stub))
    by_preview, on_session = served(RECORDED_BY_PREVIEW), served(RECORDED_ON_SESSION)
    recorded = previews_recorded()
    with caplog.at_level(logging.WARNING, "services.processor.calls"):
        async with running_processor(c, preview, triton_server, runtime_id, jobs=jobs) as processor:
            await until(lambda: processor.completed == 2, "both completions")
            assert (processor.failed, processor.handed_back) == (0, 0)
    await assert_completed_once(c)
    await jobs.close()
    assert previews_recorded() - recorded == 20
    assert not jobs.records
    assert not jobs.unary
    assert set(stub.used) == {"Session"}
    assert served(RECORDED_BY_PREVIEW) > by_preview
    assert served(RECORDED_ON_SESSION) == on_session
    notes = [r for r in caplog.records if "does not take record_previews" in r.message]
    assert len(notes) == 1
