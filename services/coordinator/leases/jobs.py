"""The processor's side of jobs (docs/leases-and-fences.md): claim, heartbeat, progress, complete,
fail and release, every write under its lease and the four fences.

The database functions of migrations 0002 and 0003 do each step in one round trip
and answer '' or the reason a fence refused; this module turns reasons into errors.
Each job's slot facts are immutable, so the ones a Claim returns are kept (bounded)
for its Complete, which then checks the result without reading the job first; the
commit verifies those facts under the job's lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TypedDict, TypeVar

from services.coordinator.identity import auth
from services.coordinator.identity.auth import Principal, ScopeName
from services.coordinator.leases import results
from services.coordinator.leases.boxes import FrameBoxes, stored_boxes
from services.coordinator.leases.jobs_params import (
    JobCheckLease,
    JobClaim,
    JobCommitPrepare,
    JobComplete,
    JobCompleteBare,
    JobCompleteBareThenClaim,
    JobFail,
    JobHeartbeat,
    JobHeartbeatMany,
    JobProgress,
    JobRelease,
)
from services.coordinator.leases.recorded import RecordedBoxes, Remembered
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import (
    Connection,
    Database,
    InvalidAuthorizationSpecificationError,
    Params,
    Row,
    bind,
    fetch_all,
    fetch_one,
    sql,
)
from services.coordinator.platform.errors import (
    FENCE_MESSAGES,
    DatabaseUnavailable,
    InvalidField,
    NotFound,
    ResultConflict,
    ResultInvalid,
    ScopeMissing,
    fenced,
)
from services.coordinator.platform.fields import check_request_id
from services.coordinator.platform.metrics import CLAIM_SECONDS, COMMIT_BOXES
from services.coordinator.review import reviews
from services.coordinator.runs.events import RunEvents
from services.coordinator.runs.rows import SnapshotRecordingRow
from services.coordinator.runs.snapshots import Frozen, SnapshotCache
from workshop.kit.box_values import NonFiniteBox
from workshop.kit.metrics import timed
from workshop.v1 import jobs_pb2

LEASE = timedelta(minutes=5)  # COORDINATOR_LEASE_SECONDS
HEARTBEAT_INTERVAL = timedelta(seconds=45)
MAX_FAILURE_MESSAGE = 2000
PHASES = ("downloading", "decoding", "labeling", "publishing", "committing")
# Slot facts kept from claims: a few per processor are in flight at a time.
FACTS_CACHE_SIZE = 20_000
# The most jobs one Claim leases, and leases one Heartbeat renews (docs/leases-and-fences.md).
log = logging.getLogger(__name__)

MAX_CLAIM_JOBS = 100
MAX_HEARTBEAT_LEASES = 1000

A = TypeVar("A", bound=Row)


def heartbeat_interval(lease: timedelta) -> timedelta:
    """The heartbeat interval Claim hands out: 45 s for the default 5-minute lease, the
    same share (0.15) of a shorter one, so that a renewal is due well before a lapse."""
    return min(HEARTBEAT_INTERVAL, lease * 0.15)


@dataclasses.dataclass(frozen=True)
class Lease:
    run_id: str
    job_index: int
    generation: int
    token: uuid.UUID

    @property
    def job_id(self) -> str:
        return job_id(self.job_index)


def job_id(index: int) -> str:
    """A job's id within its run: 'j' + its index in job order."""
    return f"j{index}"


def parse_job_id(value: str) -> int:
    if not value.startswith("j") or not value[1:].isdigit():
        raise InvalidField(f"job_id {value!r} is malformed; job ids look like 'j0', 'j1', ...")
    return int(value[1:])


def lease_from(run_id: str, job: str, generation: int, token: str) -> Lease:
    """A lease reference from a request's fields, checked for shape."""
    if not run_id:
        raise InvalidField("lease.run_id is required.")
    if generation < 1:
        raise InvalidField("lease.generation must be 1 or more (from Claim).")
    try:
        parsed = uuid.UUID(token)
    except ValueError:
        raise InvalidField("lease.token is malformed; send the token Claim returned.") from None
    return Lease(run_id, parse_job_id(job), generation, parsed)


@dataclasses.dataclass(frozen=True, slots=True)
class SlotFacts(Row):
    """A job's slots as admitted; they never change."""

    slot_count: int
    first_slot_at: datetime
    interval_ms: int  # slot length, exact milliseconds


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeIdentity(Row):
    """What a Claim checks of its runtime; it never changes."""

    runtime_id: str
    device_id: str
    code_sha256: str


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimedJob(Row):
    """A job as job_claim leased it, with its recording as the snapshot froze it."""

    run_id: str
    job_index: int
    generation: int  # the lease's
    lease_token: uuid.UUID
    lease_expires_at: datetime
    expires_at: datetime
    camera_id: str
    recording_id: str
    recording_generation: int
    facts: SlotFacts
    sha256: str  # the recording's, as are the columns below
    byte_size: int
    object_key: str
    start_at: datetime
    end_at: datetime
    fps: float

    def recording(self) -> SnapshotRecordingRow:
        return SnapshotRecordingRow(
            job_index=self.job_index,
            recording_id=self.recording_id,
            camera_id=self.camera_id,
            generation=self.recording_generation,
            sha256=self.sha256,
            byte_size=self.byte_size,
            object_key=self.object_key,
            start_at=self.start_at,
            end_at=self.end_at,
            fps=self.fps,
            slot_count=self.facts.slot_count,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class StoredReceipt(Row):
    """The receipt columns of job_facts and job_complete (all None: not committed)."""

    receipt_generation: int | None
    receipt_sha256: str | None
    receipt_committed_at: datetime | None
    receipt_items_saved: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class JobFactsRow(Row):
    """What Complete checks a result against, and the job's receipt if committed."""

    facts: SlotFacts
    receipt: StoredReceipt


@dataclasses.dataclass(frozen=True, slots=True)
class Renewal(Row):
    """job_heartbeat's answer: a refusal, or the renewed lease's expiry."""

    reason: str
    lease_expires_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseRenewal(Row):
    """One row of job_heartbeat_many: a lease's 1-based position, and its refusal or expiry."""

    ordinal: int
    reason: str
    lease_expires_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class ProgressAnswer(Row):
    """job_progress's answer: a refusal, or the job's progress, whether it was stored and
    the lease's new lapse time (a progress report renews its lease)."""

    reason: str
    progress: int | None
    persisted: bool
    lease_expires_at: datetime | None


@dataclasses.dataclass(frozen=True)
class ClaimPlan:
    """A Claim checked and ready to run: what job_claim_many needs beyond the clock."""

    runtime_id: str
    claimer: str
    cameras: list[str] | None
    request_id: str | None
    max_jobs: int


@dataclasses.dataclass(frozen=True)
class ClaimAsk:
    """A Claim as the processor asks it (Claim, or Complete's next claim)."""

    runtime_id: str
    code_sha256: str
    request_id: str = ""
    max_jobs: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class CommitAnswer(Row):
    """job_complete's answer: a refusal or '', and the receipt it settled on."""

    reason: str
    receipt: StoredReceipt
    runtime_id: str | None  # the job's, when it committed: its end is announced there


@dataclasses.dataclass(frozen=True, slots=True)
class CommitThenClaim(Row):
    """A row of job_complete_bare_then_claim: the commit's answer, and a job its next claim
    leased (claimed None: none, and `job`'s columns are all NULL)."""

    answer: CommitAnswer
    claimed: bool | None
    job: ClaimedJob


@dataclasses.dataclass(frozen=True, slots=True)
class CommitPrepared(Row):
    """job_commit_prepare's answer, one row: the job's camera, its items' timelines'
    context (review's) and, for each item that left its boxes to its upload's preview (in
    item order), the boxes of that preview's row as stored (when asked for; NULL: no such
    row) and the row's staged_at (NULL: no such row)."""

    camera_id: str
    context: reviews.ContextColumns
    recorded_boxes: list[str | None]
    recorded_staged_at: list[datetime | None]

    def still_recorded(self, remembered: Sequence[Remembered]) -> bool:
        """Whether every remembered preview's row is still the one recorded then."""
        return all(
            staged_at == row_staged_at
            for (staged_at, _), row_staged_at in zip(
                remembered, self.recorded_staged_at, strict=True
            )
        )

    def new_items(
        self, items: Sequence[results.Item], remembered: Sequence[Remembered] | None = None
    ) -> list[reviews.NewItem]:
        """The items with their boxes, as review groups them: those sent with the result,
        or those recorded with the upload's preview (`remembered`, in order, when the
        coordinator recorded them itself and still_recorded; else read from the rows:
        '[]' when none was, which the commit then refuses), as Postgres reads them once
        saved (boxes.stored_boxes)."""
        sent = stored_boxes([item.boxes for item in items if item.boxes is not None])
        kept: list[FrameBoxes] = (
            [boxes for _, boxes in remembered]
            if remembered is not None
            else stored_boxes([text or "[]" for text in self.recorded_boxes])
        )
        taken, recorded = iter(sent), iter(kept)
        return [
            reviews.NewItem(
                item.item_id,
                item.bucket_id,
                item.frame_time,
                [
                    reviews.Detection(
                        item.item_id, index, item.frame_time, class_name, x, y, w, h, score
                    )
                    for index, class_name, score, x, y, w, h in (
                        next(recorded) if item.boxes is None else next(taken)
                    )
                ],
            )
            for item in items
        ]


def box_counts(new_items: Sequence[reviews.NewItem]) -> BoxCounts:
    """The items' boxes by bucket and class as detected (what the summary's class counts
    add), as job_complete's count_ arrays; an item without boxes adds none."""
    counts = Counter(
        (item.bucket_id, detection.class_name)
        for item in new_items
        for detection in item.detections
        if detection.box_index >= 0
    )
    pairs = sorted(counts)
    return {
        "count_buckets": [bucket for bucket, _ in pairs],
        "count_classes": [class_name for _, class_name in pairs],
        "count_boxes": [counts[pair] for pair in pairs],
    }


class ItemColumns(TypedDict):
    """A commit's items' columns for job_complete (job_commit_prepare takes their buckets
    and times too)."""

    item_boxes: list[str | None]
    item_keys: list[str]
    item_buckets: list[str]
    item_times: list[datetime]


class BoxCounts(TypedDict):
    """A commit's boxes by bucket and class, as job_complete's count_ arrays."""

    count_buckets: list[str]
    count_classes: list[str]
    count_boxes: list[int]


@dataclasses.dataclass(frozen=True)
class Claimed:
    job: ClaimedJob
    frozen: Frozen


@dataclasses.dataclass(frozen=True)
class Receipt:
    run_id: str
    job_index: int
    generation: int
    result_sha256: str
    committed_at: datetime
    items_saved: int


def raise_for(reason: str | None, lease: Lease) -> None:
    """Turns a database function's refusal into the error the processor hears."""
    if not reason:
        return
    if reason == "NOT_FOUND":
        raise NotFound("job", f"{lease.run_id}/{lease.job_id}", "No such run or job.")
    if reason in FENCE_MESSAGES:
        raise fenced(reason)
    if reason == "UPLOAD_NOT_STAGED":
        raise ResultInvalid(
            "An upload the result names is not staged under this lease with that digest."
        )
    if reason == "BOXES_NOT_RECORDED":
        raise ResultInvalid(
            "An output with boxes_recorded names an upload that is no recorded preview: "
            "send its boxes."
        )
    raise InvalidField(f"Refused: {reason}.")


def reporter(who: Principal) -> str:
    """The key whose authority fence 4 checks: a workshop:run (or admin) key."""
    auth.require(who, ScopeName.WORKSHOP_RUN)
    if not who.key_id:
        raise ScopeMissing("Job calls need a workshop:run key, not a session.")
    return who.key_id


# Told of attempts (run id, job index, lease generation) that ended here: the timeline's
# trace export (leases.timeline.Timelines.ended).
AttemptsEnded = Callable[[Sequence[tuple[str, int, int | None]]], None]


def nothing_ended(ended: Sequence[tuple[str, int, int | None]]) -> None:
    return None


class JobsApi:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        snapshots: SnapshotCache,
        events: RunEvents,
        *,
        lease: timedelta = LEASE,
        attempts_ended: AttemptsEnded = nothing_ended,
        recorded: RecordedBoxes | None = None,
    ) -> None:
        self.db = db
        # the boxes the previews room recorded with a full run's previews (leases.recorded)
        self.recorded = RecordedBoxes() if recorded is None else recorded
        self.clock = clock
        self.snapshots = snapshots
        self.events = events  # announces what the commits of claims and completes changed
        self.attempts_ended = attempts_ended
        self.lease = lease
        self.heartbeat_interval = heartbeat_interval(lease)
        self._runtimes: dict[str, RuntimeIdentity] = {}
        self._facts: dict[tuple[str, int], SlotFacts] = {}

    async def _runtime(self, runtime_id: str) -> RuntimeIdentity:
        # Identity fields of a runtime never change: cache them.
        found = self._runtimes.get(runtime_id)
        if found is None:
            async with self.db.connection() as connection:
                found = await fetch_one(
                    connection, RuntimeIdentity, sql("jobs", "runtime_identity"), runtime_id
                )
            if found is None:
                raise NotFound("runtime", runtime_id, f"Runtime {runtime_id!r} is not registered.")
            self._runtimes[runtime_id] = found
        return found

    async def claim(
        self, who: Principal, runtime_id: str, code_sha256: str, request_id: str = ""
    ) -> Claimed | None:
        """Leases the next claimable job, or None (claim_many of one job)."""
        plan = await self.plan_claim(who, runtime_id, code_sha256, request_id)
        claimed = await self.claim_many(plan)
        return claimed[0] if claimed else None

    async def claim_waiting(
        self, who: Principal, ask: ClaimAsk, wait_seconds: float, events: RunEvents
    ) -> list[Claimed]:
        """Claim: leases up to `ask.max_jobs` jobs, waiting up to `wait_seconds` for one to
        be queued; [] when none came.

        Subscribed before the first try, so a job queued between a try and the wait still
        wakes it; every try carries the same request id, so a lease taken by a try whose
        answer is lost is answered again."""
        plan = await self.plan_claim(
            who, ask.runtime_id, ask.code_sha256, ask.request_id, ask.max_jobs
        )
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_seconds
        async with events.claimable(ask.runtime_id) as queued:
            while True:
                claimed = await self.claim_many(plan)
                if claimed:
                    return claimed
                left = until - loop.time()
                if left <= 0:
                    return []
                try:
                    await asyncio.wait_for(queued.wait(), left)
                except TimeoutError:
                    return []

    async def plan_claim(
        self,
        who: Principal,
        runtime_id: str,
        code_sha256: str,
        request_id: str = "",
        max_jobs: int = 1,
    ) -> ClaimPlan:
        """Checks a Claim without leasing anything (Complete checks its next claim before
        it commits): the request id, the runtime, the key's device and cameras, the code."""
        remembered_as = check_request_id("request_id", request_id)
        # The scope before the runtime: a key that may not claim learns no runtime's existence.
        reporter(who)
        if max_jobs > MAX_CLAIM_JOBS:
            raise InvalidField(f"max_jobs must be 0..{MAX_CLAIM_JOBS} (got {max_jobs}).")
        runtime = await self._runtime(runtime_id)
        cameras = _claimable_cameras(who, runtime.device_id)
        if code_sha256 != runtime.code_sha256:
            raise fenced("CODE_MISMATCH")
        return ClaimPlan(runtime_id, who.key_id, cameras, remembered_as, max(1, max_jobs))

    @timed(CLAIM_SECONDS)  # every Claim (and Complete's next claim) leases here
    async def claim_many(self, plan: ClaimPlan) -> list[Claimed]:
        """Leases up to plan.max_jobs claimable jobs in claim order, in one statement, each
        under its own lease. With a request id the claim is idempotent: the same key
        sending the same id again (its answer was lost) gets the leases that claim took,
        unchanged, while they are held, not other jobs."""
        try:
            async with self.db.connection() as connection:
                jobs = await fetch_all(
                    connection,
                    ClaimedJob,
                    *bind(
                        JobClaim(
                            runtime_id=plan.runtime_id,
                            claimer=plan.claimer,
                            cameras=plan.cameras,
                            now=self.clock.now(),
                            lease=self.lease,
                            request_id=plan.request_id,
                            max_jobs=plan.max_jobs,
                        )
                    ),
                )
        except InvalidAuthorizationSpecificationError:
            # The key was revoked (or expired, or its user disabled) after this
            # process authenticated it: what a fresh authentication would answer.
            raise auth.rejected("key is no longer valid") from None
        return await self._leased(jobs)

    async def _leased(self, jobs: list[ClaimedJob]) -> list[Claimed]:
        """The jobs a claim leased, each with its run's snapshot; their runs announced (the
        claim notifies nothing) and their slot facts remembered for their Complete."""
        self.events.announce_runs({job.run_id for job in jobs})
        claimed = []
        for job in jobs:
            self._remember(job.run_id, job.job_index, job.facts)
            claimed.append(Claimed(job, await self.snapshots.get(job.run_id)))
        return claimed

    def _remember(self, run_id: str, job_index: int, facts: SlotFacts) -> None:
        if len(self._facts) >= FACTS_CACHE_SIZE:
            del self._facts[next(iter(self._facts))]  # the oldest claim
        self._facts[(run_id, job_index)] = facts

    async def heartbeat(self, who: Principal, lease: Lease) -> datetime:
        renewal = await self._answer(
            Renewal,
            JobHeartbeat(
                **lease_fields(lease),
                reporter=reporter(who),
                now=self.clock.now(),
                lease=self.lease,
            ),
        )
        raise_for(renewal.reason, lease)
        assert renewal.lease_expires_at is not None  # set whenever nothing refused
        return renewal.lease_expires_at

    async def heartbeat_many(
        self, who: Principal, leases: list[Lease]
    ) -> list[tuple[str, datetime | None]]:
        """Renews every lease in one statement, each under its own fences; answers, in the
        order given, '' and the new lapse time, or the reason it no longer holds."""
        if len(leases) > MAX_HEARTBEAT_LEASES:
            raise InvalidField(
                f"leases: at most {MAX_HEARTBEAT_LEASES} per Heartbeat (got {len(leases)})."
            )
        key = reporter(who)
        # Sorted, so that two batches lock the jobs they share in one order (no deadlock).
        order = sorted(range(len(leases)), key=lambda i: (leases[i].run_id, leases[i].job_index))
        ordered = [leases[i] for i in order]
        async with self.db.connection() as connection:
            rows = await fetch_all(
                connection,
                LeaseRenewal,
                *bind(
                    JobHeartbeatMany(
                        **lease_columns(ordered),
                        reporter=key,
                        now=self.clock.now(),
                        lease=self.lease,
                    )
                ),
            )
        answers: list[tuple[str, datetime | None]] = [("", None)] * len(leases)
        for row in rows:
            answers[order[row.ordinal - 1]] = (row.reason, row.lease_expires_at)
        return answers

    async def progress(
        self, who: Principal, lease: Lease, percent: int, phase: str | None
    ) -> tuple[int, bool, datetime]:
        """Records progress and renews the lease: the progress stored, whether this
        report was persisted, and the lease's new lapse time."""
        if not 0 <= percent <= 100:
            raise InvalidField(f"percent must be 0..100 (got {percent}).")
        answer = await self._answer(
            ProgressAnswer,
            JobProgress(
                **lease_fields(lease),
                reporter=reporter(who),
                percent=percent,
                phase=phase,
                now=self.clock.now(),
                lease=self.lease,
            ),
        )
        raise_for(answer.reason, lease)
        # set whenever nothing refused
        assert answer.progress is not None
        assert answer.lease_expires_at is not None
        return answer.progress, answer.persisted, answer.lease_expires_at

    async def fail(self, who: Principal, lease: Lease, message: str) -> None:
        reason = await self._reason(
            JobFail(
                **lease_fields(lease),
                reporter=reporter(who),
                message=message[:MAX_FAILURE_MESSAGE],
                now=self.clock.now(),
            )
        )
        raise_for(reason, lease)
        self.attempts_ended([(lease.run_id, lease.job_index, lease.generation)])

    async def release(self, who: Principal, lease: Lease) -> None:
        reason = await self._reason(
            JobRelease(**lease_fields(lease), reporter=reporter(who), now=self.clock.now())
        )
        raise_for(reason, lease)
        self.attempts_ended([(lease.run_id, lease.job_index, lease.generation)])

    async def complete(
        self,
        who: Principal,
        lease: Lease,
        *,
        code_sha256: str,
        result: jobs_pb2.JobResult,
        result_sha256: str,
        decoder: str,
        then: ClaimPlan | None = None,
    ) -> tuple[Receipt, bool, list[Claimed] | None]:
        """Commits the result; returns the receipt, whether it was already committed, and
        the jobs `then` (a next claim, checked) leased in the commit's own statement when
        the commit could take it along (None: not claimed there: see complete_then_claim).

        One round trip when the job's slot facts are known from its Claim: the result
        is checked against them, and job_complete verifies them, runs the fences and
        commits, or answers with this lease's receipt if it already committed. Without
        them (another replica claimed the job) the facts and receipt are read first.
        """
        key = reporter(who)
        digest = results.check_digest(result, result_sha256)
        facts = self._facts.get((lease.run_id, lease.job_index))
        for _ in range(2):
            if facts is None:
                facts, settled = await self._facts_or_receipt(lease, digest)
                if settled is not None:
                    return settled, True, None
            try:
                checked = await self._checked(lease, result, facts)
            except (ResultInvalid, NonFiniteBox):
                # An invalid retry of a committed lease is a conflict, as it was
                # before this process knew the facts: the receipt decides first.
                await self._facts_or_receipt(lease, digest)
                raise
            answer, leased = await self._commit(
                lease, key, code_sha256, digest, decoder, facts, checked, then
            )
            if answer.reason != "FACTS_MISMATCH":
                break
            # Never expected (slot facts are immutable): forget them and read them again.
            self._facts.pop((lease.run_id, lease.job_index), None)
            facts = None
        reason = answer.reason
        if reason == "":
            # committed: job_complete notified nothing (the waiters of the run, and the
            # Claims of its runtime, which the job's end may have given work)
            self.events.announce_runs((lease.run_id,))
            if answer.runtime_id is not None:
                self.events.announce_claimable((answer.runtime_id,))
            self._facts.pop((lease.run_id, lease.job_index), None)
            self.attempts_ended([(lease.run_id, lease.job_index, lease.generation)])
            claimed = None if leased is None else await self._leased(leased)
            return _receipt(lease, digest, answer.receipt), False, claimed
        if answer.receipt.receipt_sha256 is not None:
            # A retry of this lease's own commit (the first answer was lost).
            return _receipt(lease, digest, answer.receipt), True, None
        raise_for(reason, lease)
        raise AssertionError(f"job_complete answered {reason!r}")  # pragma: no cover

    async def complete_then_claim(
        self,
        who: Principal,
        lease: Lease,
        *,
        code_sha256: str,
        result: jobs_pb2.JobResult,
        result_sha256: str,
        decoder: str,
        then: ClaimAsk | None,
    ) -> tuple[Receipt, bool, list[Claimed] | None]:
        """Complete (see `complete`), then with `then` the next claim: the receipt, whether
        it was already committed, and the jobs claimed ([] none queued; None when not
        asked or when that claim failed).

        The next claim is checked before the commit, so a malformed one commits nothing;
        it runs after the commit, and a failure there must not hide the receipt, so it
        answers None and the next Claim hears why."""
        plan = None
        if then is not None:
            plan = await self.plan_claim(
                who, then.runtime_id, then.code_sha256, then.request_id, then.max_jobs
            )
        receipt, already, claimed = await self.complete(
            who,
            lease,
            code_sha256=code_sha256,
            result=result,
            result_sha256=result_sha256,
            decoder=decoder,
            then=plan,
        )
        if plan is None or claimed is not None:
            return receipt, already, claimed
        try:
            claimed = await self.claim_many(plan)
        except Exception:
            log.warning("the claim after a commit failed", exc_info=True)
            return receipt, already, None
        return receipt, already, claimed

    async def _facts_or_receipt(
        self, lease: Lease, digest: str
    ) -> tuple[SlotFacts, Receipt | None]:
        """The job's slot facts, and this lease's receipt when it already committed."""
        async with self.db.connection() as connection:
            row = await fetch_one(
                connection, JobFactsRow, sql("jobs", "job_facts"), lease.run_id, lease.job_index
            )
        if row is None:
            raise_for("NOT_FOUND", lease)
            raise AssertionError("raise_for refuses NOT_FOUND")  # pragma: no cover
        return row.facts, _settled(row.receipt, lease, digest)

    async def _checked(
        self, lease: Lease, result: jobs_pb2.JobResult, facts: SlotFacts
    ) -> results.CheckedResult:
        frozen = await self.snapshots.get(lease.run_id)
        return results.check_result(
            result,
            results.JobFacts(
                slot_count=facts.slot_count,
                first_slot_at=facts.first_slot_at,
                interval=timedelta(milliseconds=facts.interval_ms),
                window_end=frozen.window_end,
                dropped_allowed=frozen.dropped_allowed,
                full_run=frozen.full_run,
                output_buckets=frozen.output_buckets,
            ),
            run_id=lease.run_id,
            job_index=lease.job_index,
        )

    async def _commit(
        self,
        lease: Lease,
        key: str,
        code_sha256: str,
        digest: str,
        decoder: str,
        facts: SlotFacts,
        checked: results.CheckedResult,
        then: ClaimPlan | None = None,
    ) -> tuple[CommitAnswer, list[ClaimedJob] | None]:
        """job_complete's answer, and the jobs `then` leased in the same statement (None:
        not claimed there; only a commit that saves nothing claims in its statement)."""
        items = checked.items
        uploads = checked.uploads
        now = self.clock.now()
        # Each of the items' columns built once: the prepare statement and the commit share some.
        columns = ItemColumns(
            item_boxes=[i.boxes for i in items],  # NULL: the boxes recorded with the preview
            item_keys=[i.object_key for i in items],
            item_buckets=[i.bucket_id for i in items],
            item_times=[i.frame_time for i in items],
        )

        # What every commit names: the lease, who reports, the result and its slot counts.
        result = ResultFields(
            **lease_fields(lease),
            reporter=key,
            code_sha256=code_sha256,
            result_sha256=digest,
            decoder=decoder,
            slot_count=facts.slot_count,
            first_slot_at=facts.first_slot_at,
            interval_ms=facts.interval_ms,
            frames=checked.frames,
            empties=checked.empties,
            dropped=checked.dropped,
            now=now,
        )

        def complete(
            grouping: reviews.Grouping,
            sightings: list[str | None],
            counts: BoxCounts | None = None,
        ) -> JobComplete:
            """The commit's parameters, built once the grouping is known."""
            return JobComplete(
                **result,
                upload_keys=[u.object_key for u in uploads],
                upload_sha256s=[u.sha256 for u in uploads],
                upload_slots=[u.slot_index for u in uploads],
                item_ids=[i.item_id for i in items],
                item_slots=[i.slot_index for i in items],
                item_steps=[i.step_id for i in items],
                item_sightings=sightings,
                item_sha256s=[i.sha256 for i in items],
                **columns,
                # what the grouping changed besides the items
                **grouping.changes_columns(),
                camera_id=grouping.camera_id,
                **(counts or {"count_buckets": [], "count_classes": [], "count_boxes": []}),
                # the review columns of the sightings it makes whose review it knows
                **grouping.new_reviews(),
            )

        if not items:  # nothing saved, so no upload either: one statement, its arrays empty
            if then is not None:
                return await self._commit_bare_then_claim(result, then)
            return await self._answer(CommitAnswer, JobCompleteBare(**result)), None
        ungrouped = reviews.Grouping(lease.run_id, "")
        # One transaction with the sightings and counters of the items it saves: the items
        # are grouped before they are written (review's plan_grouping, under the job's and
        # then the timelines' locks, which job_commit_prepare takes as it reads what the
        # grouping needs), each written once with its sightings, so no read ever sees items
        # without them; job_complete then writes the grouping's other changes.
        # The boxes the items left to their previews: as this coordinator recorded them,
        # when it did (and their rows are still those, job_commit_prepare checks), else
        # read from the rows.
        recorded_keys = [i.object_key for i in items if i.boxes is None]
        remembered = self.recorded.take(recorded_keys)
        async with self.db.transaction() as connection:

            async def prepare(read_boxes: bool) -> CommitPrepared | None:
                return await fetch_one(
                    connection,
                    CommitPrepared,
                    *bind(
                        JobCommitPrepare(
                            run_id=lease.run_id,
                            job_index=lease.job_index,
                            item_buckets=columns["item_buckets"],
                            item_times=columns["item_times"],
                            recorded_keys=recorded_keys,
                            read_boxes=read_boxes,
                        )
                    ),
                )

            prepared = await prepare(read_boxes=not remembered)
            if prepared is not None and remembered and not prepared.still_recorded(remembered):
                remembered = None  # recorded again since: the rows' boxes
                prepared = await prepare(read_boxes=True)
            if prepared is None:  # the job is gone: nothing to group, and the commit refuses it
                commit = complete(ungrouped, [None for _ in items])
                return await self._answer_on(connection, CommitAnswer, commit), None
            if recorded_keys:
                COMMIT_BOXES.labels("remembered" if remembered else "rows").inc()
            new_items = prepared.new_items(items, remembered or None)
            grouping = reviews.plan_grouping(
                lease.run_id,
                prepared.camera_id,
                new_items,
                prepared.context.boxes(),
                sorted(set(columns["item_buckets"])),
            )
            commit = complete(
                grouping, [grouping.literal(i.item_id) for i in items], box_counts(new_items)
            )
            answer = await self._answer_on(connection, CommitAnswer, commit)
            if not answer.reason:
                # the review queue's columns of the sightings the commit made or changed
                # but could not set itself (refresh_sightings skips the round trip if none)
                full, appended = grouping.refreshed()
                await reviews.refresh_sightings(
                    connection, lease.run_id, full, appended, commit.item_ids
                )
            return answer, None

    async def _commit_bare_then_claim(
        self, result: ResultFields, then: ClaimPlan
    ) -> tuple[CommitAnswer, list[ClaimedJob] | None]:
        """A commit that saves nothing and Complete's next claim in one statement
        (jobs.job_complete_bare_then_claim): the claim runs only once the commit
        committed. Should the statement fail, it rolled back whole, and the commit runs
        alone (the caller claims after it), so a failing claim never hides a receipt."""
        params = JobCompleteBareThenClaim(
            **result,
            runtime_id=then.runtime_id,
            claimer=then.claimer,
            cameras=then.cameras,
            lease=self.lease,
            request_id=then.request_id,
            max_jobs=then.max_jobs,
        )
        try:
            rows = await self._commit_then_claim_rows(params)
        except DatabaseUnavailable:
            raise
        except Exception:
            log.warning("a commit with its next claim failed; committing alone", exc_info=True)
            return await self._answer(CommitAnswer, JobCompleteBare(**result)), None
        answer = rows[0].answer
        if answer.reason:  # refused, or a retry answered with its receipt: nothing claimed
            return answer, None
        return answer, [row.job for row in rows if row.claimed]

    @timed(CLAIM_SECONDS)  # the claim attempt of a Complete that saves nothing
    async def _commit_then_claim_rows(
        self, params: JobCompleteBareThenClaim
    ) -> list[CommitThenClaim]:
        async with self.db.connection() as connection:
            return await fetch_all(connection, CommitThenClaim, *bind(params))

    async def _answer(self, answer: type[A], params: Params) -> A:
        """The one-row answer of the lease function `params` call."""
        async with self.db.connection() as connection:
            return await self._answer_on(connection, answer, params)

    @staticmethod
    async def _answer_on(connection: Connection, answer: type[A], params: Params) -> A:
        row = await fetch_one(connection, answer, *bind(params))
        assert row is not None, f"{params.NAME} answers one row"
        return row

    async def _reason(self, params: Params) -> str:
        """The refusal ('' for none) that the lease function `params` calls answers."""
        async with self.db.connection() as connection:
            reason: str = await connection.fetchval(*bind(params))
            return reason


class LeaseFields(TypedDict):
    """A lease as the leading parameters of every lease function's statement."""

    run_id: str
    job_index: int
    generation: int
    lease_token: uuid.UUID


class ResultFields(LeaseFields):
    """What every commit's statement names (job_complete, job_complete_bare and
    job_complete_bare_then_claim): the lease, the reporting key and code, the result's
    digest, decoder, slot facts and counts, and now."""

    reporter: str
    code_sha256: str
    result_sha256: str
    decoder: str
    slot_count: int
    first_slot_at: datetime
    interval_ms: int
    frames: int
    empties: int
    dropped: int
    now: datetime


def lease_fields(lease: Lease) -> LeaseFields:
    """A lease as the parameters that name it: `JobFail(**lease_fields(lease), ...)`."""
    return {
        "run_id": lease.run_id,
        "job_index": lease.job_index,
        "generation": lease.generation,
        "lease_token": lease.token,
    }


class LeaseColumns(TypedDict):
    """Leases as the array parameters of a batch statement, one element per lease."""

    run_ids: list[str]
    job_indexes: list[int]
    generations: list[int]
    lease_tokens: list[uuid.UUID]


def lease_columns(leases: Sequence[Lease]) -> LeaseColumns:
    """Leases as the columns that name them, in their order:
    `JobHeartbeatMany(**lease_columns(leases), ...)`."""
    return {
        "run_ids": [lease.run_id for lease in leases],
        "job_indexes": [lease.job_index for lease in leases],
        "generations": [lease.generation for lease in leases],
        "lease_tokens": [lease.token for lease in leases],
    }


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseFacts:
    """What CheckLease tells the preview service about a held lease."""

    lease_expires_at: datetime
    mode: str
    kind: str
    camera_id: str
    slot_count: int


@dataclasses.dataclass(frozen=True, slots=True)
class CheckedLease(Row):
    """job_check_lease's answer: the refusal ('' when held) and, when held, the facts."""

    reason: str
    lease_expires_at: datetime | None
    mode: str | None
    kind: str | None
    camera_id: str | None
    slot_count: int | None


async def check_lease(
    connection: Connection,
    lease: Lease,
    service: str,
    reporter: str,
    code_sha256: str,
    now: datetime,
) -> tuple[str | None, LeaseFacts | None]:
    """The refusal of a lease (None: held) and, when held, its facts, in one statement
    that is its own transaction: the calling service's key still live (SERVICE_NOT_
    AUTHORIZED), then the fences. The caller raises only after it has returned, i.e.
    committed: a permanent refusal ends the job in the fence (workshop_fence), and that
    end must stay. One round trip where the key lookups, BEGIN, fence, facts and COMMIT
    were six: the caller may take both principals from its cache, as the fenced writes
    do, since this statement checks both keys again (the service's here, the
    processor's in fence 4)."""
    checked = await fetch_one(
        connection,
        CheckedLease,
        *bind(
            JobCheckLease(
                **lease_fields(lease),
                service=service,
                reporter=reporter,
                code_sha256=code_sha256,
                now=now,
            )
        ),
    )
    assert checked is not None  # the statement answers one row
    if checked.reason:
        return checked.reason, None
    if checked.lease_expires_at is None:
        return "NOT_FOUND", None  # the fence held, and the job is gone (not by a fence)
    return None, LeaseFacts(
        checked.lease_expires_at,
        checked.mode or "",
        checked.kind or "",
        checked.camera_id or "",
        checked.slot_count or 0,
    )


def _claimable_cameras(who: Principal, device_id: str) -> list[str] | None:
    """The cameras whose jobs this key may claim (None: all); refuses other devices' keys."""
    if who.is_admin:
        return None
    for grant in who.grants:
        if grant.scope is ScopeName.WORKSHOP_RUN and grant.device_id == device_id:
            return list(grant.camera_ids) or None
    raise ScopeMissing(
        f"Claiming for this runtime needs a workshop:run key bound to device {device_id!r}."
    )


def _settled(stored: StoredReceipt, lease: Lease, digest: str) -> Receipt | None:
    """The receipt when this lease already committed this result (a retry after a lost
    answer); a conflict when it committed another. A receipt of another generation
    settles nothing: that call is stale and the fences refuse it."""
    if stored.receipt_sha256 is None or stored.receipt_generation != lease.generation:
        return None
    return _receipt(lease, digest, stored)


def _receipt(lease: Lease, digest: str, stored: StoredReceipt) -> Receipt:
    """The receipt `stored` (job_complete's answer or the job's facts); a conflict when it
    holds another result."""
    if stored.receipt_sha256 != digest:
        raise ResultConflict(
            "This job was already completed with a different result.",
            metadata={"result_sha256": stored.receipt_sha256 or ""},
        )
    # a receipt's columns are all set or all NULL
    assert stored.receipt_generation is not None
    assert stored.receipt_committed_at is not None
    assert stored.receipt_items_saved is not None
    return Receipt(
        lease.run_id,
        lease.job_index,
        stored.receipt_generation,
        digest,
        stored.receipt_committed_at,
        stored.receipt_items_saved,
    )
