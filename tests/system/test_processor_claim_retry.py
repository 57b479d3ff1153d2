"""A processor whose Claim answer is lost asks again with the same request id
(docs/leases-and-fences.md), on the real coordinator, preview service, object storage and Triton.

The coordinator commits the lease and the answer never reaches the processor (it stopped
mid-reply, the connection reset, or it failed after the commit and answered INTERNAL):
here the processor's stub throws the real answer away and reports UNAVAILABLE, INTERNAL or
UNKNOWN, so the loss happens after the commit by construction. Only a clean answer or a
definite refusal is an answer: the next claim carries the same request id and is answered
the same lease; before, it leased nothing (the run's only job was leased to nobody) until
the lease lapsed, five minutes and one of the job's three attempts later. (An INTERNAL got
a fresh id, and so stranded the lease.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from services.processor.calls import JobCalls
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.processor_gates import rows, until
from tests.processor_world import finished, job_calls, one_camera_run, running_processor
from workshop.v1 import common_pb2, jobs_pb2

pytestmark = pytest.mark.triton


class LosesFirstLease:
    """The processor's real JobService stub, except that the answer to the first Claim that
    leased a job is dropped after the coordinator committed it: the processor hears `code`.
    Every Claim is logged as (request id, job id or "", answer dropped)."""

    def __init__(self, stub: JobCalls, code: grpc.StatusCode) -> None:
        self._stub = stub
        self._code = code
        self.claims: list[tuple[str, str, bool]] = []

    def __getattr__(self, method: str) -> Any:
        return getattr(self._stub, method)

    async def Claim(self, request: jobs_pb2.ClaimRequest, **kwargs: Any) -> Any:
        reply = await self._stub.Claim(request, **kwargs)
        job = reply.job.lease.job_id if reply.HasField("job") else ""
        dropped = bool(job) and not any(leased for _, leased, _ in self.claims)
        self.claims.append((request.request_id, job, dropped))
        if dropped:
            empty = grpc.aio.Metadata()
            raise grpc.aio.AioRpcError(self._code, empty, empty, details="answer lost (test)")
        return reply


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN]
)
async def test_a_lost_claim_answer_is_claimed_again_under_the_same_lease(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
    code: grpc.StatusCode,
) -> None:
    c = coordinator
    world = await one_camera_run(c, preview, triton_server, tmp_path)
    jobs = LosesFirstLease(job_calls(c.channel), code)
    # No long poll: the claim after the job answers at once instead of after 20 s.
    async with running_processor(
        c, preview, triton_server, world.runtime_id, jobs=jobs, claim_wait_seconds=0
    ) as worker:
        detail = await finished(c, "r1")
        await until(lambda: worker.completed == 1, "the processor to count it")
        await until(lambda: len(jobs.claims) >= 3, "a claim after the job")
        assert (worker.failed, worker.handed_back) == (0, 0)

    assert detail.run.status == common_pb2.RUN_STATUS_COMPLETED, detail
    (job,) = detail.jobs
    assert (job.state, job.generation) == (common_pb2.JOB_STATE_COMPLETED, 1)
    assert await rows(c, "SELECT lapses FROM jobs WHERE run_id = 'r1'") == [{"lapses": 0}]
    assert await rows(c, "SELECT generation FROM receipts WHERE run_id = 'r1'") == [
        {"generation": 1}
    ]
    lost, answered = jobs.claims[:2]
    assert lost[1:] == ("j0", True)
    assert answered == (lost[0], "j0", False)  # the same id, the same lease answered again
    ids = [request_id for request_id, _, _ in jobs.claims]
    assert all(ids), "every claim carries a request id"
    assert len(set(ids)) == len(ids) - 1  # after each answer a fresh one
