"""The lease loop (docs/runs-and-jobs.md): claim, renew, complete or hand back, drain.

Owns the processor's leases and nothing about frames: it claims jobs, runs each under
its lease with the work function it was given (pipeline.py), and ends each one:
Complete, Fail, or Release.

Up to `in_flight` jobs (three recordings) run at once, so downloads and decoding
overlap. A Claim asks for as many jobs as there are free places, and a Complete claims
the job that takes its place, so a busy processor makes one call per job
(docs/runs-and-jobs.md#batched-leases).

Progress is reported only for a job still running after `progress_after_seconds`
(PROCESSOR_PROGRESS_AFTER_SECONDS, 5 s by default): the pipeline's reports before then
are dropped, and after it at most one goes out per that many seconds, with the percent
of the moment. A short job (a photo, most test runs) thus sends nothing but its
Complete: one message each way, the next job coming in its answer. A progress report
renews its job's lease; one heartbeat task renews, in one batched Heartbeat, the leases
of the jobs that reported nothing for a heartbeat interval (jobs yet to report
included), exactly as without the delay (docs/leases-and-fences.md#batched-leases).

When a heartbeat, preview or upload says a lease no longer holds (cancelled, lapsed,
fenced), that job stops at once and the loop claims the next (a fence that can never
hold again, such as a replaced recording, has ended the job in the coordinator
already). Only the job's own problems (`JobFailed`) and this processor's own (a request
the services call invalid, a bug) fail the job with processor_failed and the decoder's
or model's own message.

A service that gives no answer is not the job's fault (calls.py): when an outage
outlasts `retry_seconds`, or the recording or Triton cannot be reached, or a service
refuses for reasons of its own (a revoked key, an old version), the job is handed back
with Release (no attempt spent; also when even a Fail got no answer) and the loop waits
before it claims again, longer after each such hand-back in a row.

A stop drains (docs/operations.md#stopping-and-restarting): `drain()` stops claiming
(a Claim waiting at the coordinator is abandoned, and asked once more with its
request id so that a lease it took meanwhile is handed back, not stranded), and lets
the jobs in flight run on, their leases renewed, for up to `job_grace_seconds`; a
finished job completes as usual (its Complete claims no next job). `stop()` then hands
back with Release whatever is still running, no attempt spent; `hurry()` (a second
signal) ends the drain at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable

import grpc

from services.processor import metrics
from services.processor.calls import (
    INVALID,
    REFUSALS,
    Caller,
    JobCalls,
    JobFailed,
    LeaseLost,
    Refused,
    ServiceUnavailable,
)
from services.processor.pipeline import Progress
from workshop.kit.hashing import sha256_hex
from workshop.v1 import common_pb2, jobs_pb2

log = logging.getLogger(__name__)

# What a claimed job is turned into: its result and the decoder's name (pipeline.py).
Work = Callable[[jobs_pb2.ClaimedJob, Progress], Awaitable[tuple[jobs_pb2.JobResult, str]]]

PROGRESS_AFTER_SECONDS = 5.0  # a job reports progress once it has run this long, then as often
CLAIM_PAUSE_MAX_SECONDS = 60.0  # the longest wait before claiming after hand-backs in a row
CLAIM_DEADLINE_MARGIN_SECONDS = 10.0  # a waiting Claim's deadline: its wait plus this
# On a stop: the deadline of each hand-back (Release, and the Claim that asks again for the
# leases of an abandoned one); they run at once, so a stop hands back within about this.
RELEASE_SECONDS = 5.0


@dataclasses.dataclass
class Held:
    """A lease this processor works under, and when it was last renewed (loop time)."""

    lease: common_pb2.LeaseRef
    work: asyncio.Task[None]
    interval: float  # seconds without a renewal before it is heartbeaten
    renewed_at: float


class Renewals:
    """The leases held by jobs at work, and their renewal: every third of the shortest
    interval, one batched Heartbeat renews those not renewed for an interval (a progress
    report renews its own); a job whose lease is lost stops, the others go on."""

    def __init__(self, jobs: JobCalls, call: Caller, heartbeat_seconds: float) -> None:
        self._jobs = jobs
        self._call = call
        self._heartbeat_seconds = heartbeat_seconds  # 0: the interval Claim hands out
        self._held: dict[str, Held] = {}  # by run/job/generation

    def hold(self, job: jobs_pb2.ClaimedJob, work: asyncio.Task[None]) -> Held:
        """Renews the job's lease while `work` runs under it, until let_go()."""
        interval = (
            self._heartbeat_seconds or job.heartbeat_interval.ToTimedelta().total_seconds() or 45.0
        )
        held = Held(job.lease, work, interval, asyncio.get_running_loop().time())
        self._held[_lease_key(job.lease)] = held
        return held

    def let_go(self, lease: common_pb2.LeaseRef) -> None:
        """No more renewals: the job ended, or its Complete's own answer decides now."""
        self._held.pop(_lease_key(lease), None)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            tick = min((held.interval for held in self._held.values()), default=1.0) / 3
            await asyncio.sleep(tick)
            now = loop.time()
            due = [held for held in self._held.values() if now - held.renewed_at >= held.interval]
            if not due:
                continue
            try:
                reply = await self._call(
                    self._jobs.Heartbeat,
                    jobs_pb2.HeartbeatRequest(leases=[held.lease for held in due]),
                )
            except (Refused, ServiceUnavailable) as error:  # try again next beat
                log.warning("heartbeat failed: %s", error)
                continue
            for held, renewal in zip(due, reply.renewals, strict=True):
                if renewal.renewed:
                    held.renewed_at = now
                    continue
                log.info(
                    "lease of %s/%s lost: %s", held.lease.run_id, held.lease.job_id, renewal.reason
                )
                if self._held.get(_lease_key(held.lease)) is held:
                    # still working under it (not in its Complete, whose answer decides)
                    held.work.cancel()


@dataclasses.dataclass
class LeaseLoop:
    """Claims jobs for one runtime and runs each under its lease (see the module)."""

    jobs: JobCalls  # unary or on the session stream (calls.py)
    call: Caller
    runtime_id: str
    code_sha256: str
    work: Work
    in_flight: int = 3
    idle_seconds: float = 2.0
    claim_wait_seconds: int = 20  # a Claim waits this long at the coordinator for a job
    heartbeat_seconds: float = 0.0  # 0: the interval Claim hands out (45 s); tests shorten it
    # Progress is reported once a job has run this long, then at most this often (0: every
    # report the pipeline makes, as before the delay).
    progress_after_seconds: float = PROGRESS_AFTER_SECONDS
    # On a stop, how long jobs in flight may run on before what is left is handed back.
    job_grace_seconds: float = 30.0
    _claiming: asyncio.Task[None] | None = None
    _beating: asyncio.Task[None] | None = None
    _draining: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    _hurried: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    _running: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)
    _claim_pause: float = 0.0  # seconds the loop waits before its next claim (after hand-backs)
    _renewals: Renewals = dataclasses.field(init=False)
    completed: int = 0
    failed: int = 0
    handed_back: int = 0
    drained: int = 0  # jobs in flight when a drain began that ended during it
    released_at_stop: int = 0  # jobs still running at a stop, handed back

    def __post_init__(self) -> None:
        self._renewals = Renewals(self.jobs, self.call, self.heartbeat_seconds)

    @property
    def running_jobs(self) -> set[asyncio.Task[None]]:
        return self._running

    @property
    def _stopping(self) -> asyncio.Event:
        return self.call.stopping

    async def start(self) -> None:
        metrics.JOBS_IN_FLIGHT.add(self)
        if self._beating is None:
            self._stopping.clear()
            self._draining.clear()
            self._hurried.clear()
            slots = asyncio.Semaphore(self.in_flight)
            self._beating = asyncio.create_task(self._renewals.run(), name="heartbeats")
            self._claiming = asyncio.create_task(self._claims(slots), name="claim-loop")

    async def drain(self) -> None:
        """Stops claiming and lets the jobs in flight run on (heartbeats go on) until they
        end, `job_grace_seconds` pass, or hurry(); stop() hands back what is left."""
        if self._beating is None or self._draining.is_set():
            return
        self._draining.set()
        await self._stop_claiming()
        began = len(self._running)
        log.info(
            "draining: %d job(s) in flight may finish within %g s",
            began,
            self.job_grace_seconds,
        )
        if self._running and not self._hurried.is_set():
            waits = [
                asyncio.create_task(self._all_ended()),
                asyncio.create_task(self._hurried.wait()),
            ]
            await asyncio.wait(
                waits, timeout=self.job_grace_seconds, return_when=asyncio.FIRST_COMPLETED
            )
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        ended = max(0, began - len(self._running))
        self.drained += ended
        metrics.STOP_JOBS.labels("finished").inc(ended)
        log.info(
            "drained: %d job(s) ended, %d still running (%s)",
            ended,
            len(self._running),
            self._drain_end(),
        )

    def _drain_end(self) -> str:
        """Why the drain ended, for its log line (which tests and operators read)."""
        if not self._running:
            return "none in flight"
        if self._hurried.is_set():
            return "cut short by a second stop signal"
        return f"the grace of {self.job_grace_seconds:g} s ended"

    def hurry(self) -> None:
        """Ends a drain now (a second stop signal): stop() hands back what is running."""
        self._hurried.set()

    async def _all_ended(self) -> None:
        while self._running:
            await asyncio.wait(set(self._running))

    async def stop(self) -> None:
        """Stops claiming; jobs still in flight (all of them without a drain first) are
        released (not lapsed) so others take them."""
        if self._beating is None:
            return
        self._stopping.set()
        await self._stop_claiming()
        left = list(self._running)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        self.released_at_stop += len(left)
        metrics.STOP_JOBS.labels("handed_back").inc(len(left))
        beating, self._beating = self._beating, None
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating

    async def _stop_claiming(self) -> None:
        claiming, self._claiming = self._claiming, None
        if claiming is not None:
            claiming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await claiming

    def _claim_request(
        self, request_id: str, max_jobs: int, wait: int = 0
    ) -> jobs_pb2.ClaimRequest:
        return jobs_pb2.ClaimRequest(
            runtime_id=self.runtime_id,
            code_sha256=self.code_sha256,
            request_id=request_id,
            wait_seconds=wait,
            max_jobs=max_jobs,
        )

    async def _claims(self, slots: asyncio.Semaphore) -> None:
        # Each claim carries a fresh request id; a claim that got no answer is asked again
        # with the same one, so the leases the lost call took are answered, not stranded.
        request_id = uuid.uuid4().hex
        while not self._stopping.is_set():
            await slots.acquire()
            free = 1  # one place is ours; take every other free one too, for one batch
            while free < self.in_flight and not slots.locked():
                await slots.acquire()
                free += 1
            if self._claim_pause:
                await self._idle(self._claim_pause)
                if self._stopping.is_set():
                    _release(slots, free)
                    return
            try:
                reply = await self.jobs.Claim(
                    self._claim_request(request_id, free, self.claim_wait_seconds),
                    metadata=self.call.credentials,
                    timeout=self.claim_wait_seconds + CLAIM_DEADLINE_MARGIN_SECONDS,
                )
            except asyncio.CancelledError:  # a stop: no more claims
                _release(slots, free)
                await self._abandon_claim(request_id, free)
                raise
            except grpc.aio.AioRpcError as error:
                _release(slots, free)
                log.warning("claim failed: %s %s", error.code().name, error.details())
                if error.code() in REFUSALS:
                    request_id = uuid.uuid4().hex  # a refusal is an answer: it leased nothing
                await self._idle(self.idle_seconds)
                continue
            request_id = uuid.uuid4().hex
            claimed = _jobs_of(reply)
            _release(slots, free - len(claimed))  # a batch may hold fewer jobs than asked
            for job in claimed:
                self._start(job, slots)
            if not claimed:
                pause = reply.retry_after.ToTimedelta().total_seconds()
                if pause or not self.claim_wait_seconds:  # after a wait: ask again at once
                    await self._idle(pause or 1.0)

    async def _abandon_claim(self, request_id: str, free: int) -> None:
        """A Claim given up mid-call (a stop) may have leased jobs whose answer never came:
        the same request id, asked again without a wait, answers those leases (or, rarely,
        leases jobs queued since), and they are handed back at once."""
        try:
            reply = await self.jobs.Claim(
                self._claim_request(request_id, free),
                metadata=self.call.credentials,
                timeout=RELEASE_SECONDS,
            )
        except grpc.aio.AioRpcError as error:
            log.warning(
                "an abandoned claim could not be asked again (a lease it took lapses): %s %s",
                error.code().name,
                error.details(),
            )
            return
        await self._release_unstarted(_jobs_of(reply))

    async def _release_now(self, lease: common_pb2.LeaseRef) -> None:
        """Release asked once with a short deadline (a stop): a lease not answered lapses."""
        with contextlib.suppress(LeaseLost, ServiceUnavailable, Refused):
            await self.call(
                self.jobs.Release,
                jobs_pb2.ReleaseRequest(lease=lease),
                retry=False,
                deadline=RELEASE_SECONDS,
            )

    async def _release_unstarted(self, claimed: list[jobs_pb2.ClaimedJob]) -> None:
        """Hands back jobs claimed while stopping, never started (no attempt spent)."""
        await asyncio.gather(*(self._release_now(job.lease) for job in claimed))

    def _start(self, job: jobs_pb2.ClaimedJob, slots: asyncio.Semaphore) -> None:
        """Runs a claimed job in a place of `slots` already taken for it."""
        task = asyncio.create_task(self._run(job, slots), name=job.lease.job_id)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _idle(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _run(self, job: jobs_pb2.ClaimedJob, slots: asyncio.Semaphore) -> None:
        """Works on the job in its place of `slots`: frees the place when it ends, or hands
        it to the job its Complete claimed."""
        lease = job.lease
        work = asyncio.current_task()
        assert work is not None
        loop = asyncio.get_running_loop()
        held = self._renewals.hold(job, work)
        after = self.progress_after_seconds
        last_report = loop.time()  # the job's start, until its first report

        async def progress(percent: int) -> None:
            # Only a job still running after the delay reports, at most once per delay: a
            # short job sends nothing but its Complete. Its lease is renewed as ever: by a
            # report, or by the heartbeat due for a job that reported nothing for an interval.
            nonlocal last_report
            now = loop.time()
            if now - last_report < after:
                return
            last_report = now
            await self.call(
                self.jobs.ReportProgress,
                jobs_pb2.ReportProgressRequest(lease=lease, percent=percent),
            )
            held.renewed_at = loop.time()  # the report renewed its lease: no heartbeat due

        following: list[jobs_pb2.ClaimedJob] = []
        try:
            result, decoder = await self.work(job, progress)
            # Complete's own answer decides now: a heartbeat racing it would find the job
            # finished and stop it between the commit and its answer
            self._renewals.let_go(lease)
            complete = jobs_pb2.CompleteRequest(
                lease=lease,
                code_sha256=self.code_sha256,
                result=result,
                result_sha256=_digest(result),
                decoder=decoder,
            )
            if not self._draining.is_set() and not self._stopping.is_set():
                # the next job, in this one's place; a repeated Complete carries the
                # same request id, so it answers the lease the first one took
                complete.then_claim.CopyFrom(self._claim_request(uuid.uuid4().hex, 1))
            reply = await self.call(self.jobs.Complete, complete)
            self.completed += 1
            self._claim_pause = 0.0
            following = _jobs_of(reply.claimed)
            if self._draining.is_set() or self._stopping.is_set():
                # a stop began meanwhile: hand the next job(s) back
                await self._release_unstarted(following)
                following = []
        except LeaseLost as lost:
            log.info("job %s/%s stopped: %s", lease.run_id, lease.job_id, lost)
        except JobFailed as error:
            await self._fail(lease, str(error))
        except ServiceUnavailable as error:
            await self._hand_back(lease, str(error))
        except Refused as error:
            if error.code in INVALID:  # what this processor made of the job is wrong
                await self._fail(lease, str(error))
            else:  # the service's own reasons (a revoked key, an old version): not the job's
                await self._hand_back(lease, str(error))
        except Exception as error:  # a bug must not strand the lease until it lapses
            log.exception("job %s/%s failed unexpectedly", lease.run_id, lease.job_id)
            await self._fail(lease, f"processor error: {error!r}")
        except asyncio.CancelledError:
            if self._stopping.is_set():  # graceful shutdown: hand the job back
                log.info("job %s/%s handed back: stopping", lease.run_id, lease.job_id)
                await self._release_now(lease)
            raise
        finally:
            self._renewals.let_go(lease)
            _release(slots, 1 - len(following))
            for claimed in following:
                self._start(claimed, slots)

    async def _fail(self, lease: common_pb2.LeaseRef, message: str) -> None:
        """Fails the job with processor_failed. A Fail that gets no answer is not left to
        the lease's lapse (five minutes, one attempt): the job is handed back instead, and
        whoever claims it next meets its problem again. A refused one ends the matter."""
        self.failed += 1
        try:
            await self.call(
                self.jobs.Fail,
                jobs_pb2.FailRequest(
                    lease=lease,
                    reason=common_pb2.FAILURE_REASON_PROCESSOR_FAILED,
                    message=message,
                ),
            )
        except ServiceUnavailable as error:
            await self._hand_back(lease, f"{error} (failing it: {message})")
        except (LeaseLost, Refused) as error:
            log.warning("job %s/%s: %s", lease.run_id, lease.job_id, error)

    async def _hand_back(self, lease: common_pb2.LeaseRef, why: str) -> None:
        """Releases the job (no attempt spent: the outage is not its fault) and makes the
        loop wait before it claims again. Release is asked again like any call about the
        job; when even that gets no answer, the lease lapses and maintenance takes the job
        back (one attempt spent)."""
        self.handed_back += 1
        metrics.HAND_BACKS.inc()
        self._claim_pause = min(
            CLAIM_PAUSE_MAX_SECONDS, max(self.idle_seconds, 2 * self._claim_pause)
        )
        log.warning(
            "job %s/%s handed back, next claim in %.1f s: %s",
            lease.run_id,
            lease.job_id,
            self._claim_pause,
            why,
        )
        with contextlib.suppress(LeaseLost, ServiceUnavailable, Refused):
            await self.call(self.jobs.Release, jobs_pb2.ReleaseRequest(lease=lease))


def _release(slots: asyncio.Semaphore, places: int) -> None:
    for _ in range(places):
        slots.release()


def _jobs_of(reply: jobs_pb2.ClaimResponse) -> list[jobs_pb2.ClaimedJob]:
    """The jobs a Claim answered, in claim order."""
    return [reply.job, *reply.more_jobs] if reply.HasField("job") else []


def _lease_key(lease: common_pb2.LeaseRef) -> str:
    return f"{lease.run_id}/{lease.job_id}/{lease.generation}"


def _digest(result: jobs_pb2.JobResult) -> str:
    """SHA-256 of the deterministic serialization, as the coordinator recomputes it."""
    return sha256_hex(result.SerializeToString(deterministic=True))
