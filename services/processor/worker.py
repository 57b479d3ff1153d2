"""The claim loop (docs/runs-and-jobs.md): claim, decode, infer, route, publish, commit.

Up to `in_flight` jobs (three recordings) run at once, so downloads and decoding
overlap; model passes take turns behind one lock. A Claim asks for as many jobs as
there are free places, and a Complete claims the job that takes its place, so a busy
processor makes one call per job (docs/runs-and-jobs.md#batched-leases). A progress
report renews its job's lease; one heartbeat task renews, in one batched Heartbeat,
the leases of the jobs that reported nothing for a heartbeat interval. When a
heartbeat, preview or upload says a lease no longer holds (cancelled, lapsed,
fenced), that job stops at once and the loop claims the next (a fence that can
never hold again, such as a replaced recording, has ended the job in the
coordinator already). Only the job's own problems (a missing
or altered recording, a file the decoder cannot read, the model) and this
processor's own (a request the services call invalid, a bug) fail the job with
processor_failed and the decoder's or model's own message.

A service that gives no answer (the coordinator or preview service restarting,
its database or object storage down, Triton down) is not the job's fault. Every
answer but a success or a definite refusal counts as none: UNAVAILABLE, a deadline,
and also INTERNAL or UNKNOWN, the words of a service that failed rather than refused.
Each RPC about a job is asked again with backoff for up to `retry_seconds`, which is
safe because every write is idempotent under its lease (the same preview slot, staged
upload, progress or result again is accepted; a Claim asked again carries the same
request id, so it answers the lease the lost call took). When the outage outlasts
that, or the recording or Triton cannot be reached, or a service refuses for reasons
of its own (a revoked key, an old version), the job is handed back with Release (no
attempt spent; also when even a Fail got no answer) and the loop waits before it
claims again, longer after each such hand-back in a row.

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
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from services.processor import decode, metrics
from services.processor.decode import DecodeError, StreamInfo
from services.processor.direct_writes import DirectPreviews, WriteFailed, WriteUnavailable
from services.processor.images import JPEG, encode_jpeg
from services.processor.inference import (
    Detection,
    ModelServer,
    ModelUnavailable,
    Pin,
    TritonUnreachable,
)
from services.processor.recordings import (
    RecordingStore,
    RecordingUnavailable,
    StorageUnreachable,
)
from services.processor.routing import JobRouter, Routed, Router, empty_slot_result, to_slot_result
from services.processor.tracking import Box, box_to_proto
from workshop.kit.hashing import sha256_hex
from workshop.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, preview_pb2, preview_pb2_grpc

log = logging.getLogger(__name__)

Metadata = tuple[tuple[str, str], ...]
PROGRESS_STEP = 10  # percent between progress reports
# A photo's frame: no model and no output step; it is published as the job's preview.
PHOTO_FRAME = Routed("frame", (), ())
# Definite refusals: the service heard the call and said no. Every other code means no
# answer that can be trusted (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, and INTERNAL,
# UNKNOWN, DATA_LOSS of a service that failed): the call may not have reached it, or did
# its work and the answer was lost, so it is asked again.
REFUSALS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)
# Refusals that say the lease no longer holds (a fence; the run or job is gone).
FENCED = frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND})
# Refusals of the request itself: what this processor sent about the job is wrong.
INVALID = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE})
RETRY_FIRST_PAUSE_SECONDS = 0.5
RETRY_MAX_PAUSE_SECONDS = 5.0
CLAIM_PAUSE_MAX_SECONDS = 60.0  # the longest wait before claiming after hand-backs in a row
CLAIM_DEADLINE_MARGIN_SECONDS = 10.0  # a waiting Claim's deadline: its wait plus this
# On a stop: the deadline of each hand-back (Release, and the Claim that asks again for the
# leases of an abandoned one); they run at once, so a stop hands back within about this.
RELEASE_SECONDS = 5.0


class LeaseLost(Exception):
    """The coordinator refused a write under this lease: stop the job."""


class JobFailed(Exception):
    """A processor error: the job fails with processor_failed and this message."""


class ServiceUnavailable(Exception):
    """A service the job needs did not answer in time: the job is handed back."""


@dataclasses.dataclass
class Held:
    """A lease this processor works under, and when it was last renewed (loop time)."""

    lease: common_pb2.LeaseRef
    work: asyncio.Task[None]
    interval: float  # seconds without a renewal before it is heartbeaten
    renewed_at: float


class Refused(Exception):
    """A service refused a call about the job for a reason other than its fences."""

    def __init__(self, what: str, error: grpc.aio.AioRpcError) -> None:
        super().__init__(f"{what} refused: {error.code().name} {error.details()}")
        self.code = error.code()


@dataclasses.dataclass
class Processor:
    """One runtime on one device: the long-running claim loop (a kit Worker)."""

    jobs: jobs_pb2_grpc.JobServiceAsyncStub
    previews: preview_pb2_grpc.PreviewServiceAsyncStub
    credentials: Metadata
    runtime_id: str
    code_sha256: str
    recordings: RecordingStore
    models: ModelServer
    gpu: bool = False
    in_flight: int = 3
    idle_seconds: float = 2.0
    claim_wait_seconds: int = 20  # a Claim waits this long at the coordinator for a job
    heartbeat_seconds: float = 0.0  # 0: the interval Claim hands out (45 s); tests shorten it
    retry_seconds: float = 60.0  # how long an RPC about a job is asked again before a hand-back
    # Write preview bytes straight to object storage with grants (False: through
    # PublishPreview, as processors before GrantPreviewWrites do; also the fallback when
    # the preview service answers UNIMPLEMENTED).
    direct_writes: bool = True
    # On a stop, how long jobs in flight may run on before what is left is handed back.
    job_grace_seconds: float = 30.0
    _direct: DirectPreviews | None = None
    _claiming: asyncio.Task[None] | None = None
    _beating: asyncio.Task[None] | None = None
    _stopping: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    _draining: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    _hurried: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    _model_turn: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    _running: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)
    _claim_pause: float = 0.0  # seconds the loop waits before its next claim (after hand-backs)
    _held: dict[str, Held] = dataclasses.field(default_factory=dict)  # by run/job/generation
    _batched_heartbeats: bool = True  # False once a coordinator refused a batched Heartbeat
    completed: int = 0
    failed: int = 0
    handed_back: int = 0
    drained: int = 0  # jobs in flight when a drain began that ended during it
    released_at_stop: int = 0  # jobs still running at a stop, handed back

    @property
    def running_jobs(self) -> set[asyncio.Task[None]]:
        return self._running

    async def start(self) -> None:
        metrics.JOBS_IN_FLIGHT.add(self)
        if self._beating is None:
            self._stopping.clear()
            self._draining.clear()
            self._hurried.clear()
            slots = asyncio.Semaphore(self.in_flight)
            self._beating = asyncio.create_task(self._heartbeats(), name="heartbeats")
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
                    jobs_pb2.ClaimRequest(
                        runtime_id=self.runtime_id,
                        code_sha256=self.code_sha256,
                        request_id=request_id,
                        wait_seconds=self.claim_wait_seconds,
                        max_jobs=free,
                    ),
                    metadata=self.credentials,
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
            # a coordinator of the previous version answers one job whatever was asked
            _release(slots, free - len(claimed))
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
                jobs_pb2.ClaimRequest(
                    runtime_id=self.runtime_id,
                    code_sha256=self.code_sha256,
                    request_id=request_id,
                    max_jobs=free,
                ),
                metadata=self.credentials,
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

    async def _release_unstarted(self, claimed: list[jobs_pb2.ClaimedJob]) -> None:
        """Hands back jobs claimed while stopping, never started (no attempt spent)."""

        async def release(job: jobs_pb2.ClaimedJob) -> None:
            with contextlib.suppress(LeaseLost, ServiceUnavailable, Refused):
                await self._call(
                    self.jobs.Release,
                    jobs_pb2.ReleaseRequest(lease=job.lease),
                    retry=False,
                    deadline=RELEASE_SECONDS,
                )

        await asyncio.gather(*(release(job) for job in claimed))

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
        key = _lease_key(lease)
        interval = (
            self.heartbeat_seconds or job.heartbeat_interval.ToTimedelta().total_seconds() or 45.0
        )
        self._held[key] = Held(lease, work, interval, asyncio.get_running_loop().time())
        following: list[jobs_pb2.ClaimedJob] = []
        try:
            result, decoder = await self._process(job)
            # Complete's own answer decides now: a heartbeat racing it would find the job
            # finished and stop it between the commit and its answer
            self._held.pop(key, None)
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
                complete.then_claim.CopyFrom(
                    jobs_pb2.ClaimRequest(
                        runtime_id=self.runtime_id,
                        code_sha256=self.code_sha256,
                        request_id=uuid.uuid4().hex,
                        max_jobs=1,
                    )
                )
            reply = await self._call(self.jobs.Complete, complete)
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
                with contextlib.suppress(LeaseLost, ServiceUnavailable, Refused):
                    await self._call(
                        self.jobs.Release,
                        jobs_pb2.ReleaseRequest(lease=lease),
                        retry=False,
                        deadline=RELEASE_SECONDS,
                    )
            raise
        finally:
            self._held.pop(key, None)
            _release(slots, 1 - len(following))
            for claimed in following:
                self._start(claimed, slots)

    async def _fail(self, lease: common_pb2.LeaseRef, message: str) -> None:
        """Fails the job with processor_failed. A Fail that gets no answer is not left to
        the lease's lapse (five minutes, one attempt): the job is handed back instead, and
        whoever claims it next meets its problem again. A refused one ends the matter."""
        self.failed += 1
        try:
            await self._call(
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
            await self._call(self.jobs.Release, jobs_pb2.ReleaseRequest(lease=lease))

    async def _heartbeats(self) -> None:
        """Renews, every third of an interval, the leases not renewed for an interval (a
        progress report renews its own), all in one Heartbeat; a job whose lease is lost
        stops, the others go on."""
        loop = asyncio.get_running_loop()
        while True:
            tick = min((held.interval for held in self._held.values()), default=1.0) / 3
            await asyncio.sleep(tick)
            now = loop.time()
            due = [held for held in self._held.values() if now - held.renewed_at >= held.interval]
            if not due:
                continue
            try:
                lost = await self._renew(due)
            except (Refused, ServiceUnavailable) as error:  # try again next beat
                log.warning("heartbeat failed: %s", error)
                continue
            for held in due:
                if id(held) not in lost:
                    held.renewed_at = now
                elif self._held.get(_lease_key(held.lease)) is held:
                    # still working under it (not in its Complete, whose answer decides)
                    held.work.cancel()

    async def _renew(self, due: list[Held]) -> set[int]:
        """Heartbeats `due`; answers the ids of those whose lease was lost. A coordinator of
        the previous version refuses a batch (no `lease`): then one call per lease."""
        lost: set[int] = set()
        if self._batched_heartbeats:
            try:
                reply = await self._call(
                    self.jobs.Heartbeat,
                    jobs_pb2.HeartbeatRequest(leases=[held.lease for held in due]),
                )
            except Refused as error:
                if error.code not in INVALID:
                    raise
                log.warning("batched heartbeats refused, renewing one by one: %s", error)
                self._batched_heartbeats = False
            else:
                for held, renewal in zip(due, reply.renewals, strict=True):
                    if not renewal.renewed:
                        _log_lost(held.lease, renewal.reason)
                        lost.add(id(held))
                return lost
        for held in due:
            try:
                await self._call(self.jobs.Heartbeat, jobs_pb2.HeartbeatRequest(lease=held.lease))
            except LeaseLost as error:
                _log_lost(held.lease, str(error))
                lost.add(id(held))
        return lost

    async def _call(
        self, method: Any, request: Any, *, retry: bool = True, deadline: float | None = None
    ) -> Any:
        """One RPC about a job. A fence refusal becomes LeaseLost, any other refusal
        Refused; no answer (see REFUSALS) is asked again with backoff for up to
        `retry_seconds` (unless `retry` is False), then becomes ServiceUnavailable.
        `deadline`: seconds each try may take (none by default)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + (self.retry_seconds if retry else 0.0)
        pause = RETRY_FIRST_PAUSE_SECONDS
        what = type(request).__name__.removesuffix("Request")
        while True:
            try:
                if deadline is None:
                    reply = await method(request, metadata=self.credentials)
                else:
                    reply = await method(request, metadata=self.credentials, timeout=deadline)
            except grpc.aio.AioRpcError as error:
                code = error.code()
                if code in FENCED:
                    raise LeaseLost(error.details()) from None
                if code in REFUSALS:
                    raise Refused(what, error) from None
                if not retry or loop.time() + pause > give_up or self._stopping.is_set():
                    raise ServiceUnavailable(
                        f"{what} got no answer for {self.retry_seconds:g} s: "
                        f"{code.name} {error.details()}"
                    ) from None
                log.warning("%s: %s; asking again in %.1f s", what, code.name, pause)
                await asyncio.sleep(pause)
                pause = min(RETRY_MAX_PAUSE_SECONDS, 2 * pause)
                continue
            if isinstance(request, jobs_pb2.ReportProgressRequest) and reply.HasField(
                "lease_expires_at"
            ):
                # the report renewed its lease: no heartbeat due for it (a coordinator of
                # the previous version answers no lapse time: its reports renew nothing)
                held = self._held.get(_lease_key(request.lease))
                if held is not None:
                    held.renewed_at = loop.time()
            return reply

    async def _process(self, job: jobs_pb2.ClaimedJob) -> tuple[jobs_pb2.JobResult, str]:
        snapshot, recording = job.snapshot, job.input.recording
        if snapshot.code_sha256 != self.code_sha256:
            raise JobFailed(
                f"The run's snapshot names code {snapshot.code_sha256}; this processor runs "
                f"{self.code_sha256}."
            )
        try:
            data = await self.recordings.fetch(recording.object_key, recording.sha256)
            info = await asyncio.to_thread(decode.probe, data)
            indices = decode.slot_frames(
                info,
                recording.start.ToDatetime(tzinfo=UTC),
                [slot.start.ToDatetime(tzinfo=UTC) for slot in job.input.slots],
                [slot.end.ToDatetime(tzinfo=UTC) for slot in job.input.slots],
            )
            served = [
                await self.models.ensure(Pin(m.name, m.version, m.weights_sha256))
                for m in snapshot.models
            ]
        except DecodeError as error:
            raise JobFailed(f"Cannot read recording {recording.recording_id}: {error}") from None
        except (RecordingUnavailable, ModelUnavailable) as error:
            raise JobFailed(str(error)) from None
        except (StorageUnreachable, TritonUnreachable) as error:
            raise ServiceUnavailable(str(error)) from None
        decoder, decoder_name = decode.choose_decoder(info.codec, self.gpu)
        height, width = (served[0].height, served[0].width) if served else (info.height, info.width)
        photo = snapshot.kind == common_pb2.RUN_KIND_PHOTO
        router = None if photo else JobRouter(Router(snapshot.workflow, snapshot.models))
        full = snapshot.mode == common_pb2.RUN_MODE_FULL
        slots: dict[int, jobs_pb2.SlotResult] = {
            index: empty_slot_result(index) for index, frame in enumerate(indices) if frame is None
        }
        wanted = [(index, frame) for index, frame in enumerate(indices) if frame is not None]
        reported = 0
        async for batch, frames in self._frames(decoder, data, wanted, height, width):
            detections = await self._detect(served, frames)
            for position, (index, frame_index) in enumerate(batch):
                moment = _frame_time(info, recording.start.ToDatetime(tzinfo=UTC), frame_index)
                by_step = {
                    model.step_id: [_box(d) for d in found[position]]
                    for model, found in zip(snapshot.models, detections, strict=True)
                }
                routed = router.route(by_step) if router else PHOTO_FRAME
                slots[index] = await self._publish(
                    job, index, moment, frames[position], routed, full
                )
                if routed.outcome == "frame":  # it was published
                    metrics.FRAMES_PUBLISHED.inc()
            done = len(slots) * 100 // max(1, len(indices))
            if done >= reported + PROGRESS_STEP:
                reported = done
                await self._call(
                    self.jobs.ReportProgress,
                    jobs_pb2.ReportProgressRequest(lease=job.lease, percent=min(done, 99)),
                )
        if self._direct is not None:
            await self._direct.settle(job.lease)  # every preview recorded before Complete
        result = jobs_pb2.JobResult(slots=[slots[index] for index in range(len(indices))])
        return result, decoder_name

    async def _frames(
        self,
        decoder: decode.Decoder,
        data: bytes,
        wanted: list[tuple[int, int]],
        height: int,
        width: int,
    ) -> AsyncIterator[tuple[list[tuple[int, int]], Any]]:
        """Decoded frames chunk by chunk, off the event loop, with their slots."""
        chunks: Iterator[Any] = decoder.chunks(
            data, [frame for _, frame in wanted], out_height=height, out_width=width
        )
        taken = 0
        while True:
            started = time.perf_counter()
            try:
                chunk = await asyncio.to_thread(next, chunks, None)
            except DecodeError as error:
                raise JobFailed(str(error)) from None
            if chunk is None:
                return
            metrics.DECODE_SECONDS.observe(time.perf_counter() - started)
            metrics.FRAMES_DECODED.inc(len(chunk))
            batch = wanted[taken : taken + len(chunk)]
            taken += len(chunk)
            yield batch, chunk

    async def _detect(self, served: list[Any], frames: Any) -> list[list[list[Detection]]]:
        """Each model's detections for each frame; one model pass at a time."""
        found = []
        async with self._model_turn:
            for model in served:
                try:
                    with metrics.INFERENCE_SECONDS.labels(model.pin.name).time():
                        found.append(await self.models.infer(model, frames))
                except ModelUnavailable as error:
                    raise JobFailed(str(error)) from None
                except TritonUnreachable as error:
                    raise ServiceUnavailable(str(error)) from None
        metrics.FRAMES_INFERRED.inc(len(frames))
        return found

    async def _publish(
        self,
        job: jobs_pb2.ClaimedJob,
        index: int,
        moment: datetime,
        frame: Any,
        routed: Routed,
        full: bool,
    ) -> jobs_pb2.SlotResult:
        """A frame that reaches an output: its preview, which in full runs is also its upload.

        The bytes go straight to object storage with a grant and the record is queued
        (direct_writes.py); through PublishPreview when `direct_writes` is off or the
        preview service predates grants. A preview service that does not answer the
        preview's digest (older than the coordinator's migration 0008) gets the upload
        staged separately, as before.
        """
        if routed.outcome != "frame":
            return to_slot_result(index, moment, routed)
        image = await asyncio.to_thread(encode_jpeg, frame)
        labels = [box for _, boxes in routed.outputs for box in boxes]
        boxes = [box_to_proto(box) for box in labels]
        # The preview is recorded with `labels`: with one output, its item's boxes exactly,
        # which a coordinator that takes recorded boxes then copies instead of receiving.
        recorded = job.takes_recorded_boxes and len(routed.outputs) == 1
        if self.direct_writes:
            written = await self._publish_direct(job, index, moment, image, boxes)
            if written is not None:
                key, digest = written
                if not full or not routed.outputs:
                    return to_slot_result(index, moment, routed)
                return to_slot_result(
                    index,
                    moment,
                    routed,
                    upload_key=key,
                    upload_sha256=digest,
                    boxes_recorded=recorded,
                )
        published = await self._call(
            self.previews.PublishPreview,
            preview_pb2.PublishPreviewRequest(
                lease=job.lease,
                code_sha256=self.code_sha256,
                slot_index=index,
                frame_time=_timestamp(moment),
                image=image,
                content_type=JPEG,
                boxes=boxes,
            ),
        )
        if not full or not routed.outputs:
            return to_slot_result(index, moment, routed)
        if published.sha256:
            return to_slot_result(
                index,
                moment,
                routed,
                upload_key=published.object_key,
                upload_sha256=published.sha256,
                boxes_recorded=recorded,
            )
        staged = await self._call(
            self.previews.StageUpload,
            preview_pb2.StageUploadRequest(
                lease=job.lease,
                code_sha256=self.code_sha256,
                slot_index=index,
                image=image,
                content_type=JPEG,
            ),
        )
        return to_slot_result(
            index, moment, routed, upload_key=staged.object_key, upload_sha256=staged.sha256
        )

    async def _publish_direct(
        self,
        job: jobs_pb2.ClaimedJob,
        index: int,
        moment: datetime,
        image: bytes,
        boxes: list[common_pb2.Box],
    ) -> tuple[str, str] | None:
        """The preview written with a grant, its record queued: (key, SHA-256). None when
        the preview service predates grants (UNIMPLEMENTED): then never asked again."""
        if self._direct is None:
            self._direct = DirectPreviews(
                self.previews,
                self._call,
                _refusal_error,
                self.code_sha256,
                retry_seconds=self.retry_seconds,
            )
        digest = sha256_hex(image)
        try:
            key = await self._direct.publish(
                job, index, _timestamp(moment), image, JPEG, boxes, digest
            )
        except Refused as error:
            if error.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            log.info("the preview service grants no direct writes; publishing through it")
            self.direct_writes = False
            return None
        except (WriteUnavailable, WriteFailed) as error:
            raise ServiceUnavailable(str(error)) from None
        return key, digest


def _refusal_error(refusal: Any) -> Exception:
    """One preview's refusal in a RecordWrittenPreviews answer, as _call would raise it."""
    code = next((c for c in grpc.StatusCode if c.value[0] == refusal.code), grpc.StatusCode.UNKNOWN)
    if code in FENCED:
        return LeaseLost(refusal.message)
    error = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), refusal.message)
    if code in REFUSALS:
        return Refused("RecordWrittenPreviews", error)
    return ServiceUnavailable(f"RecordWrittenPreviews: {code.name} {refusal.message}")


def _release(slots: asyncio.Semaphore, places: int) -> None:
    for _ in range(places):
        slots.release()


def _jobs_of(reply: jobs_pb2.ClaimResponse) -> list[jobs_pb2.ClaimedJob]:
    """The jobs a Claim answered, in claim order."""
    return [reply.job, *reply.more_jobs] if reply.HasField("job") else []


def _lease_key(lease: common_pb2.LeaseRef) -> str:
    return f"{lease.run_id}/{lease.job_id}/{lease.generation}"


def _log_lost(lease: common_pb2.LeaseRef, why: str) -> None:
    log.info("lease of %s/%s lost: %s", lease.run_id, lease.job_id, why)


def _frame_time(info: StreamInfo, recording_start: datetime, frame_index: int) -> datetime:
    """Wall-clock time of a frame: the recording's start plus its offset from the first frame."""
    offset = (info.frame_pts[frame_index] - info.frame_pts[0]) * info.time_base
    return recording_start + timedelta(microseconds=round(offset * 1_000_000))


def _box(detection: Detection) -> Box:
    return Box(
        class_name=detection.class_name,
        score=detection.score,
        x=detection.x,
        y=detection.y,
        w=detection.w,
        h=detection.h,
    )


def _timestamp(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def _digest(result: jobs_pb2.JobResult) -> str:
    """SHA-256 of the deterministic serialization, as the coordinator recomputes it."""
    return sha256_hex(result.SerializeToString(deterministic=True))
