"""JobService: translates the contract to JobsApi calls and back."""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache

from google.protobuf.duration_pb2 import Duration

from services.coordinator import convert
from services.coordinator.leases.jobs import (
    HEARTBEAT_INTERVAL,
    PHASES,
    ClaimAsk,
    Claimed,
    JobsApi,
    job_id,
)
from services.coordinator.platform.errors import InvalidField
from services.coordinator.runs.events import RunEvents
from services.coordinator.servicers.common import Authenticator, Context
from services.coordinator.servicers.views import lease, leases, snapshot_recording
from workshop.v1 import common_pb2, jobs_pb2_grpc
from workshop.v1 import jobs_pb2 as pb

NO_JOB_RETRY_AFTER = timedelta(seconds=2)
MAX_CLAIM_WAIT_SECONDS = 60
# A waiting Claim answers this long before the call's deadline, so the answer arrives.
DEADLINE_MARGIN_SECONDS = 1.0


def duration(value: timedelta) -> Duration:
    out = Duration()
    out.FromTimedelta(value)
    return out


@lru_cache(maxsize=1024)
def _slots(first_us: int, count: int, interval_us: int, window_end_us: int) -> tuple[pb.Slot, ...]:
    """A job's slots, in integer microseconds: about 20x cheaper than a datetime and a
    Timestamp.FromDatetime per bound, and shared by every job on the same slot grid
    (protobuf copies them into each answer)."""
    slots = []
    for index in range(count):
        start = first_us + index * interval_us
        end = min(start + interval_us, window_end_us)
        slots.append(pb.Slot(index=index, start=convert.stamp(start), end=convert.stamp(end)))
    return tuple(slots)


def claimed_job(claimed: Claimed, interval: timedelta = HEARTBEAT_INTERVAL) -> pb.ClaimedJob:
    job, frozen = claimed.job, claimed.frozen
    slots = _slots(
        convert.micros(job.facts.first_slot_at),
        job.facts.slot_count,
        job.facts.interval_ms * 1_000,
        convert.micros(frozen.window_end),
    )
    return pb.ClaimedJob(
        lease=common_pb2.LeaseRef(
            run_id=job.run_id,
            job_id=job_id(job.job_index),
            generation=job.generation,
            token=str(job.lease_token),
        ),
        lease_expires_at=convert.ts(job.lease_expires_at),
        heartbeat_interval=duration(interval),
        input=pb.JobInput(
            job_id=job_id(job.job_index),
            job_index=job.job_index,
            recording=snapshot_recording(job.recording()),
            slots=slots,
            expires_at=convert.ts(job.expires_at),
        ),
        snapshot=frozen.snapshot,
        takes_recorded_boxes=True,  # every coordinator of release 0.1 on takes them
    )


def claim_response(
    claimed: list[Claimed], interval: timedelta = HEARTBEAT_INTERVAL
) -> pb.ClaimResponse:
    jobs = [claimed_job(one, interval) for one in claimed]
    return pb.ClaimResponse(job=jobs[0], more_jobs=jobs[1:])


class JobServicer(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, api: JobsApi, authenticate: Authenticator, events: RunEvents) -> None:
        self.api = api
        self.who = authenticate
        self.events = events

    # Every call here authenticates through the principal cache: job_claim checks the
    # claiming key and every fenced write the reporting key again, in SQL.

    async def Claim(self, request: pb.ClaimRequest, context: Context) -> pb.ClaimResponse:
        if request.wait_seconds > MAX_CLAIM_WAIT_SECONDS:
            raise InvalidField(f"wait_seconds must be 0..{MAX_CLAIM_WAIT_SECONDS}.")
        who = await self.who.cached(context)
        wait = float(request.wait_seconds)
        remaining = context.time_remaining()
        if remaining is not None:
            wait = min(wait, remaining - DEADLINE_MARGIN_SECONDS)
        claimed = await self.api.claim_waiting(
            who,
            ClaimAsk(request.runtime_id, request.code_sha256, request.request_id, request.max_jobs),
            wait,
            self.events,
        )
        if claimed:
            return claim_response(claimed, self.api.heartbeat_interval)
        # after a wait, the next Claim may come at once: it waits in turn
        retry_after = timedelta(0) if request.wait_seconds else NO_JOB_RETRY_AFTER
        return pb.ClaimResponse(retry_after=duration(retry_after))

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: Context
    ) -> pb.HeartbeatResponse:
        if not request.leases:  # one lease: a refusal is the call's error
            renewed = await self.api.heartbeat(await self.who.cached(context), lease(request.lease))
            return pb.HeartbeatResponse(lease_expires_at=convert.ts(renewed))
        if request.HasField("lease"):
            raise InvalidField("Send lease or leases, not both.")
        answers = await self.api.heartbeat_many(
            await self.who.cached(context), leases(request.leases)
        )
        return pb.HeartbeatResponse(
            renewals=[
                pb.LeaseRenewal(
                    lease=ref,
                    renewed=not reason,
                    lease_expires_at=convert.ts(expires) if expires is not None else None,
                    reason=reason,
                )
                for ref, (reason, expires) in zip(request.leases, answers, strict=True)
            ]
        )

    async def ReportProgress(
        self, request: pb.ReportProgressRequest, context: Context
    ) -> pb.ReportProgressResponse:
        phase = None
        if request.HasField("phase"):
            if request.phase == common_pb2.JOB_PHASE_UNSPECIFIED:
                raise InvalidField("phase, when given, must be a real phase.")
            phase = common_pb2.JobPhase.Name(request.phase).removeprefix("JOB_PHASE_").lower()
            assert phase in PHASES
        percent, persisted, renewed = await self.api.progress(
            await self.who.cached(context), lease(request.lease), request.percent, phase
        )
        return pb.ReportProgressResponse(
            percent=percent, persisted=persisted, lease_expires_at=convert.ts(renewed)
        )

    async def Complete(self, request: pb.CompleteRequest, context: Context) -> pb.CompleteResponse:
        who = await self.who.cached(context)
        then = None
        if request.HasField("then_claim"):
            ask = request.then_claim
            if ask.wait_seconds:
                raise InvalidField("then_claim.wait_seconds must be 0: Complete does not wait.")
            then = ClaimAsk(ask.runtime_id, ask.code_sha256, ask.request_id, ask.max_jobs)
        receipt, already, claimed = await self.api.complete_then_claim(
            who,
            lease(request.lease),
            code_sha256=request.code_sha256,
            result=request.result,
            result_sha256=request.result_sha256,
            decoder=request.decoder,
            then=then,
        )
        return pb.CompleteResponse(
            receipt=pb.Receipt(
                run_id=receipt.run_id,
                job_id=job_id(receipt.job_index),
                generation=receipt.generation,
                result_sha256=receipt.result_sha256,
                committed_at=convert.ts(receipt.committed_at),
                items_saved=receipt.items_saved,
            ),
            already_committed=already,
            claimed=None if claimed is None else self._claimed(claimed),
        )

    def _claimed(self, claimed: list[Claimed]) -> pb.ClaimResponse:
        """Complete's next claim: its jobs, or when none was queued when to ask again."""
        if not claimed:
            return pb.ClaimResponse(retry_after=duration(NO_JOB_RETRY_AFTER))
        return claim_response(claimed, self.api.heartbeat_interval)

    async def Fail(self, request: pb.FailRequest, context: Context) -> pb.FailResponse:
        who = await self.who.cached(context)  # the credential before the request's fields
        if request.reason != common_pb2.FAILURE_REASON_PROCESSOR_FAILED:
            raise InvalidField("reason must be PROCESSOR_FAILED; lapses are the coordinator's.")
        await self.api.fail(who, lease(request.lease), request.message)
        return pb.FailResponse(state=common_pb2.JOB_STATE_FAILED)

    async def Release(self, request: pb.ReleaseRequest, context: Context) -> pb.ReleaseResponse:
        await self.api.release(await self.who.cached(context), lease(request.lease))
        return pb.ReleaseResponse(state=common_pb2.JOB_STATE_QUEUED)
