"""When the processor reports progress, on the real components (its session stream, the
coordinator's per-method counts: workshop_rpc_requests_total under
workshop.v1.JobService/Session/<RPC>): a short job (well inside
PROCESSOR_PROGRESS_AFTER_SECONDS) sends only its Complete, which claims the next, one
message each way; a job still running after the delay reports progress, and that report
renews its lease. The lease loop's timing against a scripted service:
tests/service/test_processor_progress.py."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from services.processor.settings import MAX_PROGRESS_AFTER_SECONDS
from testbed.coordinator_world import run_request, save_workflow
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.processor_gates import Call, Spy, rows, until, within
from tests.processor_world import (
    build_world,
    finished,
    job_calls,
    one_camera_run,
    running_processor,
    yard_spec,
)
from workshop.kit.metrics import REGISTRY
from workshop.v1 import common_pb2, preview_pb2_grpc

pytestmark = pytest.mark.triton
FULL = common_pb2.RUN_MODE_FULL


def on_session(method: str) -> float:
    """Calls of `method` this process's coordinators answered as messages on a Session."""
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        for sample in metric.samples
        if sample.name == "workshop_rpc_requests_total"
        and sample.labels.get("method") == f"workshop.v1.JobService/Session/{method}"
    )


def counts() -> dict[str, float]:
    return {m: on_session(m) for m in ("Claim", "Heartbeat", "ReportProgress", "Complete")}


async def test_short_jobs_send_only_their_complete(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """A two-job run whose jobs end well before the delay (each takes under a second on
    an idle machine; the delay here is the longest a setting allows, so that a loaded
    machine's slow job is still short): no progress report and no heartbeat reach the
    coordinator; each job's one call is its Complete (the first Complete claims for the
    place it frees), and the run completes with both jobs at 100 %."""
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path)
    await save_workflow(c, "yard", yard_spec(world.model))
    await c.workshop.CreateRun(
        run_request("r1", "yard", world.runtime_id, mode=FULL), metadata=c.admin
    )
    before = counts()
    async with running_processor(
        c,
        preview,
        triton_server,
        world.runtime_id,
        progress_after_seconds=float(MAX_PROGRESS_AFTER_SECONDS),
    ) as processor:
        await until(lambda: processor.completed == 2, "both completions")
        assert (processor.failed, processor.handed_back) == (0, 0)
        moved = {method: counts()[method] - was for method, was in before.items()}
    detail = await finished(c, "r1")
    assert detail.run.status == common_pb2.RUN_STATUS_COMPLETED, detail
    assert [job.progress_percent for job in detail.jobs] == [100, 100]
    assert (moved["ReportProgress"], moved["Heartbeat"], moved["Complete"]) == (0, 0, 2), moved
    assert moved["Claim"] >= 1, moved


async def test_a_job_running_past_the_delay_reports_progress_that_renews_its_lease(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """A delay of 0.2 s, and a job held in slot 1's preview past it: the coordinator's
    clock moves a minute meanwhile (the lease, 5 minutes from the claim, still holds), the
    job goes on and reports its progress, and that report renews the lease to 5 minutes
    from the moved clock, before its Complete (held) is sent."""
    c = coordinator
    world = await one_camera_run(c, preview, triton_server, tmp_path)
    log: list[Call] = []
    jobs = Spy(job_calls(c.channel), log, hold=lambda method, _request: method == "Complete")
    previews = Spy(
        preview_pb2_grpc.PreviewServiceStub(preview.channel),
        log,
        hold=lambda method, request: method == "PublishPreview" and request.slot_index == 1,
    )
    before = counts()
    async with running_processor(
        c,
        preview,
        triton_server,
        world.runtime_id,
        jobs=jobs,
        previews=previews,
        progress_after_seconds=0.2,
        direct_writes=False,  # the job itself waits in PublishPreview, the call held
    ) as processor:
        await within(previews.held.wait(), "slot 1's preview")
        query = "SELECT lease_expires_at FROM jobs WHERE run_id = 'r1'"
        ((claimed,),) = [tuple(row.values()) for row in await rows(c, query)]
        c.clock.advance(timedelta(minutes=1))
        await asyncio.sleep(0.3)  # past the delay
        previews.gate.set()
        await within(jobs.held.wait(), "the Complete")
        ((renewed,),) = [tuple(row.values()) for row in await rows(c, query)]
        assert Call("ReportProgress", "r1/j0", None, "ok") in log, log
        assert counts()["ReportProgress"] - before["ReportProgress"] >= 1
        assert renewed == claimed + timedelta(minutes=1), (claimed, renewed)
        jobs.gate.set()
        await until(lambda: processor.completed == 1, "the completion")
        assert (processor.failed, processor.handed_back) == (0, 0)
    detail = await finished(c, "r1")
    assert detail.run.status == common_pb2.RUN_STATUS_COMPLETED, detail
    assert counts()["Heartbeat"] == before["Heartbeat"]  # the report renewed it, none due
