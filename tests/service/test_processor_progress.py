"""When the processor's lease loop (services/processor/leases.py) reports progress: only for
a job still running after `progress_after_seconds`, then at most once per as many seconds,
so a short job sends nothing but its Complete (which claims the next); a long job reports
and its lease is renewed by those reports, or by heartbeats when it reported nothing for a
heartbeat interval. Against an in-memory JobService that logs each call with its time; the
pipeline's part is played by a work function that reports every 10 %, as pipeline.py does.
On the real components: tests/system/test_processor_progress.py."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Any

from google.protobuf.duration_pb2 import Duration

from services.processor.calls import Caller
from services.processor.leases import PROGRESS_AFTER_SECONDS, LeaseLoop
from services.processor.pipeline import Progress
from tests.processor_gates import until
from workshop.v1 import common_pb2, jobs_pb2

CREDENTIALS = (("authorization", "Bearer test"),)


@dataclasses.dataclass(frozen=True)
class Logged:
    method: str
    job: str
    at: float  # loop time
    percent: int = 0
    then_claim: bool = False


class Jobs:
    """A JobService with `count` queued jobs; every call logged, every renewal granted."""

    def __init__(self, count: int) -> None:
        self.queued = [f"j{index}" for index in range(count)]
        self.log: list[Logged] = []

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _claim(self, request: jobs_pb2.ClaimRequest) -> jobs_pb2.ClaimResponse:
        taken = self.queued[: max(1, request.max_jobs)]
        del self.queued[: len(taken)]
        self.log.extend(Logged("Claim", job, self._now()) for job in taken)
        leased = [
            jobs_pb2.ClaimedJob(lease=common_pb2.LeaseRef(run_id="r1", job_id=job, generation=1))
            for job in taken
        ]
        if not leased:
            return jobs_pb2.ClaimResponse(retry_after=Duration(seconds=1))
        return jobs_pb2.ClaimResponse(job=leased[0], more_jobs=leased[1:])

    async def Claim(self, request: jobs_pb2.ClaimRequest, **_: Any) -> jobs_pb2.ClaimResponse:
        return self._claim(request)

    async def ReportProgress(
        self, request: jobs_pb2.ReportProgressRequest, **_: Any
    ) -> jobs_pb2.ReportProgressResponse:
        self.log.append(
            Logged("ReportProgress", request.lease.job_id, self._now(), request.percent)
        )
        return jobs_pb2.ReportProgressResponse()

    async def Heartbeat(
        self, request: jobs_pb2.HeartbeatRequest, **_: Any
    ) -> jobs_pb2.HeartbeatResponse:
        self.log.extend(Logged("Heartbeat", lease.job_id, self._now()) for lease in request.leases)
        return jobs_pb2.HeartbeatResponse(
            renewals=[jobs_pb2.LeaseRenewal(lease=lease, renewed=True) for lease in request.leases]
        )

    async def Complete(
        self, request: jobs_pb2.CompleteRequest, **_: Any
    ) -> jobs_pb2.CompleteResponse:
        asks = request.HasField("then_claim")
        self.log.append(Logged("Complete", request.lease.job_id, self._now(), then_claim=asks))
        claimed = self._claim(request.then_claim) if asks else jobs_pb2.ClaimResponse()
        return jobs_pb2.CompleteResponse(claimed=claimed if claimed.HasField("job") else None)

    async def Fail(self, request: Any, **_: Any) -> jobs_pb2.FailResponse:
        raise AssertionError(f"no job fails here: {request}")

    async def Release(self, request: Any, **_: Any) -> jobs_pb2.ReleaseResponse:
        raise AssertionError(f"no job is handed back here: {request}")

    def of(self, job: str) -> list[Logged]:
        return [entry for entry in self.log if entry.job == job]

    def methods(self, job: str) -> list[str]:
        return [entry.method for entry in self.of(job)]


def lasting(seconds: float) -> Any:
    """A job's work that takes `seconds` and reports every 10 %, as the pipeline does."""

    async def work(job: jobs_pb2.ClaimedJob, progress: Progress) -> tuple[jobs_pb2.JobResult, str]:
        for step in range(1, 11):
            await asyncio.sleep(seconds / 10)
            await progress(min(step * 10, 99))
        return jobs_pb2.JobResult(), "pyav"

    return work


async def run_jobs(jobs: Jobs, count: int, seconds: float, **fields: Any) -> LeaseLoop:
    """A lease loop that works on `jobs` (in_flight 1) until `count` jobs completed."""
    loop = LeaseLoop(
        jobs,
        Caller(CREDENTIALS, 1.0),
        "rt",
        "code",
        lasting(seconds),
        in_flight=1,
        claim_wait_seconds=0,
        **fields,
    )
    await loop.start()
    try:
        await until(lambda: loop.completed == count, f"{count} completions")
    finally:
        await loop.stop()
    assert (loop.failed, loop.handed_back) == (0, 0)
    return loop


async def test_a_short_job_sends_only_its_complete_which_claims_the_next() -> None:
    """Three jobs of 50 ms each under the default delay: one Claim, then per job only a
    Complete carrying then_claim (the next job comes in its answer): no progress report
    and no heartbeat, although the work reported every 10 %."""
    assert PROGRESS_AFTER_SECONDS >= 1.0  # short: well inside the default
    jobs = Jobs(3)
    await run_jobs(jobs, 3, 0.05)
    assert [entry.method for entry in jobs.log] == ["Claim", "Complete"] * 3
    assert all(e.then_claim for e in jobs.log if e.method == "Complete")
    assert [e.job for e in jobs.log] == ["j0", "j0", "j1", "j1", "j2", "j2"]


async def test_a_long_job_reports_after_the_delay_and_at_most_once_per_delay() -> None:
    """A job of 1.5 s with a delay of 0.35 s: nothing in its first 0.35 s, then a report at
    most every 0.35 s, each with the latest percent (growing); the reports renew its lease,
    so with a heartbeat interval of 1 s no heartbeat is due."""
    jobs = Jobs(1)
    await run_jobs(jobs, 1, 1.5, progress_after_seconds=0.35, heartbeat_seconds=1.0)
    claim, *reports, complete = jobs.of("j0")
    assert (claim.method, complete.method) == ("Claim", "Complete")
    assert {report.method for report in reports} == {"ReportProgress"}, jobs.log
    assert 2 <= len(reports) <= 4, reports  # 1.5 s / 0.35 s, at steps of 0.15 s
    times = [claim.at, *(report.at for report in reports)]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert min(gaps) >= 0.35 - 0.01, gaps
    percents = [report.percent for report in reports]
    assert percents == sorted(set(percents)), percents
    assert percents[0] >= 20, percents
    # its lease was never left unrenewed for a heartbeat interval (1 s)
    renewals = [*times, complete.at]
    assert max(b - a for a, b in itertools.pairwise(renewals)) < 1.0, renewals


async def test_a_job_without_reports_yet_is_heartbeaten_as_ever() -> None:
    """A job of 1.2 s under the default delay reports no progress, and a heartbeat every
    interval (0.2 s here) renews its lease, as for any job that reported nothing for one."""
    jobs = Jobs(1)
    await run_jobs(jobs, 1, 1.2, heartbeat_seconds=0.2)
    logged = jobs.of("j0")
    assert "ReportProgress" not in jobs.methods("j0")
    beats = [entry.at for entry in logged if entry.method == "Heartbeat"]
    assert len(beats) >= 3, logged
    renewals = [logged[0].at, *beats, logged[-1].at]
    # due after 0.2 s without a renewal, checked every 0.2 / 3 s
    assert max(b - a for a, b in itertools.pairwise(renewals)) < 0.45, renewals


async def test_a_delay_of_0_reports_every_step() -> None:
    """With a delay of 0 every report of the work goes out, as before the delay."""
    jobs = Jobs(1)
    await run_jobs(jobs, 1, 0.2, progress_after_seconds=0.0)
    assert jobs.methods("j0") == ["Claim", *["ReportProgress"] * 10, "Complete"]
    assert [e.percent for e in jobs.of("j0") if e.method == "ReportProgress"] == [
        *range(10, 100, 10),
        99,
    ]
