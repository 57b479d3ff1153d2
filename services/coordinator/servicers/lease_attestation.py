"""The signed statement every claimed job carries (ClaimedJob.lease_attestation).

With COORDINATOR_LEASE_ATTESTATION_KEY set, each job a claim hands out (unary Claim, a
Session's claim, Complete's then_claim) says, signed, what CheckLease would have answered
for it right then, for the claiming key and the run's code: the preview service verifies
it and grants writes without asking CheckLease (docs/previews-and-uploads.md). Everything
comes from what the claim already read: no statement of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from services.coordinator import convert
from services.coordinator.leases.jobs import Claimed
from services.coordinator.platform.clock import Clock
from workshop.kit.lease_attestation import VALID_SECONDS, sign
from workshop.v1 import common_pb2
from workshop.v1 import publication_pb2 as pub


class LeaseAttester:
    def __init__(self, key: str, clock: Clock, wall: Callable[[], float] = time.time) -> None:
        self._key = key.encode()
        self._clock = clock
        # valid_until is real time, which the preview service's clock keeps too: the
        # coordinator's clock (`checked_at`, as CheckLease answers it) may be one that tests
        # move, and a statement's life must not move with it.
        self._wall = wall

    def attest(
        self, claimed: Claimed, lease: common_pb2.LeaseRef, credential_sha256: str
    ) -> pub.LeaseAttestation:
        job, snapshot = claimed.job, claimed.frozen.snapshot
        valid_until_us = int((self._wall() + VALID_SECONDS) * 1_000_000)
        claims = pub.LeaseClaims(
            lease=lease,
            credential_sha256=credential_sha256,
            # the run's code, which fence 4 compares every write's with (the claim checked
            # the runtime's; a processor refuses a snapshot naming other code)
            code_sha256=snapshot.code_sha256,
            facts=pub.CheckLeaseResponse(
                lease_expires_at=convert.ts(job.lease_expires_at),
                mode=snapshot.mode,
                kind=snapshot.kind,
                camera_id=job.camera_id,
                slot_count=job.facts.slot_count,
                checked_at=convert.ts(self._clock.now()),
            ),
            valid_until=convert.stamp(valid_until_us),
        )
        return sign(self._key, claims)
