"""Which leases the preview service writes bytes for.

A preview's bytes are written before the coordinator records them (publication.proto),
so before writing, the service asks the coordinator once whether the lease holds
for this processor's key and code (CheckLease: all four fences, nothing written) and
keeps the answer for a few seconds. Within that time a lease that lost a fence, or a
key revoked, still gets its bytes written; the record is then refused and the bytes
become collectable, so the only cost is a write the cleanup loop undoes. A caller
whose lease never held gets nothing written at all.

GrantPreviewWrites may carry the claim's lease attestation instead: the coordinator's
signed statement that the lease held at the claim, for this caller's key and this code
(workshop.kit.lease_attestation). Verified with the key the coordinator signs with, it is
taken for CheckLease's answer until it ends, at most `seconds` after the claim: no longer
than a CheckLease answer is kept, so it allows exactly what the cache allows. One that does
not verify (no key here, another key, another lease, code or caller, expired, too far
ahead) is ignored: CheckLease decides, as without one.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from services.preview.coordinator import CoordinatorClient
from services.preview.metrics import LEASE_CHECKS
from workshop.kit.lease_attestation import verify
from workshop.v1 import common_pb2
from workshop.v1 import publication_pb2 as pub

CHECK_SECONDS = 10.0
MAX_LEASES = 10_000

LeaseKey = tuple[str, str, str, int, str, str]

log = logging.getLogger(__name__)


class LeaseChecks:
    def __init__(
        self,
        coordinator: CoordinatorClient,
        *,
        seconds: float = CHECK_SECONDS,
        size: int = MAX_LEASES,
        clock: Callable[[], float] = time.monotonic,
        attestation_key: str = "",
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._coordinator = coordinator
        self.seconds = seconds
        self._size = size
        self._clock = clock
        # No key, or no reuse of answers at all (seconds 0): every attestation is ignored.
        self._attestation_key = attestation_key.encode() if seconds > 0 else b""
        self._wall = wall  # attestations end at a time of day; the cache's clock is monotonic
        self._from_attestation = LEASE_CHECKS.labels("attestation")
        self._from_cache = LEASE_CHECKS.labels("cache")
        self._from_coordinator = LEASE_CHECKS.labels("coordinator")
        self._held: OrderedDict[LeaseKey, tuple[float, pub.CheckLeaseResponse]] = OrderedDict()

    async def facts(
        self,
        processor: str,
        lease: common_pb2.LeaseRef,
        code_sha256: str,
        attestation: pub.LeaseAttestation | None = None,
    ) -> pub.CheckLeaseResponse:
        """The lease's facts if it held within the last few seconds (as `attestation` says,
        when it verifies, or as CheckLease answered); else the coordinator's refusal
        (FAILED_PRECONDITION, NOT_FOUND, UNAUTHENTICATED...). `processor` is the caller's
        bearer secret."""
        if attestation is not None and self._attestation_key:
            verdict = verify(
                self._attestation_key,
                attestation,
                lease=lease,
                code_sha256=code_sha256,
                credential=processor,
                now=self._wall(),
                longest_seconds=self.seconds,
            )
            if verdict.facts is not None:
                self._from_attestation.inc()
                return verdict.facts
            log.debug("lease attestation not taken (%s): asking CheckLease", verdict.reason)
        key = (
            processor,
            lease.run_id,
            lease.job_id,
            lease.generation,
            lease.token,
            code_sha256,
        )
        now = self._clock()
        held = self._held.get(key)
        if held is not None and now - held[0] < self.seconds:
            self._from_cache.inc()
            return held[1]
        self._from_coordinator.inc()
        facts = await self._coordinator.check_lease(
            pub.CheckLeaseRequest(lease=lease, code_sha256=code_sha256), processor
        )
        self._held[key] = (now, facts)
        self._held.move_to_end(key)
        while len(self._held) > self._size:
            self._held.popitem(last=False)
        return facts
