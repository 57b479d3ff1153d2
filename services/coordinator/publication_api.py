"""The coordinator's side of previews and staged uploads (SPEC §7, §9).

The preview service calls these with its own `service` key; the processor's
key rides along as the on-behalf-of principal, and fence 4 checks it. Every
write goes through the same fence function as results and progress.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from services.coordinator import auth
from services.coordinator.auth import Principal, ScopeName
from services.coordinator.clock import Clock
from services.coordinator.db import Database, Record, sql
from services.coordinator.errors import InvalidField, NotFound
from services.coordinator.fields import check_sha256
from services.coordinator.jobs_api import Lease, raise_for, reporter
from workshop.kit.hashing import sha256_hex

TEST_PREFIX = "workshop-tests/"
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


def _require_service(who: Principal) -> None:
    auth.require(who, ScopeName.SERVICE)


class PublicationApi:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

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
    ) -> str:
        """Records a staged object under the fences; returns its key."""
        _require_service(who)
        check_sha256("sha256", sha256)
        if kind not in KINDS:
            raise InvalidField("kind must be PREVIEW or UPLOAD.")
        if content_type not in EXTENSIONS:
            raise InvalidField(f"content_type must be one of {', '.join(EXTENSIONS)}.")
        if byte_size <= 0:
            raise InvalidField("byte_size must be positive.")
        async with self.db.connection() as connection:
            facts = await connection.fetchrow(
                sql("jobs", "job_lease_facts"), lease.run_id, lease.job_index
            )
            if facts is None:
                raise_for("NOT_FOUND", lease)
            key = object_key(
                kind, lease, slot, test=facts["mode"] == "test", content_type=content_type
            )
            reason = await connection.fetchval(
                sql("jobs", "object_stage"),
                *_lease_args(lease),
                reporter(processor),
                code_sha256,
                kind,
                slot,
                sha256,
                byte_size,
                content_type,
                key,
                self.clock.now(),
            )
        if reason == "SLOT_NOT_EXPECTED":
            raise InvalidField(f"Slot {slot} is not an expected slot of job {lease.job_id}.")
        raise_for(reason, lease)
        return key

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
        _require_service(who)
        async with self.db.connection() as connection:
            row: Record = await connection.fetchrow(
                sql("jobs", "preview_publish"),
                *_lease_args(lease),
                reporter(processor),
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
        if row["reason"] == "PREVIEW_NOT_STAGED":
            raise NotFound(
                "staged_object",
                key,
                "No preview is staged under this key for this lease, slot, digest and size.",
            )
        raise_for(row["reason"], lease)
        expires: datetime | None = row["expires_at"]
        return expires


def _lease_args(lease: Lease) -> tuple[str, int, int, Any]:
    return (lease.run_id, lease.job_index, lease.generation, lease.token)
