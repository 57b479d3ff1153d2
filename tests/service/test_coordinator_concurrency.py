"""Leases under concurrency (docs/leases-and-fences.md): 16 claimers against 2,000 jobs
over real gRPC and real Postgres, with random crashes (leases left to lapse), deliberately
stale writes and a frozen clock moved forward while maintenance rescues lapsed leases.

Afterwards every job is completed or failed exactly once, no job was ever held by two
live leases, and no stale write was accepted.

How the log is kept exact: the coordinator answers every Claim and Heartbeat with
`lease_expires_at = now + 5 minutes` (job expiries are 40 days away), so the server's
clock value of every accepted claim and heartbeat is known exactly, and a receipt
carries its commit time. Each is also checked to lie inside the window
[clock before the call, clock after it], since the frozen clock only moves forward.

A write counts as stale (and must be refused) when, before it is sent, its lease is
certainly dead: its job was committed, a later generation was claimed, or the clock
already reached the lease's last known expiry. A crashed lease that may still be live
is never used for a stale write.

Every accepted write must also have been sent before the next generation's claim was
answered, and that answer must come at a clock value at or past the previous lease's
last expiry. (The claim's own stamp may be earlier: the server reads its clock before
the claim's statement runs, so a claim stamped just before a tick can run after that
tick's rescue; such claims are only counted.)

SEED fixes each claimer's choices; the interleaving of 16 tasks, and so the counts,
vary from run to run, while the invariants must hold in every one.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.leases.maintenance import MAX_LAPSES, Maintenance, Pass
from services.coordinator.leases.results import result_digest
from testbed.coordinator_leases import complete_request, empty_result
from testbed.coordinator_world import (
    CODE,
    DAY,
    build_world,
    copy_recordings,
    error_reason,
    run_request,
    save_workflow,
    workflow_spec,
)
from testbed.harness.coordinator import EPOCH, CoordinatorHarness, running_coordinator
from testbed.session_jobs import JOB_TRANSPORTS
from workshop.kit.auth import bearer_metadata
from workshop.v1 import (
    common_pb2,
    jobs_pb2,
)

pytestmark = pytest.mark.slow

SEED = 20261130
JOBS = 2_000
CLAIMERS = 16
POOL_SIZE = 16  # the harness's 4 would let only 4 of the 16 claimers into Postgres at once
CAMERAS = ("cam-a", "cam-b")  # 1,000 one-minute recordings each from 06:00: a 17-hour window
WINDOW = (6, 23)

LEASE = timedelta(minutes=5)
JUMP = timedelta(minutes=6)  # when claimers find nothing claimable: every lease lapses
TICK = timedelta(minutes=1)  # every TICK_EVERY claims, while claimers work
TICK_EVERY = 40
MAX_JUMPS = 200

P_CRASH = 0.25  # abandon the lease without a word
P_HEARTBEAT = 0.5  # heartbeat (1-2 times) before completing or crashing
P_STALE = 0.12  # before a claim: a write under a dead lease this claimer held
P_RETRY = 0.03  # before a claim: Complete again under a lease that committed (idempotent)

FENCED = {"LEASE_MISMATCH", "JOB_FINISHED"}
Metadata = tuple[tuple[str, str], ...]
Row = dict[str, Any]  # a fetched row, as a plain dict


MINUTE = timedelta(minutes=1)


@dataclasses.dataclass
class Held:
    """One lease (job, generation) as the claimers saw it."""

    job: int
    generation: int
    claimer: int
    claimed: jobs_pb2.ClaimedJob
    claimed_at: datetime  # server clock at the claim
    answered: int  # event number when the claim's answer arrived
    answered_clock: datetime  # clock when the claim's answer arrived
    expires: datetime  # latest expiry the coordinator announced (claim or heartbeat)
    # accepted writes: (server clock, event number when the request was sent)
    writes: list[tuple[datetime, int]] = dataclasses.field(default_factory=list)
    committed_at: datetime | None = None
    fate: str = "working"  # completed, crashed or fenced (refused while working)


@dataclasses.dataclass
class Log:
    holds: dict[tuple[int, int], Held] = dataclasses.field(default_factory=dict)
    counts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    violations: list[str] = dataclasses.field(default_factory=list)
    passes: list[Pass] = dataclasses.field(default_factory=list)
    events: int = 0  # one event loop: a counter orders sends and answers

    def event(self) -> int:
        self.events += 1
        return self.events

    def violation(self, text: str) -> None:
        self.violations.append(text)

    def dead(self, held: Held, now: datetime) -> bool:
        """Certainly no longer a live lease (so any write under it must be refused)."""
        return (
            held.committed_at is not None
            or now >= held.expires
            or (held.job, held.generation + 1) in self.holds
        )


def _when(value: Timestamp) -> datetime:
    return value.ToDatetime(tzinfo=UTC)


def _fence_reason(error: grpc.aio.AioRpcError) -> str:
    code, reason, _ = error_reason(error)
    if code is not grpc.StatusCode.FAILED_PRECONDITION:
        raise error
    return reason


async def _create_run(c: CoordinatorHarness) -> str:
    """A full run of JOBS one-slot jobs (one-minute recordings, 60 s slots); its runtime."""
    world = await build_world(c, recordings_per_camera=0)
    per_camera = JOBS // len(CAMERAS)
    start = DAY + timedelta(hours=WINDOW[0])
    await copy_recordings(
        c,
        [
            (f"{camera}-{i}", camera, start + i * MINUTE, start + (i + 1) * MINUTE)
            for camera in CAMERAS
            for i in range(per_camera)
        ],
    )
    await save_workflow(c, "yard", workflow_spec(cameras=CAMERAS, interval=60, window=WINDOW))
    created = await c.workshop.CreateRun(
        run_request("r1", "yard", world.tracking_runtime, mode=common_pb2.RUN_MODE_FULL),
        metadata=c.admin,
    )
    assert (created.run.counts.jobs_total, created.run.counts.slots_expected) == (JOBS, JOBS)
    return world.tracking_runtime


class Pacer:
    """Moves the frozen clock and runs maintenance: a minute every TICK_EVERY claims, and
    six minutes whenever a claimer finds nothing claimable; done when nothing is left."""

    def __init__(self, c: CoordinatorHarness, log: Log) -> None:
        self.c = c
        self.log = log
        self.maintenance = Maintenance(c.db, c.clock, interval_seconds=0)
        self.poke = asyncio.Event()
        self.jumped = asyncio.Event()
        self.done = asyncio.Event()
        self.jump_wanted = False
        self.claims = 0
        self.jumps = 0
        self.ticks = 0

    def claimed(self) -> None:
        self.claims += 1
        if self.claims % TICK_EVERY == 0:
            self.poke.set()

    async def idle(self) -> None:
        """Nothing claimable: wait for the next jump (or the end)."""
        if self.done.is_set():
            return
        jumped = self.jumped
        self.jump_wanted = True
        self.poke.set()
        await jumped.wait()

    async def run(self) -> None:
        while True:
            await self.poke.wait()
            self.poke.clear()
            jump, self.jump_wanted = self.jump_wanted, False
            self.c.clock.advance(JUMP if jump else TICK)
            self.log.passes.append(await self.maintenance.run_once())
            if not jump:
                self.ticks += 1
                continue
            self.jumps += 1
            async with self.c.db.connection() as connection:
                remaining: int = await connection.fetchval(
                    "SELECT count(*) FROM jobs WHERE state IN ('queued', 'leased')"
                )
            woken = self.jumped
            if remaining == 0 or self.jumps >= MAX_JUMPS:
                self.done.set()  # the last event stays set: later idlers return at once
            else:
                self.jumped = asyncio.Event()
            woken.set()
            if self.done.is_set():
                return


class Claimer:
    def __init__(
        self, index: int, c: CoordinatorHarness, runtime: str, key: Metadata, pacer: Pacer, log: Log
    ) -> None:
        self.index = index
        self.c = c
        self.runtime = runtime
        self.key = key
        self.pacer = pacer
        self.log = log
        self.rng = random.Random(SEED * 100 + index)
        self.past: list[Held] = []

    async def run(self) -> None:
        while not self.pacer.done.is_set():
            roll = self.rng.random()
            if roll < P_RETRY:
                await self._retry_committed()
            elif roll < P_RETRY + P_STALE:
                await self._stale_write()
            held = await self._claim()
            if held is None:
                await self.pacer.idle()
                continue
            await self._work(held)
            self.past.append(held)

    async def _claim(self) -> Held | None:
        clock, log = self.c.clock, self.log
        before = clock.now()
        reply = await self.c.jobs.Claim(
            jobs_pb2.ClaimRequest(runtime_id=self.runtime, code_sha256=CODE), metadata=self.key
        )
        after = clock.now()
        answered = log.event()
        if not reply.HasField("job"):
            log.counts["empty claims"] += 1
            return None
        job = reply.job
        expires = _when(job.lease_expires_at)
        held = Held(
            job=job.input.job_index,
            generation=job.lease.generation,
            claimer=self.index,
            claimed=job,
            claimed_at=expires - LEASE,
            answered=answered,
            answered_clock=after,
            expires=expires,
        )
        key = (held.job, held.generation)
        if key in log.holds:
            log.violation(f"job {held.job} generation {held.generation} was claimed twice")
        log.holds[key] = held
        if not before <= held.claimed_at <= after:
            log.violation(f"claim of {key} at {held.claimed_at} outside [{before}, {after}]")
        log.counts["claims"] += 1
        self.pacer.claimed()
        return held

    async def _work(self, held: Held) -> None:
        if self.rng.random() < P_HEARTBEAT:
            for _ in range(self.rng.randint(1, 2)):
                await asyncio.sleep(0)
                if not await self._heartbeat(held):
                    held.fate = "fenced"
                    return
        await asyncio.sleep(0)
        if self.rng.random() < P_CRASH:
            held.fate = "crashed"
            self.log.counts["crashes"] += 1
            return
        await self._complete(held)

    async def _heartbeat(self, held: Held) -> bool:
        """An honest heartbeat under the claimer's current lease; False when fenced."""
        clock, log = self.c.clock, self.log
        before, sent = clock.now(), log.event()
        try:
            reply = await self.c.jobs.Heartbeat(
                jobs_pb2.HeartbeatRequest(lease=held.claimed.lease), metadata=self.key
            )
        except grpc.aio.AioRpcError as error:
            reason = _fence_reason(error)
            self._fenced_honestly(held, "heartbeat", reason, clock.now())
            return False
        after = clock.now()
        renewed = _when(reply.lease_expires_at)
        at = renewed - LEASE
        if not before <= at <= after:
            log.violation(f"heartbeat of {held.job}/{held.generation} at {at} outside the call")
        if not held.claimed_at <= at < held.expires:
            log.violation(
                f"heartbeat of {held.job}/{held.generation} accepted at {at}, outside its lease "
                f"[{held.claimed_at}, {held.expires})"
            )
        held.writes.append((at, sent))
        held.expires = renewed
        log.counts["heartbeats"] += 1
        return True

    async def _complete(self, held: Held) -> None:
        clock, log = self.c.clock, self.log
        before, sent = clock.now(), log.event()
        try:
            reply = await self.c.jobs.Complete(
                complete_request(held.claimed, empty_result(held.claimed)), metadata=self.key
            )
        except grpc.aio.AioRpcError as error:
            reason = _fence_reason(error)
            self._fenced_honestly(held, "complete", reason, clock.now())
            held.fate = "fenced"
            return
        after = clock.now()
        receipt = reply.receipt
        at = _when(receipt.committed_at)
        where = f"job {held.job} generation {held.generation}"
        if reply.already_committed or receipt.generation != held.generation:
            log.violation(
                f"first Complete of {where} answered already_committed={reply.already_committed} "
                f"with the receipt of generation {receipt.generation}"
            )
        if not before <= at <= after:
            log.violation(f"commit of {where} at {at} outside [{before}, {after}]")
        if not held.claimed_at <= at < held.expires:
            log.violation(
                f"commit of {where} accepted at {at}, outside its lease "
                f"[{held.claimed_at}, {held.expires})"
            )
        held.committed_at = at
        held.writes.append((at, sent))
        held.fate = "completed"
        log.counts["completions"] += 1

    def _fenced_honestly(self, held: Held, what: str, reason: str, after: datetime) -> None:
        """The current lease was refused: fine once the clock reached its expiry."""
        self.log.counts[f"honest {what}s fenced ({reason})"] += 1
        if reason not in FENCED or after < held.expires:
            self.log.violation(
                f"{what} of job {held.job} generation {held.generation} refused with {reason} "
                f"while its lease was live (clock {after} < expiry {held.expires})"
            )

    async def _stale_write(self) -> None:
        """A heartbeat or Complete under a lease this claimer held that is certainly dead."""
        clock, log = self.c.clock, self.log
        now = clock.now()
        kind = self.rng.choice(("heartbeat", "complete"))
        # Complete under the generation that committed is an idempotent retry, not stale;
        # heartbeats go half the time to committed leases, half to lapsed ones.
        committed = kind == "heartbeat" and self.rng.random() < 0.5
        dead = [
            h for h in self.past if log.dead(h, now) and (h.committed_at is not None) == committed
        ]
        if not dead:
            return
        held = self.rng.choice(dead)
        where = f"stale {kind} of job {held.job} generation {held.generation} ({held.fate})"
        log.counts[f"stale {kind}s sent"] += 1
        try:
            if kind == "heartbeat":
                await self.c.jobs.Heartbeat(
                    jobs_pb2.HeartbeatRequest(lease=held.claimed.lease), metadata=self.key
                )
            else:
                reply = await self.c.jobs.Complete(
                    complete_request(held.claimed, empty_result(held.claimed)), metadata=self.key
                )
                where += (
                    f", answered already_committed={reply.already_committed} with the receipt "
                    f"of generation {reply.receipt.generation}"
                )
        except grpc.aio.AioRpcError as error:
            code, reason, _ = error_reason(error)
            if code is grpc.StatusCode.FAILED_PRECONDITION and reason in FENCED:
                log.counts[f"stale {kind}s refused ({reason})"] += 1
            else:
                log.violation(f"{where} refused with {code.name} {reason}, not a fence")
            return
        log.counts[f"stale {kind}s accepted"] += 1
        log.violation(f"{where} was accepted")

    async def _retry_committed(self) -> None:
        """Complete again under a lease that committed: settled from its receipt."""
        done = [h for h in self.past if h.committed_at is not None]
        if not done:
            return
        held = self.rng.choice(done)
        reply = await self.c.jobs.Complete(
            complete_request(held.claimed, empty_result(held.claimed)), metadata=self.key
        )
        receipt = reply.receipt
        if not (
            reply.already_committed
            and receipt.generation == held.generation
            and _when(receipt.committed_at) == held.committed_at
            and receipt.result_sha256 == result_digest(empty_result(held.claimed))
        ):
            self.log.violation(
                f"retried Complete of job {held.job} generation {held.generation} answered {reply}"
            )
        self.log.counts["retries settled"] += 1


def _check_leases(log: Log, jobs: dict[int, Row], receipts: dict[int, Row]) -> None:
    """Per job: generations 1..N, one after another, and at most one committed."""
    by_job: dict[int, list[Held]] = collections.defaultdict(list)
    for one in log.holds.values():
        by_job[one.job].append(one)
    for index, row in jobs.items():
        held = sorted(by_job.get(index, []), key=lambda h: h.generation)
        where = f"job {index}"
        if [h.generation for h in held] != list(range(1, row["generation"] + 1)):
            log.violation(
                f"{where}: generations claimed {[h.generation for h in held]}, "
                f"job generation {row['generation']}"
            )
        for before, after in itertools.pairwise(held):
            if before.committed_at is not None:
                log.violation(f"{where}: generation {after.generation} claimed after a commit")
            # The next generation is granted only after this one lapsed and was rescued:
            # its answer comes at a clock value at or past this lease's last expiry...
            if after.answered_clock < before.expires:
                log.violation(
                    f"{where}: generation {after.generation} granted by clock "
                    f"{after.answered_clock} while generation {before.generation} was live "
                    f"until {before.expires}"
                )
            # ...and no write of this lease sent after that answer was accepted.
            for at, sent in before.writes:
                if sent > after.answered:
                    log.violation(
                        f"{where}: a write of generation {before.generation} (at {at}) was "
                        f"accepted though sent after generation {after.generation} was granted"
                    )
            if after.claimed_at < before.expires:  # a stale stamp, see the module docstring
                log.counts["claims stamped before the previous lease's expiry"] += 1
        committed = [h for h in held if h.committed_at is not None]
        lapsed = len(held) - len(committed)
        if row["lapses"] != lapsed:
            log.violation(f"{where}: {row['lapses']} lapses recorded, {lapsed} leases lapsed")
        if row["state"] == "completed":
            receipt = receipts.get(index)
            if len(committed) != 1 or receipt is None:
                log.violation(f"{where}: completed with {len(committed)} commits, {receipt=}")
                continue
            if not (
                receipt["generation"] == row["generation"] == committed[0].generation
                and receipt["committed_at"] == committed[0].committed_at == row["committed_at"]
            ):
                log.violation(
                    f"{where}: receipt generation {receipt['generation']} at "
                    f"{receipt['committed_at']}, job generation {row['generation']}, committed "
                    f"by generation {committed[0].generation} at {committed[0].committed_at}"
                )
        elif row["state"] == "failed":
            if committed or index in receipts:
                log.violation(f"{where}: failed but committed")
            if (row["failure_reason"], row["lapses"]) != ("attempts_exhausted", MAX_LAPSES):
                log.violation(f"{where}: failed with {row['failure_reason']}, {row['lapses']}")
        else:
            log.violation(f"{where}: left {row['state']}")


@pytest.mark.parametrize("job_transport", JOB_TRANSPORTS)
async def test_claimers_crashes_and_time(pg_dsn: str, job_transport: str) -> None:
    started = time.perf_counter()
    async with running_coordinator(pg_dsn, pool_size=POOL_SIZE, job_transport=job_transport) as c:
        runtime = await _create_run(c)
        key = bearer_metadata(
            await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="processor")
        )
        setup_s = time.perf_counter() - started
        log = Log()
        pacer = Pacer(c, log)
        claimers = [Claimer(i, c, runtime, key, pacer, log) for i in range(CLAIMERS)]
        async with asyncio.timeout(240), asyncio.TaskGroup() as group:
            group.create_task(pacer.run())
            for claimer in claimers:
                group.create_task(claimer.run())
        churn_s = time.perf_counter() - started - setup_s
        async with c.db.connection() as connection:
            jobs = {
                row["job_index"]: dict(row)
                for row in await connection.fetch(
                    "SELECT job_index, state, generation, lapses, failure_reason, committed_at "
                    "FROM jobs WHERE run_id = 'r1'"
                )
            }
            receipts = {
                row["job_index"]: dict(row)
                for row in await connection.fetch(
                    "SELECT job_index, generation, committed_at FROM receipts WHERE run_id = 'r1'"
                )
            }
            items = await connection.fetchval("SELECT count(*) FROM bucket_items")
    states = collections.Counter(str(row["state"]) for row in jobs.values())
    requeued = sum(p.requeued for p in log.passes)
    exhausted = sum(p.exhausted for p in log.passes)
    counts = log.counts
    print(
        f"\nconcurrency: setup {setup_s:.1f} s, churn {churn_s:.1f} s, "
        f"{pacer.jumps} jumps, {pacer.ticks} ticks, clock +{c.clock.now() - EPOCH}; "
        f"states {dict(states)}; lapses requeued {requeued}, attempts_exhausted {exhausted}; "
        f"{dict(sorted(counts.items()))}"
    )

    assert pacer.jumps < MAX_JUMPS
    assert len(jobs) == JOBS
    # every job completed or failed, exactly once
    assert states["completed"] + states["failed"] == JOBS, states
    assert len(receipts) == states["completed"] == counts["completions"]
    assert set(receipts) == {i for i, row in jobs.items() if row["state"] == "completed"}
    assert items == 0  # all-EMPTY results
    # maintenance: every lapse seen, the third one fails the job
    assert not any(p.skipped or p.expired for p in log.passes)
    assert exhausted == states["failed"]
    assert requeued + exhausted == sum(row["lapses"] for row in jobs.values())
    # never two live leases; every accepted write inside its lease
    _check_leases(log, jobs, receipts)
    assert log.violations == [], f"{len(log.violations)} violations, the first 40:\n" + "\n".join(
        log.violations[:40]
    )
    # the run was not vacuous: crashes, lapses, exhaustion and refused stale writes happened
    refused = collections.Counter[str]()
    for name, n in counts.items():
        if name.startswith("stale") and "refused" in name:
            refused[name.split()[1]] += n  # heartbeats, completes
            refused[name.split()[-1].strip("()")] += n  # LEASE_MISMATCH, JOB_FINISHED
    assert counts["crashes"] > 0
    assert requeued > 0
    assert exhausted > 0
    assert refused["heartbeats"] == counts["stale heartbeats sent"] > 0
    assert refused["completes"] == counts["stale completes sent"] > 0
    assert refused["LEASE_MISMATCH"] > 0  # lapsed, or the job re-leased
    assert refused["JOB_FINISHED"] > 0  # the job completed or failed since
    assert counts["retries settled"] > 0
