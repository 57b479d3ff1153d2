"""The one-round-trip lease and publication paths, and the caches behind them (0003).

The coordinator keeps a caller's principal for a few seconds, but only for calls whose
SQL checks the caller's key again in the transaction that writes. These tests revoke
keys straight in the database, as a revocation through another coordinator replica
would (this process's cache is not told), and check that a cached principal gets no
lease, renewal, lease check, staged object or commit through; each check is also shown holding
before the revocation. Complete keeps the slot facts of its Claim: the commit verifies
them under the job's lock, and a Complete on a replica that never saw the Claim still
commits and settles retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, timedelta

import asyncpg
import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.leases.jobs import LEASE, JobsApi, SlotFacts, lease_fields, lease_from
from services.coordinator.leases.jobs_params import JobComplete
from services.coordinator.leases.results import result_digest
from services.coordinator.platform import queries
from services.coordinator.platform.db import Database, bind
from services.coordinator.runs.events import RunEvents
from services.coordinator.runs.snapshots import SnapshotCache
from services.coordinator.servicers.common import Authenticator
from testbed.coordinator_leases import (
    Setup,
    claim,
    claimed,
    complete_request,
    create_run,
    empty_result,
    on_behalf,
    record_request,
    refused,
    setup,
)
from testbed.coordinator_world import CODE
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from testbed.session_jobs import JOB_TRANSPORTS
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import publication_pb2 as pub

UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture(params=JOB_TRANSPORTS)
def job_transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs twice: on JobService's unary calls and on a Session stream."""
    return str(request.param)


@pytest.fixture
async def s(coordinator: CoordinatorHarness) -> Setup:
    s = await setup(coordinator)
    await create_run(coordinator, s)
    return s


def heartbeat(
    c: CoordinatorHarness, job: jobs_pb2.ClaimedJob, metadata: tuple[tuple[str, str], ...]
) -> Awaitable[jobs_pb2.HeartbeatResponse]:
    return c.jobs.Heartbeat(jobs_pb2.HeartbeatRequest(lease=job.lease), metadata=metadata)


async def leased(c: CoordinatorHarness) -> int:
    async with c.db.connection() as connection:
        count: int = await connection.fetchval("SELECT count(*) FROM jobs WHERE state = 'leased'")
    return count


async def revoke_in_database(c: CoordinatorHarness, key_name: str) -> None:
    """What RevokeKey through another replica leaves behind: this process is not told."""
    async with c.db.connection() as connection:
        revoked = await connection.execute(
            "UPDATE keys SET revoked_at = $2 WHERE name = $1", key_name, c.clock.now()
        )
    assert revoked == "UPDATE 1"


def stage_request(job: jobs_pb2.ClaimedJob, slot: int) -> pub.StageObjectRequest:
    return pub.StageObjectRequest(
        lease=job.lease,
        code_sha256=CODE,
        kind=common_pb2.OBJECT_KIND_PREVIEW,
        slot_index=slot,
        sha256="a" * 64,
        byte_size=100,
        content_type="image/jpeg",
    )


# the principal cache never outruns a revocation -------------------------------------------


async def test_a_key_revoked_elsewhere_gets_no_lease_renewal_or_commit(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)  # the processor's principal is now cached
    await heartbeat(c, job, s.processor)
    await revoke_in_database(c, "processor")
    assert await refused(
        c.jobs.Claim(
            jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE),
            metadata=s.processor,
        )
    ) == (UNAUTHENTICATED, "CREDENTIAL_REJECTED")
    assert await leased(c) == 1  # the refused claim leased nothing
    assert await refused(heartbeat(c, job, s.processor)) == (
        FAILED_PRECONDITION,
        "REPORTER_NOT_AUTHORIZED",
    )
    complete = c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
    assert await refused(complete) == (FAILED_PRECONDITION, "REPORTER_NOT_AUTHORIZED")
    assert await c.count("receipts") == 0


async def test_a_revocation_through_this_coordinator_empties_its_cache(
    coordinator: CoordinatorHarness, s: Setup, job_transport: str
) -> None:
    c = coordinator
    job = await claimed(c, s)
    await heartbeat(c, job, s.processor)
    async with c.db.connection() as connection:
        key_id = await connection.fetchval("SELECT key_id FROM keys WHERE name = 'processor'")
    await c.operator.RevokeKey(op.RevokeKeyRequest(key_id=key_id), metadata=c.admin)
    # Authenticated afresh: the credential itself is refused, not just the write. A Session
    # authenticated once, when it opened (before the revocation): its write is refused by
    # the SQL's fence 4 instead (test_coordinator_sessions.py).
    expected = (
        (UNAUTHENTICATED, "CREDENTIAL_REJECTED")
        if job_transport == "unary"
        else (FAILED_PRECONDITION, "REPORTER_NOT_AUTHORIZED")
    )
    assert await refused(heartbeat(c, job, s.processor)) == expected


async def test_a_reporting_key_of_a_user_disabled_elsewhere_stops(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    await c.operator.CreateUser(op.CreateUserRequest(user_id="ops"), metadata=c.admin)
    secret = await c.key(
        Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="ops-processor", user_id="ops"
    )
    processor = bearer_metadata(secret)
    reply = await c.jobs.Claim(
        jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE),
        metadata=processor,
    )
    job = reply.job
    await heartbeat(c, job, processor)
    async with c.db.connection() as connection:
        await connection.execute(
            "UPDATE users SET disabled_at = $1 WHERE user_id = 'ops'", c.clock.now()
        )
    assert await refused(heartbeat(c, job, processor)) == (
        FAILED_PRECONDITION,
        "REPORTER_NOT_AUTHORIZED",
    )
    assert await refused(
        c.jobs.Claim(
            jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE),
            metadata=processor,
        )
    ) == (UNAUTHENTICATED, "CREDENTIAL_REJECTED")


async def test_a_service_key_revoked_elsewhere_stages_and_publishes_nothing(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    staged = await c.publication.StageObject(stage_request(job, 0), metadata=on_behalf(s))
    await revoke_in_database(c, "preview-service")
    assert await refused(
        c.publication.StageObject(stage_request(job, 1), metadata=on_behalf(s))
    ) == (UNAUTHENTICATED, "CREDENTIAL_REJECTED")
    # neither the staged slot nor one written without staging is recorded
    for slot in (0, 1):
        publish = record_request(job, slot, test=False)
        assert await refused(c.publication.RecordPreview(publish, metadata=on_behalf(s))) == (
            UNAUTHENTICATED,
            "CREDENTIAL_REJECTED",
        )
    async with c.db.connection() as connection:
        rows = await connection.fetch(
            "SELECT object_key, published_at, collectable_at FROM staged_objects"
        )
    assert [tuple(row) for row in rows] == [(staged.object_key, None, None)]


# CheckLease in one round trip: its statement checks both cached keys again -----------------


def check_lease(
    c: CoordinatorHarness, s: Setup, job: jobs_pb2.ClaimedJob
) -> Awaitable[pub.CheckLeaseResponse]:
    request = pub.CheckLeaseRequest(lease=job.lease, code_sha256=CODE)
    return c.publication.CheckLease(request, metadata=on_behalf(s))


@pytest.mark.parametrize(
    ("key_name", "expected"),
    [
        ("preview-service", (UNAUTHENTICATED, "CREDENTIAL_REJECTED")),
        ("processor", (FAILED_PRECONDITION, "REPORTER_NOT_AUTHORIZED")),
    ],
)
async def test_a_key_revoked_elsewhere_gets_no_lease_check(
    coordinator: CoordinatorHarness, s: Setup, key_name: str, expected: tuple[object, str]
) -> None:
    c = coordinator
    job = await claimed(c, s)
    checked = await check_lease(c, s, job)  # both principals are now cached
    assert checked.slot_count == len(job.input.slots)
    await revoke_in_database(c, key_name)
    assert await refused(check_lease(c, s, job)) == expected
    assert await leased(c) == 1  # a revoked key ends no job: the next holder may go on


# StageObject in one round trip --------------------------------------------------------------


async def test_staging_says_when_an_uncommitted_object_becomes_collectable(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    first = await c.publication.StageObject(stage_request(job, 0), metadata=on_behalf(s))
    assert first.collectable_after == job.lease_expires_at
    c.clock.advance(timedelta(minutes=1))
    renewed = await heartbeat(c, job, s.processor)
    second = await c.publication.StageObject(stage_request(job, 1), metadata=on_behalf(s))
    assert second.collectable_after == renewed.lease_expires_at
    assert second.collectable_after.ToDatetime() - first.collectable_after.ToDatetime() == (
        timedelta(minutes=1)
    )


# Complete in one round trip ---------------------------------------------------------------


async def test_a_replica_that_did_not_claim_the_job_commits_and_settles_it(
    coordinator: CoordinatorHarness, pg_dsn: str, s: Setup, job_transport: str
) -> None:
    c = coordinator
    job = await claimed(c, s)
    result = empty_result(job)
    async with running_coordinator(pg_dsn, clock=c.clock, job_transport=job_transport) as other:
        first = await other.jobs.Complete(complete_request(job, result), metadata=s.processor)
        assert not first.already_committed
        again = await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
        assert again.already_committed
        assert again.receipt == first.receipt
        different = empty_result(job)
        different.slots[0].outcome = common_pb2.SLOT_OUTCOME_DROPPED  # not allowed: invalid
        different.slots[0].frame_time.CopyFrom(job.input.slots[0].start)
        for replica in (other, c):  # without and with the facts of the claim kept
            assert await refused(
                replica.jobs.Complete(complete_request(job, different), metadata=s.processor)
            ) == (grpc.StatusCode.ABORTED, "RESULT_CONFLICT")


async def test_the_commit_verifies_the_slot_facts_it_was_checked_against(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    c = coordinator
    job = await claimed(c, s)
    lease = lease_from(job.lease.run_id, job.lease.job_id, job.lease.generation, job.lease.token)
    result = empty_result(job)
    first_slot_at = job.input.slots[0].start.ToDatetime(tzinfo=UTC)
    slot = job.input.slots[0]
    interval = (slot.end.ToDatetime() - slot.start.ToDatetime()) // timedelta(milliseconds=1)
    slot_count = len(job.input.slots)
    async with c.db.connection() as connection:
        key_id = await connection.fetchval("SELECT key_id FROM keys WHERE name = 'processor'")

        async def commit(facts: SlotFacts) -> str:
            reason: str = await connection.fetchval(
                *bind(
                    JobComplete(
                        **lease_fields(lease),
                        reporter=key_id,
                        code_sha256=CODE,
                        result_sha256=result_digest(result),
                        decoder="pyav",
                        slot_count=facts.slot_count,
                        first_slot_at=facts.first_slot_at,
                        interval_ms=facts.interval_ms,
                        frames=0,
                        empties=slot_count,
                        dropped=0,
                        upload_keys=[],
                        upload_sha256s=[],
                        upload_slots=[],
                        item_ids=[],
                        item_buckets=[],
                        item_slots=[],
                        item_steps=[],
                        item_times=[],
                        item_boxes=[],
                        item_sightings=[],
                        item_keys=[],
                        item_sha256s=[],
                        camera_id="",
                        changed_items=[],
                        changed_sightings=[],
                        gone=[],
                        sighting_ids=[],
                        sighting_buckets=[],
                        sighting_classes=[],
                        sighting_firsts=[],
                        sighting_lasts=[],
                        sighting_counts=[],
                        count_buckets=[],
                        count_classes=[],
                        count_boxes=[],
                        now=c.clock.now(),
                        new_sightings=[],
                        new_pending=[],
                        new_scores=[],
                    )
                )
            )
            return reason

        wrong = SlotFacts(slot_count, first_slot_at + timedelta(hours=1), interval)
        assert await commit(wrong) == "FACTS_MISMATCH"
        assert await connection.fetchval("SELECT count(*) FROM receipts") == 0
        assert await commit(SlotFacts(slot_count, first_slot_at, interval)) == ""
        assert await connection.fetchval("SELECT count(*) FROM receipts") == 1


async def test_complete_reads_the_facts_again_when_the_kept_ones_are_refused(
    coordinator: CoordinatorHarness, s: Setup
) -> None:
    """Kept facts never change in practice; if they were wrong, the commit refuses them
    and Complete reads the job's own and commits."""
    c = coordinator
    api = JobsApi(c.db, c.clock, SnapshotCache(c.db), RunEvents(c.db.dsn))
    processor = await Authenticator(c.db, c.clock).principal(s.processor_secret)
    claimed_job = await api.claim(processor, s.world.tracking_runtime, CODE)
    assert claimed_job is not None
    job = claimed_job.job
    key = (job.run_id, job.job_index)
    kept = api._facts[key]
    api._facts[key] = SlotFacts(
        kept.slot_count, kept.first_slot_at - LEASE, kept.interval_ms
    )  # all slots EMPTY: the result checks out against these too
    lease = lease_from(job.run_id, f"j{job.job_index}", job.generation, str(job.lease_token))
    result = jobs_pb2.JobResult(
        slots=[
            jobs_pb2.SlotResult(slot_index=index, outcome=common_pb2.SLOT_OUTCOME_EMPTY)
            for index in range(kept.slot_count)
        ]
    )
    receipt, already, _ = await api.complete(
        processor,
        lease,
        code_sha256=CODE,
        result=result,
        result_sha256=result_digest(result),
        decoder="pyav",
    )
    assert not already
    assert receipt.generation == job.generation
    assert await c.count("receipts") == 1


# session state stays off pooled connections ------------------------------------------------


async def test_a_session_connection_releases_its_advisory_locks(pg_dsn: str) -> None:
    lock = "SELECT pg_try_advisory_lock(hashtext('workshop.test.session'))"

    async def failing_pass(db: Database) -> None:
        async with db.session() as connection:
            assert await connection.fetchval(lock)
            raise RuntimeError("the pass failed before it unlocked")

    async with Database.open(pg_dsn, size=1) as db:
        with pytest.raises(RuntimeError):
            await failing_pass(db)
        async with Database.open(pg_dsn, size=1) as other, other.connection() as connection:
            assert await connection.fetchval(lock)  # free again: the reset unlocked it
            await connection.execute("SELECT pg_advisory_unlock_all()")


async def test_a_pooled_connection_looks_up_every_array_type_when_it_opens(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No named statement of the coordinator makes asyncpg query the catalog for a type
    once the pool's connection has opened: the connection's setup named them all at once
    (db.sql's array_types), instead of one lookup per new type on its first statements."""
    looked_up: list[list[int]] = []
    introspect = asyncpg.Connection._introspect_types

    async def watched(self: asyncpg.Connection, oids: list[int], *rest: object) -> object:
        looked_up.append(list(oids))
        return await introspect(self, oids, *rest)

    monkeypatch.setattr(asyncpg.Connection, "_introspect_types", watched)
    async with Database.open(pg_dsn, size=1) as db, db.connection() as connection:
        assert looked_up, "opening the connection looked the array types up"
        looked_up.clear()
        for path in queries.sql_files():
            for text in queries.load(path.stem).values():
                await connection.prepare(text)
        names = await connection.fetch(
            "SELECT typname FROM pg_type WHERE oid = ANY($1::oid[])",
            [oid for oids in looked_up for oid in oids],
        )
        assert not looked_up, f"add {[row['typname'] for row in names]} to db.sql's array_types"


async def test_a_claim_that_overlaps_a_run_creation_answers_the_job_it_leased(
    coordinator: CoordinatorHarness,
) -> None:
    """A Claim whose statement began before CreateRun committed, and whose lease was taken
    after (here: it waits on the runtime's row, held by another transaction, while the run
    is created). The lease and the answer come from the same snapshot, so the processor gets
    the job it leased; before, the answer's join read the older snapshot, found no
    recording, and answered "no job" while the job stayed leased until its lease lapsed."""
    c = coordinator
    s = await setup(c)
    runtime = s.world.tracking_runtime
    async with c.db.connection() as holder, holder.transaction():
        # NO KEY UPDATE: blocks the claim's runtime_seen, not CreateRun's foreign keys.
        await holder.execute(
            "SELECT 1 FROM runtimes WHERE runtime_id = $1 FOR NO KEY UPDATE", runtime
        )
        claiming = asyncio.create_task(claim(c, s))
        async with c.db.connection() as watcher:
            for _ in range(500):
                waiting = await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND query LIKE '%job_claim%'"
                )
                if waiting:
                    break
                await asyncio.sleep(0.01)
            assert waiting == 1, "the claim never waited on the runtime's row"
        await create_run(c, s)
        assert not claiming.done()
    job = await asyncio.wait_for(claiming, 10)
    async with c.db.connection() as connection:
        leased = await connection.fetch(
            "SELECT job_index, generation FROM jobs WHERE state = 'leased'"
        )
    assert job is not None, f"no job answered, but leased: {[dict(r) for r in leased]}"
    assert [(r["job_index"], r["generation"]) for r in leased] == [(0, job.lease.generation)]
    assert job.input.recording.sha256  # the recording's facts came with it
