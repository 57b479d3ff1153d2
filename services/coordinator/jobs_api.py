"""The processor's side of jobs (SPEC §5-§7): claim, heartbeat, progress, complete,
fail and release, every write under its lease and the four fences.

The database functions of migration 0002 do each step in one round trip and
answer '' or the reason a fence refused; this module turns reasons into errors.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import datetime, timedelta
from typing import Any

from services.coordinator import auth, results
from services.coordinator.auth import Principal, ScopeName
from services.coordinator.clock import Clock
from services.coordinator.db import Database, Record, sql
from services.coordinator.errors import (
    FENCE_MESSAGES,
    InvalidField,
    NotFound,
    ResultConflict,
    ResultInvalid,
    ScopeMissing,
    fenced,
)
from services.coordinator.snapshots import Frozen, SnapshotCache
from workshop.v1 import jobs_pb2

LEASE = timedelta(minutes=5)
HEARTBEAT_INTERVAL = timedelta(seconds=45)
MAX_FAILURE_MESSAGE = 2000
PHASES = ("downloading", "decoding", "labeling", "publishing", "committing")


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


@dataclasses.dataclass(frozen=True)
class Claimed:
    job: Record
    frozen: Frozen


@dataclasses.dataclass(frozen=True)
class Receipt:
    run_id: str
    job_index: int
    generation: int
    result_sha256: str
    committed_at: datetime
    items_saved: int


def raise_for(reason: str, lease: Lease) -> None:
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
    raise InvalidField(f"Refused: {reason}.")


def reporter(who: Principal) -> str:
    """The key whose authority fence 4 checks: a workshop:run (or admin) key."""
    auth.require(who, ScopeName.WORKSHOP_RUN)
    if not who.key_id:
        raise ScopeMissing("Job calls need a workshop:run key, not a session.")
    return who.key_id


class JobsApi:
    def __init__(self, db: Database, clock: Clock, snapshots: SnapshotCache) -> None:
        self.db = db
        self.clock = clock
        self.snapshots = snapshots
        self._runtimes: dict[str, Record] = {}

    async def _runtime(self, runtime_id: str) -> Record:
        # Identity fields of a runtime never change: cache them.
        found = self._runtimes.get(runtime_id)
        if found is None:
            async with self.db.connection() as connection:
                found = await connection.fetchrow(sql("jobs", "runtime_identity"), runtime_id)
            if found is None:
                raise NotFound("runtime", runtime_id, f"Runtime {runtime_id!r} is not registered.")
            self._runtimes[runtime_id] = found
        return found

    async def claim(self, who: Principal, runtime_id: str, code_sha256: str) -> Claimed | None:
        runtime = await self._runtime(runtime_id)
        cameras = _claimable_cameras(who, runtime["device_id"])
        if code_sha256 != runtime["code_sha256"]:
            raise fenced("CODE_MISMATCH")
        async with self.db.connection() as connection:
            row = await connection.fetchrow(
                sql("jobs", "job_claim"), runtime_id, cameras, self.clock.now(), LEASE
            )
        if row is None:
            return None
        return Claimed(row, await self.snapshots.get(row["run_id"]))

    async def heartbeat(self, who: Principal, lease: Lease) -> datetime:
        row = await self._call(
            "job_heartbeat", lease, reporter(who), self.clock.now(), LEASE, fetch="row"
        )
        raise_for(row["reason"], lease)
        renewed: datetime = row["lease_expires_at"]
        return renewed

    async def progress(
        self, who: Principal, lease: Lease, percent: int, phase: str | None
    ) -> tuple[int, bool]:
        if not 0 <= percent <= 100:
            raise InvalidField(f"percent must be 0..100 (got {percent}).")
        row = await self._call(
            "job_progress", lease, reporter(who), percent, phase, self.clock.now(), fetch="row"
        )
        raise_for(row["reason"], lease)
        return row["progress"], row["persisted"]

    async def fail(self, who: Principal, lease: Lease, message: str) -> None:
        reason = await self._call(
            "job_fail", lease, reporter(who), message[:MAX_FAILURE_MESSAGE], self.clock.now()
        )
        raise_for(reason, lease)

    async def release(self, who: Principal, lease: Lease) -> None:
        reason = await self._call("job_release", lease, reporter(who), self.clock.now())
        raise_for(reason, lease)

    async def complete(
        self,
        who: Principal,
        lease: Lease,
        *,
        code_sha256: str,
        result: jobs_pb2.JobResult,
        result_sha256: str,
        decoder: str,
    ) -> tuple[Receipt, bool]:
        """Commits the result; returns the receipt and whether it was already committed."""
        key = reporter(who)
        digest = results.check_digest(result, result_sha256)
        async with self.db.connection() as connection:
            facts = await connection.fetchrow(
                sql("jobs", "job_facts"), lease.run_id, lease.job_index
            )
        if facts is None:
            raise_for("NOT_FOUND", lease)
        settled = _settled(facts, lease, digest)
        if settled is not None:
            return settled, True
        frozen = await self.snapshots.get(lease.run_id)
        checked = results.check_result(
            result,
            results.JobFacts(
                slot_count=facts["slot_count"],
                first_slot_at=facts["first_slot_at"],
                interval=timedelta(seconds=facts["interval_seconds"]),
                window_end=frozen.window_end,
                dropped_allowed=frozen.dropped_allowed,
                full_run=frozen.full_run,
                output_buckets=frozen.output_buckets,
            ),
            run_id=lease.run_id,
            job_index=lease.job_index,
        )
        now = self.clock.now()
        items = checked.items
        reason = await self._call(
            "job_complete",
            lease,
            key,
            code_sha256,
            digest,
            decoder,
            checked.frames,
            checked.empties,
            checked.dropped,
            [u.object_key for u in checked.uploads],
            [u.sha256 for u in checked.uploads],
            [u.slot_index for u in checked.uploads],
            [i.item_id for i in items],
            [i.bucket_id for i in items],
            [i.slot_index for i in items],
            [i.step_id for i in items],
            [i.frame_time for i in items],
            # each item's boxes as JSON text: a list of lists would be read as a 2-D array
            [json.dumps(i.boxes) for i in items],
            [i.object_key for i in items],
            [i.sha256 for i in items],
            now,
        )
        if reason in ("JOB_FINISHED", "LEASE_MISMATCH"):
            # A retry that raced its own first attempt: the receipt settles it.
            async with self.db.connection() as connection:
                facts = await connection.fetchrow(
                    sql("jobs", "job_facts"), lease.run_id, lease.job_index
                )
            settled = _settled(facts, lease, digest)
            if settled is not None:
                return settled, True
        raise_for(reason, lease)
        return (
            Receipt(lease.run_id, lease.job_index, lease.generation, digest, now, len(items)),
            False,
        )

    async def _call(self, name: str, lease: Lease, *args: Any, fetch: str = "val") -> Any:
        query = sql("jobs", name)
        params = (lease.run_id, lease.job_index, lease.generation, lease.token, *args)
        async with self.db.connection() as connection:
            if fetch == "row":
                return await connection.fetchrow(query, *params)
            return await connection.fetchval(query, *params)


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


def _settled(facts: Record, lease: Lease, digest: str) -> Receipt | None:
    """The receipt when this lease already committed this result (a retry after a lost
    answer); a conflict when it committed another. A receipt of another generation
    settles nothing: that call is stale and the fences refuse it."""
    if facts["receipt_sha256"] is None or facts["receipt_generation"] != lease.generation:
        return None
    if facts["receipt_sha256"] != digest:
        raise ResultConflict(
            "This job was already completed with a different result.",
            metadata={"result_sha256": facts["receipt_sha256"]},
        )
    return Receipt(
        lease.run_id,
        lease.job_index,
        facts["receipt_generation"],
        digest,
        facts["receipt_committed_at"],
        facts["receipt_items_saved"],
    )
