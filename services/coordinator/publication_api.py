"""The coordinator's side of previews and staged uploads (SPEC §7, §9).

The preview service calls these with its own `service` key; the processor's
key rides along as the on-behalf-of principal, and fence 4 checks it. Every
write goes through the same fence function as results and progress, and checks
that the service's own key is still live, so both principals may come from the
coordinator's principal cache. Staging and publishing are one round trip each.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from services.coordinator import auth
from services.coordinator.auth import Principal, ScopeName
from services.coordinator.clock import Clock
from services.coordinator.db import Database, Record, sql
from services.coordinator.errors import Expired, InvalidField, NotFound
from services.coordinator.fields import check_sha256
from services.coordinator.jobs_api import Lease, raise_for, reporter
from services.coordinator.snapshots import Frozen, SnapshotCache
from workshop.kit.errors import PermissionDenied
from workshop.kit.hashing import sha256_hex

TEST_PREFIX = "workshop-tests/"
MAX_COLLECT = 1000
COLLECT_HOLD = timedelta(minutes=5)  # a pass that dies releases its objects after this
EXTENSIONS = {"image/jpeg": "jpg", "image/png": "png"}
KINDS = ("preview", "upload")


def object_key(kind: str, lease: Lease, slot: int, *, test: bool, content_type: str) -> str:
    """`[workshop-tests/]previews|uploads/<run>/<job>/<generation>/<slot>.<ext>`."""
    prefix = TEST_PREFIX if test else ""
    extension = EXTENSIONS[content_type]
    return f"{prefix}{kind}s/{lease.run_id}/{lease.job_id}/{lease.generation}/{slot}.{extension}"


def preview_item_id(key: str) -> str:
    """A preview's id in image URLs: stable per object key, and free of slashes."""
    return "pv_" + sha256_hex(key.encode())[:24]


@dataclasses.dataclass(frozen=True)
class LeaseFacts:
    lease_expires_at: datetime
    mode: str
    kind: str
    camera_id: str
    slot_count: int


@dataclasses.dataclass(frozen=True)
class Staged:
    object_key: str
    collectable_after: datetime  # if nothing commits it: when the lease lapses, unless renewed


def _require_service(who: Principal) -> str:
    """The service's key id (staging and publishing check it is still live)."""
    auth.require(who, ScopeName.SERVICE)
    return who.key_id


def _refused_service(reason: str) -> None:
    if reason == "SERVICE_NOT_AUTHORIZED":
        raise auth.rejected("service key is no longer valid")


class PublicationApi:
    def __init__(self, db: Database, clock: Clock, snapshots: SnapshotCache) -> None:
        self.db = db
        self.clock = clock
        self.snapshots = snapshots

    async def check_lease(
        self, who: Principal, processor: Principal, lease: Lease, code_sha256: str
    ) -> LeaseFacts:
        _require_service(who)
        async with self.db.transaction() as connection:
            reason = await connection.fetchval(
                sql("jobs", "job_check_lease"),
                *_lease_args(lease),
                reporter(processor),
                code_sha256,
                self.clock.now(),
            )
            raise_for(reason, lease)
            row = await connection.fetchrow(
                sql("jobs", "job_lease_facts"), lease.run_id, lease.job_index
            )
        return LeaseFacts(
            row["lease_expires_at"], row["mode"], row["kind"], row["camera_id"], row["slot_count"]
        )

    async def stage(
        self,
        who: Principal,
        processor: Principal,
        lease: Lease,
        *,
        code_sha256: str,
        kind: str,
        slot: int,
        sha256: str,
        byte_size: int,
        content_type: str,
    ) -> Staged:
        """Records a staged object under the fences; returns its key."""
        service = _require_service(who)
        check_sha256("sha256", sha256)
        if kind not in KINDS:
            raise InvalidField("kind must be PREVIEW or UPLOAD.")
        if content_type not in EXTENSIONS:
            raise InvalidField(f"content_type must be one of {', '.join(EXTENSIONS)}.")
        if byte_size <= 0:
            raise InvalidField("byte_size must be positive.")
        frozen = await self._frozen(lease)
        key = object_key(kind, lease, slot, test=not frozen.full_run, content_type=content_type)
        async with self.db.connection() as connection:
            row = await connection.fetchrow(
                sql("jobs", "object_stage"),
                *_lease_args(lease),
                reporter(processor),
                service,
                code_sha256,
                kind,
                slot,
                sha256,
                byte_size,
                content_type,
                key,
                self.clock.now(),
            )
        reason = row["reason"]
        _refused_service(reason)
        if reason == "SLOT_NOT_EXPECTED":
            raise InvalidField(f"Slot {slot} is not an expected slot of job {lease.job_id}.")
        raise_for(reason, lease)
        return Staged(key, row["collectable_after"])

    async def _frozen(self, lease: Lease) -> Frozen:
        """The run's snapshot (its mode names the key's prefix); NOT_FOUND as the fences say."""
        try:
            return await self.snapshots.get(lease.run_id)
        except NotFound:
            raise_for("NOT_FOUND", lease)
            raise

    async def publish_preview(
        self,
        who: Principal,
        processor: Principal,
        lease: Lease,
        *,
        code_sha256: str,
        key: str,
        slot: int,
        sha256: str,
        byte_size: int,
        frame_time: datetime,
        boxes: list[dict[str, Any]],
    ) -> datetime | None:
        """Publishes a staged preview; returns when it expires (None: when its job ends)."""
        service = _require_service(who)
        async with self.db.connection() as connection:
            row: Record = await connection.fetchrow(
                sql("jobs", "preview_publish"),
                *_lease_args(lease),
                reporter(processor),
                service,
                code_sha256,
                key,
                slot,
                sha256,
                byte_size,
                frame_time,
                boxes,
                preview_item_id(key),
                self.clock.now(),
            )
        _refused_service(row["reason"])
        if row["reason"] == "PREVIEW_OUT_OF_ORDER":
            raise InvalidField(
                f"Slot {slot} comes before a preview already published under this lease; "
                "previews are published in slot order."
            )
        if row["reason"] == "PREVIEW_NOT_STAGED":
            raise NotFound(
                "staged_object",
                key,
                "No preview is staged under this key for this lease, slot, digest and size.",
            )
        raise_for(row["reason"], lease)
        expires: datetime | None = row["expires_at"]
        return expires

    async def claim_collectable(
        self, who: Principal, kind: str, limit: int
    ) -> tuple[list[Record], bool]:
        """Up to `limit` collectable objects, held for this caller's pass; and whether more wait."""
        _require_service(who)
        if kind not in KINDS:
            raise InvalidField("kind must be PREVIEW or UPLOAD.")
        if not 1 <= limit <= MAX_COLLECT:
            raise InvalidField(f"limit must be 1..{MAX_COLLECT}.")
        now = self.clock.now()
        async with self.db.connection() as connection:
            rows: list[Record] = await connection.fetch(
                sql("jobs", "objects_claim_collectable"), kind, limit, now, COLLECT_HOLD
            )
            more: bool = await connection.fetchval(
                sql("jobs", "objects_collectable_remaining"), kind, now
            )
        return rows, more

    async def mark_deleted(self, who: Principal, keys: list[str]) -> int:
        _require_service(who)
        if len(keys) > MAX_COLLECT:
            raise InvalidField(f"At most {MAX_COLLECT} keys per call.")
        async with self.db.connection() as connection:
            rows = await connection.fetch(
                sql("jobs", "objects_mark_deleted"), keys, self.clock.now()
            )
        return len(rows)

    async def authorize_read(
        self, who: Principal, reader: Principal, run_id: str, item_id: str
    ) -> Record:
        """Where an image's bytes are, if `reader` may see that camera and it has not expired."""
        _require_service(who)
        async with self.db.connection() as connection:
            row = await connection.fetchrow(sql("jobs", "image_for_read"), run_id, item_id)
        if row is None:
            raise NotFound("image", f"{run_id}/{item_id}", "No such image in this run.")
        if not may_read_camera(reader, row["camera_id"]):
            raise PermissionDenied(
                f"This credential may not read images of camera {row['camera_id']!r}."
            )
        now = self.clock.now()
        for moment in (row["expires_at"], row["run_expires_at"]):
            if moment is not None and moment <= now:
                raise Expired(
                    "This image has expired; its labels and bytes are no longer readable.",
                    metadata={"kind": "image", "id": f"{run_id}/{item_id}"},
                )
        return row


def may_read_camera(reader: Principal, camera_id: str) -> bool:
    """Sessions, admin keys, workshop keys covering the camera, footage:read for it."""
    if reader.kind == "session" or reader.is_admin:
        return True
    for grant in reader.grants:
        if grant.scope is ScopeName.WORKSHOP and (
            not grant.camera_ids or camera_id in grant.camera_ids
        ):
            return True
        if grant.scope is ScopeName.FOOTAGE_READ and camera_id in grant.camera_ids:
            return True
    return False


def _lease_args(lease: Lease) -> tuple[str, int, int, Any]:
    return (lease.run_id, lease.job_index, lease.generation, lease.token)
