"""The coordinator's jobs, leases and fences agree with a reference model (docs/runs-and-jobs.md).

A Hypothesis state machine drives one small run per example (2-4 jobs of 1-3
slots of 60 s in a 3-minute window, test or full mode; a test run sometimes
nearly an hour old) through the real gRPC services with two simulated
processors: claims, heartbeats, progress, completions (an all-EMPTY result, or
a different one with a DROPPED slot), retried completions under the committing
lease (same or different result), failures, releases, CheckLease, a processor
that claims and dies while the other heartbeats, cancelling the run, replacing
a recording (SOURCE_CHANGED), raising the policy revision (POLICY_CHANGED),
moving the clock 0-7 minutes and maintenance passes. Leases are used live, as
a job's newest, stale, or forged (another token, the next generation).
`tests/lease_model.py` predicts every answer; after each step the job rows, the
receipts and GetRun are compared with the model.

Properties:
- every RPC's outcome is the model's: OK, or the exact gRPC code and ErrorInfo
  reason (fence order: cancelled, finished, lease, source, policy); OK answers
  carry the model's lease expiry, progress and receipt;
- no write under a dead lease is accepted (a receipt lookup may answer OK);
- job rows (state, generation, token, lease expiry, lapses, progress and its
  update count, phase, failure reason, result digest, input cleared, expiry)
  and receipts equal the model's;
- Claim never leases a job that can never commit (its recording replaced, the
  policy raised): it ends failed with source_changed or authority_lost, as does
  a job whose Complete or Fail those fences refuse;
- no job has two live leases: in the model after every step, and in the
  coordinator (CheckLease on every issued lease) at the end of every example;
- progress never decreases; a committed digest never changes;
- receipts == completed jobs; GetRun's status, counts, finished_at and jobs
  (state, generation, progress, failure reason, phase, updated_at) follow §8
  and the contract's field comments.

Hypothesis is synchronous and the harness is asyncio: the machine runs in a
worker thread (`asyncio.to_thread`) and every call is a coroutine scheduled on
the test's loop (`run_coroutine_threadsafe`), so gRPC calls are made and awaited
on the loop that owns the channel. Examples share one coordinator and database;
each creates its own recordings (on a day of its own), workflow and run, and
cancels the run on teardown so the next example's run is the runtime's head.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.leases.maintenance import Maintenance
from services.coordinator.leases.results import result_digest
from testbed.coordinator_leases import Metadata, Setup, on_behalf, setup
from testbed.coordinator_world import (
    CODE,
    DAY,
    error_reason,
    put_recording,
    run_request,
    save_workflow,
    stamp,
    workflow_spec,
)
from testbed.harness.coordinator import CoordinatorHarness
from testbed.session_jobs import JOB_TRANSPORTS
from tests.lease_model import OK, Job, Lease, Outcome, Pass, RunModel, refused
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2, run_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

T = TypeVar("T")

CAMERAS = ("cam-a", "cam-b", "cam-c", "cam-d")
INTERVAL = timedelta(seconds=60)
WINDOW_START = timedelta(hours=8)  # the window is 08:00-08:03
TEST_HOUR = timedelta(hours=1)
RECORDING_RETENTION = timedelta(days=40)
PHASES = ("downloading", "decoding", "labeling", "publishing", "committing")
CALL_TIMEOUT_S = 30.0
LEASE_PICKS = ("live", "live", "latest", "any", "forged")

SETTINGS = settings(
    max_examples=75,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    # A failure is shrunk to a short trace; one bug at a time and no "explain" phase keep
    # that under a couple of minutes (each step is a few gRPC calls and queries).
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    report_multiple_bugs=False,
)

JOB_STATES = {
    "queued": common_pb2.JOB_STATE_QUEUED,
    "leased": common_pb2.JOB_STATE_LEASED,
    "completed": common_pb2.JOB_STATE_COMPLETED,
    "failed": common_pb2.JOB_STATE_FAILED,
    "cancelled": common_pb2.JOB_STATE_CANCELLED,
    "expired": common_pb2.JOB_STATE_EXPIRED,
}
RUN_STATUSES = {
    "running": common_pb2.RUN_STATUS_RUNNING,
    "queued": common_pb2.RUN_STATUS_QUEUED,
    "failed": common_pb2.RUN_STATUS_FAILED,
    "cancelled": common_pb2.RUN_STATUS_CANCELLED,
    "expired": common_pb2.RUN_STATUS_EXPIRED,
    "completed": common_pb2.RUN_STATUS_COMPLETED,
}
FAILURE_REASONS = {
    None: common_pb2.FAILURE_REASON_UNSPECIFIED,
    "processor_failed": common_pb2.FAILURE_REASON_PROCESSOR_FAILED,
    "attempts_exhausted": common_pb2.FAILURE_REASON_ATTEMPTS_EXHAUSTED,
    "source_changed": common_pb2.FAILURE_REASON_SOURCE_CHANGED,
    "authority_lost": common_pb2.FAILURE_REASON_AUTHORITY_LOST,
}


@pytest.fixture(params=JOB_TRANSPORTS)
def job_transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs twice: on JobService's unary calls and on a Session stream."""
    return str(request.param)


def phase_enum(phase: str | None) -> common_pb2.JobPhase.ValueType:
    if phase is None:
        return common_pb2.JOB_PHASE_UNSPECIFIED
    return common_pb2.JobPhase.Value("JOB_PHASE_" + phase.upper())


def aware(value: Timestamp) -> datetime:
    return value.ToDatetime(tzinfo=UTC)


async def attempt(call: Awaitable[T]) -> tuple[T | None, Outcome]:
    """The reply and OK, or None and (code, ErrorInfo reason) of the refusal."""
    try:
        return await call, OK
    except grpc.aio.AioRpcError as error:
        code, reason, _ = error_reason(error)
        return None, (code.name, reason)


class Bridge:
    """Runs coroutines on the test's event loop from Hypothesis's worker thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def __call__(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(CALL_TIMEOUT_S)


@dataclasses.dataclass
class Shared:
    """What every example uses: one coordinator, its world and two processor keys."""

    c: CoordinatorHarness
    s: Setup
    processors: tuple[Metadata, Metadata]
    call: Bridge
    maintenance: Maintenance
    examples: int = 0


@dataclasses.dataclass(frozen=True)
class Row:
    """A job row as read back from the database, in the model's vocabulary."""

    state: str
    generation: int
    token: str | None
    lease_expires_at: datetime | None
    lapses: int
    progress: int
    progress_updates: int
    phase: str | None
    failure_reason: str | None
    input_cleared: bool
    result_sha256: str | None
    committed_at: datetime | None
    expires_at: datetime
    slot_count: int
    recording_generation: int

    @classmethod
    def of(cls, job: Job) -> Row:
        return cls(
            state=job.state,
            generation=job.generation,
            token=job.token,
            lease_expires_at=job.lease_expires_at,
            lapses=job.lapses,
            progress=job.progress,
            progress_updates=job.progress_updates,
            phase=job.phase,
            failure_reason=job.failure_reason,
            input_cleared=job.input_cleared,
            result_sha256=job.result_sha256,
            committed_at=job.committed_at,
            expires_at=job.expires_at,
            slot_count=job.slot_count,
            recording_generation=job.admitted_source,
        )


Receipt = tuple[int, int | None, str | None, int, int, datetime | None]

READ_JOBS = """
SELECT state, generation, lease_token::text AS token, lease_expires_at, lapses, progress,
       progress_updates, phase, failure_reason, input_cleared, result_sha256, committed_at,
       expires_at, slot_count, recording_generation
FROM jobs WHERE run_id = $1 ORDER BY job_index
"""
READ_RECEIPTS = """
SELECT job_index, generation, result_sha256, empties, dropped, committed_at
FROM receipts WHERE run_id = $1 ORDER BY job_index
"""


class LeaseMachine(RuleBasedStateMachine):
    def __init__(self, shared: Shared) -> None:
        super().__init__()
        self.shared = shared
        self.c = shared.c
        self.call = shared.call
        self.run_id = ""
        self.day = DAY
        self.cameras: tuple[str, ...] = ()
        self.recordings: list[tuple[str, str, timedelta]] = []
        self._model: RunModel | None = None
        self.leases: list[Lease] = []  # every lease Claim issued, oldest first
        self.latest: dict[int, Lease] = {}  # the newest issued lease per job
        self.committed: dict[int, tuple[Lease, str]] = {}  # job -> the lease and result
        self.seen_progress: dict[int, int] = {}
        self.seen_digest: dict[int, str] = {}

    # plumbing -----------------------------------------------------------------------

    @property
    def model(self) -> RunModel:
        assert self._model is not None
        return self._model

    def now(self) -> datetime:
        return self.c.clock.now()

    def rpc(self, make: Callable[[], Awaitable[T]]) -> tuple[T | None, Outcome]:
        """Makes the call on the loop (gRPC calls belong to their channel's loop)."""

        async def go() -> tuple[T | None, Outcome]:
            return await attempt(make())

        return self.call(go())

    def processor(self, which: int) -> Metadata:
        return self.shared.processors[which]

    def ref(self, lease: Lease) -> common_pb2.LeaseRef:
        return common_pb2.LeaseRef(
            run_id=self.run_id,
            job_id=f"j{lease.job_index}",
            generation=lease.generation,
            token=lease.token,
        )

    def pick_lease(self, data: st.DataObject, picks: tuple[str, ...] = LEASE_PICKS) -> Lease:
        """A live lease (the model's word; else a job's newest), a job's newest lease, any
        issued lease (often stale), or a forged one (another token or the next generation)."""
        how = data.draw(st.sampled_from(picks), label="lease")
        if how == "any":
            return data.draw(st.sampled_from(self.leases), label="issued lease")
        now = self.now()
        live = [x for x in self.latest.values() if self.model.live(x, now)]
        if how == "live" and live:
            return data.draw(st.sampled_from(live), label="live lease")
        lease = data.draw(st.sampled_from(list(self.latest.values())), label="latest lease")
        if how == "forged":
            if data.draw(st.booleans(), label="forge the token (else the generation)"):
                token = str(uuid.UUID(int=data.draw(st.integers(1, 2**32), label="token")))
                return dataclasses.replace(lease, token=token)
            return dataclasses.replace(lease, generation=lease.generation + 1)
        return lease

    def differs(self, what: str, got: object, want: object) -> str:
        return (
            f"{what}: coordinator {got!r} != model {want!r} at {self.now().isoformat()}\n"
            f"model jobs: {self.model.jobs}"
        )

    def slot_start(self, index: int) -> datetime:
        return self.day + WINDOW_START + index * INTERVAL

    # setup and teardown ---------------------------------------------------------------

    @initialize(
        jobs=st.integers(2, 4),
        lengths=st.lists(st.integers(1, 3), min_size=4, max_size=4),
        test_mode=st.booleans(),
        aged=st.sampled_from((0, 58, 0, 45)),
    )
    def create_run(self, jobs: int, lengths: list[int], test_mode: bool, aged: int) -> None:
        """A run of `jobs` recordings of 1-3 minutes on a day of its own; a test run is
        sometimes `aged` minutes old already, so that its hour ends during the example."""
        self.shared.examples += 1
        number = self.shared.examples
        self.day = DAY - timedelta(days=number)
        self.run_id = f"lease-model-{number}"
        self.cameras = CAMERAS[:jobs]
        self.recordings = [
            (f"lm{number}-{i}", camera, timedelta(minutes=lengths[i]))
            for i, camera in enumerate(self.cameras)
        ]
        created = self.now()
        self.call(self._create(f"lease-model-{number}", test_mode))
        self._model = RunModel(
            jobs=[
                Job(
                    index=i,
                    slot_count=lengths[i],
                    # a job expires with its source: the test's hour, or the recording's 40 days
                    expires_at=created + (TEST_HOUR if test_mode else RECORDING_RETENTION),
                    changed_at=created,
                )
                for i in range(jobs)
            ],
            test_mode=test_mode,
            run_expires_at=created + TEST_HOUR if test_mode else None,
        )
        if test_mode and aged:
            self.c.clock.advance(timedelta(minutes=aged))

    async def _create(self, workflow_id: str, test_mode: bool) -> None:
        c = self.c
        for recording_id, camera, length in self.recordings:
            await put_recording(c, recording_id, camera, self.day + WINDOW_START, length)
        spec = workflow_spec(
            cameras=self.cameras,
            interval=int(INTERVAL.total_seconds()),
            date=(self.day.year, self.day.month, self.day.day),
            window=(8, 8),
        )
        spec.graph.steps[0].input.window_end.minutes = 3  # 08:00-08:03
        await save_workflow(c, workflow_id, spec)
        mode = common_pb2.RUN_MODE_TEST if test_mode else common_pb2.RUN_MODE_FULL
        await c.workshop.CreateRun(
            run_request(self.run_id, workflow_id, self.shared.s.world.tracking_runtime, mode=mode),
            metadata=c.admin,
        )

    def teardown(self) -> None:
        if not self.run_id:
            return
        try:
            if self._model is not None:
                self.audit_leases()
        finally:
            # Cancel what is unfinished, so the next example's run is the runtime's head.
            self.rpc(
                lambda: self.c.workshop.CancelRun(
                    ws.CancelRunRequest(run_id=self.run_id), metadata=self.c.admin
                )
            )

    def audit_leases(self) -> None:
        """Of every lease ever issued, CheckLease accepts at most one per job: the model's."""
        now = self.now()
        accepted: dict[int, list[Lease]] = {}
        for lease in self.leases:
            reply, outcome = self.call(self._check(lease))
            reason = self.model.met(lease, now)
            want = refused(reason) if reason else OK
            assert outcome == want, self.differs(f"CheckLease {lease}", outcome, want)
            if reply is not None:
                accepted.setdefault(lease.job_index, []).append(lease)
        for index, leases in accepted.items():
            assert len(leases) == 1, f"job j{index} has {len(leases)} live leases: {leases}"

    async def _check(self, lease: Lease) -> tuple[pub.CheckLeaseResponse | None, Outcome]:
        return await attempt(
            self.c.publication.CheckLease(
                pub.CheckLeaseRequest(lease=self.ref(lease), code_sha256=CODE),
                metadata=on_behalf(self.shared.s),
            )
        )

    # processor rules ----------------------------------------------------------------

    @rule(processor=st.integers(0, 1))
    def claim(self, processor: int) -> None:
        self.take(processor)

    @rule(processor=st.integers(0, 1), max_jobs=st.integers(2, 4))
    def claim_many(self, processor: int, max_jobs: int) -> None:
        """A batched Claim: the model's next jobs, one after another, each its own lease."""
        self.take(processor, max_jobs)

    def take(self, processor: int, max_jobs: int = 0) -> Lease | None:
        """Claim: the model's next job(s) under new leases, or nothing; the first lease."""
        now = self.now()
        reply, outcome = self.rpc(
            lambda: self.c.jobs.Claim(
                jobs_pb2.ClaimRequest(
                    runtime_id=self.shared.s.world.tracking_runtime,
                    code_sha256=CODE,
                    max_jobs=max_jobs,
                ),
                metadata=self.processor(processor),
            )
        )
        assert outcome == OK, self.differs("Claim", outcome, OK)
        assert reply is not None
        got = [reply.job, *reply.more_jobs] if reply.HasField("job") else []
        taken: list[Lease] = []
        for position in range(max(1, max_jobs)):
            expected = self.model.next_claim(now)
            if expected is None:
                left = [j.lease.job_id for j in got[position:]]
                assert left == [], self.differs("Claim leased", left, [])
                break
            assert position < len(got), self.differs("Claim leased", None, expected.index)
            taken.append(self.taken(got[position], expected, now))
        return taken[0] if taken else None

    def taken(self, job: jobs_pb2.ClaimedJob, expected: Job, now: datetime) -> Lease:
        """One job of a Claim's answer, checked against the model's next claim."""
        got_lease = (job.lease.run_id, job.lease.job_id, job.lease.generation)
        want_lease = (self.run_id, f"j{expected.index}", expected.generation + 1)
        assert got_lease == want_lease, self.differs("Claim lease", got_lease, want_lease)
        self.model.claimed(expected, job.lease.token, now)
        got_facts = (
            aware(job.lease_expires_at),
            aware(job.input.expires_at),
            len(job.input.slots),
            job.input.recording.generation,
        )
        want_facts = (expected.lease_expires_at, expected.expires_at, expected.slot_count, 1)
        assert got_facts == want_facts, self.differs("Claim facts", got_facts, want_facts)
        lease = Lease(expected.index, job.lease.generation, job.lease.token)
        assert lease not in self.leases, f"a lease was issued twice: {lease}"
        assert all(lease.token != other.token for other in self.leases), "a token twice"
        self.leases.append(lease)
        self.latest[expected.index] = lease
        return lease

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data(), processor=st.integers(0, 1))
    def heartbeat(self, data: st.DataObject, processor: int) -> None:
        self.beat(self.pick_lease(data), processor)

    def beat(self, lease: Lease, processor: int) -> None:
        now = self.now()
        was_live = self.model.live(lease, now)
        want, until = self.model.heartbeat(lease, now)
        reply, outcome = self.rpc(
            lambda: self.c.jobs.Heartbeat(
                jobs_pb2.HeartbeatRequest(lease=self.ref(lease)),
                metadata=self.processor(processor),
            )
        )
        assert outcome == want, self.differs(f"Heartbeat {lease}", outcome, want)
        if reply is not None:
            assert was_live, f"a heartbeat under a dead lease was accepted: {lease}"
            got = aware(reply.lease_expires_at)
            assert got == until, self.differs("Heartbeat lease_expires_at", got, until)

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data(), processor=st.integers(0, 1), count=st.integers(1, 4))
    def heartbeat_many(self, data: st.DataObject, processor: int, count: int) -> None:
        """One Heartbeat of several leases (live, stale, forged, repeated): each answered
        as a single Heartbeat of it would be, in job order (the coordinator's), and a
        lost one never stops the others."""
        leases = [self.pick_lease(data) for _ in range(count)]
        now = self.now()
        was_live = [self.model.live(lease, now) for lease in leases]
        want: list[tuple[Outcome, datetime | None]] = [(OK, None)] * count
        for position in sorted(range(count), key=lambda i: leases[i].job_index):
            want[position] = self.model.heartbeat(leases[position], now)
        reply, outcome = self.rpc(
            lambda: self.c.jobs.Heartbeat(
                jobs_pb2.HeartbeatRequest(leases=[self.ref(lease) for lease in leases]),
                metadata=self.processor(processor),
            )
        )
        assert outcome == OK, self.differs("batched Heartbeat", outcome, OK)
        assert reply is not None
        got = [
            (OK, aware(r.lease_expires_at)) if r.renewed else (refused(r.reason), None)
            for r in reply.renewals
        ]
        assert got == want, self.differs(f"batched Heartbeat {leases}", got, want)
        for position, (answer, _until) in enumerate(got):
            if answer == OK:
                assert was_live[position], f"a dead lease was renewed: {leases[position]}"

    @precondition(lambda self: bool(self.leases))
    @rule(
        data=st.data(),
        processor=st.integers(0, 1),
        percent=st.integers(0, 100),
        phase=st.none() | st.sampled_from(PHASES),
    )
    def report_progress(
        self, data: st.DataObject, processor: int, percent: int, phase: str | None
    ) -> None:
        self.progress(self.pick_lease(data), processor, percent, phase)

    def progress(self, lease: Lease, processor: int, percent: int, phase: str | None) -> None:
        now = self.now()
        was_live = self.model.live(lease, now)
        want, stored, persisted = self.model.progress(lease, percent, phase, now)
        request = jobs_pb2.ReportProgressRequest(lease=self.ref(lease), percent=percent)
        if phase is not None:
            request.phase = phase_enum(phase)
        reply, outcome = self.rpc(
            lambda: self.c.jobs.ReportProgress(request, metadata=self.processor(processor))
        )
        assert outcome == want, self.differs(f"ReportProgress {lease} {percent}%", outcome, want)
        if reply is not None:
            assert was_live, f"progress under a dead lease was accepted: {lease}"
            got = (reply.percent, reply.persisted)
            assert got == (stored, persisted), self.differs("progress", got, (stored, persisted))
            until = self.model.jobs[lease.job_index].lease_expires_at
            renewed = aware(reply.lease_expires_at)
            assert renewed == until, self.differs("progress lease_expires_at", renewed, until)

    @precondition(lambda self: bool(self.leases))
    @rule(
        data=st.data(),
        processor=st.integers(0, 1),
        variant=st.sampled_from(("empty", "empty", "dropped")),
    )
    def complete(self, data: st.DataObject, processor: int, variant: str) -> None:
        """An all-EMPTY result, or (a different result) slot 0 DROPPED at its start."""
        self.send_result(self.pick_lease(data), processor, variant)

    @precondition(lambda self: bool(self.committed))
    @rule(data=st.data(), processor=st.integers(0, 1), same=st.booleans())
    def retry_complete(self, data: st.DataObject, processor: int, same: bool) -> None:
        """Complete again under the lease that committed: the same result (a retry after
        a lost answer) returns the receipt; a different one is RESULT_CONFLICT."""
        lease, variant = data.draw(
            st.sampled_from([self.committed[i] for i in sorted(self.committed)])
        )
        other = {"empty": "dropped", "dropped": "empty"}[variant]
        self.send_result(lease, processor, variant if same else other)

    def send_result(self, lease: Lease, processor: int, variant: str) -> None:
        now = self.now()
        job = self.model.jobs[lease.job_index]
        result = jobs_pb2.JobResult(
            slots=[
                jobs_pb2.SlotResult(slot_index=i, outcome=common_pb2.SLOT_OUTCOME_EMPTY)
                for i in range(job.slot_count)
            ]
        )
        if variant == "dropped":
            result.slots[0].outcome = common_pb2.SLOT_OUTCOME_DROPPED
            result.slots[0].frame_time.CopyFrom(stamp(self.slot_start(0)))
        dropped = int(variant == "dropped")
        digest = result_digest(result)
        was_live = self.model.live(lease, now)
        want = self.model.complete(lease, digest, job.slot_count - dropped, dropped, now)
        request = jobs_pb2.CompleteRequest(
            lease=self.ref(lease),
            code_sha256=CODE,
            result=result,
            result_sha256=digest,
            decoder="pyav",
        )
        reply, outcome = self.rpc(
            lambda: self.c.jobs.Complete(request, metadata=self.processor(processor))
        )
        assert outcome == want.outcome, self.differs(
            f"Complete {lease} {variant}", outcome, want.outcome
        )
        if reply is None:
            return
        if not reply.already_committed:
            assert was_live, f"a result under a dead lease was committed: {lease}"
            self.committed[lease.job_index] = (lease, variant)
        receipt = reply.receipt
        got_receipt = (
            receipt.run_id,
            receipt.job_id,
            receipt.generation,
            receipt.result_sha256,
            aware(receipt.committed_at),
            receipt.items_saved,
            reply.already_committed,
        )
        want_receipt = (
            self.run_id,
            f"j{lease.job_index}",
            want.generation,
            digest,
            want.committed_at,
            0,
            want.already_committed,
        )
        assert got_receipt == want_receipt, self.differs("receipt", got_receipt, want_receipt)

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data(), processor=st.integers(0, 1))
    def fail(self, data: st.DataObject, processor: int) -> None:
        self.give_up(self.pick_lease(data), processor)

    def give_up(self, lease: Lease, processor: int) -> None:
        now = self.now()
        was_live = self.model.live(lease, now)
        want = self.model.fail(lease, now)
        reply, outcome = self.rpc(
            lambda: self.c.jobs.Fail(
                jobs_pb2.FailRequest(
                    lease=self.ref(lease),
                    reason=common_pb2.FAILURE_REASON_PROCESSOR_FAILED,
                    message="decode error",
                ),
                metadata=self.processor(processor),
            )
        )
        assert outcome == want, self.differs(f"Fail {lease}", outcome, want)
        if reply is not None:
            assert was_live, f"a failure under a dead lease was accepted: {lease}"
            assert reply.state == common_pb2.JOB_STATE_FAILED

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data(), processor=st.integers(0, 1))
    def release(self, data: st.DataObject, processor: int) -> None:
        self.hand_back(self.pick_lease(data), processor)

    def hand_back(self, lease: Lease, processor: int) -> None:
        now = self.now()
        was_live = self.model.live(lease, now)
        want = self.model.release(lease, now)
        reply, outcome = self.rpc(
            lambda: self.c.jobs.Release(
                jobs_pb2.ReleaseRequest(lease=self.ref(lease)), metadata=self.processor(processor)
            )
        )
        assert outcome == want, self.differs(f"Release {lease}", outcome, want)
        if reply is not None:
            assert was_live, f"a release under a dead lease was accepted: {lease}"
            assert reply.state == common_pb2.JOB_STATE_QUEUED

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data())
    def check_lease(self, data: st.DataObject) -> None:
        """PublicationService.CheckLease answers the same fences and writes nothing, except
        that a refusal that can never pass ends the job, as with every fenced call."""
        lease, now = self.pick_lease(data), self.now()
        reason = self.model.met(lease, now)
        want = refused(reason) if reason else OK
        reply, outcome = self.call(self._check(lease))
        assert outcome == want, self.differs(f"CheckLease {lease}", outcome, want)
        if reply is not None:
            job = self.model.jobs[lease.job_index]
            got = (aware(reply.lease_expires_at), reply.slot_count, reply.camera_id)
            facts = (job.lease_expires_at, job.slot_count, self.cameras[lease.job_index])
            assert got == facts, self.differs("CheckLease facts", got, facts)

    # the world moves --------------------------------------------------------------------

    @rule(
        minutes=st.sampled_from((3, 1, 2, 4, 5, 6, 7, 0, 7)),
        maintain=st.sampled_from((True, True, False)),
    )
    def tick(self, minutes: int, maintain: bool) -> None:
        """Moves the clock 0-7 minutes, then (mostly) runs one maintenance pass."""
        self.c.clock.advance(timedelta(minutes=minutes))
        if not maintain:
            return
        want = self.model.maintain(self.now())
        done = self.call(self.shared.maintenance.run_once())
        assert not done.skipped, "maintenance skipped its pass"
        got = Pass(requeued=done.requeued, exhausted=done.exhausted, expired=done.expired)
        assert got == want, self.differs("maintenance", got, want)

    @rule(
        processor=st.integers(0, 1),
        percent=st.integers(0, 100),
        phase=st.sampled_from(PHASES),
        minutes=st.sampled_from((1, 2, 3, 4)),
        ending=st.sampled_from(("complete", "fail", "release", "stop")),
    )
    def process_job(
        self, processor: int, percent: int, phase: str, minutes: int, ending: str
    ) -> None:
        """A processor's ordinary work: claim, report progress in a phase, work a few
        minutes, heartbeat, then complete, fail, release or just stop (the lease lapses)."""
        lease = self.take(processor)
        if lease is None:
            return
        self.progress(lease, processor, percent, phase)
        self.tick(minutes, False)
        self.beat(lease, processor)
        if ending == "complete":
            self.send_result(lease, processor, "empty")
        elif ending == "fail":
            self.give_up(lease, processor)
        elif ending == "release":
            self.hand_back(lease, processor)

    @rule(processor=st.integers(0, 1))
    def claim_and_crash(self, processor: int) -> None:
        """A processor claims and dies while the other keeps heartbeating its leases: 7
        minutes pass, maintenance rescues the lapsed lease (the third lapse of a job fails
        it with attempts_exhausted)."""
        before = set(self.leases)
        self.claim(processor)
        self.tick(4, False)
        now = self.now()
        for lease in list(self.latest.values()):
            if lease not in before or not self.model.live(lease, now):
                continue
            self.beat(lease, 1 - processor)
        self.tick(3, True)

    # Hypothesis enables a random subset of the rules in each example (swarm testing), so
    # the rules that end a run's writes below appear in some examples and not in others.
    # They wait for a first lease, so that they meet processors at work, and cancelling
    # waits for a job to end too, so that it meets a run part done.

    @precondition(
        lambda self: (
            bool(self.leases) and self.model.count_unfinished() not in (0, len(self.model.jobs))
        )
    )
    @rule()
    def cancel_run(self) -> None:
        """CancelRun: queued and leased jobs are cancelled; ended jobs keep their state."""
        want = self.model.cancel(self.now())
        reply, outcome = self.rpc(
            lambda: self.c.workshop.CancelRun(
                ws.CancelRunRequest(run_id=self.run_id), metadata=self.c.admin
            )
        )
        assert outcome == OK, self.differs("CancelRun", outcome, OK)
        assert reply is not None
        got = reply.jobs_cancelled
        assert got == want, self.differs("CancelRun jobs_cancelled", got, want)

    @precondition(lambda self: bool(self.leases))
    @rule(index=st.integers(0, 3))
    def replace_recording(self, index: int) -> None:
        """PutRecording with the same id: a new generation, so the job's source changed."""
        index %= len(self.model.jobs)
        recording_id, camera, length = self.recordings[index]
        self.model.replace_source(index)

        async def put() -> op.PutRecordingResponse:
            return await put_recording(
                self.c, recording_id, camera, self.day + WINDOW_START, length
            )

        got = self.call(put()).recording.generation
        want = self.model.jobs[index].source
        assert got == want, self.differs("PutRecording generation", got, want)

    @precondition(lambda self: bool(self.leases) and not self.model.policy_changed)
    @rule()
    def raise_policy(self) -> None:
        """Retires the run creator's authority (fence 3: POLICY_CHANGED)."""
        self.model.raise_policy()
        _, outcome = self.rpc(
            lambda: self.c.operator.RaisePolicyRevision(
                op.RaisePolicyRevisionRequest(), metadata=self.c.admin
            )
        )
        assert outcome == OK, self.differs("RaisePolicyRevision", outcome, OK)

    # invariants -------------------------------------------------------------------------

    @invariant()
    def one_live_lease_per_job(self) -> None:
        if self._model is None:
            return
        now = self.now()
        for job in self.model.jobs:
            live = [x for x in self.leases if x.job_index == job.index and self.model.live(x, now)]
            assert len(live) <= 1, f"model: job j{job.index} has live leases {live}"

    @invariant()
    def database_agrees(self) -> None:
        if self._model is None:
            return
        rows, receipts = self.call(self._read())
        assert len(rows) == len(self.model.jobs)
        for job, row in zip(self.model.jobs, rows, strict=True):
            want = Row.of(job)
            assert row == want, self.differs(f"job row j{job.index}", row, want)
            assert row.progress >= self.seen_progress.get(job.index, 0), "progress went down"
            self.seen_progress[job.index] = row.progress
            if job.index in self.seen_digest:
                assert row.result_sha256 == self.seen_digest[job.index], "a digest changed"
            if row.result_sha256 is not None:
                self.seen_digest[job.index] = row.result_sha256
        completed = [j for j in self.model.jobs if j.state == "completed"]
        assert len(receipts) == len(completed), self.differs(
            "receipts == completed jobs", len(receipts), len(completed)
        )
        want_receipts = [
            (j.index, j.receipt_generation, j.result_sha256, j.empties, j.dropped, j.committed_at)
            for j in completed
        ]
        assert receipts == want_receipts, self.differs("receipts", receipts, want_receipts)

    async def _read(self) -> tuple[list[Row], list[Receipt]]:
        async with self.c.db.connection() as connection:
            jobs = await connection.fetch(READ_JOBS, self.run_id)
            receipts = await connection.fetch(READ_RECEIPTS, self.run_id)
        return [Row(**dict(row)) for row in jobs], [
            (
                r["job_index"],
                r["generation"],
                r["result_sha256"],
                r["empties"],
                r["dropped"],
                r["committed_at"],
            )
            for r in receipts
        ]

    @invariant()
    def run_detail_agrees(self) -> None:
        """GetRun (docs/runs-and-jobs.md and the contract's field comments): the run's status,
        counts and finished_at; each job's state, generation, progress, failure reason, phase
        (leased jobs only) and updated_at (when it last changed state). One assertion per field,
        so that Hypothesis reports each disagreement as a bug of its own."""
        if self._model is None:
            return
        detail, model = self._run_detail(), self.model
        run = detail.run
        status = RUN_STATUSES[model.status(self.now())]
        assert run.status == status, self.differs("run status", run.status, status)
        done = [j for j in model.jobs if j.state == "completed"]
        counts = (
            run.counts.jobs_total,
            run.counts.jobs_queued,
            run.counts.jobs_leased,
            run.counts.jobs_completed,
            run.counts.jobs_failed,
            run.counts.jobs_cancelled,
            run.counts.jobs_expired,
            run.counts.slots_expected,
            run.counts.slots_empty,
            run.counts.slots_dropped,
            run.counts.slots_frame,
        )
        want_counts = (
            len(model.jobs),
            *(model.count(state) for state in JOB_STATES),
            sum(j.slot_count for j in model.jobs),
            sum(j.empties for j in done),
            sum(j.dropped for j in done),
            0,
        )
        assert counts == want_counts, self.differs("run counts", counts, want_counts)
        jobs = [(j.job_index, j.state, j.generation, j.progress_percent) for j in detail.jobs]
        want_jobs = [(j.index, JOB_STATES[j.state], j.generation, j.progress) for j in model.jobs]
        assert jobs == want_jobs, self.differs("run jobs", jobs, want_jobs)
        reasons = [j.failure_reason for j in detail.jobs]
        want_reasons = [FAILURE_REASONS[j.failure_reason] for j in model.jobs]
        assert reasons == want_reasons, self.differs(
            "JobSummary.failure_reason", reasons, want_reasons
        )
        phases = [j.phase for j in detail.jobs]
        want_phases = [phase_enum(j.phase if j.state == "leased" else None) for j in model.jobs]
        assert phases == want_phases, self.differs(
            "JobSummary.phase (leased jobs only)", phases, want_phases
        )
        updated = [aware(j.updated_at) for j in detail.jobs]
        want_updated = [j.changed_at for j in model.jobs]
        assert updated == want_updated, self.differs(
            "JobSummary.updated_at (when it last changed state)", updated, want_updated
        )
        finished = aware(run.finished_at) if run.HasField("finished_at") else None
        assert finished == model.finished_at(), self.differs(
            "Run.finished_at (absent while any job is queued or leased)",
            finished,
            model.finished_at(),
        )

    def _run_detail(self) -> run_pb2.RunDetail:
        reply, outcome = self.rpc(
            lambda: self.c.workshop.GetRun(
                ws.GetRunRequest(run_id=self.run_id), metadata=self.c.admin
            )
        )
        assert reply is not None, self.differs("GetRun", outcome, OK)
        return reply.detail


async def test_leases_and_fences_agree_with_the_reference_model(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s = await setup(c)
    second = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="processor-2")
    for camera in CAMERAS[2:]:
        await c.operator.PutCamera(op.PutCameraRequest(camera_id=camera), metadata=c.admin)
    shared = Shared(
        c=c,
        s=s,
        processors=(s.processor, bearer_metadata(second)),
        call=Bridge(asyncio.get_running_loop()),
        maintenance=Maintenance(c.db, c.clock, interval_seconds=60),
    )

    class Machine(LeaseMachine):
        def __init__(self) -> None:
            super().__init__(shared)

    await asyncio.to_thread(run_state_machine_as_test, Machine, settings=SETTINGS)
