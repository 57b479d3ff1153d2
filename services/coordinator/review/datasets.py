"""Dataset versions: a bucket's reviewed items frozen into an immutable, content-addressed
version that exports are made from (docs/datasets.md).

Freezing is one statement (datasets.sql, dataset_version_freeze): the items, their boxes
after review and their split are chosen, hashed and written set-based, so 100,000 items
take seconds, not a round trip each. A version never changes afterwards: nothing
updates its rows, so an export of it is the same bytes every time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import unicodedata
from datetime import datetime
from typing import Any

from services.coordinator.identity import auth
from services.coordinator.identity.auth import Principal, ScopeName
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import Database, Row, bind, fetch_all, fetch_one, sql
from services.coordinator.platform.errors import InvalidField, NotFound, ScopeMissing
from services.coordinator.review.datasets_params import (
    DatasetVersionFreeze,
    DatasetVersionsPage,
    ItemVersionsPage,
)
from services.coordinator.review.reviews import ItemFilter, readable_cameras

MAX_NAME_LENGTH = 200
DEFAULT_VAL_FRACTION = 0.2
MAX_SEED = 2**63 - 1


@dataclasses.dataclass(frozen=True, slots=True)
class VersionRow(Row):
    version_id: str
    bucket_id: str
    name: str
    filter: dict[str, Any]
    classes: list[str]
    seed: int
    val_fraction: float
    camera_ids: list[str]
    item_count: int
    val_count: int
    box_count: int
    created_by: dict[str, str]
    created_at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenItemRow(Row):
    ordinal: int
    item_id: str
    object_key: str
    sha256: str
    camera_id: str
    frame_time: datetime
    boxes: list[dict[str, Any]]
    split: str


@dataclasses.dataclass(frozen=True, slots=True)
class ChangeRow(Row):
    item_id: str
    before: list[dict[str, Any]] | None
    after: list[dict[str, Any]] | None
    kind: str


@dataclasses.dataclass(frozen=True, slots=True)
class DiffCounts(Row):
    added: int
    removed: int
    relabelled: int
    boxes_changed: int
    unchanged: int


@dataclasses.dataclass(frozen=True, slots=True)
class FreezeAnswer(Row):
    version_id: str
    created: bool


@dataclasses.dataclass(frozen=True)
class VersionKey:
    """Where a page of versions (newest first) starts: before this one."""

    created_at: datetime
    version_id: str


@dataclasses.dataclass(frozen=True)
class VersionsPage:
    versions: list[VersionRow]
    next_key: VersionKey | None


@dataclasses.dataclass(frozen=True)
class Diff:
    changes: list[ChangeRow]
    next_item: str | None  # the last item of this page, when more follow
    counts: DiffCounts | None  # on the first page


def filter_json(wanted: ItemFilter) -> dict[str, Any]:
    """The filter as a version stores it, and as its content hashes it (canonical JSON).
    The run and the score range only when set: a version frozen again without them keeps
    the id it had before they existed."""
    stored: dict[str, Any] = {
        "review_states": list(wanted.review_states),
        "class_name": wanted.class_name,
        "camera_id": wanted.camera_id,
        "frame_time_from": _iso(wanted.frame_time_from),
        "frame_time_to": _iso(wanted.frame_time_to),
    }
    if wanted.run_id:
        stored["run_id"] = wanted.run_id
    if wanted.min_score is not None:
        stored["min_score"] = wanted.min_score
    if wanted.max_score is not None:
        stored["max_score"] = wanted.max_score
    return stored


def _iso(moment: datetime | None) -> str:
    return moment.isoformat() if moment is not None else ""


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def check_name(value: str) -> str:
    if not value:
        raise InvalidField("name is required.", metadata={"field": "name"})
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidField(
            f"name is {len(value)} characters; at most {MAX_NAME_LENGTH} are allowed.",
            metadata={"field": "name", "limit": str(MAX_NAME_LENGTH)},
        )
    if any(unicodedata.category(ch) in ("Cc", "Cf") for ch in value) or value.strip() != value:
        raise InvalidField(
            "name may not hold control characters or start or end with spaces.",
            metadata={"field": "name"},
        )
    return value


def check_split(seed: int, val_fraction: float | None) -> float:
    if seed > MAX_SEED:
        raise InvalidField(f"seed is at most {MAX_SEED}.", metadata={"field": "seed"})
    if val_fraction is None:
        return DEFAULT_VAL_FRACTION
    if not math.isfinite(val_fraction) or not 0.0 <= val_fraction < 1.0:
        raise InvalidField(
            f"val_fraction must be at least 0 and below 1, not {val_fraction!r}.",
            metadata={"field": "val_fraction"},
        )
    return val_fraction


def check_version_id(field: str, value: str) -> str:
    if not value:
        raise InvalidField(f"{field} is required.", metadata={"field": field})
    if len(value) != 67 or not value.startswith("dv_"):
        raise NotFound("dataset_version", value[:80], f"No dataset version {value[:80]!r}.")
    return value


class DatasetsApi:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    @staticmethod
    def check_freezer(who: Principal) -> None:
        """ScopeMissing unless `who` may freeze: `workshop` over every camera (a version is
        the bucket's, not one camera's)."""
        auth.require(who, ScopeName.WORKSHOP)
        if auth.cameras_reached(who, ScopeName.WORKSHOP) is not None:
            raise ScopeMissing(
                "Freezing a dataset version needs the workshop scope over every camera; this "
                "key is bound to some cameras.",
            )

    async def freeze(
        self,
        who: Principal,
        bucket_id: str,
        name: str,
        wanted: ItemFilter,
        seed: int,
        val_fraction: float,
    ) -> tuple[VersionRow, bool]:
        """The version of the bucket's items matching `wanted` now, and whether this call
        made it (`check_freezer` says who may)."""
        self.check_freezer(who)
        if not bucket_id:
            raise InvalidField("bucket_id is required.", metadata={"field": "bucket_id"})
        wanted = (
            wanted
            if wanted.review_states
            else dataclasses.replace(wanted, review_states=("accepted",))
        )
        async with self.db.transaction() as connection:
            if await connection.fetchval(sql("review", "bucket_exists"), bucket_id) is None:
                raise NotFound("bucket", bucket_id, f"Bucket {bucket_id!r} does not exist.")
            answer = await fetch_one(
                connection,
                FreezeAnswer,
                *bind(
                    DatasetVersionFreeze(
                        seed=seed,
                        val_fraction=val_fraction,
                        bucket_id=bucket_id,
                        review_states=list(wanted.review_states),
                        class_name=wanted.class_name or None,
                        camera_id=wanted.camera_id or None,
                        run_id=wanted.run_id or None,
                        frame_time_from=wanted.frame_time_from,
                        frame_time_to=wanted.frame_time_to,
                        min_score=wanted.min_score,
                        max_score=wanted.max_score,
                        filter=canonical(filter_json(wanted)),
                        name=name,
                        created_by=who.to_json(),
                        created_at=self.clock.now(),
                    )
                ),
            )
            assert answer is not None  # one row always: the content's
            version = await fetch_one(
                connection, VersionRow, sql("datasets", "dataset_version_get"), answer.version_id
            )
        assert version is not None
        return version, answer.created

    async def get(self, who: Principal, version_id: str) -> VersionRow:
        cameras = readable_cameras(who)
        check_version_id("version_id", version_id)
        async with self.db.connection() as connection:
            version = await fetch_one(
                connection, VersionRow, sql("datasets", "dataset_version_get"), version_id
            )
        if version is None:
            raise NotFound("dataset_version", version_id, f"No dataset version {version_id!r}.")
        _check_reach(version, cameras)
        return version

    async def versions(
        self, who: Principal, bucket_id: str, before: VersionKey | None, limit: int
    ) -> VersionsPage:
        cameras = readable_cameras(who)
        if not bucket_id:
            raise InvalidField("bucket_id is required.", metadata={"field": "bucket_id"})
        async with self.db.connection() as connection:
            if await connection.fetchval(sql("review", "bucket_exists"), bucket_id) is None:
                raise NotFound("bucket", bucket_id, f"Bucket {bucket_id!r} does not exist.")
            rows = await fetch_all(
                connection,
                VersionRow,
                *bind(
                    DatasetVersionsPage(
                        bucket_id=bucket_id,
                        before_created_at=before.created_at if before else None,
                        before_version_id=before.version_id if before else None,
                        cameras=sorted(cameras) if cameras is not None else None,
                        limit=limit + 1,
                    )
                ),
            )
        return _versions_page(rows, limit)

    async def item_versions(
        self, who: Principal, item_id: str, before: VersionKey | None, limit: int
    ) -> VersionsPage:
        cameras = readable_cameras(who)
        if not item_id:
            raise InvalidField("item_id is required.", metadata={"field": "item_id"})
        async with self.db.connection() as connection:
            camera = await connection.fetchval(sql("datasets", "item_camera"), item_id)
            if camera is None:
                raise NotFound("item", item_id, f"No bucket item {item_id!r}.")
            if cameras is not None and camera not in cameras:
                raise ScopeMissing(
                    f"Item {item_id!r} is of a camera this key does not reach.",
                )
            rows = await fetch_all(
                connection,
                VersionRow,
                *bind(
                    ItemVersionsPage(
                        item_id=item_id,
                        before_created_at=before.created_at if before else None,
                        before_version_id=before.version_id if before else None,
                        limit=limit + 1,
                    )
                ),
            )
        return _versions_page(rows, limit)

    async def diff(
        self, who: Principal, from_id: str, to_id: str, after: str | None, limit: int
    ) -> Diff:
        readable_cameras(who)  # the credential before the request's fields
        await self.get(who, check_version_id("from_version_id", from_id))
        await self.get(who, check_version_id("to_version_id", to_id))
        async with self.db.connection() as connection:
            rows = await fetch_all(
                connection,
                ChangeRow,
                sql("datasets", "dataset_versions_diff_page"),
                from_id,
                to_id,
                after or "",
                limit + 1,
            )
            counts = None
            if after is None:
                counts = await fetch_one(
                    connection,
                    DiffCounts,
                    sql("datasets", "dataset_versions_diff_counts"),
                    from_id,
                    to_id,
                )
        more = len(rows) > limit
        rows = rows[:limit]
        return Diff(rows, rows[-1].item_id if more else None, counts)

    async def items(
        self, reader: Principal, version_id: str, after: int, limit: int
    ) -> tuple[VersionRow, list[FrozenItemRow]]:
        """A page of a version's items in its order, after ordinal `after` (0: the first)."""
        version = await self.get(reader, version_id)
        async with self.db.connection() as connection:
            rows = await fetch_all(
                connection,
                FrozenItemRow,
                sql("datasets", "dataset_version_items_page"),
                version_id,
                after,
                limit,
            )
        return version, rows


def _check_reach(version: VersionRow, cameras: frozenset[str] | None) -> None:
    if cameras is not None and not set(version.camera_ids) <= cameras:
        raise ScopeMissing(
            f"Dataset version {version.version_id!r} holds items of cameras this key does not "
            "reach.",
        )


def _versions_page(rows: list[VersionRow], limit: int) -> VersionsPage:
    if len(rows) <= limit:
        return VersionsPage(rows, None)
    last = rows[limit - 1]
    return VersionsPage(rows[:limit], VersionKey(last.created_at, last.version_id))
