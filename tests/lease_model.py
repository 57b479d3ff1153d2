"""A reference model of one run's jobs, leases and fences (docs/runs-and-jobs.md), without I/O.

`tests/service/test_coordinator_lease_model.py` drives the coordinator and this model with
the same steps and asserts they agree. The model is written from the spec and the
JobService contract, not from the implementation:

- States: queued -> leased -> completed, or the job ends failed, cancelled or
  expired. A lease lasts 5 minutes, never past the job's expiry; a lease whose
  expiry has passed is dead at once (LEASE_MISMATCH) even while the row still
  says `leased`, until maintenance rescues it.
- Fenced calls answer the first reason that applies, in this order: the job was
  cancelled (JOB_CANCELLED); it ended (JOB_FINISHED); the lease is not the job's
  live lease (LEASE_MISMATCH); the source recording moved on (SOURCE_CHANGED);
  the policy revision was raised (POLICY_CHANGED). The creator (an admin key),
  the reporters (workshop:run keys) and the code never change in these tests, so
  AUTHORITY_REVOKED, REPORTER_NOT_AUTHORIZED and CODE_MISMATCH never apply.
- Complete first settles against the receipt of the lease's own generation (a
  retry after a lost answer; the contract's "same job, generation and
  result_sha256"): the same digest returns that receipt (already committed),
  another is RESULT_CONFLICT. A call of any other generation is checked by the
  fences like every other write, so a stale lease hears JOB_FINISHED.
- Maintenance expires jobs whose source expired before it rescues lapsed leases;
  the third lapse fails the job with attempts_exhausted. Release does not count.
- Claim leases the first queued job in job order whose source has not expired.
  A queued job it meets on the way that can never commit (its recording moved on:
  fence 2; the policy revision was raised: fence 3) is not leased: it ends failed
  with source_changed or authority_lost (source first), and Claim goes on. Any
  fenced call (heartbeat, progress, complete, fail, release) refused with
  SOURCE_CHANGED or POLICY_CHANGED ends the job the same way (and is still
  answered with the refusal); later calls under its lease hear JOB_FINISHED.
- Progress is the maximum reported; an update is persisted (at most 100 per job)
  when it raises the percent or changes the phase. The stored phase outlives the
  lease in the job row; GetRun shows it for leased jobs only.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

LEASE = timedelta(minutes=5)
MAX_LAPSES = 3
MAX_PROGRESS_UPDATES = 100

OK = ("OK", "")
UNFINISHED = ("queued", "leased")
FINISHED = ("completed", "failed", "expired")
# Refusals of fences 2 and 3: the job can never commit.
DOOMING = ("SOURCE_CHANGED", "POLICY_CHANGED")

# (gRPC status code name, ErrorInfo reason); ("OK", "") for success.
Outcome = tuple[str, str]


def refused(reason: str) -> Outcome:
    """The outcome of a fence refusal."""
    return ("FAILED_PRECONDITION", reason)


RESULT_CONFLICT = ("ABORTED", "RESULT_CONFLICT")


@dataclasses.dataclass(frozen=True)
class Lease:
    """A lease reference as a processor holds it (possibly stale or forged)."""

    job_index: int
    generation: int
    token: str


@dataclasses.dataclass
class Job:
    index: int
    slot_count: int
    expires_at: datetime
    admitted_source: int = 1
    source: int = 1
    state: str = "queued"
    generation: int = 0
    token: str | None = None
    lease_expires_at: datetime | None = None
    lapses: int = 0
    progress: int = 0
    progress_updates: int = 0
    phase: str | None = None
    failure_reason: str | None = None
    input_cleared: bool = False
    result_sha256: str | None = None
    receipt_generation: int | None = None
    changed_at: datetime | None = None  # when it last changed state; None: since admission
    committed_at: datetime | None = None
    empties: int = 0
    dropped: int = 0

    def end_lease(self) -> None:
        self.token = None
        self.lease_expires_at = None

    def move(self, state: str, now: datetime) -> None:
        """Changes state; every change but a claim ends the lease."""
        self.state = state
        self.changed_at = now
        if state != "leased":
            self.end_lease()


@dataclasses.dataclass(frozen=True)
class Settled:
    """What Complete answers: the outcome and, when OK, the receipt it returns."""

    outcome: Outcome
    generation: int | None = None
    committed_at: datetime | None = None
    already_committed: bool = False


@dataclasses.dataclass(frozen=True)
class Pass:
    requeued: int = 0
    exhausted: int = 0
    expired: int = 0


@dataclasses.dataclass
class RunModel:
    jobs: list[Job]
    test_mode: bool
    run_expires_at: datetime | None
    policy_changed: bool = False

    # fences ---------------------------------------------------------------------------

    def fence(self, lease: Lease, now: datetime) -> str:
        """'' when every fence holds for `lease`, else the reason that wins."""
        job = self.jobs[lease.job_index]
        if job.state == "cancelled":
            return "JOB_CANCELLED"
        if job.state in FINISHED:
            return "JOB_FINISHED"
        if (
            job.state != "leased"
            or job.generation != lease.generation
            or job.token != lease.token
            or job.lease_expires_at is None
            or job.lease_expires_at <= now
        ):
            return "LEASE_MISMATCH"
        if job.source != job.admitted_source:
            return "SOURCE_CHANGED"
        if self.policy_changed:
            return "POLICY_CHANGED"
        return ""

    def met(self, lease: Lease, now: datetime) -> str:
        """`fence` as a fenced call meets it: a refusal that can never pass ends the job."""
        reason = self.fence(lease, now)
        if reason in DOOMING:
            self.end_if_doomed(self.jobs[lease.job_index], now)
        return reason

    def doomed(self, job: Job) -> str | None:
        """The failure reason when fence 2 or 3 fails for `job` (it can never commit)."""
        if job.source != job.admitted_source:
            return "source_changed"
        if self.policy_changed:
            return "authority_lost"
        return None

    def end_if_doomed(self, job: Job, now: datetime) -> bool:
        """Fails `job` when it can never commit; whether it did."""
        reason = self.doomed(job)
        if reason is None:
            return False
        job.move("failed", now)
        job.failure_reason = reason
        return True

    def live(self, lease: Lease, now: datetime) -> bool:
        """Whether `lease` is the job's live lease (fence 1 holds)."""
        return self.fence(lease, now) not in ("JOB_CANCELLED", "JOB_FINISHED", "LEASE_MISMATCH")

    def lease_until(self, job: Job, now: datetime) -> datetime:
        return min(now + LEASE, job.expires_at)

    # processor calls ------------------------------------------------------------------

    def next_claim(self, now: datetime) -> Job | None:
        """The job Claim leases next: the first queued job, in job order, not yet expired,
        that can still commit. The doomed ones before it end failed (a Claim's effect)."""
        for job in self.jobs:
            if job.state == "queued" and job.expires_at > now and not self.end_if_doomed(job, now):
                return job
        return None

    def claimed(self, job: Job, token: str, now: datetime) -> None:
        job.move("leased", now)
        job.generation += 1
        job.token = token
        job.lease_expires_at = self.lease_until(job, now)

    def heartbeat(self, lease: Lease, now: datetime) -> tuple[Outcome, datetime | None]:
        reason = self.met(lease, now)
        if reason:
            return refused(reason), None
        job = self.jobs[lease.job_index]
        job.lease_expires_at = self.lease_until(job, now)
        return OK, job.lease_expires_at

    def progress(
        self, lease: Lease, percent: int, phase: str | None, now: datetime
    ) -> tuple[Outcome, int | None, bool]:
        """Outcome, the stored progress and whether this update was persisted."""
        reason = self.met(lease, now)
        if reason:
            return refused(reason), None, False
        job = self.jobs[lease.job_index]
        job.lease_expires_at = self.lease_until(job, now)  # a report renews its lease
        changes = percent > job.progress or (phase is not None and phase != job.phase)
        if job.progress_updates < MAX_PROGRESS_UPDATES and changes:
            job.progress = max(job.progress, percent)
            job.phase = phase if phase is not None else job.phase
            job.progress_updates += 1
            return OK, job.progress, True
        return OK, job.progress, False

    def complete(
        self, lease: Lease, digest: str, empties: int, dropped: int, now: datetime
    ) -> Settled:
        job = self.jobs[lease.job_index]
        if job.result_sha256 is not None and job.receipt_generation == lease.generation:
            if job.result_sha256 != digest:
                return Settled(RESULT_CONFLICT)
            return Settled(OK, job.receipt_generation, job.committed_at, already_committed=True)
        reason = self.met(lease, now)
        if reason:
            return Settled(refused(reason))
        job.move("completed", now)
        job.progress = 100
        job.result_sha256 = digest
        job.receipt_generation = lease.generation
        job.committed_at = now
        job.empties, job.dropped = empties, dropped
        return Settled(OK, lease.generation, now)

    def fail(self, lease: Lease, now: datetime) -> Outcome:
        reason = self.met(lease, now)
        job = self.jobs[lease.job_index]
        if reason:
            return refused(reason)
        job.move("failed", now)
        job.failure_reason = "processor_failed"
        return OK

    def release(self, lease: Lease, now: datetime) -> Outcome:
        reason = self.met(lease, now)
        if reason:
            return refused(reason)
        job = self.jobs[lease.job_index]
        job.move("queued", now)
        return OK

    # operator and user calls ----------------------------------------------------------

    def cancel(self, now: datetime) -> int:
        cancelled = 0
        for job in self.jobs:
            if job.state in UNFINISHED:
                job.move("cancelled", now)
                cancelled += 1
        return cancelled

    def replace_source(self, index: int) -> None:
        self.jobs[index].source += 1

    def raise_policy(self) -> None:
        self.policy_changed = True

    # maintenance ----------------------------------------------------------------------

    def maintain(self, now: datetime) -> Pass:
        expired = requeued = exhausted = 0
        for job in self.jobs:  # expiry first: an expired job is not retried
            if job.state in UNFINISHED and job.expires_at <= now:
                job.move("expired", now)
                job.input_cleared = True
                expired += 1
        for job in self.jobs:
            if (
                job.state == "leased"
                and job.lease_expires_at is not None
                and job.lease_expires_at <= now
                and job.expires_at > now
            ):
                job.lapses += 1
                if job.lapses >= MAX_LAPSES:
                    job.move("failed", now)
                    job.failure_reason = "attempts_exhausted"
                    exhausted += 1
                else:
                    job.move("queued", now)
                    requeued += 1
        return Pass(requeued=requeued, exhausted=exhausted, expired=expired)

    # read side ------------------------------------------------------------------------

    def count_unfinished(self) -> int:
        return sum(job.state in UNFINISHED for job in self.jobs)

    def count(self, state: str) -> int:
        return sum(job.state == state for job in self.jobs)

    def status(self, now: datetime) -> str:
        """The run status of docs/runs-and-jobs.md (a test run past its hour is expired)."""
        if self.run_expires_at is not None and self.run_expires_at <= now:
            return "expired"
        for state, status in (
            ("leased", "running"),
            ("queued", "queued"),
            ("failed", "failed"),
            ("cancelled", "cancelled"),
            ("expired", "expired"),
        ):
            if self.count(state):
                return status
        return "completed"

    def finished_at(self) -> datetime | None:
        """When the last job ended; None while any job is queued or leased."""
        if any(job.state in UNFINISHED for job in self.jobs):
            return None
        return max(job.changed_at for job in self.jobs if job.changed_at is not None)
