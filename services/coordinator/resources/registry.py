"""The registry of resources (docs/concepts.md, docs/operations.md): devices, runtimes,
cameras, recordings, model versions and buckets, as the `Resources` service keeps them.

Every function takes the caller's principal and checks it holds `admin`, but for listing
devices and runtimes and registering a runtime, which `workshop` (a website session, an
Agent key) may do too.
Results are the typed rows below (devices, runtimes, cameras, recordings, model
versions, buckets); the servicer renders them. Workshop, photo and scheduler code read
the same resources through these rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from services.coordinator.identity import auth
from services.coordinator.identity.auth import Grant, Principal, ScopeName
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import (
    Connection,
    Database,
    ForeignKeyViolationError,
    Row,
    bind,
    fetch_all,
    fetch_column,
    fetch_one,
    sql,
)
from services.coordinator.platform.errors import (
    IdConflict,
    InvalidField,
    NoRuntime,
    NotFound,
)
from services.coordinator.platform.fields import check_id, check_sha256
from services.coordinator.resources.resources_params import (
    ModelVersionPublish,
    RecordingList,
    RecordingPut,
    RuntimeRegister,
)
from workshop.kit.errors import PermissionDenied
from workshop.kit.hashing import canonical_json, runtime_manifest
from workshop.kit.hashing import runtime_id as compute_runtime_id

RECORDING_RETENTION = timedelta(days=40)
RECENT_CHECK_IN = timedelta(minutes=2)  # the website's rule for choosing a runtime
TRACKING_CAPABILITY = "workshop-v3"

R = TypeVar("R", bound="Row")

# Deleting a bucket cancels the unfinished runs writing into it, in the same transaction.
# Runs sit above resources, so the deletion is given the runs room's cancellation (app.py
# wires it): (connection, bucket_id, now) -> the ids of the runs cancelled.
CancelBucketRuns = Callable[[Connection, str, datetime], Awaitable[list[str]]]


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceRow(Row):
    device_id: str
    description: str
    registered_at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeRow(Row):
    runtime_id: str
    device_id: str
    engine: str
    code_sha256: str
    capabilities: list[str]
    registered_at: datetime
    last_seen_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class RegisteredRuntime(RuntimeRow):
    """A runtime as RegisterRuntime left it, and whether that call created it."""

    created: bool


@dataclasses.dataclass(frozen=True, slots=True)
class CameraRow(Row):
    camera_id: str
    name: str
    created_at: datetime
    updated_at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class RecordingRow(Row):
    recording_id: str
    camera_id: str
    generation: int
    start_at: datetime
    end_at: datetime
    fps: float
    object_key: str
    sha256: str
    byte_size: int
    put_at: datetime
    expires_at: datetime
    deleted_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class ModelVersionRow(Row):
    name: str
    version: int
    weights_sha256: str
    classes: list[str]
    input_shape: list[int]
    published_at: datetime
    # Recorded since migration 0005 (docs/bring-your-own-model.md); "" and 0: not recorded.
    family: str
    confidence_threshold: float
    iou_threshold: float
    max_detections: int
    source_sha256: str


@dataclasses.dataclass(frozen=True, slots=True)
class ModelDecoding:
    """How a version's served graph decodes its model's output; empty: not recorded."""

    family: str = ""
    confidence_threshold: float = 0.0
    iou_threshold: float = 0.0
    max_detections: int = 0
    source_sha256: str = ""


FAMILIES = frozenset({"", "yolov8", "yolov5", "nms", "efficient-nms"})
MAX_DETECTIONS = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class BucketRow(Row):
    bucket_id: str
    name: str
    created_at: datetime
    deleted_at: datetime | None


def _require_admin(principal: Principal) -> None:
    auth.require(principal, ScopeName.ADMIN)


def _require_workshop(principal: Principal) -> None:
    """What the website may see and do of devices and runtimes (admin holds it too)."""
    auth.require(principal, ScopeName.WORKSHOP)


class Resources:
    def __init__(self, db: Database, clock: Clock, cancel_runs: CancelBucketRuns) -> None:
        self.db = db
        self.clock = clock
        self.cancel_runs = cancel_runs

    # devices and runtimes ---------------------------------------------------------

    async def register_device(self, who: Principal, device_id: str, description: str) -> DeviceRow:
        _require_admin(who)
        check_id("device_id", device_id)
        async with self.db.connection() as connection:
            row = await fetch_one(
                connection,
                DeviceRow,
                sql("resources", "device_register"),
                device_id,
                description,
                self.clock.now(),
            )
            if row is not None:
                return row
            existing = await fetch_one(
                connection, DeviceRow, sql("resources", "device_get"), device_id
            )
        assert existing is not None  # the insert found it
        if existing.description != description:
            raise IdConflict(
                f"Device {device_id!r} is registered with another description.",
                metadata={"device_id": device_id},
            )
        return existing

    async def register_runtime(
        self,
        who: Principal,
        *,
        device_id: str,
        engine: str,
        code_sha256: str,
        capabilities: Sequence[str],
    ) -> tuple[RegisteredRuntime, str]:
        """Registers the runtime of a manifest; returns it and the manifest JSON."""
        _require_workshop(who)
        check_id("device_id", device_id)
        check_sha256("code_sha256", code_sha256)
        if not engine:
            raise InvalidField("engine must name the processor engine, e.g. workshop-processor.")

        manifest = runtime_manifest(engine=engine, device_id=device_id, code_sha256=code_sha256)
        runtime = compute_runtime_id(engine=engine, device_id=device_id, code_sha256=code_sha256)
        async with self.db.connection() as connection:
            if await connection.fetchrow(sql("resources", "device_get"), device_id) is None:
                raise NotFound(
                    "device",
                    device_id,
                    f"Device {device_id!r} is not registered; register it first "
                    "(OperatorService/RegisterDevice).",
                )
            row = await fetch_one(
                connection,
                RegisteredRuntime,
                *bind(
                    RuntimeRegister(
                        runtime_id=runtime,
                        device_id=device_id,
                        engine=engine,
                        code_sha256=code_sha256,
                        capabilities=sorted(set(capabilities)),
                        registered_at=self.clock.now(),
                    )
                ),
            )
        assert row is not None  # an upsert always returns its row
        return row, canonical_json(manifest).decode()

    async def list_devices(self, who: Principal, after: str | None, limit: int) -> list[DeviceRow]:
        _require_workshop(who)
        return await self._all(DeviceRow, sql("resources", "device_list"), after, limit)

    async def list_runtimes(
        self, who: Principal, device_id: str, after: tuple[datetime, str] | None, limit: int
    ) -> list[RuntimeRow]:
        _require_workshop(who)
        after_at, after_id = after if after else (None, None)
        return await self._all(
            RuntimeRow,
            sql("resources", "runtime_list"),
            device_id or None,
            after_at,
            after_id,
            limit,
        )

    # cameras and recordings ------------------------------------------------------------

    async def put_camera(self, who: Principal, camera_id: str, name: str) -> CameraRow:
        _require_admin(who)
        check_id("camera_id", camera_id)
        row = await self._one(
            CameraRow, sql("resources", "camera_put"), camera_id, name, self.clock.now()
        )
        assert row is not None  # an upsert always returns its row
        return row

    async def list_cameras(self, who: Principal, after: str | None, limit: int) -> list[CameraRow]:
        _require_admin(who)
        return await self._all(CameraRow, sql("resources", "camera_list"), after, limit)

    async def put_recording(
        self,
        who: Principal,
        *,
        recording_id: str,
        camera_id: str,
        start: datetime,
        end: datetime,
        fps: float,
        object_key: str,
        sha256: str,
        byte_size: int,
    ) -> RecordingRow:
        _require_admin(who)
        check_id("recording_id", recording_id)
        check_id("camera_id", camera_id)
        check_sha256("sha256", sha256)
        if end <= start:
            raise InvalidField("A recording's end must be after its start.")
        if not fps > 0:
            raise InvalidField(f"fps must be positive (got {fps}).")
        if byte_size <= 0:
            raise InvalidField("byte_size must be positive.")
        if not object_key:
            raise InvalidField("object_key must name the recording's object in storage.")
        now = self.clock.now()
        try:
            row = await self._one(
                RecordingRow,
                *bind(
                    RecordingPut(
                        recording_id=recording_id,
                        camera_id=camera_id,
                        start_at=start,
                        end_at=end,
                        fps=fps,
                        object_key=object_key,
                        sha256=sha256,
                        byte_size=byte_size,
                        put_at=now,
                        expires_at=now + RECORDING_RETENTION,
                    )
                ),
            )
        except ForeignKeyViolationError:
            raise NotFound(
                "camera", camera_id, f"Camera {camera_id!r} does not exist; create it first."
            ) from None
        if row is None:
            raise InvalidField(
                f"Recording {recording_id!r} belongs to another camera; a replacement keeps "
                "its camera."
            )
        return row

    async def delete_recording(self, who: Principal, recording_id: str) -> RecordingRow:
        _require_admin(who)
        row = await self._one(
            RecordingRow, sql("resources", "recording_delete"), recording_id, self.clock.now()
        )
        if row is None:
            raise NotFound(
                "recording",
                recording_id,
                f"Recording {recording_id!r} does not exist or is already deleted.",
            )
        return row

    async def list_recordings(
        self,
        who: Principal,
        *,
        camera_id: str,
        overlaps_from: datetime | None,
        overlaps_until: datetime | None,
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[RecordingRow]:
        _require_workshop(who)
        reach = auth.cameras_reached(who, ScopeName.WORKSHOP)
        if reach is not None and camera_id not in reach:
            covered = ", ".join(repr(c) for c in sorted(reach)) or "none"
            raise PermissionDenied(
                f"This key reads the recordings of its own cameras only ({covered}): "
                "name one of them in camera_id."
            )
        after_start, after_id = after if after else (None, None)
        return await self._all(
            RecordingRow,
            *bind(
                RecordingList(
                    now=self.clock.now(),
                    camera_id=camera_id or None,
                    overlaps_from=overlaps_from,
                    overlaps_until=overlaps_until,
                    after_start=after_start,
                    after_id=after_id,
                    limit=limit,
                )
            ),
        )

    # models and buckets -----------------------------------------------------------------

    async def publish_model_version(
        self,
        who: Principal,
        *,
        name: str,
        version: int,
        weights_sha256: str,
        classes: Sequence[str],
        input_shape: Sequence[int],
        decoding: ModelDecoding = ModelDecoding(),
    ) -> tuple[ModelVersionRow, bool]:
        _require_admin(who)
        check_id("name", name)
        check_sha256("weights_sha256", weights_sha256)
        if version < 1:
            raise InvalidField("version must be 1 or more.")
        if not classes or any(not value for value in classes) or len(set(classes)) != len(classes):
            raise InvalidField("classes must list distinct, non-empty class names.")
        if not input_shape or any(value < 1 for value in input_shape):
            raise InvalidField(
                "input_shape must list the positive sizes of one input frame (no batch dimension)."
            )
        _check_decoding(decoding)
        row = await self._one(
            ModelVersionRow,
            *bind(
                ModelVersionPublish(
                    name=name,
                    version=version,
                    weights_sha256=weights_sha256,
                    classes=list(classes),
                    input_shape=list(input_shape),
                    published_at=self.clock.now(),
                    family=decoding.family,
                    confidence_threshold=decoding.confidence_threshold,
                    iou_threshold=decoding.iou_threshold,
                    max_detections=decoding.max_detections,
                    source_sha256=decoding.source_sha256,
                )
            ),
        )
        if row is not None:
            return row, True
        existing = await self._one(
            ModelVersionRow, sql("resources", "model_version_get"), name, version
        )
        assert existing is not None  # the insert found it
        same = (
            existing.weights_sha256 == weights_sha256
            and list(existing.classes) == list(classes)
            and list(existing.input_shape) == list(input_shape)
            and _decoding(existing) == decoding
        )
        if not same:
            raise IdConflict(
                f"Model {name} version {version} is already published with other weights, "
                "classes, shape or decoding; versions are immutable, publish a new version.",
                metadata={"name": name, "version": str(version)},
            )
        return existing, False

    async def list_model_versions(
        self, who: Principal, name: str, after: tuple[str, int] | None, limit: int
    ) -> list[ModelVersionRow]:
        _require_admin(who)
        after_name, after_version = after if after else (None, None)
        return await self._all(
            ModelVersionRow,
            sql("resources", "model_version_list"),
            name or None,
            after_name,
            after_version,
            limit,
        )

    async def create_bucket(self, who: Principal, bucket_id: str, name: str) -> BucketRow:
        _require_admin(who)
        check_id("bucket_id", bucket_id)
        row = await self._one(
            BucketRow, sql("resources", "bucket_create"), bucket_id, name, self.clock.now()
        )
        if row is not None:
            return row
        existing = await self._one(BucketRow, sql("resources", "bucket_get"), bucket_id)
        assert existing is not None  # the insert found it
        if existing.deleted_at is not None or existing.name != name:
            raise IdConflict(
                f"Bucket id {bucket_id!r} is taken (by another bucket or a deleted one); "
                "choose another id.",
                metadata={"bucket_id": bucket_id},
            )
        return existing

    async def delete_bucket(self, who: Principal, bucket_id: str) -> tuple[list[str], int]:
        """Deletes the bucket with its items and cancels unfinished runs writing into it;
        returns those runs and how many items went."""
        _require_admin(who)
        now = self.clock.now()
        async with self.db.transaction() as connection:
            row = await connection.fetchrow(sql("resources", "bucket_delete"), bucket_id, now)
            if row is None:
                raise NotFound("bucket", bucket_id, f"Bucket {bucket_id!r} does not exist.")
            cancelled = await self.cancel_runs(connection, bucket_id, now)
            items: int = await connection.fetchval(
                sql("resources", "bucket_items_delete"), bucket_id, now
            )
        return cancelled, items

    async def list_buckets(self, who: Principal, after: str | None, limit: int) -> list[BucketRow]:
        _require_admin(who)
        return await self._all(BucketRow, sql("resources", "bucket_list"), after, limit)

    # helpers ----------------------------------------------------------------------------------

    async def _all(self, row: type[R], query: str, *args: object) -> list[R]:
        async with self.db.connection() as connection:
            return await fetch_all(connection, row, query, *args)

    async def _one(self, row: type[R], query: str, *args: object) -> R | None:
        async with self.db.connection() as connection:
            return await fetch_one(connection, row, query, *args)


async def check_grant_targets(connection: Connection, grants: Sequence[Grant]) -> None:
    """NotFound unless every device and camera the grants name exist (identity's
    `GrantTargets`: it asks before it stores a key)."""
    cameras = set(await fetch_column(connection, str, sql("resources", "camera_ids_all")))
    for grant in grants:
        if grant.device_id and (
            await connection.fetchrow(sql("resources", "device_get"), grant.device_id) is None
        ):
            raise NotFound(
                "device", grant.device_id, f"Device {grant.device_id!r} is not registered."
            )
        missing = sorted(set(grant.camera_ids) - cameras)
        if missing:
            raise NotFound("camera", missing[0], f"Unknown cameras in scope: {', '.join(missing)}.")


# What other rooms read of the registry, inside their own transactions ---------------------


@dataclasses.dataclass(frozen=True)
class CatalogRows:
    """What GetCatalog lists: the resources a workflow may name."""

    cameras: list[CameraRow]
    buckets: list[BucketRow]
    models: list[ModelVersionRow]
    runtimes: list[RuntimeRow]


async def catalog_rows(connection: Connection) -> CatalogRows:
    return CatalogRows(
        cameras=await fetch_all(
            connection, CameraRow, sql("resources", "camera_list"), None, 10_000
        ),
        buckets=await fetch_all(
            connection, BucketRow, sql("resources", "bucket_list"), None, 10_000
        ),
        models=await fetch_all(
            connection,
            ModelVersionRow,
            sql("resources", "model_version_list"),
            None,
            None,
            None,
            10_000,
        ),
        runtimes=await fetch_all(
            connection, RuntimeRow, sql("resources", "runtime_list"), None, None, None, 10_000
        ),
    )


async def camera_ids(connection: Connection) -> list[str]:
    """Every camera's id (a workflow's input names cameras)."""
    return await fetch_column(connection, str, sql("resources", "camera_ids_all"))


async def live_bucket_ids(connection: Connection) -> list[str]:
    """The ids of the buckets not deleted (a workflow's outputs name buckets)."""
    return await fetch_column(connection, str, sql("resources", "bucket_ids_live"))


async def model_versions(connection: Connection) -> list[ModelVersionRow]:
    """Every published model version (validation reads their classes, runs pin them)."""
    return await fetch_all(connection, ModelVersionRow, sql("resources", "model_version_all"))


async def choose_runtime(
    connection: Connection, now: datetime, needed: list[str], recent: bool
) -> RuntimeRow:
    """The website's rule (recent: checked in lately with the capabilities needed) or the
    schedules' and agents' rule (the newest ever seen); docs/runs-and-jobs.md."""
    if recent:
        row = await fetch_one(
            connection,
            RuntimeRow,
            sql("resources", "runtime_newest_capable"),
            now - RECENT_CHECK_IN,
            needed,
        )
        rule = "checked in within the last 2 minutes" + (
            f" with capabilities {', '.join(needed)}" if needed else ""
        )
    else:
        row = await fetch_one(connection, RuntimeRow, sql("resources", "runtime_newest_seen"))
        rule = "ever checked in"
    if row is None:
        raise NoRuntime(f"No runtime {rule}; start a processor for this device first.")
    return row


@dataclasses.dataclass(frozen=True, slots=True)
class CurrentRecording(Row):
    """A current recording (not deleted, not expired) as runs and photos admit it."""

    recording_id: str
    camera_id: str
    generation: int
    start_at: datetime
    end_at: datetime
    fps: float
    object_key: str
    sha256: str
    byte_size: int
    expires_at: datetime


async def runtime(connection: Connection, runtime_id: str) -> RuntimeRow | None:
    return await fetch_one(connection, RuntimeRow, sql("resources", "runtime_get"), runtime_id)


async def camera_exists(connection: Connection, camera_id: str) -> bool:
    return await connection.fetchrow(sql("resources", "camera_get"), camera_id) is not None


async def recordings_for_input(
    connection: Connection,
    now: datetime,
    camera_ids: Sequence[str],
    window: tuple[datetime, datetime],
) -> list[CurrentRecording]:
    """The current recordings of the cameras that overlap the window [start, end)."""
    return await fetch_all(
        connection,
        CurrentRecording,
        sql("resources", "recording_list_for_input"),
        now,
        list(camera_ids),
        window[0],
        window[1],
    )


async def recording_covering(
    connection: Connection, camera_id: str, moment: datetime, now: datetime
) -> CurrentRecording | None:
    """The newest current recording of the camera that covers the instant (photos)."""
    return await fetch_one(
        connection, CurrentRecording, sql("resources", "recording_covering"), camera_id, moment, now
    )


def _check_decoding(decoding: ModelDecoding) -> None:
    if decoding.family not in FAMILIES:
        raise InvalidField(
            f"family must be one of {', '.join(sorted(FAMILIES - {''}))}, or empty.",
            metadata={"field": "family"},
        )
    for field in ("confidence_threshold", "iou_threshold"):
        value = getattr(decoding, field)
        if not 0.0 <= value <= 1.0:
            raise InvalidField(f"{field} must be between 0 and 1.", metadata={"field": field})
    if not 0 <= decoding.max_detections <= MAX_DETECTIONS:
        raise InvalidField(
            f"max_detections must be between 0 and {MAX_DETECTIONS}.",
            metadata={"field": "max_detections"},
        )
    if decoding.source_sha256:
        check_sha256("source_sha256", decoding.source_sha256)


def _decoding(row: ModelVersionRow) -> ModelDecoding:
    return ModelDecoding(
        family=row.family,
        confidence_threshold=row.confidence_threshold,
        iou_threshold=row.iou_threshold,
        max_detections=row.max_detections,
        source_sha256=row.source_sha256,
    )
