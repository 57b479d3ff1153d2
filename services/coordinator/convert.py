"""Typed rows and domain values rendered as contract messages, and back."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from services.coordinator.identity.accounts import KeyRow, SessionRow, UserRow
from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.platform.errors import InvalidField
from services.coordinator.resources.registry import (
    BucketRow,
    CameraRow,
    DeviceRow,
    ModelVersionRow,
    RecordingRow,
    RuntimeRow,
)
from workshop.kit.box_values import BOX_FLOATS
from workshop.v1 import common_pb2, operator_pb2, resources_pb2

SCOPE_TO_PROTO = {
    ScopeName.WORKSHOP: common_pb2.SCOPE_WORKSHOP,
    ScopeName.FOOTAGE_READ: common_pb2.SCOPE_FOOTAGE_READ,
    ScopeName.WORKSHOP_RUN: common_pb2.SCOPE_WORKSHOP_RUN,
    ScopeName.ADMIN: common_pb2.SCOPE_ADMIN,
    ScopeName.SERVICE: common_pb2.SCOPE_SERVICE,
    ScopeName.GATEWAY: common_pb2.SCOPE_GATEWAY,
}
SCOPE_FROM_PROTO = {value: key for key, value in SCOPE_TO_PROTO.items()}


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


def micros(value: datetime) -> int:
    """Microseconds since the epoch (a naive datetime is UTC, as in FromDatetime)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - EPOCH) // MICROSECOND


def stamp(microseconds: int) -> Timestamp:
    seconds, rest = divmod(microseconds, 1_000_000)
    return Timestamp(seconds=seconds, nanos=rest * 1000)


def ts(value: datetime) -> Timestamp:
    # Integer arithmetic: a third of Timestamp.FromDatetime's cost, and the same value.
    return stamp(micros(value))


def set_ts(target: Timestamp, value: datetime) -> None:
    """Writes `value` into a message's Timestamp field in place (a naive datetime is UTC).

    From the timedelta's own fields, which are floored as a Timestamp's are (seconds
    0..86399 and microseconds 0..999999 of any day, before 1970 too): 0.4 us against 0.6
    through `micros` and divmod; a review page writes 2,000."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    since = value - EPOCH
    target.seconds = since.days * 86_400 + since.seconds
    target.nanos = since.microseconds * 1000


def opt_ts(value: datetime | None) -> Timestamp | None:
    return None if value is None else ts(value)


def from_ts(field: str, stamp: Timestamp) -> datetime:
    """A required instant of a request; INVALID_ARGUMENT naming the field when unset."""
    if stamp.seconds == 0 and stamp.nanos == 0:
        raise InvalidField(f"{field} is required.")
    return stamp.ToDatetime(tzinfo=UTC)


def from_optional_ts(stamp: Timestamp | None) -> datetime | None:
    """An optional instant: None when absent or unset."""
    if stamp is None or (stamp.seconds == 0 and stamp.nanos == 0):
        return None
    return stamp.ToDatetime(tzinfo=UTC)


def from_duration(value: Duration) -> timedelta | None:
    if value.seconds == 0 and value.nanos == 0:
        return None
    return value.ToTimedelta()


def device(row: DeviceRow) -> resources_pb2.Device:
    return resources_pb2.Device(
        device_id=row.device_id,
        description=row.description,
        registered_at=ts(row.registered_at),
    )


def runtime(row: RuntimeRow) -> resources_pb2.Runtime:
    return resources_pb2.Runtime(
        runtime_id=row.runtime_id,
        device_id=row.device_id,
        engine=row.engine,
        code_sha256=row.code_sha256,
        capabilities=list(row.capabilities),
        registered_at=ts(row.registered_at),
        last_seen_at=opt_ts(row.last_seen_at),
    )


def camera(row: CameraRow) -> resources_pb2.Camera:
    return resources_pb2.Camera(
        camera_id=row.camera_id,
        name=row.name,
        created_at=ts(row.created_at),
        updated_at=ts(row.updated_at),
    )


def recording(row: RecordingRow) -> resources_pb2.Recording:
    return resources_pb2.Recording(
        recording_id=row.recording_id,
        camera_id=row.camera_id,
        generation=row.generation,
        start=ts(row.start_at),
        end=ts(row.end_at),
        fps=row.fps,
        object_key=row.object_key,
        sha256=row.sha256,
        byte_size=row.byte_size,
        put_at=ts(row.put_at),
        expires_at=ts(row.expires_at),
        deleted_at=opt_ts(row.deleted_at),
    )


def model_version(row: ModelVersionRow) -> resources_pb2.ModelVersion:
    return resources_pb2.ModelVersion(
        name=row.name,
        version=row.version,
        weights_sha256=row.weights_sha256,
        classes=list(row.classes),
        input_shape=list(row.input_shape),
        published_at=ts(row.published_at),
        family=row.family,
        confidence_threshold=row.confidence_threshold,
        iou_threshold=row.iou_threshold,
        max_detections=row.max_detections,
        source_sha256=row.source_sha256,
    )


def bucket(row: BucketRow, item_count: int = 0) -> resources_pb2.Bucket:
    return resources_pb2.Bucket(
        bucket_id=row.bucket_id,
        name=row.name,
        created_at=ts(row.created_at),
        item_count=item_count,
    )


def user(row: UserRow) -> operator_pb2.User:
    return operator_pb2.User(
        user_id=row.user_id,
        display_name=row.display_name,
        disabled=row.disabled_at is not None,
        created_at=ts(row.created_at),
        disabled_at=opt_ts(row.disabled_at),
        has_password=row.has_password,
    )


def session(row: SessionRow) -> operator_pb2.Session:
    return operator_pb2.Session(
        session_id=row.session_id,
        user_id=row.user_id,
        created_at=ts(row.created_at),
        expires_at=ts(row.expires_at),
        revoked_at=opt_ts(row.revoked_at),
    )


def grant(value: Grant) -> common_pb2.KeyScope:
    return common_pb2.KeyScope(
        scope=SCOPE_TO_PROTO[value.scope],
        device_id=value.device_id,
        camera_ids=list(value.camera_ids),
    )


def grant_from_proto(value: common_pb2.KeyScope) -> Grant:
    scope = SCOPE_FROM_PROTO.get(value.scope)
    if scope is None:
        raise InvalidField(
            "Each scope must be one of workshop, footage:read, workshop:run, admin, service, "
            "gateway."
        )
    return Grant(scope, value.device_id, tuple(value.camera_ids))


def key(row: KeyRow) -> operator_pb2.Key:
    return operator_pb2.Key(
        key_id=row.key_id,
        name=row.name,
        scopes=[grant(value) for value in row.grants],
        user_id=row.user_id or "",
        created_at=ts(row.created_at),
        expires_at=opt_ts(row.expires_at),
        revoked_at=opt_ts(row.revoked_at),
        last_used_at=opt_ts(row.last_used_at),
    )


def boxes(values: list[dict[str, Any]] | None) -> list[common_pb2.Box]:
    """An image's boxes as stored (jsonb as MessageToDict wrote it, None: none).

    Built field by field: json_format.ParseDict costs about 20 us a box, which a review
    page of 1,000 items with a few boxes each cannot afford."""
    return [_box(value) for value in values or []]


def _box(value: dict[str, Any]) -> common_pb2.Box:
    box = common_pb2.Box()
    fill_box(box, value)
    return box


def fill_box_floats(box: common_pb2.Box, value: Mapping[str, Any]) -> None:
    """A stored box's floats, each a number or, in rows an earlier release stored, NaN or
    an infinity as protobuf's JSON (and Postgres's for a `real`) spells it: "NaN",
    "Infinity", "-Infinity", which `float` reads. Requests refuse such values now
    (workshop.kit.box_values); the HTTP API writes them as null."""
    for name in BOX_FLOATS:
        setattr(box, name, float(value.get(name, 0.0)))


def fill_box(box: common_pb2.Box, value: dict[str, Any]) -> None:
    """Writes a stored box into `box` in place (`boxes.add()`: no copy into the list)."""
    box.class_name = value.get("class_name", "")
    try:
        box.score = value.get("score", 0.0)
        box.x = value.get("x", 0.0)
        box.y = value.get("y", 0.0)
        box.w = value.get("w", 0.0)
        box.h = value.get("h", 0.0)
    except TypeError:  # a value spelled as a string: a NaN an earlier release stored
        fill_box_floats(box, value)
    track = value.get("track_id")
    if track is not None:
        box.track_id = int(track)  # int64 is a JSON string
