"""The runs room's rows: what review, leases and the servicers read of a run, a job, a
run's recent images and a snapshot's recordings. Kept apart from `runs.Runs` so a room
that reads these rows does not import admission and the workflows behind it."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from services.coordinator.platform.db import Row
from services.coordinator.runs.status import RunCounts


@dataclasses.dataclass(frozen=True, slots=True)
class RunFingerprint(Row):
    run_id: str
    fingerprint: str


@dataclasses.dataclass(frozen=True, slots=True)
class RunRow(Row):
    """A run with the counts its status and detail are worked out from (run_status)."""

    run_id: str
    seq: int
    kind: str  # "workflow" | "photo"
    mode: str  # "test" | "full"
    workflow_id: str
    workflow_revision: int
    runtime_id: str
    image_limit: int
    created_by: dict[str, str]  # the creating Principal.to_json
    created_at: datetime
    expires_at: datetime | None
    last_job_update: datetime | None
    counts: RunCounts


@dataclasses.dataclass(frozen=True, slots=True)
class JobRow(Row):
    """A job as a run's detail shows it."""

    job_index: int
    camera_id: str
    recording_id: str
    recording_generation: int
    state: str
    phase: str | None
    progress: int
    slot_count: int
    generation: int
    failure_reason: str | None
    failure_message: str | None
    decoder: str | None
    updated_at: datetime
    lease_expires_at: datetime | None

    @property
    def leased_phase(self) -> str | None:
        """The phase it reported, which means something only while the job is leased."""
        return self.phase if self.state == "leased" else None

    @property
    def lease_held_until(self) -> datetime | None:
        """When its lease ends, while the job is leased (None otherwise)."""
        return self.lease_expires_at if self.state == "leased" else None


@dataclasses.dataclass(frozen=True, slots=True)
class RunImageRow(Row):
    """One of a run's recent images: a published preview or a bucket item."""

    item_id: str
    source: str  # "preview" | "item"
    job_index: int
    slot_index: int
    camera_id: str
    frame_time: datetime
    boxes: list[dict[str, object]] | None
    bucket_id: str
    published_at: datetime
    expires_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotRecordingRow(Row):
    """A recording as a run's snapshot froze it, with its job's slot count."""

    job_index: int
    recording_id: str
    camera_id: str
    generation: int
    sha256: str
    byte_size: int
    object_key: str
    start_at: datetime
    end_at: datetime
    fps: float
    slot_count: int
