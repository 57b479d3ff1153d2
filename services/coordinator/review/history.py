"""One bucket item with its history (GetBucketItem): the result as detected, every
correction and undo of its boxes, every decision on the item alone, and the sightings its
boxes belong to with their decisions (docs/review.md, "Corrections" and "Item decisions").

Read only, from the logs the writers keep (box_corrections, item_decisions, migration
0007) and the item's sightings as GetReview shows them; no lock is taken, so the parts are
each consistent, and together as of one snapshot (one REPEATABLE READ transaction)."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from services.coordinator.identity.auth import Principal
from services.coordinator.platform.db import Database, Row, fetch_all, fetch_one, sql
from services.coordinator.platform.errors import NotFound
from services.coordinator.platform.fields import check_id
from services.coordinator.review.reviews import (
    ItemView,
    SightingRow,
    Timeline,
    item_view_of,
    readable_cameras,
)
from workshop.kit import errors


@dataclasses.dataclass(frozen=True, slots=True)
class CorrectionLogRow(Row):
    revision: int
    boxes: list[dict[str, Any]] | None
    corrected_by: dict[str, str]
    corrected_at: datetime
    undone_by: dict[str, str] | None
    undone_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class ItemDecisionLogRow(Row):
    revision: int
    review_state: str | None  # None: the item decision was cleared
    relabel_class: str | None
    decided_by: dict[str, str]
    decided_at: datetime


@dataclasses.dataclass(frozen=True)
class ItemHistory:
    view: ItemView
    corrections: list[CorrectionLogRow]  # oldest first
    decisions: list[ItemDecisionLogRow]  # oldest first
    sightings: list[SightingRow]  # in the order of the boxes they hold


class ItemHistories:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, reader: Principal, item_id: str) -> ItemHistory:
        """The item and its history, for `reader` (a camera-bound key: its cameras only)."""
        cameras = readable_cameras(reader)
        check_id("item_id", item_id)
        async with self.db.snapshot() as connection:
            timeline = await fetch_one(
                connection, Timeline, sql("review", "item_timeline"), item_id
            )
            if timeline is None:
                raise NotFound("item", item_id, f"Bucket item {item_id!r} does not exist.")
            if cameras is not None and timeline.camera_id not in cameras:
                raise errors.PermissionDenied(
                    f"This credential may not read camera {timeline.camera_id!r}."
                )
            view = await item_view_of(connection, item_id)
            corrections = await fetch_all(
                connection, CorrectionLogRow, sql("review", "item_correction_log"), item_id
            )
            decisions = await fetch_all(
                connection, ItemDecisionLogRow, sql("review", "item_decision_log"), item_id
            )
            sighting_ids = list(dict.fromkeys(b.sighting_id for b in view.boxes if b.sighting_id))
            found = (
                await fetch_all(
                    connection,
                    SightingRow,
                    sql("review", "sightings_get"),
                    timeline.run_id,
                    sighting_ids,
                )
                if sighting_ids
                else []
            )
        by_id = {row.sighting_id: row for row in found}
        return ItemHistory(
            view=view,
            corrections=corrections,
            decisions=decisions,
            sightings=[by_id[s] for s in sighting_ids if s in by_id],
        )
