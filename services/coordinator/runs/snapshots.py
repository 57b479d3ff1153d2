"""Run snapshots, read once per process: they never change, so caching is safe.

A snapshot is immutable from its run's creation on (docs/runs-and-jobs.md).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from datetime import UTC, datetime

from google.protobuf import json_format

from services.coordinator.platform.db import Database, sql
from services.coordinator.platform.errors import NotFound
from workshop.v1 import common_pb2, snapshot_pb2


@dataclasses.dataclass(frozen=True)
class Frozen:
    """A snapshot and the facts the lease path reads from it."""

    snapshot: snapshot_pb2.RunSnapshot
    window_end: datetime
    dropped_allowed: bool
    full_run: bool
    output_buckets: dict[str, str]


class SnapshotCache:
    def __init__(self, db: Database, *, size: int = 1024) -> None:
        self._db = db
        self._size = size
        self._entries: OrderedDict[str, Frozen] = OrderedDict()

    async def get(self, run_id: str) -> Frozen:
        found = self._entries.get(run_id)
        if found is not None:
            self._entries.move_to_end(run_id)
            return found
        async with self._db.connection() as connection:
            document = await connection.fetchval(sql("runs", "run_snapshot_get"), run_id)
        if document is None:
            raise NotFound("run", run_id, f"Run {run_id!r} does not exist.")
        snapshot = json_format.ParseDict(document, snapshot_pb2.RunSnapshot())
        frozen = Frozen(
            snapshot=snapshot,
            window_end=snapshot.inputs[0].window_end.ToDatetime(tzinfo=UTC)
            if snapshot.inputs
            else datetime.max.replace(tzinfo=UTC),
            dropped_allowed=snapshot.sampling.dropped_allowed,
            full_run=snapshot.mode == common_pb2.RUN_MODE_FULL,
            output_buckets={output.step_id: output.bucket_id for output in snapshot.outputs},
        )
        self._entries[run_id] = frozen
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return frozen
