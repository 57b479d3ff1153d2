"""A bucket's review queue across runs, and bulk decisions on a filtered selection of its
sightings (docs/review.md, "Review queue" and "Bulk decisions").

The queue reads the review columns each sighting keeps (migration 0010, set by every
writer of a sighting's items or decisions: `sightings_refresh_v1` from all its items, and
since 0015 `sightings_refresh_v2` from the added boxes for a commit that only appends), one
index range per review state asked for, in the order asked, after the last key of the
page before (keyset paging: no OFFSET, so a page deep in a bucket costs what the first
one does). A bulk decision selects the sightings a filter matches, takes their
timelines' locks in key order, checks the selection against the revision its preview
answered, and applies one decision to all of them in one statement
(`sightings_bulk_decide_v1`), logging each changed box's review before for the undo.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from services.coordinator.identity.auth import Principal
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import Connection, Database, Row, bind, fetch_all, sql
from services.coordinator.platform.errors import (
    InvalidField,
    NotFound,
    NothingToUndo,
    StaleRevision,
)
from services.coordinator.review.review_params import (
    BulkDecide,
    BulkDecisionInsert,
    BulkSelection,
    QueuePageKeys,
)
from services.coordinator.review.reviews import (
    SightingRow,
    decidable_cameras,
    readable_cameras,
)
from workshop.kit import errors

ORDERS = ("oldest", "score", "camera")
STATES = ("pending", "accepted", "rejected")
# A bulk decision is one transaction: its selection is bounded (narrow the filter).
MAX_BULK_SIGHTINGS = 100_000
MAX_BULK_ITEMS = 100_000


@dataclasses.dataclass(frozen=True)
class SightingFilter:
    """Which of a bucket's sightings: every set field must match. review_states empty
    means pending only (what a queue is for)."""

    review_states: tuple[str, ...] = ()
    class_name: str = ""
    camera_id: str = ""
    run_id: str = ""
    frame_time_from: datetime | None = None
    frame_time_to: datetime | None = None
    min_score: float | None = None
    max_score: float | None = None

    @property
    def states(self) -> list[str]:
        return list(self.review_states) or ["pending"]

    def as_json(self) -> dict[str, Any]:
        """The filter as stored on a bulk decision and digested into page tokens."""
        return {
            "review_states": self.states,
            "class_name": self.class_name,
            "camera_id": self.camera_id,
            "run_id": self.run_id,
            "frame_time_from": self.frame_time_from.isoformat() if self.frame_time_from else "",
            "frame_time_to": self.frame_time_to.isoformat() if self.frame_time_to else "",
            "min_score": self.min_score,
            "max_score": self.max_score,
        }

    def fingerprint(self, bucket_id: str, order: str) -> str:
        text = json.dumps([bucket_id, order, self.as_json()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def params(self, bucket_id: str, cameras: frozenset[str] | None) -> dict[str, Any]:
        return {
            "bucket_id": bucket_id,
            "review_states": self.states,
            "class_name": self.class_name or None,
            "camera_id": self.camera_id or None,
            "cameras": sorted(cameras) if cameras is not None else None,
            "run_id": self.run_id or None,
            "frame_time_from": self.frame_time_from,
            "frame_time_to": self.frame_time_to,
            "min_score": self.min_score,
            "max_score": self.max_score,
        }


@dataclasses.dataclass(frozen=True)
class QueueKey:
    """Where a queue page starts: after this sighting in the order's key."""

    score: float
    camera_id: str
    first_frame_time: datetime
    run_id: str
    sighting_id: str


FIRST = QueueKey(-math.inf, "", datetime(1, 1, 1, tzinfo=UTC), "", "")


@dataclasses.dataclass(frozen=True, slots=True)
class QueueRow(Row):
    run_id: str
    sighting_id: str
    camera_id: str
    first_frame_time: datetime
    score: float

    def key(self) -> QueueKey:
        return QueueKey(
            self.score, self.camera_id, self.first_frame_time, self.run_id, self.sighting_id
        )


@dataclasses.dataclass(frozen=True, slots=True)
class QueuedSightingRow(Row):
    """A sighting of the queue: its run and score, and the sighting as GetReview shows it."""

    run_id: str
    score: float
    sighting: SightingRow


@dataclasses.dataclass(frozen=True)
class QueuePage:
    sightings: list[QueuedSightingRow]
    next_key: QueueKey | None


@dataclasses.dataclass(frozen=True, slots=True)
class SelectedRow(Row):
    """A sighting a bulk decision selects, with what its selection revision digests."""

    run_id: str
    sighting_id: str
    bucket_id: str
    camera_id: str
    item_count: int
    first_frame_time: datetime
    last_frame_time: datetime
    review_state: str
    pending_items: int
    relabel_class: str | None
    decided_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class ChangeCounts(Row):
    sightings: int
    items: int


@dataclasses.dataclass(frozen=True, slots=True)
class BulkDecisionRow(Row):
    action_id: str
    bucket_id: str
    filter: dict[str, Any]
    review_state: str
    relabel_class: str | None
    decided_by: dict[str, str]
    decided_at: datetime
    sightings_selected: int
    sightings_changed: int
    items_changed: int
    undone_by: dict[str, str] | None
    undone_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class TimelineRow(Row):
    run_id: str
    bucket_id: str
    camera_id: str


@dataclasses.dataclass(frozen=True)
class BulkOutcome:
    """What a bulk decision selects and changes; `action` None on a dry run."""

    sightings_selected: int
    sightings_changed: int
    items_changed: int
    selection_revision: str
    action: BulkDecisionRow | None


def selection_revision(rows: Sequence[SelectedRow], state: str, relabel: str | None) -> str:
    """A digest of the selection as it stands (each sighting's items and review) and the
    decision: a preview's answer, which the apply then expects."""
    digest = hashlib.sha256(json.dumps([state, relabel]).encode())
    for row in rows:
        digest.update(
            "|".join(
                (
                    row.run_id,
                    row.sighting_id,
                    str(row.item_count),
                    row.first_frame_time.isoformat(),
                    row.last_frame_time.isoformat(),
                    row.review_state,
                    str(row.pending_items),
                    row.relabel_class or "",
                    row.decided_at.isoformat() if row.decided_at else "",
                )
            ).encode()
            + b"\n"
        )
    return "sel1." + digest.hexdigest()[:32]


class SelectionChanged(Exception):
    """The selection's sightings moved to timelines not locked yet: the apply starts over."""


class ReviewQueue:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    async def page(
        self,
        who: Principal,
        bucket_id: str,
        wanted: SightingFilter,
        order: str,
        after: QueueKey | None,
        limit: int,
    ) -> QueuePage:
        """The next `limit` sightings of the bucket's queue in `order` after `after`."""
        cameras = readable_cameras(who)
        key = after or FIRST
        keys = QueuePageKeys(
            **wanted.params(bucket_id, cameras),
            order_by=order if order in ORDERS else "oldest",
            after_score=key.score,
            after_camera=key.camera_id,
            after_time=key.first_frame_time,
            after_run=key.run_id,
            after_sighting=key.sighting_id,
            limit=limit + 1,
        )
        async with self.db.connection() as connection:
            await _bucket_exists(connection, bucket_id)
            rows = await fetch_all(connection, QueueRow, *bind(keys))
            next_key = rows[limit - 1].key() if len(rows) > limit else None
            rows = rows[:limit]
            found = (
                await fetch_all(
                    connection,
                    QueuedSightingRow,
                    sql("review", "queue_sightings"),
                    [row.run_id for row in rows],
                    [row.sighting_id for row in rows],
                )
                if rows
                else []
            )
        return QueuePage(found, next_key)

    async def bulk_decide(
        self,
        who: Principal,
        bucket_id: str,
        wanted: SightingFilter,
        state: str,
        relabel: str | None,
        *,
        dry_run: bool,
        expected_revision: str | None,
    ) -> BulkOutcome:
        """Previews (dry_run) or applies one decision to every sighting `wanted` selects."""
        cameras = decidable_cameras(who)
        if dry_run:
            async with self.db.transaction() as connection:
                outcome, _ = await self._select(
                    connection, bucket_id, wanted, cameras, state, relabel, expected_revision
                )
                return outcome
        for _ in range(3):
            try:
                return await self._apply(
                    who, bucket_id, wanted, cameras, state, relabel, expected_revision
                )
            except SelectionChanged:
                continue
        raise StaleRevision(
            "The selection kept changing while it was being locked (sightings regrouped by "
            "commits); try again.",
            metadata={"current_revision": ""},
        )

    async def _select(
        self,
        connection: Connection,
        bucket_id: str,
        wanted: SightingFilter,
        cameras: frozenset[str] | None,
        state: str,
        relabel: str | None,
        expected_revision: str | None,
        *,
        locked: set[tuple[str, str, str]] | None = None,
    ) -> tuple[BulkOutcome, list[SelectedRow]]:
        await _bucket_exists(connection, bucket_id)
        rows = await fetch_all(
            connection,
            SelectedRow,
            *bind(BulkSelection(**wanted.params(bucket_id, cameras), limit=MAX_BULK_SIGHTINGS + 1)),
        )
        if len(rows) > MAX_BULK_SIGHTINGS:
            raise InvalidField(
                f"The filter selects more than {MAX_BULK_SIGHTINGS:,} sightings; narrow it "
                "(by time range, camera, run or class) and act on each part.",
                metadata={"field": "filter", "limit": str(MAX_BULK_SIGHTINGS)},
            )
        if (
            locked is not None
            and not {(row.run_id, row.bucket_id, row.camera_id) for row in rows} <= locked
        ):
            raise SelectionChanged
        runs = [row.run_id for row in rows]
        ids = [row.sighting_id for row in rows]
        counts = ChangeCounts(0, 0)
        if rows:
            found = await fetch_all(
                connection, ChangeCounts, sql("review", "bulk_changes"), runs, ids, state, relabel
            )
            counts = found[0]
        revision = selection_revision(rows, state, relabel)
        if expected_revision and expected_revision != revision:
            raise StaleRevision(
                f"The selection changed since its preview (revision {expected_revision!r}): it "
                f"now holds {len(rows)} sightings, {counts.sightings} of them to change "
                f"({counts.items} items); preview it again.",
                metadata={
                    "current_revision": revision,
                    "sightings_selected": str(len(rows)),
                    "sightings_changed": str(counts.sightings),
                    "items_changed": str(counts.items),
                },
            )
        if counts.items > MAX_BULK_ITEMS:
            raise InvalidField(
                f"The decision would change {counts.items:,} items; at most "
                f"{MAX_BULK_ITEMS:,} change in one bulk decision: narrow the filter.",
                metadata={"field": "filter", "limit": str(MAX_BULK_ITEMS)},
            )
        return BulkOutcome(len(rows), counts.sightings, counts.items, revision, None), rows

    async def _apply(
        self,
        who: Principal,
        bucket_id: str,
        wanted: SightingFilter,
        cameras: frozenset[str] | None,
        state: str,
        relabel: str | None,
        expected_revision: str | None,
    ) -> BulkOutcome:
        now = self.clock.now()
        async with self.db.transaction() as connection:
            await _bucket_exists(connection, bucket_id)
            # the timelines of the selection as read before any lock, then the selection
            # again under them: a sighting that moved to another timeline starts it over
            rows = await fetch_all(
                connection,
                TimelineRow,
                *bind(
                    BulkSelection(**wanted.params(bucket_id, cameras), limit=MAX_BULK_SIGHTINGS + 1)
                ),
            )
            timelines = sorted({(row.run_id, row.bucket_id, row.camera_id) for row in rows})
            await _lock_timelines(connection, timelines)
            outcome, selected = await self._select(
                connection,
                bucket_id,
                wanted,
                cameras,
                state,
                relabel,
                expected_revision,
                locked=set(timelines),
            )
            action_id = "bulk-" + uuid.uuid4().hex[:20]
            by = who.to_json()
            await connection.execute(
                *bind(
                    BulkDecisionInsert(
                        action_id=action_id,
                        bucket_id=bucket_id,
                        filter=wanted.as_json(),
                        review_state=state,
                        relabel_class=relabel,
                        decided_by=by,
                        decided_at=now,
                    )
                )
            )
            await connection.execute(
                *bind(
                    BulkDecide(
                        action_id=action_id,
                        run_ids=[row.run_id for row in selected],
                        sighting_ids=[row.sighting_id for row in selected],
                        review_state=state,
                        relabel_class=relabel,
                        decided_by=by,
                        now=now,
                    )
                )
            )
            action = await _action(connection, action_id, lock=False)
        return dataclasses.replace(outcome, action=action)

    async def undo(self, who: Principal, action_id: str) -> BulkDecisionRow:
        """Undoes a bulk decision: every box it changed goes back to its review before,
        unless one was decided again since (then nothing changes: ABORTED)."""
        cameras = decidable_cameras(who)
        if not action_id:
            raise InvalidField("action_id is required.", metadata={"field": "action_id"})
        now = self.clock.now()
        async with self.db.transaction() as connection:
            timelines = await fetch_all(
                connection, TimelineRow, sql("review", "bulk_decision_timelines"), action_id
            )
            await _action(connection, action_id, lock=False)  # NOT_FOUND first
            if cameras is not None and any(t.camera_id not in cameras for t in timelines):
                raise errors.PermissionDenied(
                    "This bulk decision changed sightings of cameras this credential may not "
                    "decide on."
                )
            await _lock_timelines(
                connection, sorted({(t.run_id, t.bucket_id, t.camera_id) for t in timelines})
            )
            action = await _action(connection, action_id, lock=True)
            if action.undone_at is not None:
                raise NothingToUndo(f"Bulk decision {action_id!r} was undone already.")
            changed: int = await connection.fetchval(
                sql("review", "bulk_decision_changed_since"), action_id
            )
            if changed:
                raise StaleRevision(
                    f"{changed} of the boxes bulk decision {action_id!r} changed were decided "
                    "again since; undoing it would overwrite those decisions. Nothing changed.",
                    metadata={"changed_since": str(changed)},
                )
            await connection.execute(
                sql("review", "bulk_decision_undo"), action_id, who.to_json(), now
            )
            return await _action(connection, action_id, lock=False)


async def _bucket_exists(connection: Connection, bucket_id: str) -> None:
    if not bucket_id:
        raise InvalidField("bucket_id is required.", metadata={"field": "bucket_id"})
    if await connection.fetchval(sql("review", "bucket_exists"), bucket_id) is None:
        raise NotFound("bucket", bucket_id, f"Bucket {bucket_id!r} does not exist.")


async def _lock_timelines(
    connection: Connection, timelines: Sequence[tuple[str, str, str]]
) -> None:
    if timelines:
        await connection.execute(
            sql("review", "timelines_lock_many"),
            [t[0] for t in timelines],
            [t[1] for t in timelines],
            [t[2] for t in timelines],
        )


async def _action(connection: Connection, action_id: str, *, lock: bool) -> BulkDecisionRow:
    if lock:
        rows = await fetch_all(
            connection, BulkDecisionRow, sql("review", "bulk_decision_locked"), action_id
        )
    else:
        rows = await fetch_all(
            connection, BulkDecisionRow, sql("review", "bulk_decision_get"), action_id
        )
    if not rows:
        raise NotFound("bulk_decision", action_id, f"Bulk decision {action_id!r} does not exist.")
    return rows[0]
