"""The cleanup loop: deletes the bytes the coordinator calls collectable.

See docs/previews-and-uploads.md for what becomes collectable when.

One pass deletes every expired preview (batch after batch until the
coordinator says none remain) and at most one batch of 500 expired or
abandoned uploads, oldest first; a backlog of uploads drains over later
passes. The coordinator claims each batch it lists for this pass alone (5
minutes), so preview replicas running passes at once get disjoint batches;
a pass that dies releases its batch when the claim lapses; one whose deletes fail
hands back what it could not delete at once. Bytes are deleted
before they are marked deleted, so a failure in between only repeats work:
deleting a missing object succeeds.

Preview batches also carry sweeps: jobs whose previews have all expired, whose
prefix may hold bytes that were written but never recorded (a preview service
that stopped between the write and the record). The pass lists the prefix and
hands what it found to the coordinator, which records the unknown objects as
collectable; the next batches delete them like any other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence

from services.preview.coordinator import CoordinatorClient
from services.preview.metrics import CLEANUP_PASSES, count_deletion
from services.preview.storage import ObjectStore
from workshop.kit.periodic import Periodic
from workshop.v1 import common_pb2
from workshop.v1 import publication_pb2 as pub

log = logging.getLogger(__name__)

PREVIEW_BATCH = 500
UPLOAD_LIMIT = 500
SETTLE_BATCH = 1000
HAND_BACK_BATCH = 1000  # MarkObjectsDeleted's limit


@dataclasses.dataclass
class CleanupReport:
    previews_deleted: int = 0
    unrecorded_previews_found: int = 0
    uploads_deleted: int = 0
    bytes_deleted: int = 0
    uploads_remaining: bool = False


class Cleanup:
    """Runs cleanup passes, one at a time per replica (the loop and RunCleanup share it)."""

    def __init__(
        self,
        coordinator: CoordinatorClient,
        store: ObjectStore,
        *,
        preview_batch: int = PREVIEW_BATCH,
        upload_limit: int = UPLOAD_LIMIT,
    ) -> None:
        self.coordinator = coordinator
        self.store = store
        self.preview_batch = preview_batch
        self.upload_limit = upload_limit
        self._one_pass_at_a_time = asyncio.Lock()

    async def run_pass(self) -> CleanupReport:
        async with self._one_pass_at_a_time:
            report = CleanupReport()
            not_deleted: list[str] = []
            try:
                await self._pass(report, not_deleted)
            except Exception:
                CLEANUP_PASSES.labels("failed").inc()
                raise
            finally:
                # Handed back at the end, not batch by batch: within the pass a key the
                # store keeps refusing would be listed again and again.
                await self._hand_back(not_deleted)
            CLEANUP_PASSES.labels("partial" if not_deleted else "ok").inc()
        log.info(
            "cleanup pass: deleted %d previews (%d of them never recorded) and %d uploads "
            "(%d bytes); uploads remaining: %s; handed back %d it could not delete",
            report.previews_deleted,
            report.unrecorded_previews_found,
            report.uploads_deleted,
            report.bytes_deleted,
            "yes" if report.uploads_remaining else "no",
            len(not_deleted),
        )
        return report

    async def _pass(self, report: CleanupReport, not_deleted: list[str]) -> None:
        while True:
            listed = await self.coordinator.collectable(
                common_pb2.OBJECT_KIND_PREVIEW, self.preview_batch
            )
            for sweep in listed.sweeps:
                report.unrecorded_previews_found += await self._settle(sweep)
            count, size = await self._delete(listed.objects, not_deleted)
            report.previews_deleted += count
            report.bytes_deleted += size
            # after sweeps, the objects they recorded wait in the next batches
            if not listed.sweeps and (not listed.has_more or not listed.objects):
                break
        listed = await self.coordinator.collectable(
            common_pb2.OBJECT_KIND_UPLOAD, self.upload_limit
        )
        count, size = await self._delete(listed.objects, not_deleted)
        report.uploads_deleted = count
        report.bytes_deleted += size
        report.uploads_remaining = listed.has_more

    async def _hand_back(self, keys: list[str]) -> None:
        """Ends the pass's hold of `keys`, so the next pass takes them again; best effort:
        when the coordinator does not answer, the holds lapse after 5 minutes anyway."""
        try:
            for start in range(0, len(keys), HAND_BACK_BATCH):
                await self.coordinator.mark_deleted([], keys[start : start + HAND_BACK_BATCH])
        except Exception as error:  # the pass's own outcome (or error) stands
            log.warning("cleanup: could not hand back %d objects: %s", len(keys), error)

    async def _settle(self, sweep: pub.Sweep) -> int:
        """Hands what is under a sweep's prefix to the coordinator; how many it did not know."""
        found = [
            pub.SweptObject(object_key=key, byte_size=size)
            for key, size in await self.store.list_under(sweep.prefix)
        ]
        recorded = 0
        for start in range(0, max(len(found), 1), SETTLE_BATCH):
            chunk = found[start : start + SETTLE_BATCH]
            done = start + SETTLE_BATCH >= len(found)
            recorded += await self.coordinator.settle_sweep(sweep, chunk, done=done)
        return recorded

    async def _delete(
        self, objects: Sequence[pub.CollectableObject], not_deleted: list[str]
    ) -> tuple[int, int]:
        """Deletes the objects' bytes and marks them deleted; (objects, bytes) deleted.
        Adds the keys whose bytes it could not delete to `not_deleted`."""
        if not objects:
            return 0, 0
        keys = [item.object_key for item in objects]
        try:
            failures = await self.store.remove(keys)
        except Exception:
            not_deleted.extend(keys)  # the store is unreachable: none of them is known gone
            raise
        failed = {failure.key for failure in failures}
        for failure in failures:
            log.warning("cleanup: could not delete %s: %s", failure.key, failure.problem)
        not_deleted.extend(key for key in keys if key in failed)
        deleted = [item for item in objects if item.object_key not in failed]
        if deleted:
            await self.coordinator.mark_deleted([item.object_key for item in deleted])
            for item in deleted:
                count_deletion(item.object_key, item.byte_size)
        return len(deleted), sum(item.byte_size for item in deleted)


def cleanup_worker(cleanup: Cleanup, interval_seconds: float) -> Periodic:
    return Periodic("preview-cleanup", cleanup.run_pass, interval_seconds=interval_seconds)
