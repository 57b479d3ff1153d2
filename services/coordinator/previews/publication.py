"""The coordinator's side of previews and staged uploads (docs/previews-and-uploads.md).

The preview service calls these with its own `service` key; the processor's
key rides along as the on-behalf-of principal, and fence 4 checks it. Every
write goes through the same fence function as results and progress, and checks
that the service's own key is still live, so both principals may come from the
coordinator's principal cache. Staging an upload and recording previews are one
round trip each; a batch of previews (group commit) is one statement.

A processor also records the previews it wrote itself on its Session stream
(`record_own_previews`): the same statement, with its own key in the service's
place (previews_record_v1's key_live check then reads that key, which fence 4
checks too).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from services.coordinator.identity import auth
from services.coordinator.identity.auth import Principal, ScopeName
from services.coordinator.leases.boxes import FrameBoxes
from services.coordinator.leases.jobs import (
    Lease,
    LeaseFacts,
    check_lease,
    job_id,
    lease_columns,
    raise_for,
    reporter,
)
from services.coordinator.leases.recorded import RecordedBoxes
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import Database, Row, bind, fetch_all, fetch_one, sql
from services.coordinator.platform.errors import Expired, InvalidField, NotFound
from services.coordinator.platform.fields import check_sha256
from services.coordinator.platform.metrics import PREVIEWS_RECORDED
from services.coordinator.previews.previews_params import (
    ObjectStage,
    PreviewsRecord,
    PreviewSweepSettle,
)
from services.coordinator.runs.events import RunEvents
from services.coordinator.runs.snapshots import Frozen, SnapshotCache
from workshop.kit import limits, object_keys
from workshop.kit.errors import PermissionDenied, WorkshopError
from workshop.kit.hashing import sha256_hex
from workshop.kit.object_keys import EXTENSIONS
from workshop.kit.values import hot_value

# ListCollectableObjects, MarkObjectsDeleted and SettleSweep: objects per call.
MAX_COLLECT = limits.COLLECTABLE.maximum
MAX_RECORD_BATCH = 256
COLLECT_HOLD = timedelta(minutes=5)  # a pass that dies releases its objects after this
# A job's preview prefix is swept this long after it ended: a write that was in flight
# then has long finished (or failed), so the sweep sees every byte it will ever see.
SWEEP_GRACE = timedelta(minutes=10)
KINDS = ("preview", "upload")


def object_key(kind: str, lease: Lease, slot: int, *, test: bool, content_type: str) -> str:
    """This lease's key for one slot's object of `kind`."""
    return object_keys.object_key(
        kind,
        lease.run_id,
        lease.job_id,
        lease.generation,
        slot,
        test=test,
        content_type=content_type,
    )


def preview_item_id(key: str) -> str:
    """A preview's id in image URLs: stable per object key, and free of slashes."""
    return "pv_" + sha256_hex(key.encode())[:24]


@hot_value
class PreviewRecord:
    """One preview to record: its bytes are written under `key`."""

    lease: Lease
    code_sha256: str
    key: str
    slot: int
    sha256: str
    byte_size: int
    content_type: str
    frame_time: datetime
    boxes: str  # JSON text, as stored (convert.boxes_json)
    # the boxes as the commit's grouping reads them, when known (leases.recorded)
    read: FrameBoxes | None = None


@hot_value
class Recorded:
    item_id: str
    expires_at: datetime | None  # None: when its job ends (a full run's items replace it)


@dataclasses.dataclass(frozen=True)
class Sweep:
    run_id: str
    job_index: int
    prefix: str


@dataclasses.dataclass(frozen=True)
class Staged:
    object_key: str
    collectable_after: datetime  # if nothing commits it: when the lease lapses, unless renewed


@dataclasses.dataclass(frozen=True, slots=True)
class StageAnswer(Row):
    """object_stage's answer: a refusal, or when the staged object becomes collectable."""

    reason: str
    collectable_after: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class PreviewAnswer(Row):
    """previews_record's answer for one preview: a refusal, or when the preview expires."""

    reason: str
    expires_at: datetime | None  # None: when its job ends


@dataclasses.dataclass(frozen=True, slots=True)
class CollectableObject(Row):
    """An object whose bytes a cleanup pass may delete, held for that pass."""

    object_key: str
    byte_size: int
    collectable_at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class SweepTarget(Row):
    """A job whose preview prefix a cleanup pass sweeps, held for that pass."""

    run_id: str
    job_index: int
    mode: str  # the run's: "test" | "full"


@dataclasses.dataclass(frozen=True, slots=True)
class ImageLocation(Row):
    """Where an image's bytes are, with what reading them needs (image_for_read)."""

    source: str  # "preview" | "item"
    object_key: str
    content_type: str
    boxes: list[dict[str, object]] | None
    frame_time: datetime
    camera_id: str
    sha256: str
    expires_at: datetime | None
    run_expires_at: datetime | None

    @property
    def readable_until(self) -> datetime | None:
        """When reading it ends: the image's own expiry, else its run's (None: never)."""
        return self.expires_at or self.run_expires_at


def _require_service(who: Principal) -> str:
    """The service's key id (staging and publishing check it is still live)."""
    auth.require(who, ScopeName.SERVICE)
    return who.key_id


def _raise_lease_refusal(reason: str | None, lease: Lease) -> None:
    """The error a refusal of the calling service's key or of the lease's fences means
    (None or '' is none)."""
    if reason == "SERVICE_NOT_AUTHORIZED":
        raise auth.rejected("service key is no longer valid")
    raise_for(reason, lease)


def _raise_refusal(reason: str, lease: Lease, slot: int) -> None:
    """The error a staging or recording function's refusal means ('' is none)."""
    if reason == "SLOT_NOT_EXPECTED":
        raise InvalidField(f"Slot {slot} is not an expected slot of job {lease.job_id}.")
    if reason == "PREVIEW_OUT_OF_ORDER":
        raise InvalidField(
            f"Slot {slot} comes before a preview already published under this lease; "
            "previews are published in slot order."
        )
    _raise_lease_refusal(reason, lease)


def _check_object(sha256: str, byte_size: int, content_type: str) -> None:
    check_sha256("sha256", sha256)
    if content_type not in EXTENSIONS:
        raise InvalidField(f"content_type must be one of {', '.join(EXTENSIONS)}.")
    if byte_size <= 0:
        raise InvalidField("byte_size must be positive.")


def _check_fields(preview: PreviewRecord) -> PreviewRecord:
    """The preview with its content type, its digest, size and type checked."""
    if not preview.content_type:
        # a preview service from before 0008 sends none: its key names the type
        extension = preview.key.rpartition(".")[2]
        preview = dataclasses.replace(
            preview, content_type=object_keys.CONTENT_TYPES.get(extension, "")
        )
    _check_object(preview.sha256, preview.byte_size, preview.content_type)
    return preview


def _checked_preview(preview: PreviewRecord, frozen: Frozen) -> PreviewRecord:
    """The preview with its content type, checked: its key must be the lease's for the slot
    (`frozen`: its run's snapshot, which names the key's prefix)."""
    preview = _check_fields(preview)
    expected = object_key(
        "preview",
        preview.lease,
        preview.slot,
        test=not frozen.full_run,
        content_type=preview.content_type,
    )
    if preview.key != expected:
        raise InvalidField(
            f"object_key must be this lease's preview key for slot {preview.slot}: {expected!r}."
        )
    return preview


class PublicationApi:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        snapshots: SnapshotCache,
        events: RunEvents,
        recorded: RecordedBoxes | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.snapshots = snapshots
        self.events = events  # announces the runs whose previews a batch recorded
        # what a full run's previews were recorded with, for their commits (leases.recorded)
        self.recorded = RecordedBoxes() if recorded is None else recorded

    async def check_lease(
        self, who: Principal, processor: Principal, lease: Lease, code_sha256: str
    ) -> LeaseFacts:
        service = _require_service(who)
        async with self.db.connection() as connection:
            reason, facts = await check_lease(
                connection, lease, service, reporter(processor), code_sha256, self.clock.now()
            )
        # Refused only after the commit: a permanent refusal ended the job (workshop_fence).
        _raise_lease_refusal(reason, lease)
        assert facts is not None  # the fences found the job
        return facts

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
        _check_object(sha256, byte_size, content_type)
        if kind not in KINDS:
            raise InvalidField("kind must be PREVIEW or UPLOAD.")
        frozen = await self._frozen(lease)
        key = object_key(kind, lease, slot, test=not frozen.full_run, content_type=content_type)
        async with self.db.connection() as connection:
            answer = await fetch_one(
                connection,
                StageAnswer,
                *bind(
                    ObjectStage(
                        run_id=lease.run_id,
                        job_index=lease.job_index,
                        generation=lease.generation,
                        lease_token=lease.token,
                        reporter=reporter(processor),
                        service=service,
                        code_sha256=code_sha256,
                        kind=kind,
                        slot=slot,
                        sha256=sha256,
                        byte_size=byte_size,
                        content_type=content_type,
                        object_key=key,
                        now=self.clock.now(),
                    )
                ),
            )
        assert answer is not None  # object_stage answers one row
        _raise_refusal(answer.reason, lease, slot)
        assert answer.collectable_after is not None  # set whenever nothing refused
        return Staged(key, answer.collectable_after)

    async def _frozen(self, lease: Lease) -> Frozen:
        """The run's snapshot (its mode names the key's prefix); NOT_FOUND as the fences say."""
        try:
            return await self.snapshots.get(lease.run_id)
        except NotFound:
            raise_for("NOT_FOUND", lease)
            raise

    async def record_previews(
        self, who: Principal, processor: Principal, previews: list[PreviewRecord]
    ) -> list[Recorded | WorkshopError]:
        """Records previews of one processor in one statement; one outcome per preview.

        A preview with malformed fields gets its error without reaching the database;
        a refusal by the fences leaves its bytes to the cleanup loop (preview_record).
        """
        service = _require_service(who)
        if not 1 <= len(previews) <= MAX_RECORD_BATCH:
            raise InvalidField(f"Give 1..{MAX_RECORD_BATCH} previews per call.")
        return await self._record(service, reporter(processor), previews, own=False)

    async def record_own_previews(
        self, processor: Principal, previews: list[PreviewRecord]
    ) -> list[Recorded | WorkshopError]:
        """A processor's records of the previews it wrote (JobService.Session's
        record_previews), exactly as record_previews records them for the preview service,
        with the processor's own key as the calling one: previews_record_v1 checks that it
        is live, and fence 4 that it is still the lease's device's workshop:run key. A key
        no longer live refuses each preview as fence 4 would (REPORTER_NOT_AUTHORIZED),
        and records none (the job's sweep finds their bytes after the job ends)."""
        reporting = reporter(processor)
        if not 1 <= len(previews) <= MAX_RECORD_BATCH:
            raise InvalidField(f"Give 1..{MAX_RECORD_BATCH} previews per call.")
        return await self._record(reporting, reporting, previews, own=True)

    async def _record(
        self, service: str, reporting: str, previews: list[PreviewRecord], *, own: bool
    ) -> list[Recorded | WorkshopError]:
        outcomes: list[Recorded | WorkshopError | None] = []
        checked: list[PreviewRecord] = []
        # A batch's previews are of a few runs: each run's snapshot looked up once, before
        # the previews are checked one by one without awaiting (None: no such run).
        runs: dict[str, Frozen | None] = {}
        for preview in previews:
            if preview.lease.run_id not in runs:
                try:
                    runs[preview.lease.run_id] = await self._frozen(preview.lease)
                except WorkshopError:
                    runs[preview.lease.run_id] = None
        for preview in previews:
            try:
                frozen = runs[preview.lease.run_id]
                if frozen is None:  # no such run: the preview's refusal, after the checks before it
                    _check_fields(preview)
                    frozen = await self._frozen(preview.lease)
                checked.append(_checked_preview(preview, frozen))
            except WorkshopError as error:
                outcomes.append(error)
            else:
                outcomes.append(None)
        if not checked:
            return [outcome for outcome in outcomes if outcome is not None]
        item_ids = [preview_item_id(preview.key) for preview in checked]
        # A batch's previews are of a few leases: each lease (with the code it reports
        # under) is sent once, and each preview as its lease's position among them.
        positions: dict[tuple[Lease, str], int] = {}
        lease_positions = [
            positions.setdefault((preview.lease, preview.code_sha256), len(positions) + 1)
            for preview in checked
        ]
        now = self.clock.now()
        async with self.db.connection() as connection:
            answers = await fetch_all(
                connection,
                PreviewAnswer,
                *bind(
                    PreviewsRecord(
                        **lease_columns([lease for lease, _ in positions]),
                        code_sha256s=[code for _, code in positions],
                        reporter=reporting,
                        service=service,
                        lease_positions=lease_positions,
                        object_keys=[preview.key for preview in checked],
                        slots=[preview.slot for preview in checked],
                        sha256s=[preview.sha256 for preview in checked],
                        byte_sizes=[preview.byte_size for preview in checked],
                        content_types=[preview.content_type for preview in checked],
                        frame_times=[preview.frame_time for preview in checked],
                        boxes=[preview.boxes for preview in checked],
                        item_ids=item_ids,
                        now=now,
                    )
                ),
            )
        # what a full run's commits will group (a test run's save nothing): each preview
        # recorded now, `now` its row's staged_at
        full_runs = {run for run, frozen in runs.items() if frozen is not None and frozen.full_run}
        self.recorded.remember(
            now,
            (
                (preview.key, preview.read)
                for preview, answer in zip(checked, answers, strict=True)
                if preview.read is not None
                and not answer.reason
                and preview.lease.run_id in full_runs
            ),
        )
        # previews_record notifies nothing: the runs' live images changed
        self.events.announce_runs({preview.lease.run_id for preview in checked})
        PREVIEWS_RECORDED.inc(sum(not answer.reason for answer in answers))
        recorded = iter(zip(checked, item_ids, answers, strict=True))
        return [
            outcome if outcome is not None else _recorded(*next(recorded), own=own)
            for outcome in outcomes
        ]

    async def claim_collectable(
        self, who: Principal, kind: str, limit: int
    ) -> tuple[list[CollectableObject], bool, list[Sweep]]:
        """Up to `limit` collectable objects, held for this caller's pass; whether more wait;
        for previews, up to `limit` job prefixes to sweep, held the same way."""
        _require_service(who)
        if kind not in KINDS:
            raise InvalidField("kind must be PREVIEW or UPLOAD.")
        if not 1 <= limit <= MAX_COLLECT:
            raise InvalidField(f"limit must be 1..{MAX_COLLECT}.")
        now = self.clock.now()
        async with self.db.connection() as connection:
            rows = await fetch_all(
                connection,
                CollectableObject,
                sql("previews", "objects_claim_collectable"),
                kind,
                limit,
                now,
                COLLECT_HOLD,
            )
            more: bool = await connection.fetchval(
                sql("previews", "objects_collectable_remaining"), kind, now
            )
            swept = (
                await fetch_all(
                    connection,
                    SweepTarget,
                    sql("previews", "preview_sweeps_claim"),
                    limit,
                    now,
                    SWEEP_GRACE,
                    COLLECT_HOLD,
                )
                if kind == "preview"
                else []
            )
        sweeps = [
            Sweep(
                target.run_id,
                target.job_index,
                object_keys.job_prefix(
                    "preview", target.run_id, job_id(target.job_index), test=target.mode != "full"
                ),
            )
            for target in swept
        ]
        return rows, more, sweeps

    async def settle_sweep(
        self, who: Principal, sweep: Sweep, objects: list[tuple[str, int]], *, done: bool
    ) -> int:
        """Records the objects found under a sweep's prefix that no row knows as collectable."""
        _require_service(who)
        if len(objects) > MAX_COLLECT:
            raise InvalidField(f"At most {MAX_COLLECT} objects per call.")
        job = job_id(sweep.job_index)
        missing = NotFound("job", f"{sweep.run_id}/{job}", "No such run or job.")
        try:
            frozen = await self.snapshots.get(sweep.run_id)
        except NotFound:
            raise missing from None
        prefix = object_keys.job_prefix("preview", sweep.run_id, job, test=not frozen.full_run)
        if sweep.prefix != prefix:
            raise InvalidField(f"The sweep of job {job} has prefix {prefix!r}.")
        generations: list[int] = []
        slots: list[int] = []
        content_types: list[str] = []
        for key, _ in objects:
            if not key.startswith(prefix):
                raise InvalidField(f"Object {key!r} is not under the sweep's prefix {prefix!r}.")
            parts = object_keys.parts_under(prefix, key)
            generations.append(parts.generation if parts else -1)
            slots.append(parts.slot if parts else -1)
            content_types.append(parts.content_type if parts else object_keys.UNKNOWN_CONTENT_TYPE)
        params = PreviewSweepSettle(
            run_id=sweep.run_id,
            job_index=sweep.job_index,
            object_keys=[key for key, _ in objects],
            byte_sizes=[size for _, size in objects],
            generations=generations,
            slots=slots,
            content_types=content_types,
            done=done,
            now=self.clock.now(),
            hold=COLLECT_HOLD,
        )
        async with self.db.connection() as connection:
            recorded: int | None = await connection.fetchval(*bind(params))
        if recorded is None:
            raise missing
        return recorded

    async def mark_deleted(
        self, who: Principal, keys: list[str], not_deleted: list[str]
    ) -> tuple[int, int]:
        """Marks `keys` deleted and hands back the held `not_deleted`; how many of each."""
        _require_service(who)
        if len(keys) + len(not_deleted) > MAX_COLLECT:
            raise InvalidField(f"At most {MAX_COLLECT} keys per call.")
        now = self.clock.now()
        async with self.db.connection() as connection:
            # a cleanup pass's hand-back names only keys not deleted: no statement for none
            marked = (
                await connection.fetch(sql("previews", "objects_mark_deleted"), keys, now)
                if keys
                else []
            )
            released = (
                await connection.fetch(sql("previews", "objects_release_held"), not_deleted, now)
                if not_deleted
                else []
            )
        return len(marked), len(released)

    async def authorize_read(
        self, who: Principal, reader: Principal, run_id: str, item_id: str
    ) -> ImageLocation:
        """Where an image's bytes are, if `reader` may see that camera and it has not expired."""
        _require_service(who)
        # The reader's scope before the lookup: a key that reads no footage learns no
        # image's existence.
        auth.require(reader, ScopeName.WORKSHOP, ScopeName.FOOTAGE_READ)
        async with self.db.connection() as connection:
            row = await fetch_one(
                connection, ImageLocation, sql("previews", "image_for_read"), run_id, item_id
            )
        if row is None:
            raise NotFound("image", f"{run_id}/{item_id}", "No such image in this run.")
        if not auth.may_read_camera(reader, row.camera_id):
            raise PermissionDenied(
                f"This credential may not read images of camera {row.camera_id!r}."
            )
        now = self.clock.now()
        for moment in (row.expires_at, row.run_expires_at):
            if moment is not None and moment <= now:
                raise Expired(
                    "This image has expired; its labels and bytes are no longer readable.",
                    metadata={"kind": "image", "id": f"{run_id}/{item_id}"},
                )
        return row


def _recorded(
    preview: PreviewRecord, item_id: str, answer: PreviewAnswer, *, own: bool = False
) -> Recorded | WorkshopError:
    """preview_record's answer for one preview: recorded, or the error its refusal means
    (`own`: the processor recorded it with its own key, so a key no longer live is its
    reporter's, as fence 4 names it)."""
    reason = answer.reason
    if own and reason == "SERVICE_NOT_AUTHORIZED":
        reason = "REPORTER_NOT_AUTHORIZED"
    try:
        _raise_refusal(reason, preview.lease, preview.slot)
    except WorkshopError as error:
        return error
    return Recorded(item_id, answer.expires_at)
