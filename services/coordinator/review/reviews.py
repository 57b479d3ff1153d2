"""Review, sightings, the summary and bucket datasets (docs/review.md).

Sightings are grouped when items are committed (`group_items`, in the committing
transaction, before the items are written), so reads only look them up. Every writer of a
timeline's sightings takes its lock row first (sighting_timelines), then items, then the
sightings and the counters, each in key order, so decisions, commits and bucket deletions
never deadlock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import unicodedata
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, TypedDict, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from services.coordinator.identity import auth
from services.coordinator.identity.auth import Principal, ScopeName
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import (
    Connection,
    Database,
    Row,
    bind,
    fetch_all,
    fetch_column,
    fetch_one,
    sql,
)
from services.coordinator.platform.errors import (
    InvalidField,
    NotFound,
    NothingToUndo,
    StaleRevision,
    TestRunNotReviewable,
)
from services.coordinator.review import listing, sightings
from services.coordinator.review.review_params import (
    ItemCorrectionLogged,
    ItemDecisionLogged,
    ItemRevise,
    ReviewPageBoxes,
    ReviewPreviewsPage,
    SightingDecide,
    SightingsApply,
    TimelineContext,
)
from services.coordinator.runs.rows import RunRow, SnapshotRecordingRow
from services.coordinator.runs.runs import Runs, RunView
from workshop.kit import errors
from workshop.kit.values import hot_value

P = TypeVar("P")

MAX_CLASS_LENGTH = 200
DEFAULT_SUMMARY_DAYS = 30
MAX_SUMMARY_DAYS = 366


@dataclasses.dataclass(frozen=True, slots=True)
class Timeline(Row):
    run_id: str
    bucket_id: str
    camera_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class ContextBox(Row):
    """A box of a timeline as a regroup reads it (timeline_context); sighting_id '' while
    ungrouped; a fixed box comes with its sighting's first frame time and item count."""

    bucket_id: str
    item_id: str
    box_index: int
    frame_time: datetime
    class_name: str
    x: float
    y: float
    w: float
    h: float
    sighting_id: str
    fixed: bool
    sighting_first: datetime | None
    sighting_items: int | None

    def detection(self) -> sightings.Detection:
        return sightings.Detection(
            self.item_id,
            self.box_index,
            self.frame_time,
            self.class_name,
            self.x,
            self.y,
            self.w,
            self.h,
        )


# A box of an item about to be committed, as the grouping holds it: leases build them from
# the commit's prepared arrays (`NewItem.detections`).
Detection = sightings.Detection


@hot_value
class NewItem:
    """An item about to be committed, with its boxes as the grouping holds them (box_index
    -1 alone for an item without boxes, as bucket_item_boxes_of reads it once saved):
    built as Detections at once, one object a box, not a box object copied into one."""

    item_id: str
    bucket_id: str
    frame_time: datetime
    detections: Sequence[sightings.Detection]


@dataclasses.dataclass(frozen=True, slots=True)
class SightingChange:
    sighting_id: str
    bucket_id: str
    class_name: str
    first_frame_time: datetime
    last_frame_time: datetime
    item_count: int
    # only added boxes joined it: its boxes already written are those it had, so its review
    # columns follow from theirs and the added boxes' (sightings_refresh_v2's shortcut)
    appended: bool = False
    # made from added boxes alone, and its score known (`_new_sighting_score`): its review
    # is pending with all item_count items pending and this score, which the commit sets
    # itself (job_complete's new_ arrays) instead of a refresh reading the items back
    new_score: float | None = None


def array_literal(values: Sequence[str]) -> str:
    """`values` as a Postgres text array literal (what `'...'::text[]` reads back)."""
    quoted = ('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"' for value in values)
    return "{" + ",".join(quoted) + "}"


@dataclasses.dataclass
class Grouping:
    """What grouping a run's timelines of one camera decided: the box sightings of the
    items being added (`added`, written with them), and what `apply` writes under the
    timelines' locks: items already written whose box sightings changed, sightings made
    or changed, sightings gone (docs/review.md, "Storage")."""

    run_id: str
    camera_id: str
    added: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    changed_items: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    changed_sightings: list[SightingChange] = dataclasses.field(default_factory=list)
    gone: list[str] = dataclasses.field(default_factory=list)

    def literal(self, item_id: str) -> str | None:
        """The box sightings of an added item as job_complete takes them (None: ungrouped)."""
        found = self.added.get(item_id)
        return array_literal(found) if found is not None else None

    @property
    def changes(self) -> int:
        return len(self.changed_items) + len(self.changed_sightings) + len(self.gone)

    def changes_columns(self) -> SightingChanges:
        """What `apply` writes, as the array parameters that write it (review's
        sightings_apply, and a commit's job_complete, which applies them itself), each in
        key order."""
        items = sorted(self.changed_items)
        found = sorted(self.changed_sightings, key=lambda change: change.sighting_id)
        return {
            "changed_items": items,
            "changed_sightings": [array_literal(self.changed_items[i]) for i in items],
            "gone": sorted(self.gone),
            "sighting_ids": [c.sighting_id for c in found],
            "sighting_buckets": [c.bucket_id for c in found],
            "sighting_classes": [c.class_name for c in found],
            "sighting_firsts": [c.first_frame_time for c in found],
            "sighting_lasts": [c.last_frame_time for c in found],
            "sighting_counts": [c.item_count for c in found],
        }

    async def apply(self, connection: Connection) -> None:
        if not self.changes:
            return
        columns = self.changes_columns()
        await connection.execute(
            *bind(
                SightingsApply(
                    run_id=self.run_id,
                    camera_id=self.camera_id,
                    item_ids=columns["changed_items"],
                    item_sightings=columns["changed_sightings"],
                    gone=columns["gone"],
                    sighting_ids=columns["sighting_ids"],
                    sighting_buckets=columns["sighting_buckets"],
                    sighting_classes=columns["sighting_classes"],
                    sighting_firsts=columns["sighting_firsts"],
                    sighting_lasts=columns["sighting_lasts"],
                    sighting_counts=columns["sighting_counts"],
                )
            )
        )
        await refresh_sightings(connection, self.run_id, columns["sighting_ids"])

    def refreshed(self) -> tuple[list[str], list[str]]:
        """The sightings made or changed whose review columns a commit of the added items
        refreshes: (those recomputed from all their items, those only appended to); not
        the new ones whose review the commit sets itself (`new_reviews`)."""
        left = [c for c in self.changed_sightings if c.new_score is None]
        full = [c.sighting_id for c in left if not c.appended]
        appended = [c.sighting_id for c in left if c.appended]
        return sorted(full), sorted(appended)

    def new_reviews(self) -> NewReviews:
        """The review columns of the sightings made from the added items alone whose
        score is known, as a commit's job_complete sets them (review's
        sightings_review_new_v1), in key order."""
        found = sorted(
            (c.sighting_id, c.item_count, c.new_score)
            for c in self.changed_sightings
            if c.new_score is not None
        )
        return {
            "new_sightings": [sighting_id for sighting_id, _, _ in found],
            "new_pending": [items for _, items, _ in found],
            "new_scores": [score for _, _, score in found],
        }


async def refresh_sightings(
    connection: Connection,
    run_id: str,
    sighting_ids: Sequence[str],
    appended: Sequence[str] = (),
    added_items: Sequence[str] = (),
) -> None:
    """The review columns of a run's sightings (the queue's) as their items now say, after
    whatever made or changed them, in the same transaction: `sighting_ids` from all their
    items, `appended` (sightings whose only change is boxes of the just written
    `added_items`) from their columns and those boxes, so a commit's cost does not grow
    with the length of the sightings it extends (sightings_refresh_v2)."""
    if sighting_ids or appended:
        await connection.execute(
            sql("review", "sightings_refresh"),
            run_id,
            list(sighting_ids),
            list(appended),
            list(added_items),
        )


class NewReviews(TypedDict):
    """New sightings' review columns as job_complete's array parameters
    (`Grouping.new_reviews`): each one pending with new_pending[n] items pending."""

    new_sightings: list[str]
    new_pending: list[int]
    new_scores: list[float]


class SightingChanges(TypedDict):
    """A grouping's changes as array parameters (`Grouping.changes_columns`): items already
    written with their new box sightings (text array literals), sightings gone, and
    sightings made or changed with their ranges and counts."""

    changed_items: list[str]
    changed_sightings: list[str]
    gone: list[str]
    sighting_ids: list[str]
    sighting_buckets: list[str]
    sighting_classes: list[str]
    sighting_firsts: list[datetime]
    sighting_lasts: list[datetime]
    sighting_counts: list[int]


@dataclasses.dataclass(frozen=True, slots=True)
class ContextColumns(Row):
    """The boxes a regroup reads (timelines_context_v1, a commit's job_commit_prepare), as
    one row of arrays: one element per box in each (see ContextBox)."""

    context_buckets: list[str]
    context_items: list[str]
    context_boxes: list[int]
    context_times: list[datetime]
    context_classes: list[str]
    context_xs: list[float]
    context_ys: list[float]
    context_ws: list[float]
    context_hs: list[float]
    context_sightings: list[str]
    context_fixed: list[bool]
    context_firsts: list[datetime | None]
    context_counts: list[int | None]

    def boxes(self) -> list[ContextBox]:
        return [
            ContextBox(*values)
            for values in zip(
                self.context_buckets,
                self.context_items,
                self.context_boxes,
                self.context_times,
                self.context_classes,
                self.context_xs,
                self.context_ys,
                self.context_ws,
                self.context_hs,
                self.context_sightings,
                self.context_fixed,
                self.context_firsts,
                self.context_counts,
                strict=True,
            )
        ]


@dataclasses.dataclass(frozen=True, slots=True)
class ReviewRun(Row):
    run_id: str
    mode: str
    kind: str
    expires_at: datetime | None
    snapshot: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class ItemRow(Row):
    """A bucket item (or a test run's preview) as review and listings show it."""

    item_id: str
    bucket_id: str
    run_id: str
    job_index: int
    slot_index: int
    camera_id: str
    recording_id: str
    recording_generation: int
    output_current: bool
    frame_time: datetime
    boxes: list[dict[str, Any]] | None  # a test run's preview's; bucket items': BoxRow
    review_state: str
    relabel_class: str | None
    saved_at: datetime
    reviewed_at: datetime | None
    revision: int
    corrected_boxes: list[dict[str, Any]] | None  # the correction in force (None: as detected)
    corrected_by: dict[str, str] | None
    corrected_at: datetime | None
    item_state: str | None  # the item decision (None: it follows its sightings)
    item_relabel: str | None
    item_decided_by: dict[str, str] | None
    item_decided_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class ReviewedBoxRow(Row):
    """A box of a bucket item after review (bucket_item_reviewed_boxes): as corrected or
    detected, class after relabels, review state; source_index -1: added by a correction."""

    item_id: str
    box_index: int
    source_index: int
    class_name: str
    score: float
    x: float
    y: float
    w: float
    h: float
    track_id: int | None
    review_state: str
    relabel_class: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class LockedItem(Row):
    item_id: str
    run_id: str
    revision: int
    boxes: list[dict[str, Any]]
    corrected_boxes: list[dict[str, Any]] | None
    item_state: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class CorrectionInForce(Row):
    revision: int
    boxes: list[dict[str, Any]] | None
    corrected_by: dict[str, str]
    corrected_at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class BoxRow(Row):
    """A box of a bucket item as detected, with its review (box_index -1: the item has no
    boxes; it only carries the review)."""

    item_id: str
    box_index: int
    class_name: str
    score: float
    x: float
    y: float
    w: float
    h: float
    track_id: int | None
    sighting_id: str
    review_state: str
    relabel_class: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class StoredItemRow(Row):
    """A bucket item with where its bytes are (exports)."""

    item: ItemRow
    object_key: str
    sha256: str


@dataclasses.dataclass(frozen=True, slots=True)
class SightingRow(Row):
    sighting_id: str
    bucket_id: str
    camera_id: str
    class_name: str
    item_ids: list[str]
    first_frame_time: datetime
    last_frame_time: datetime
    pending: int
    accepted: int
    rejected: int
    relabel_variants: int
    relabel_class: str | None
    decided_at: datetime | None
    decided_by: dict[str, str] | None

    @property
    def review_state(self) -> str:
        """The state its items share; 'pending' while any is undecided, or when two decided
        sightings were merged with different decisions (it needs a decision again)."""
        total = len(self.item_ids)
        if self.accepted == total and self.relabel_variants == 1:
            return "accepted"
        if self.rejected == total:
            return "rejected"
        return "pending"

    @property
    def accepted_as(self) -> str | None:
        """The class its items were relabelled to, while the sighting is accepted."""
        return self.relabel_class if self.review_state == "accepted" else None


@dataclasses.dataclass(frozen=True, slots=True)
class LockedBox(Row):
    bucket_id: str
    camera_id: str
    sighting_id: str
    ungrouped: bool


@dataclasses.dataclass(frozen=True, slots=True)
class BucketSummaryRow(Row):
    bucket_id: str
    name: str
    images: int
    accepted: int
    rejected: int
    pending: int
    saved: int
    last_added_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowSummaryRow(Row):
    workflow_id: str
    name: str
    runs: int
    last_run_id: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class ClassCountRow(Row):
    workflow_id: str
    class_name: str
    detections: int
    confirmations: int


@dataclasses.dataclass(frozen=True, slots=True)
class DayCountRow(Row):
    workflow_id: str
    day: int  # 1-based position of the day in the range
    images: int


@dataclasses.dataclass(frozen=True, slots=True)
class RunReviewCounts(Row):
    run_id: str
    pending: int
    accepted: int
    rejected: int


@dataclasses.dataclass(frozen=True)
class ItemFilter:
    """Which of a bucket's items: every set field must match."""

    review_states: tuple[str, ...] = ()
    class_name: str = ""
    camera_id: str = ""
    frame_time_from: datetime | None = None
    frame_time_to: datetime | None = None
    run_id: str = ""
    min_score: float | None = None  # the highest detected score of its boxes (0: none)
    max_score: float | None = None

    def fingerprint(self, bucket_id: str) -> str:
        """What a page token is bound to, so a token of another listing is refused."""
        text = "|".join(
            (
                bucket_id,
                ",".join(self.review_states),
                self.class_name,
                self.camera_id,
                self.frame_time_from.isoformat() if self.frame_time_from else "",
                self.frame_time_to.isoformat() if self.frame_time_to else "",
            )
        )
        later = (self.run_id, self.min_score, self.max_score)
        if later != ("", None, None):
            # only when set: the tokens of the filters from before these fields stay valid
            text += "|" + json.dumps(later)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class PageKey:
    """Where a page starts: after this item in (frame time, item id) order."""

    frame_time: datetime
    item_id: str


# Before every item: where a first page starts.
FIRST_KEY = PageKey(datetime(1, 1, 1, tzinfo=UTC), "")


@dataclasses.dataclass(frozen=True)
class ReviewPage:
    run: ReviewRun
    recordings: list[SnapshotRecordingRow]
    items: list[ItemRow]
    boxes: dict[str, list[BoxRow]]  # by item id, in box order
    sightings: list[SightingRow]
    next_key: PageKey | None
    # by item id: the boxes after review of the items with a correction only; an item as
    # detected has none here (its reviewed boxes are its `boxes`: `review_as_detected`)
    reviewed: dict[str, list[ReviewedBoxRow]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CorrectionBox:
    """A box of a correction as asked: the detected box it replaces (-1: added)."""

    source_box_index: int
    class_name: str
    x: float
    y: float
    w: float
    h: float


@dataclasses.dataclass(frozen=True)
class ItemView:
    """A bucket item after a correction or an item decision, as answered."""

    item: ItemRow
    boxes: list[BoxRow]
    reviewed: list[ReviewedBoxRow]


@dataclasses.dataclass(frozen=True)
class Decision:
    sighting: SightingRow
    items_updated: int
    items_joined: int


@dataclasses.dataclass(frozen=True)
class DailyCount:
    day: date
    images: int


@dataclasses.dataclass(frozen=True)
class WorkflowSummary:
    row: WorkflowSummaryRow
    last_run: RunView | None
    classes: list[ClassCountRow]
    days: list[DailyCount]


@dataclasses.dataclass(frozen=True)
class Summary:
    buckets: list[BucketSummaryRow]
    workflows: list[WorkflowSummary]


@dataclasses.dataclass(frozen=True)
class ItemsPage:
    items: list[StoredItemRow]
    boxes: dict[str, list[BoxRow]]  # by item id, in box order
    next_key: PageKey | None
    classes: list[str]
    reviewed: dict[str, list[ReviewedBoxRow]] = dataclasses.field(default_factory=dict)


def readable_cameras(who: Principal) -> frozenset[str] | None:
    """The cameras whose items `who` may read (None: every camera): sessions, admins and
    workshop keys without cameras read all; camera-bound workshop and footage:read keys
    their cameras. ScopeMissing without either scope."""
    auth.require(who, ScopeName.WORKSHOP, ScopeName.FOOTAGE_READ)
    return auth.cameras_reached(who, ScopeName.WORKSHOP, ScopeName.FOOTAGE_READ)


def decidable_cameras(who: Principal) -> frozenset[str] | None:
    """The cameras whose sightings `who` may decide: workshop scope only (footage:read keys
    only read)."""
    auth.require(who, ScopeName.WORKSHOP)
    return auth.cameras_reached(who, ScopeName.WORKSHOP)


def check_class(value: str) -> str:
    """A relabel class: 1-200 characters, no control characters."""
    if not value:
        raise InvalidField("class_name is required for RELABEL.", metadata={"field": "class_name"})
    if len(value) > MAX_CLASS_LENGTH:
        raise InvalidField(
            f"class_name is {len(value)} characters; at most {MAX_CLASS_LENGTH} are allowed.",
            metadata={"field": "class_name", "limit": str(MAX_CLASS_LENGTH)},
        )
    if any(unicodedata.category(ch) in ("Cc", "Cf") for ch in value) or value.strip() != value:
        raise InvalidField(
            "class_name may not hold control characters or start or end with spaces.",
            metadata={"field": "class_name"},
        )
    return value


def summary_days(time_zone: str, days: int, now: datetime) -> list[datetime]:
    """The instants the local days of the range start at, plus the instant the range ends
    (the start of tomorrow in that zone)."""
    name = time_zone or "UTC"
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidField(
            f"time_zone {name[:80]!r} is not an IANA time zone (e.g. 'Europe/Berlin').",
            metadata={"field": "time_zone"},
        ) from None
    count = days or DEFAULT_SUMMARY_DAYS
    if not 1 <= count <= MAX_SUMMARY_DAYS:
        raise InvalidField(
            f"days must be 1..{MAX_SUMMARY_DAYS} (got {days}).", metadata={"field": "days"}
        )
    today = now.astimezone(zone).date()
    first = today - timedelta(days=count - 1)
    return [
        datetime.combine(first + timedelta(days=n), time(0), tzinfo=zone) for n in range(count + 1)
    ]


async def group_timeline(connection: Connection, timeline: Timeline) -> int:
    """Groups a timeline's ungrouped items (the caller holds its lock); returns how many
    items changed sightings."""
    grouping = await group_items(
        connection,
        timeline.run_id,
        timeline.camera_id,
        [],
        lock=False,
        buckets=[timeline.bucket_id],
    )
    await grouping.apply(connection)
    return len(grouping.changed_items)


async def group_items(
    connection: Connection,
    run_id: str,
    camera_id: str,
    added: Sequence[NewItem],
    *,
    lock: bool = True,
    buckets: Sequence[str] = (),
) -> Grouping:
    """Groups the items `added` (not written yet) into their timelines (run, their bucket,
    `camera_id`), with the timelines' ungrouped items, from the first of them on, starting
    from the sightings open just before it; also the timelines of `buckets` with nothing
    added (their ungrouped items only). Takes the timelines' locks first unless the caller
    holds them (`lock`). Reads only: the caller writes the added items with
    `Grouping.literal` and then `Grouping.apply`. (A commit reads its context with its
    job's lock, job_commit_prepare, and calls `plan_grouping` itself.)"""
    firsts = first_new(added, buckets)
    if not firsts:
        return Grouping(run_id, camera_id)
    names = sorted(firsts)  # the timelines' lock order
    if lock:
        await connection.execute(sql("review", "timelines_lock"), run_id, camera_id, names)
    rows = await fetch_all(
        connection,
        ContextBox,
        *bind(
            TimelineContext(
                run_id=run_id,
                camera_id=camera_id,
                buckets=names,
                first_new=[firsts[name] for name in names],
            )
        ),
    )
    return plan_grouping(run_id, camera_id, added, rows, names)


def first_new(added: Sequence[NewItem], buckets: Sequence[str] = ()) -> dict[str, datetime | None]:
    """The timelines (by bucket) a grouping of `added` regroups, each with the first frame
    time of its added items (None: the bucket's ungrouped items only)."""
    firsts: dict[str, datetime | None] = dict.fromkeys(buckets)
    for item in added:
        first = firsts.get(item.bucket_id)
        if first is None or item.frame_time < first:
            firsts[item.bucket_id] = item.frame_time
    return firsts


def plan_grouping(
    run_id: str,
    camera_id: str,
    added: Sequence[NewItem],
    rows: Sequence[ContextBox],
    buckets: Sequence[str],
) -> Grouping:
    """What grouping `added` into the timelines of `buckets` changes, from their context
    `rows` (timeline_context, read under the timelines' locks)."""
    grouping = Grouping(run_id, camera_id)
    by_bucket: dict[str, list[sightings.Detection]] = {}
    for item in added:
        by_bucket.setdefault(item.bucket_id, []).extend(item.detections)
    context: dict[str, list[ContextBox]] = {}
    for row in rows:
        context.setdefault(row.bucket_id, []).append(row)
    for name in buckets:
        _plan(grouping, name, context.get(name, []), by_bucket.get(name, []))
    return grouping


def _plan(
    grouping: Grouping,
    bucket_id: str,
    rows: Sequence[ContextBox],
    added: Sequence[sightings.Detection],
) -> None:
    """Groups one timeline: `rows` from the database (timeline_context) and `added`; adds
    to `grouping` what changes.

    The boxes grouped again (the rows not fixed, and `added`) are every box of the timeline
    from the first one on, so a sighting's other items are all earlier; a sighting that
    has some is open just before (consecutive items of a sighting are at most 5 s apart),
    so it has a fixed row, which brings its stored first frame time and item count."""
    last_fixed: dict[str, sightings.Detection] = {}
    stored: dict[str, tuple[datetime, int]] = {}
    fixed_seen: dict[str, tuple[datetime, int]] = {}  # first fixed time, fixed rows
    replay: list[sightings.Detection] = []
    before: dict[tuple[str, int], str] = {}
    for row in rows:
        detection = row.detection()
        if not row.fixed:
            replay.append(detection)
            before[detection.key] = row.sighting_id
            continue
        sid = row.sighting_id
        first_seen, rows_seen = fixed_seen.get(sid, (row.frame_time, 0))
        fixed_seen[sid] = (min(first_seen, row.frame_time), rows_seen + 1)
        if row.sighting_first is not None and row.sighting_items is not None:
            stored[sid] = (row.sighting_first, row.sighting_items)
        seen = last_fixed.get(sid)
        if seen is None or (seen.frame_time, seen.item_id) < (row.frame_time, row.item_id):
            last_fixed[sid] = detection
    replay.extend(added)
    assigned = sightings.group(replay, sorted(last_fixed.items()))

    # each item's box sightings, in box order: the added items', and the written ones' that
    # changed
    by_item: dict[str, list[sightings.Detection]] = {}
    for detection in replay:
        by_item.setdefault(detection.item_id, []).append(detection)
    added_items = {detection.item_id for detection in added}
    regrouped: set[str] = set()  # the sightings a written box left or joined
    for item_id, boxes in by_item.items():
        boxes.sort(key=lambda d: d.box_index)
        now = [assigned[box.key] for box in boxes]
        if item_id in added_items:
            grouping.added[item_id] = now
        elif now != (was := [before[box.key] for box in boxes]):
            grouping.changed_items[item_id] = now
            regrouped.update(now, was)

    # the sightings whose items changed
    members_before: dict[str, set[str]] = {}
    for key, sid in before.items():
        if sid:
            members_before.setdefault(sid, set()).add(key[0])
    members_now: dict[str, list[sightings.Detection]] = {}
    for detection in replay:
        members_now.setdefault(assigned[detection.key], []).append(detection)
    for sid in sorted(set(members_before) | set(members_now)):
        now_boxes = members_now.get(sid, [])
        if {d.item_id for d in now_boxes} == members_before.get(sid, set()) and not any(
            d.item_id in added_items for d in now_boxes
        ):
            continue  # the same items as before
        last = last_fixed.get(sid)
        count = len(now_boxes)
        times = [d.frame_time for d in now_boxes]
        if last is not None:
            # (no stored row: only what the window shows of it, the best there is)
            first, stored_count = stored.get(sid, fixed_seen[sid])
            count += stored_count - len(members_before.get(sid, ()))
            times.append(first)
            times.append(last.frame_time)
        if count <= 0:
            grouping.gone.append(sid)
            continue
        example = now_boxes[0] if now_boxes else last
        assert example is not None
        made_of_added = (
            last is None
            and sid not in members_before
            and all(d.item_id in added_items for d in now_boxes)
        )
        grouping.changed_sightings.append(
            SightingChange(
                sid,
                bucket_id,
                example.class_name,
                min(times),
                max(times),
                count,
                appended=sid not in regrouped,
                new_score=_new_sighting_score(now_boxes) if made_of_added else None,
            )
        )


def _new_sighting_score(boxes: Sequence[sightings.Detection]) -> float | None:
    """The score sighting_review_v1 computes for a sighting made of `boxes` alone (boxes
    being added, one an item), when their scores tell it: their highest, if above 0.
    The boxes' scores are read as bucket_item_boxes_of reads them, a missing one 0, while
    v1 takes the highest score written (0 when none is): a highest of 0 here may be v1's
    negative one. NaN (stored for a NaN score) is the highest for Postgres, not for max."""
    scores = [box.score for box in boxes]
    if any(math.isnan(score) for score in scores):
        return None
    highest = max(scores)
    return highest if highest > 0 else None


async def group_backlog(db: Database, limit: int = 100) -> int:
    """Groups timelines left ungrouped (items saved before sightings existed); returns how
    many it grouped. Each timeline in its own transaction, under its lock."""
    async with db.connection() as connection:
        timelines = await fetch_all(
            connection, Timeline, sql("review", "timelines_ungrouped"), limit
        )
    for timeline in timelines:
        async with db.transaction() as connection:
            await connection.execute(
                sql("review", "timeline_lock"),
                timeline.run_id,
                timeline.bucket_id,
                timeline.camera_id,
            )
            await group_timeline(connection, timeline)
    return len(timelines)


@dataclasses.dataclass(frozen=True)
class ListedRun:
    """A run as ListRuns shows it: its view and its items by review state (None: no items)."""

    view: RunView
    counts: RunReviewCounts | None


class ReviewApi:
    """Review of runs' items; `runs` answers the run views that review lists beside its
    counts (runs sit below review)."""

    def __init__(self, db: Database, clock: Clock, runs: Runs) -> None:
        self.runs = runs
        self.db = db
        self.clock = clock

    async def review(
        self, who: Principal, run_id: str, after: PageKey | None, limit: int
    ) -> ReviewPage:
        cameras = readable_cameras(who)
        camera_list = sorted(cameras) if cameras is not None else None
        async with self.db.connection() as connection:
            run = await _review_run(connection, run_id)
            recordings: list[SnapshotRecordingRow] = []
            if after is None:
                recordings = await fetch_all(
                    connection,
                    SnapshotRecordingRow,
                    sql("review", "review_recordings"),
                    run_id,
                    camera_list,
                )
            key = (after or FIRST_KEY).frame_time, (after or FIRST_KEY).item_id
            if run.mode == "full":
                items = await fetch_all(
                    connection,
                    ItemRow,
                    sql("review", "review_items_page"),
                    run_id,
                    camera_list,
                    *key,
                    limit + 1,
                )
            else:
                items = await fetch_all(
                    connection,
                    ItemRow,
                    *bind(
                        ReviewPreviewsPage(
                            run_id=run_id,
                            now=self.clock.now(),
                            cameras=camera_list,
                            after_frame_time=key[0],
                            after_item_id=key[1],
                            limit=limit + 1,
                        )
                    ),
                )
            items, next_key = _page(items, limit, lambda item: item)
            boxes = await page_boxes(connection, run_id, items, camera_list)
            sighting_ids = sorted(
                {box.sighting_id for found in boxes.values() for box in found} - {""}
            )
            found = (
                await fetch_all(
                    connection, SightingRow, sql("review", "sightings_get"), run_id, sighting_ids
                )
                if sighting_ids
                else []
            )
            reviewed = await corrected_boxes_of(connection, items) if run.mode == "full" else {}
        return ReviewPage(
            run=run,
            recordings=recordings,
            items=items,
            boxes=boxes,
            sightings=found,
            next_key=next_key,
            reviewed=reviewed,
        )

    async def decide(
        self,
        who: Principal,
        run_id: str,
        sighting_id: str,
        state: str,
        relabel: str | None,
        seen_item_count: int | None,
    ) -> Decision:
        """Applies a decision to every box of a sighting, in one transaction under its
        timeline's lock; the sighting named may since have been extended backwards, in
        which case its first box now names the sighting decided."""
        cameras = decidable_cameras(who)
        box = sightings.parse_sighting_id(sighting_id)
        if box is None:
            raise InvalidField(
                "sighting_id is malformed; pass a sighting_id from GetReview.",
                metadata={"field": "sighting_id"},
            )
        async with self.db.transaction() as connection:
            run = await _review_run(connection, run_id)
            if run.mode != "full":
                raise TestRunNotReviewable(
                    "A test run saves nothing to decide; run the workflow in full mode."
                )
            locked = await fetch_one(
                connection, LockedBox, sql("review", "sighting_lock"), run_id, *box
            )
            if locked is None:
                raise NotFound(
                    "sighting", sighting_id, f"Run {run_id!r} has no sighting {sighting_id!r}."
                )
            if cameras is not None and locked.camera_id not in cameras:
                raise errors.PermissionDenied(
                    f"This credential may not decide on camera {locked.camera_id!r}."
                )
            if locked.ungrouped:
                await group_timeline(
                    connection, Timeline(run_id, locked.bucket_id, locked.camera_id)
                )
                locked = await fetch_one(
                    connection, LockedBox, sql("review", "sighting_lock"), run_id, *box
                )
                assert locked is not None
            if relabel is not None and box[1] == sightings.NO_BOX:
                raise InvalidField(
                    "A sighting of frames without boxes has no class to relabel; "
                    "confirm it or decide None.",
                    metadata={"field": "decision"},
                )
            updated: int = await connection.fetchval(
                *bind(
                    SightingDecide(
                        run_id=run_id,
                        sighting_id=locked.sighting_id,
                        review_state=state,
                        relabel_class=relabel,
                        decided_by=who.to_json(),
                        now=self.clock.now(),
                    )
                )
            )
            if updated:
                await refresh_sightings(connection, run_id, [locked.sighting_id])
            found = await fetch_one(
                connection,
                SightingRow,
                sql("review", "sightings_get"),
                run_id,
                [locked.sighting_id],
            )
        assert found is not None
        joined = 0
        if seen_item_count is not None:
            joined = max(0, len(found.item_ids) - seen_item_count)
        return Decision(found, updated, joined)

    async def summary(self, who: Principal, time_zone: str, days: int) -> Summary:
        auth.require(who, ScopeName.WORKSHOP)
        starts = summary_days(time_zone, days, self.clock.now())
        async with self.db.connection() as connection:
            buckets = await fetch_all(
                connection, BucketSummaryRow, sql("review", "summary_buckets")
            )
            workflows = await fetch_all(
                connection, WorkflowSummaryRow, sql("review", "summary_workflows")
            )
            classes = await fetch_all(connection, ClassCountRow, sql("review", "summary_classes"))
            counted = await fetch_all(
                connection, DayCountRow, sql("review", "summary_days"), starts
            )
            last_ids = [row.last_run_id for row in workflows if row.last_run_id]
            runs = (
                await fetch_all(connection, RunRow, sql("review", "runs_by_ids"), last_ids)
                if last_ids
                else []
            )
        by_run = await self.runs.views(runs)
        per_class: dict[str, list[ClassCountRow]] = {}
        for row in classes:
            per_class.setdefault(row.workflow_id, []).append(row)
        per_day: dict[str, dict[int, int]] = {}
        for count in counted:
            per_day.setdefault(count.workflow_id, {})[count.day] = count.images
        local_days = [start.date() for start in starts[:-1]]
        return Summary(
            buckets=buckets,
            workflows=[
                WorkflowSummary(
                    row=row,
                    last_run=by_run.get(row.last_run_id or ""),
                    classes=per_class.get(row.workflow_id, []),
                    days=[
                        DailyCount(day, per_day.get(row.workflow_id, {}).get(n + 1, 0))
                        for n, day in enumerate(local_days)
                    ],
                )
                for row in workflows
            ],
        )

    async def list_runs(
        self,
        who: Principal,
        workflow_id: str,
        before_seq: int | None,
        limit: int,
        *,
        status: str = "",
        mode: str = "",
    ) -> list[ListedRun]:
        """A page of runs (newest first, Runs.list_runs) with their items by review state."""
        views = await self.runs.list_runs(
            who, workflow_id, before_seq, limit, status=status, mode=mode
        )
        async with self.db.connection() as connection:
            rows = await fetch_all(
                connection,
                RunReviewCounts,
                sql("review", "run_review_counts"),
                [view.row.run_id for view in views],
            )
        counts = {row.run_id: row for row in rows}
        return [ListedRun(view, counts.get(view.row.run_id)) for view in views]

    async def bucket_items(
        self,
        reader: Principal,
        bucket_id: str,
        wanted: ItemFilter,
        after: PageKey | None,
        limit: int,
        *,
        with_classes: bool = False,
    ) -> ItemsPage:
        """A page of a bucket's items that `reader` may see."""
        cameras = readable_cameras(reader)
        async with self.db.connection() as connection:
            if await connection.fetchval(sql("review", "bucket_exists"), bucket_id) is None:
                raise NotFound("bucket", bucket_id, f"Bucket {bucket_id!r} does not exist.")
            # A frame time range starts the keyset there (an index range, not a filter).
            start = after or FIRST_KEY
            if wanted.frame_time_from is not None and wanted.frame_time_from > start.frame_time:
                start = PageKey(wanted.frame_time_from, "")
            statement = await listing.page_statement(
                connection,
                bucket_id,
                wanted,
                sorted(cameras) if cameras is not None else None,
                start.frame_time,
                start.item_id,
                limit + 1,
            )
            rows = await fetch_all(connection, StoredItemRow, *bind(statement))
            rows, next_key = _page(rows, limit, lambda row: row.item)
            ids = [row.item.item_id for row in rows]
            boxes = await items_boxes(connection, ids)
            reviewed = await reviewed_boxes_of(connection, ids)
            classes: list[str] = []
            if with_classes:
                classes = await fetch_column(
                    connection, str, sql("review", "bucket_classes"), bucket_id
                )
        return ItemsPage(
            items=rows, boxes=boxes, next_key=next_key, classes=classes, reviewed=reviewed
        )

    async def export_items(
        self,
        reader: Principal,
        bucket_id: str,
        wanted: ItemFilter,
        after: PageKey | None,
        limit: int,
    ) -> ItemsPage:
        """A page of a bucket's items as a dataset export takes them: each item's boxes
        after review (`reviewed_boxes`), and the bucket's classes on the first page."""
        page = await self.bucket_items(
            reader, bucket_id, wanted, after, limit, with_classes=after is None
        )
        exported = {
            row.item.item_id: exported_boxes(page.reviewed.get(row.item.item_id, ()))
            for row in page.items
        }
        return dataclasses.replace(page, boxes=exported)

    async def correct(
        self,
        who: Principal,
        item_id: str,
        boxes: Sequence[CorrectionBox],
        expected_revision: int | None,
    ) -> ItemView:
        """Replaces the boxes in force of a bucket item with `boxes` (the detected ones
        stay), logged for undo, counters moved, in one transaction under its timeline's lock."""
        cameras = decidable_cameras(who)
        check_correction(boxes)
        now = self.clock.now()
        async with self.db.transaction() as connection:
            locked = await _lock_item(connection, cameras, item_id, expected_revision)
            detected = len(locked.boxes)
            for n, found in enumerate(boxes):
                if found.source_box_index >= detected:
                    raise InvalidField(
                        f"boxes[{n}].source_box_index is {found.source_box_index}; the item has "
                        f"{detected} detected boxes (0..{detected - 1}, or -1 for a box added).",
                        metadata={"field": f"boxes[{n}].source_box_index"},
                    )
            run = await _review_run(connection, locked.run_id)
            known = model_classes(run.snapshot)
            for n, found in enumerate(boxes):
                if known and found.class_name not in known:
                    raise InvalidField(
                        f"boxes[{n}].class_name {found.class_name[:80]!r} is not a class of "
                        "the run's models (GetReview's models list them).",
                        metadata={"field": f"boxes[{n}].class_name"},
                    )
            stored = [
                {
                    "source": found.source_box_index,
                    "class_name": found.class_name,
                    "x": found.x,
                    "y": found.y,
                    "w": found.w,
                    "h": found.h,
                }
                for found in boxes
            ]
            by = who.to_json()
            revision = await self._revise(
                connection, item_id, correct=(stored, by, now), decide=None, by=by, now=now
            )
            await connection.execute(
                *bind(
                    ItemCorrectionLogged(
                        item_id=item_id,
                        revision=revision,
                        previous=locked.corrected_boxes,
                        boxes=stored,
                        corrected_by=by,
                        corrected_at=now,
                    )
                )
            )
            return await item_view_of(connection, item_id)

    async def undo_correction(
        self, who: Principal, item_id: str, expected_revision: int | None
    ) -> ItemView:
        """Undoes the item's newest correction not undone: back to the one before it, or to
        the boxes as detected."""
        cameras = decidable_cameras(who)
        now = self.clock.now()
        async with self.db.transaction() as connection:
            await _lock_item(connection, cameras, item_id, expected_revision)
            in_force = await fetch_all(
                connection, CorrectionInForce, sql("review", "item_corrections_in_force"), item_id
            )
            if not in_force or in_force[0].boxes is None:
                raise NothingToUndo(f"Item {item_id!r} has no correction to undo.")
            back = in_force[1] if len(in_force) > 1 else None
            by = who.to_json()
            await self._revise(
                connection,
                item_id,
                correct=(back.boxes, back.corrected_by, back.corrected_at)
                if back is not None
                else (None, None, None),
                decide=None,
                by=by,
                now=now,
            )
            await connection.execute(
                sql("review", "item_correction_undone"), item_id, in_force[0].revision, by, now
            )
            return await item_view_of(connection, item_id)

    async def decide_item(
        self,
        who: Principal,
        item_id: str,
        state: str | None,
        relabel: str | None,
        expected_revision: int | None,
    ) -> ItemView:
        """Sets (state None: clears) the decision on one item, which overrides its
        sightings' decisions for its boxes."""
        cameras = decidable_cameras(who)
        now = self.clock.now()
        async with self.db.transaction() as connection:
            locked = await _lock_item(connection, cameras, item_id, expected_revision)
            if state is None and locked.item_state is None:
                raise NothingToUndo(f"Item {item_id!r} has no item decision to clear.")
            if relabel is not None and not locked.boxes:
                raise InvalidField(
                    "An item without detected boxes has no class to relabel; "
                    "confirm it or decide None.",
                    metadata={"field": "decision"},
                )
            by = who.to_json()
            revision = await self._revise(
                connection, item_id, correct=None, decide=(state, relabel), by=by, now=now
            )
            await connection.execute(
                *bind(
                    ItemDecisionLogged(
                        item_id=item_id,
                        revision=revision,
                        review_state=state,
                        relabel_class=relabel,
                        decided_by=by,
                        decided_at=now,
                    )
                )
            )
            return await item_view_of(connection, item_id)

    async def _revise(
        self,
        connection: Connection,
        item_id: str,
        *,
        correct: tuple[Any, Any, datetime | None] | None,
        decide: tuple[str | None, str | None] | None,
        by: Any,
        now: datetime,
    ) -> int:
        corrected, corrected_by, corrected_at = correct or (None, None, None)
        state, relabel = decide or (None, None)
        revision: int = await connection.fetchval(
            *bind(
                ItemRevise(
                    item_id=item_id,
                    correct=correct is not None,
                    corrected_boxes=corrected,
                    corrected_by=corrected_by,
                    corrected_at=corrected_at,
                    decide=decide is not None,
                    review_state=state,
                    relabel_class=relabel,
                    decided_by=by,
                    now=now,
                )
            )
        )
        return revision


def _page(
    rows: list[P], limit: int, item_of: Callable[[P], ItemRow]
) -> tuple[list[P], PageKey | None]:
    """A page of `rows` fetched with one row more than `limit`, and where the next page
    starts (None when that row was not there: the last page)."""
    if len(rows) <= limit:
        return rows, None
    last = item_of(rows[limit - 1])
    return rows[:limit], PageKey(last.frame_time, last.item_id)


async def _review_run(connection: Connection, run_id: str) -> ReviewRun:
    run = await fetch_one(connection, ReviewRun, sql("review", "review_run"), run_id)
    if run is None:
        raise NotFound("run", run_id, f"Run {run_id!r} does not exist.")
    return run


async def items_boxes(connection: Connection, item_ids: list[str]) -> dict[str, list[BoxRow]]:
    """The boxes of bucket items with their reviews, by item id in box order."""
    found: dict[str, list[BoxRow]] = {}
    if item_ids:
        for box in await fetch_all(connection, BoxRow, sql("review", "items_boxes"), item_ids):
            found.setdefault(box.item_id, []).append(box)
    return found


async def page_boxes(
    connection: Connection, run_id: str, items: list[ItemRow], cameras: list[str] | None
) -> dict[str, list[BoxRow]]:
    """The boxes of a review page's items (a range of the run's items in page order), by
    item id in box order. A test run's previews have none here (theirs are in the item).
    An item committed into the range since the page was read is not the page's: left out."""
    found: dict[str, list[BoxRow]] = {item.item_id: [] for item in items}
    if items:
        first, last = items[0], items[-1]
        for box in await fetch_all(
            connection,
            BoxRow,
            *bind(
                ReviewPageBoxes(
                    run_id=run_id,
                    first_frame_time=first.frame_time,
                    first_item_id=first.item_id,
                    last_frame_time=last.frame_time,
                    last_item_id=last.item_id,
                    cameras=cameras,
                )
            ),
        ):
            if (listed := found.get(box.item_id)) is not None:
                listed.append(box)
    return found


def review_as_detected(item: ItemRow, box: BoxRow) -> tuple[str, str | None]:
    """The review state and relabel of a detected box after review, for an item without a
    correction: the item decision's when there is one, else its sighting's. (What
    bucket_item_reviewed_boxes_v1 answers for such an item, whose boxes after review are
    its detected ones, class after the relabel; GetReview derives them from the page's
    boxes instead of reading every item's boxes twice.)"""
    if item.item_state is not None:
        return item.item_state, item.item_relabel
    return box.review_state, box.relabel_class


def exported_boxes(boxes: Sequence[ReviewedBoxRow]) -> list[BoxRow]:
    """An item's boxes as an export writes them: after review (corrections, relabels, item
    decision), rejected boxes left out."""
    return [
        BoxRow(
            item_id=box.item_id,
            box_index=box.box_index,
            class_name=box.class_name,
            score=box.score,
            x=box.x,
            y=box.y,
            w=box.w,
            h=box.h,
            track_id=box.track_id,
            sighting_id="",
            review_state=box.review_state,
            relabel_class=box.relabel_class,
        )
        for box in boxes
        if box.review_state != "rejected"
    ]


async def reviewed_boxes_of(
    connection: Connection, item_ids: list[str]
) -> dict[str, list[ReviewedBoxRow]]:
    """The boxes of bucket items after review, by item id in box order."""
    found: dict[str, list[ReviewedBoxRow]] = {}
    if item_ids:
        for box in await fetch_all(
            connection, ReviewedBoxRow, sql("review", "items_reviewed_boxes"), item_ids
        ):
            found.setdefault(box.item_id, []).append(box)
    return found


async def corrected_boxes_of(
    connection: Connection, items: list[ItemRow]
) -> dict[str, list[ReviewedBoxRow]]:
    """The boxes after review of those of `items` with a correction, by item id (an empty
    list for a correction that deleted every box). The others' are their detected boxes
    with their reviews, which a page reads anyway (`review_as_detected`): not read twice."""
    corrected = [item.item_id for item in items if item.corrected_boxes is not None]
    found = await reviewed_boxes_of(connection, corrected)
    return {item_id: found.get(item_id, []) for item_id in corrected}


MAX_CORRECTED_BOXES = 1000
# float32 sums: a box flush with the edge may end a rounding step past 1
EDGE_TOLERANCE = 1e-6


def check_correction(boxes: Sequence[CorrectionBox]) -> None:
    """A correction's boxes: at most 1,000, each inside the frame and not empty, each
    detected box named once at most, classes as relabels are."""
    if len(boxes) > MAX_CORRECTED_BOXES:
        raise InvalidField(
            f"boxes holds {len(boxes)} boxes; at most {MAX_CORRECTED_BOXES} are allowed.",
            metadata={"field": "boxes", "limit": str(MAX_CORRECTED_BOXES)},
        )
    named: set[int] = set()
    for n, box in enumerate(boxes):
        field = f"boxes[{n}]"
        if box.source_box_index < -1:
            raise InvalidField(
                f"{field}.source_box_index must be a detected box's index or -1 (a box added).",
                metadata={"field": f"{field}.source_box_index"},
            )
        if box.source_box_index >= 0:
            if box.source_box_index in named:
                raise InvalidField(
                    f"{field}.source_box_index {box.source_box_index} is named twice.",
                    metadata={"field": f"{field}.source_box_index"},
                )
            named.add(box.source_box_index)
        values = (box.x, box.y, box.w, box.h)
        if not all(math.isfinite(v) for v in values) or not (
            box.x >= 0
            and box.y >= 0
            and box.w > 0
            and box.h > 0
            and box.x + box.w <= 1 + EDGE_TOLERANCE
            and box.y + box.h <= 1 + EDGE_TOLERANCE
        ):
            raise InvalidField(
                f"{field} must lie inside the frame: x, y >= 0, w, h > 0, x + w <= 1 and "
                f"y + h <= 1 (normalised; got x={box.x}, y={box.y}, w={box.w}, h={box.h}).",
                metadata={"field": field},
            )
        try:
            check_class(box.class_name)
        except InvalidField as error:
            raise InvalidField(
                error.message.replace("class_name", f"{field}.class_name", 1).replace(
                    " for RELABEL", ""
                ),
                metadata={"field": f"{field}.class_name"},
            ) from None


def model_classes(snapshot: dict[str, Any]) -> frozenset[str]:
    """The class names of a run's pinned models (empty: they list none)."""
    return frozenset(
        str(name)
        for model in snapshot.get("models", [])
        if isinstance(model, dict)
        for name in model.get("classes") or []
    )


async def _lock_item(
    connection: Connection,
    cameras: frozenset[str] | None,
    item_id: str,
    expected_revision: int | None,
) -> LockedItem:
    """Locks a bucket item's timeline, then the item (the lock order), checking that the
    caller reaches its camera and saw its current revision."""
    if not item_id:
        raise InvalidField("item_id is required.", metadata={"field": "item_id"})
    timeline = await fetch_one(connection, Timeline, sql("review", "item_timeline"), item_id)
    if timeline is None:
        raise NotFound("item", item_id, f"Bucket item {item_id!r} does not exist.")
    if cameras is not None and timeline.camera_id not in cameras:
        raise errors.PermissionDenied(
            f"This credential may not decide on camera {timeline.camera_id!r}."
        )
    await connection.execute(
        sql("review", "timelines_lock"), timeline.run_id, timeline.camera_id, [timeline.bucket_id]
    )
    locked = await fetch_one(connection, LockedItem, sql("review", "item_locked"), item_id)
    if locked is None:
        raise NotFound("item", item_id, f"Bucket item {item_id!r} does not exist.")
    if expected_revision is not None and expected_revision != locked.revision:
        raise StaleRevision(
            f"Item {item_id!r} is at revision {locked.revision}, not {expected_revision}: "
            "another reviewer changed it; read it again.",
            metadata={"current_revision": str(locked.revision)},
        )
    return locked


async def item_view_of(connection: Connection, item_id: str) -> ItemView:
    item = await fetch_one(connection, ItemRow, sql("review", "item_get"), item_id)
    assert item is not None
    boxes = await items_boxes(connection, [item_id])
    reviewed = await reviewed_boxes_of(connection, [item_id])
    return ItemView(item, boxes.get(item_id, []), reviewed.get(item_id, []))
