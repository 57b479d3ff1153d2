"""Which leases the preview service writes bytes for.

A preview's bytes are written before the coordinator records them (publication.proto),
so before writing, the service asks the coordinator once whether the lease holds
for this processor's key and code (CheckLease: all four fences, nothing written) and
keeps the answer for a few seconds. Within that time a lease that lost a fence, or a
key revoked, still gets its bytes written; the record is then refused and the bytes
become collectable, so the only cost is a write the cleanup loop undoes. A caller
whose lease never held gets nothing written at all.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from services.preview.coordinator import CoordinatorClient
from workshop.v1 import common_pb2
from workshop.v1 import publication_pb2 as pub

CHECK_SECONDS = 10.0
MAX_LEASES = 10_000

LeaseKey = tuple[str, str, str, int, str, str]


class LeaseChecks:
    def __init__(
        self,
        coordinator: CoordinatorClient,
        *,
        seconds: float = CHECK_SECONDS,
        size: int = MAX_LEASES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._coordinator = coordinator
        self.seconds = seconds
        self._size = size
        self._clock = clock
        self._held: OrderedDict[LeaseKey, tuple[float, pub.CheckLeaseResponse]] = OrderedDict()

    async def facts(
        self, processor: str, lease: common_pb2.LeaseRef, code_sha256: str
    ) -> pub.CheckLeaseResponse:
        """The lease's facts if it held within the last few seconds; else the coordinator's
        refusal (FAILED_PRECONDITION, NOT_FOUND, UNAUTHENTICATED...)."""
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
            return held[1]
        facts = await self._coordinator.check_lease(
            pub.CheckLeaseRequest(lease=lease, code_sha256=code_sha256), processor
        )
        self._held[key] = (now, facts)
        self._held.move_to_end(key)
        while len(self._held) > self._size:
            self._held.popitem(last=False)
        return facts
