"""Lease attestations: a grant right after a claim costs the coordinator no CheckLease.

The in-process coordinator (real Postgres) signs every claimed job's lease with the key it
shares with the preview service (COORDINATOR_/PREVIEW_LEASE_ATTESTATION_KEY); the preview
service takes a statement it verifies for CheckLease's answer in GrantPreviewWrites. Every
statement it cannot take (tampered, another caller's, another lease's, other code, no key on
either side, ending too late) falls back to CheckLease, which decides as without one. The
CheckLease calls are counted on the coordinator's own series (the registry this process
shares with the services it runs); verify's every check, expiry included, is unit-tested in
tests/unit/test_lease_attestation.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.processor.direct_writes import DirectPreviews
from testbed.coordinator_leases import (
    Setup,
    claimed,
    complete_request,
    create_run,
    empty_result,
    on_behalf,
    setup,
)
from testbed.coordinator_world import CODE, error_reason
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from testbed.harness.preview import PreviewHarness, box, jpeg_bytes, running_preview
from testbed.harness.s3 import S3Bucket
from testbed.session_jobs import JOB_TRANSPORTS
from workshop.kit.auth import bearer_metadata
from workshop.kit.hashing import sha256_hex
from workshop.kit.metrics import REGISTRY
from workshop.v1 import jobs_pb2, publication_pb2
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import workshop_pb2 as ws

KEY = "attestation-key-for-tests-0123456789abcdef"
JPEG = "image/jpeg"
CHECK_LEASE = "workshop.v1.PublicationService/CheckLease"


@pytest.fixture
async def coordinator(pg_dsn: str, job_transport: str) -> AsyncIterator[CoordinatorHarness]:
    async with running_coordinator(
        pg_dsn, job_transport=job_transport, lease_attestation_key=KEY
    ) as harness:
        yield harness


@pytest.fixture
async def preview(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> AsyncIterator[PreviewHarness]:
    async with running_preview(coordinator, s3_bucket, lease_attestation_key=KEY) as harness:
        yield harness


@pytest.fixture
async def s(coordinator: CoordinatorHarness) -> Setup:
    return await setup(coordinator)


def check_leases() -> float:
    """CheckLease calls the test coordinator has answered (or refused) so far."""
    total = 0.0
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if (
                sample.name == "workshop_rpc_requests_total"
                and sample.labels.get("service") == "coordinator-test"
                and sample.labels.get("method") == CHECK_LEASE
            ):
                total += sample.value
    return total


def lease_checks(source: str) -> float:
    """The preview service's lease checks answered from `source` so far."""
    value = REGISTRY.get_sample_value("workshop_preview_lease_checks_total", {"source": source})
    return value or 0.0


class Counted:
    """Since it was made: CheckLease calls, attestations taken, CheckLease answers reused."""

    def __init__(self) -> None:
        self.start = self.now()

    @staticmethod
    def now() -> tuple[float, float, float]:
        return check_leases(), lease_checks("attestation"), lease_checks("cache")

    def since(self) -> tuple[float, float, float]:
        now = self.now()
        return now[0] - self.start[0], now[1] - self.start[1], now[2] - self.start[2]


def lease_grant(
    job: jobs_pb2.ClaimedJob,
    attestation: publication_pb2.LeaseAttestation | None = None,
    *,
    code: str = CODE,
) -> pb.GrantPreviewWritesRequest:
    """The processor's request: a lease grant, carrying `attestation` (default: the job's)."""
    return pb.GrantPreviewWritesRequest(
        lease=job.lease,
        code_sha256=code,
        content_type=JPEG,
        lease_grant=True,
        lease_attestation=job.lease_attestation if attestation is None else attestation,
    )


def tampered(job: jobs_pb2.ClaimedJob) -> publication_pb2.LeaseAttestation:
    """The job's attestation with another MAC."""
    return publication_pb2.LeaseAttestation(claims=job.lease_attestation.claims, mac=bytes(32))


def claims_of(job: jobs_pb2.ClaimedJob) -> publication_pb2.LeaseClaims:
    claims = publication_pb2.LeaseClaims()
    claims.ParseFromString(job.lease_attestation.claims)
    return claims


async def assert_same_grants(
    p: PreviewHarness, s: Setup, job: jobs_pb2.ClaimedJob
) -> pb.LeasePreviewWriteGrant:
    """The grant with the job's attestation (no CheckLease) bounds what the one without it
    (CheckLease) does: the same prefix, suffix, size and content type, and an expiry within
    the grant's 60 s of now."""
    counted = Counted()
    with_it = (await p.stub.GrantPreviewWrites(lease_grant(job), metadata=s.processor)).lease_grant
    assert counted.since() == (0, 1, 0)
    without = pb.GrantPreviewWritesRequest(
        lease=job.lease, code_sha256=CODE, content_type=JPEG, lease_grant=True
    )
    plain = (await p.stub.GrantPreviewWrites(without, metadata=s.processor)).lease_grant
    assert counted.since() == (1, 1, 0)
    for granted in (with_it, plain):
        left = granted.expires_at.ToDatetime(tzinfo=UTC) - datetime.now(UTC)
        assert timedelta(seconds=40) < left <= timedelta(seconds=60)
    assert (with_it.key_prefix, with_it.key_suffix, with_it.max_bytes, with_it.content_type) == (
        plain.key_prefix,
        plain.key_suffix,
        plain.max_bytes,
        plain.content_type,
    )
    return with_it


@pytest.mark.parametrize("job_transport", JOB_TRANSPORTS)
async def test_a_grant_right_after_a_claim_asks_no_check_lease_and_grants_as_before(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup, job_transport: str
) -> None:
    c, p = coordinator, preview
    await create_run(c, s, full=False)
    job = await claimed(c, s)
    claims = claims_of(job)
    # What CheckLease answers for the lease is what the claim attested (but its time).
    answer = await c.publication.CheckLease(
        publication_pb2.CheckLeaseRequest(lease=job.lease, code_sha256=CODE),
        metadata=on_behalf(s),
    )
    claims.facts.ClearField("checked_at")
    answer.ClearField("checked_at")
    assert claims.facts == answer
    assert (claims.lease, claims.code_sha256) == (job.lease, CODE)
    granted = await assert_same_grants(p, s, job)
    assert granted.key_prefix == "workshop-tests/previews/r1/j0/1/"


async def test_completes_next_claim_carries_an_attestation_the_grant_takes(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    c, p = coordinator, preview
    await create_run(c, s, full=True)
    first = await claimed(c, s)
    request = complete_request(first, empty_result(first))
    request.then_claim.CopyFrom(
        jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE)
    )
    reply = await c.jobs.Complete(request, metadata=s.processor)
    job = reply.claimed.job
    assert (job.lease.job_id, job.HasField("lease_attestation")) == ("j1", True)
    granted = await assert_same_grants(p, s, job)
    assert granted.key_prefix == "previews/r1/j1/1/"


async def test_a_statement_that_does_not_verify_falls_back_to_check_lease(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    c, p = coordinator, preview
    await create_run(c, s, full=True)
    job, other_job = await claimed(c, s), await claimed(c, s)
    # a processor key of the same device: CheckLease lets it write for the lease (fence 4),
    # the statement does not (it names the claiming key)
    another = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="processor-2")
    for request, metadata, answered in (
        (lease_grant(job, tampered(job)), s.processor, (1, 0, 0)),
        (lease_grant(job), bearer_metadata(another), (1, 0, 0)),
        # CheckLease's answer for this key and lease, of a moment ago, is reused
        (lease_grant(job, other_job.lease_attestation), s.processor, (0, 0, 1)),
    ):
        counted = Counted()
        await p.stub.GrantPreviewWrites(request, metadata=metadata)  # CheckLease: it holds
        assert counted.since() == answered
    # Other code: the statement is not taken, and CheckLease refuses (fence 4).
    counted = Counted()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await p.stub.GrantPreviewWrites(lease_grant(job, code="d" * 64), metadata=s.processor)
    assert error_reason(caught.value)[0] == grpc.StatusCode.FAILED_PRECONDITION
    assert counted.since() == (1, 0, 0)


async def test_a_lease_that_no_longer_holds_is_refused_unless_a_statement_of_it_verifies(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    """Cancelled after the claim: a statement that does not verify leaves it to CheckLease,
    which refuses; one that verifies grants, as a CheckLease answer kept for 10 s does (the
    record of what is written is then refused by the fences, and its bytes collected)."""
    c, p = coordinator, preview
    await create_run(c, s, full=True)
    job = await claimed(c, s)
    await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)
    counted = Counted()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await p.stub.GrantPreviewWrites(lease_grant(job, tampered(job)), metadata=s.processor)
    assert error_reason(caught.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_CANCELLED")
    await p.stub.GrantPreviewWrites(lease_grant(job), metadata=s.processor)
    assert counted.since() == (1, 1, 0)


async def test_without_the_key_on_either_side_or_with_a_shorter_reuse_check_lease_decides(
    pg_dsn: str, coordinator: CoordinatorHarness, s3_bucket: S3Bucket, s: Setup
) -> None:
    c = coordinator
    await create_run(c, s, full=True)
    job = await claimed(c, s)
    for overrides in (
        {},
        {"lease_attestation_key": "another-key-" + "x" * 32},
        {
            "lease_attestation_key": KEY,
            "lease_check_seconds": 5.0,  # the statement's 10 s end lies beyond what it reuses
        },
    ):
        async with running_preview(c, s3_bucket, **overrides) as p:
            counted = Counted()
            await p.stub.GrantPreviewWrites(lease_grant(job), metadata=s.processor)
            assert counted.since() == (1, 0, 0), overrides
    # A coordinator without the key (another replica on the same database) attests nothing.
    async with running_coordinator(pg_dsn) as plain:
        assert not (await claimed(plain, s)).HasField("lease_attestation")


async def test_the_processor_passes_its_jobs_attestation_and_writes_without_check_lease(
    coordinator: CoordinatorHarness, preview: PreviewHarness, s: Setup
) -> None:
    c, p = coordinator, preview
    await create_run(c, s, full=False)
    job = await claimed(c, s)

    async def call(method: Any, request: Any) -> Any:
        return await method(request, metadata=s.processor)

    direct = DirectPreviews(p.stub, call, lambda refused: RuntimeError(refused.message), CODE)
    counted = Counted()
    try:
        for slot in range(3):
            image = jpeg_bytes(seed=slot)
            await direct.publish(
                job, slot, job.input.slots[slot].start, image, JPEG, [box()], sha256_hex(image)
            )
        await direct.settle(job.lease)
    finally:
        direct.close()
    assert counted.since() == (0, 1, 0)
    assert len(await p.keys()) == 3
