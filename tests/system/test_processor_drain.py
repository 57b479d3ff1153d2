"""A processor that is stopped finishes or hands back its jobs within its grace (
docs/operations.md#stopping-and-restarting): `python -m services.processor` as a process,
SIGTERMed while a job is held mid-way (the preview service holds the records of its
previews, so "mid-job" is a fact, not a race), on the real coordinator, preview service,
SeaweedFS and Triton.

- The job finishes during the drain: readiness turns NOT_SERVING at once, its lease is
  still renewed, it commits under its first lease, the job queued behind it is not
  claimed, and the process exits 0.
- The job outlasts the grace, or a second SIGTERM ends the drain: it is handed back
  (queued again, no attempt spent) and the process exits 0.
- A Claim the drain gives up, though the coordinator leased a job for it, is asked again
  with its request id and the lease released (on either transport; on the session, also
  when the Claim was still waiting on its stream, which then ends: the Claim asked again
  goes on a new one).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.coordinator.leases.jobs import parse_job_id
from services.processor.calls import TRANSPORTS, SessionJobs, Transport
from testbed.coordinator_world import run_request, save_workflow
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness, running_preview
from testbed.harness.processes import ServiceProcess
from testbed.harness.s3 import S3Bucket
from testbed.harness.triton import TritonServer
from tests.processor_gates import HeldRecords, rows, until, within
from tests.processor_world import (
    DEVICE,
    build_world,
    job_calls,
    one_camera_run,
    run_key,
    running_processor,
    yard_spec,
)
from workshop.v1 import common_pb2, jobs_pb2_grpc

pytestmark = [pytest.mark.triton, pytest.mark.timeout(120)]
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def processor_env(
    c: CoordinatorHarness, preview: PreviewHarness, triton: TritonServer, key: str, **more: str
) -> dict[str, str]:
    server = preview.bucket.server
    values = {
        "PORT": "0",
        "DRAIN_SECONDS": "0",
        "GRACE_SECONDS": "1",
        "HEARTBEAT_SECONDS": "0.3",
        "DEVICE_ID": DEVICE,
        "KEY": key,
        "COORDINATOR_TARGET": f"127.0.0.1:{c.port}",
        "PREVIEW_TARGET": f"127.0.0.1:{preview.port}",
        "TRITON_TARGET": triton.grpc_url,
        "MODEL_REPOSITORY": str(triton.model_repository),
        "S3_ENDPOINT": server.endpoint,
        "S3_ACCESS_KEY": server.access_key,
        "S3_SECRET_KEY": server.secret_key,
        "RECORDINGS_BUCKET": preview.bucket.name,
        **more,
    }
    return {f"PROCESSOR_{name}": value for name, value in values.items()}


def first_lease_after_slot_0(previews: list[Any]) -> bool:
    """A batch of records that names a slot after 0 under a job's first lease: its job is
    mid-way while the batch is held."""
    return any(p.slot_index >= 1 and p.lease.generation == 1 for p in previews)


async def health(port: int) -> int:
    """The processor's readiness, as Kubernetes' gRPC probe asks it."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        return int(reply.status)


async def _is(check: Any, status: int) -> bool:
    return bool(await check == status)


async def jobs_of(c: CoordinatorHarness, run_id: str) -> dict[int, dict[str, Any]]:
    found = await rows(
        c,
        "SELECT job_index, state, generation, lapses, lease_expires_at FROM jobs WHERE run_id = $1",
        run_id,
    )
    return {row["job_index"]: row for row in found}


def logged_at(log: str, phrase: str) -> datetime:
    """When the process logged its first line with `phrase`, by its own clock (the
    services' log lines start with `%(asctime)s`: 2026-12-04 19:10:06,123)."""
    line = next(line for line in log.splitlines() if phrase in line)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


async def exit_code(process: ServiceProcess, within_seconds: float) -> int:
    code: int = await asyncio.to_thread(process.process.wait, within_seconds)
    return code


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_sigterm_lets_the_running_job_finish_and_claims_nothing_more(
    coordinator: CoordinatorHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    transport: Transport,
) -> None:
    """Run r1 has two jobs; the processor (one job at a time) is SIGTERMed while the first
    is held. It reports NOT_SERVING at once and goes on renewing the lease; once the hold
    ends the job commits under generation 1 (receipt, no lapse), the second job is never
    claimed (Complete asks for no next job), and the process exits 0. On either
    PROCESSOR_JOB_TRANSPORT."""
    c = coordinator
    async with running_preview(c, s3_bucket) as preview:
        held = HeldRecords(monkeypatch, first_lease_after_slot_0, preview)
        world = await build_world(c, preview, triton_server, tmp_path, ["cam-a", "cam-b"])
        await save_workflow(c, "yard", yard_spec(world.model, ["cam-a", "cam-b"]))
        await c.workshop.CreateRun(
            run_request("r1", "yard", world.runtime_id, mode=common_pb2.RUN_MODE_FULL),
            metadata=c.admin,
        )
        env = processor_env(
            c,
            preview,
            triton_server,
            await run_key(c),
            IN_FLIGHT="1",
            JOB_GRACE_SECONDS="30",
            JOB_TRANSPORT=transport,
        )
        processor = ServiceProcess("services.processor", env, tmp_path / "processor.log")
        try:
            serving = await asyncio.to_thread(processor.wait_event, "serving")
            port = int(serving["port"])
            assert await health(port) == health_pb2.HealthCheckResponse.SERVING
            await within(held.held.wait(), f"a held record\n{processor.log_tail()}")
            ((_, running_job),) = held.jobs
            running = parse_job_id(running_job)
            (waiting,) = {0, 1} - {running}
            before = await jobs_of(c, "r1")
            assert before[running]["state"] == "leased"
            assert before[waiting]["state"] == "queued"

            processor.terminate()
            await until(lambda: _is(health(port), NOT_SERVING), "NOT_SERVING")
            # health turns at the drain's start, not at its end: the job is still held
            assert "drained:" not in processor.log_tail(200)
            # the lease is still renewed while the job drains: the coordinator's clock
            # moves, and the next heartbeat sets a later lapse time
            c.clock.advance(timedelta(seconds=30))

            async def renewed() -> bool:
                now = (await jobs_of(c, "r1"))[running]["lease_expires_at"]
                return bool(now > before[running]["lease_expires_at"])

            await until(renewed, f"a heartbeat during the drain\n{processor.log_tail()}")
            assert processor.process.poll() is None  # still draining
            held.gate.set()
            assert await exit_code(processor, 30) == 0, processor.log_tail()
        finally:
            held.gate.set()
            await asyncio.to_thread(processor.stop)

        after = await jobs_of(c, "r1")
        assert (after[running]["state"], after[running]["generation"]) == ("completed", 1)
        assert after[running]["lapses"] == 0
        assert (after[waiting]["state"], after[waiting]["generation"]) == ("queued", 0)
        receipts = await rows(c, "SELECT job_index, generation FROM receipts WHERE run_id = 'r1'")
        assert receipts == [{"job_index": running, "generation": 1}]
        assert "draining: 1 job(s) in flight" in processor.log_tail(200)
        assert "drained: 1 job(s) ended, 0 still running" in processor.log_tail(200)


@pytest.mark.parametrize("how", ["grace ends", "second SIGTERM"])
async def test_a_job_still_running_when_the_drain_ends_is_handed_back(
    coordinator: CoordinatorHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """The held job outlasts the drain: a grace of 1 s ends, or a second SIGTERM ends a
    grace of 60 s. The job is released (queued again under generation 1, no lapse: no
    attempt spent) and the process exits 0 at once after."""
    c = coordinator
    async with running_preview(c, s3_bucket) as preview:
        held = HeldRecords(monkeypatch, first_lease_after_slot_0, preview)
        await one_camera_run(c, preview, triton_server, tmp_path)
        grace = "1" if how == "grace ends" else "60"
        env = processor_env(c, preview, triton_server, await run_key(c), JOB_GRACE_SECONDS=grace)
        processor = ServiceProcess("services.processor", env, tmp_path / "processor.log")
        try:
            port = int((await asyncio.to_thread(processor.wait_event, "serving"))["port"])
            await within(held.held.wait(), f"a held record\n{processor.log_tail()}")
            assert (await jobs_of(c, "r1"))[0]["state"] == "leased"
            processor.terminate()
            if how == "second SIGTERM":
                await until(lambda: _is(health(port), NOT_SERVING), "NOT_SERVING")
                processor.terminate()
            assert await exit_code(processor, 30) == 0, processor.log_tail()
        finally:
            held.gate.set()
            await asyncio.to_thread(processor.stop)
        (job,) = (await jobs_of(c, "r1")).values()
        assert (job["state"], job["generation"], job["lapses"]) == ("queued", 1, 0)
        log = processor.log_tail(200)
        assert "drained: 0 job(s) ended, 1 still running" in log
        assert "handed back: stopping" in log
        # The drain's length on the processor's own clock (its log's times), not this
        # test's: the whole grace of 1 s, or cut short well before the grace of 60 s.
        draining, drained = logged_at(log, "draining:"), logged_at(log, "drained:")
        assert draining <= drained <= logged_at(log, "handed back: stopping")
        if how == "grace ends":
            assert "(the grace of 1 s ended)" in log
            assert drained - draining >= timedelta(seconds=1), (draining, drained)
        else:
            assert "(cut short by a second stop signal)" in log
            assert drained - draining < timedelta(seconds=60), (draining, drained)


class LostClaimAnswer:
    """The processor's real JobService stub, except that the first Claim that leases a job
    never answers (as if the coordinator's answer were lost while the processor stops)."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub
        self.lost = asyncio.Event()

    def __getattr__(self, method: str) -> Any:
        return getattr(self._stub, method)

    async def Claim(self, request: Any, **kwargs: Any) -> Any:
        reply = await self._stub.Claim(request, **kwargs)
        if reply.HasField("job") and not self.lost.is_set():
            self.lost.set()
            await asyncio.Event().wait()  # until the drain cancels it
        return reply


class _WithheldAnswers:
    """A Session call whose answers are read from the real one, except a Claim's answer
    that leases a job, which never reaches the processor (lost on the way)."""

    def __init__(self, call: Any, withheld: asyncio.Event) -> None:
        self._call = call
        self._withheld = withheld

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    async def __aiter__(self) -> Any:
        async for response in self._call:
            leased = response.WhichOneof("answer") == "claim" and response.claim.HasField("job")
            if leased and not self._withheld.is_set():
                self._withheld.set()
                continue
            yield response


class LostSessionClaimAnswer:
    """The coordinator's JobService stub, the first Claim answer on the Session that
    leases a job withheld (as if lost while the processor stops)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = jobs_pb2_grpc.JobServiceStub(channel)
        self.lost = asyncio.Event()

    def __getattr__(self, method: str) -> Any:
        return getattr(self._stub, method)

    def Session(self, requests: Any, **kwargs: Any) -> Any:
        return _WithheldAnswers(self._stub.Session(requests, **kwargs), self.lost)


def _losing_claim_answer(
    channel: grpc.aio.Channel, lost: str
) -> tuple[SessionJobs | LostClaimAnswer, asyncio.Event]:
    """The processor's JobService calls, the first Claim answer that leases a job lost
    where `lost` says; and the event set when it was."""
    if lost == "on the stream":
        stub = LostSessionClaimAnswer(channel)
        real_calls: Any = stub  # the stub's own methods, its Session's answers filtered
        return SessionJobs(real_calls), stub.lost
    jobs = LostClaimAnswer(job_calls(channel, cast(Transport, lost)))
    return jobs, jobs.lost


@pytest.mark.parametrize("lost", [*TRANSPORTS, "on the stream"])
async def test_a_claim_abandoned_by_the_drain_leaves_no_lease_behind(
    coordinator: CoordinatorHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
    lost: str,
) -> None:
    """The drain gives up a Claim whose answer has not come, though the coordinator leased
    a job for it. The processor asks once more with the Claim's request id, gets that
    lease and releases it: the job is queued again at once (no lapse), not left leased to
    nobody until its lease lapses. The answer is lost after the transport read it (unary,
    session), or on the session stream while the Claim still waits there: the drain then
    ends that stream, and the Claim asked again goes on a new one."""
    c = coordinator
    async with running_preview(c, s3_bucket) as preview:
        world = await one_camera_run(c, preview, triton_server, tmp_path)
        jobs, leased = _losing_claim_answer(c.channel, lost)
        async with running_processor(
            c, preview, triton_server, world.runtime_id, jobs=jobs, claim_wait_seconds=5
        ) as processor:
            await within(leased.wait(), "a Claim that leased the job")
            (job,) = (await jobs_of(c, "r1")).values()
            assert (job["state"], job["generation"]) == ("leased", 1)
            await within(processor.drain(), "the drain")
            assert not processor.running_jobs
            (job,) = (await jobs_of(c, "r1")).values()
            assert (job["state"], job["generation"], job["lapses"]) == ("queued", 1, 0)
        if isinstance(jobs, SessionJobs):
            assert jobs.streams_opened == 2
            await jobs.close()
