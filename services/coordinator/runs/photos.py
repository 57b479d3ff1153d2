"""Photos (docs/photos.md): a still frame of a camera at an instant.

A photo is a one-frame test run with no model on the newest recording covering
the instant. Its job is a photo job, which claims take before any run and
which skips the run queue. The processor publishes the frame as the job's
preview (the same fenced stage, upload and checksum path) and completes the job.
Its id is derived from camera, instant and the clock hour of the request, so
the same request within that hour finds the same photo. It lasts an hour and
never appears in run lists or summaries.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from google.protobuf import json_format

from services.coordinator.identity import auth
from services.coordinator.identity.auth import Principal, ScopeName
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import Connection, Database, Row, bind, fetch_one, sql
from services.coordinator.platform.errors import NO_MEDIA_MESSAGE, Expired, NoMedia, NotFound
from services.coordinator.platform.metrics import RUNS_CREATED
from services.coordinator.resources import registry
from services.coordinator.resources.registry import choose_runtime
from services.coordinator.runs.runs import TEST_RESULT_LIFETIME
from services.coordinator.runs.runs_params import (
    PhotoJobInsert,
    RunInsert,
    SnapshotRecordingsInsert,
)
from services.coordinator.runs.traces import record_trace
from workshop.kit.errors import PermissionDenied
from workshop.kit.hashing import canonical_json, sha256_hex
from workshop.v1 import common_pb2, snapshot_pb2

SLOT = timedelta(seconds=1)  # the frame taken is the first at or after the instant, within 1 s
SLOT_MS = SLOT // timedelta(milliseconds=1)  # the photo job's one slot, as jobs keep it


def photo_id(camera_id: str, moment: datetime, now: datetime) -> str:
    hour = now.replace(minute=0, second=0, microsecond=0)
    text = f"{camera_id}|{_rfc3339(moment)}|{_rfc3339(hour)}"
    return "photo-" + sha256_hex(text.encode())[:32]


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclasses.dataclass(frozen=True, slots=True)
class PhotoRow(Row):
    """A photo with its job, and its frame once published."""

    run_id: str
    created_at: datetime
    expires_at: datetime
    camera_id: str
    recording_id: str
    first_slot_at: datetime  # the instant asked for
    state: str  # the job's
    item_id: str | None
    frame_time: datetime | None


@dataclasses.dataclass(frozen=True)
class PhotoView:
    row: PhotoRow
    status: str


class PhotosApi:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    async def request(
        self, who: Principal, camera_id: str, moment: datetime
    ) -> tuple[PhotoView, bool]:
        auth.require(who, ScopeName.WORKSHOP)
        if not auth.may_read_camera(who, camera_id):
            raise PermissionDenied(f"This credential may not take photos of {camera_id!r}.")
        now = self.clock.now()
        run_id = photo_id(camera_id, moment, now)
        async with self.db.transaction() as connection:
            exists = await connection.fetchrow(sql("runs", "run_fingerprint"), run_id)
            created = exists is None and await self._create(
                connection, who, run_id, camera_id, moment, now
            )
        if created:
            RUNS_CREATED.labels("photo", "test").inc()
        return await self.get(who, run_id), created

    async def _create(
        self,
        db: Connection,
        who: Principal,
        run_id: str,
        camera_id: str,
        moment: datetime,
        now: datetime,
    ) -> bool:
        """Creates the photo run; False when a concurrent request created it first."""
        if not await registry.camera_exists(db, camera_id):
            raise NotFound("camera", camera_id, f"Camera {camera_id!r} does not exist.")
        recording = await registry.recording_covering(db, camera_id, moment, now)
        if recording is None:
            raise NoMedia(NO_MEDIA_MESSAGE)
        runtime = await choose_runtime(db, now, [], recent=False)
        expires = now + TEST_RESULT_LIFETIME
        policy = await auth.policy_revision_for_run(db)
        fingerprint = sha256_hex(canonical_json({"camera_id": camera_id, "time": _rfc3339(moment)}))
        seq = await db.fetchval(
            *bind(
                RunInsert(
                    run_id=run_id,
                    kind="photo",
                    mode="test",
                    workflow_id="",
                    workflow_revision=0,
                    runtime_id=runtime.runtime_id,
                    image_limit=1,
                    fingerprint=fingerprint,
                    created_by=who.to_json(),
                    policy_revision=policy,
                    created_at=now,
                    expires_at=expires,
                    code_sha256=runtime.code_sha256,
                )
            )
        )
        if seq is None:  # the same photo requested at once: that request's run stands
            return False
        await record_trace(db, run_id)
        snapshot = snapshot_pb2.RunSnapshot(
            run_id=run_id,
            kind=common_pb2.RUN_KIND_PHOTO,
            mode=common_pb2.RUN_MODE_TEST,
            image_limit=1,
            runtime_id=runtime.runtime_id,
            code_sha256=runtime.code_sha256,
            created_by=auth.principal_proto(who.to_json()),
            policy_revision=policy,
            recording_count=1,
            sampling=snapshot_pb2.Sampling(interval_seconds=SLOT.total_seconds()),
            inputs=[snapshot_pb2.ResolvedInput(camera_ids=[camera_id])],
        )
        snapshot.inputs[0].window_start.FromDatetime(moment)
        snapshot.inputs[0].window_end.FromDatetime(moment + SLOT)
        snapshot.created_at.FromDatetime(now)
        snapshot.expires_at.FromDatetime(expires)
        await db.execute(
            sql("runs", "snapshot_insert"),
            run_id,
            json_format.MessageToDict(snapshot, preserving_proto_field_name=True),
        )
        await db.execute(
            *bind(
                SnapshotRecordingsInsert(
                    run_id=run_id,
                    job_index=[0],
                    recording_id=[recording.recording_id],
                    camera_id=[camera_id],
                    generation=[recording.generation],
                    sha256=[recording.sha256],
                    byte_size=[recording.byte_size],
                    object_key=[recording.object_key],
                    start_at=[recording.start_at],
                    end_at=[recording.end_at],
                    fps=[recording.fps],
                    slot_count=[1],
                )
            )
        )
        await db.execute(
            *bind(
                PhotoJobInsert(
                    run_id=run_id,
                    run_seq=seq,
                    runtime_id=runtime.runtime_id,
                    camera_id=camera_id,
                    recording_id=recording.recording_id,
                    recording_generation=recording.generation,
                    first_slot_at=moment,
                    interval_ms=SLOT_MS,
                    expires_at=min(expires, recording.expires_at),
                    updated_at=now,
                )
            )
        )
        return True

    async def get(self, who: Principal, run_id: str) -> PhotoView:
        auth.require(who, ScopeName.WORKSHOP)
        async with self.db.connection() as connection:
            row = await fetch_one(connection, PhotoRow, sql("runs", "photo_get"), run_id)
        if row is None:
            raise NotFound("photo", run_id, f"Photo {run_id!r} does not exist.")
        if row.expires_at <= self.clock.now():
            raise Expired(
                f"Photo {run_id!r} has expired (photos last an hour).",
                metadata={"kind": "photo", "id": run_id},
            )
        status = {"leased": "running"}.get(row.state, row.state)
        return PhotoView(row, status)
