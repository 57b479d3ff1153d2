"""Conversions more than one servicer shares: a lease reference, a recording as the
snapshot lists it, a preview's record and its outcome, and review's items, sightings,
filters and page tokens.

The servicer modules (identity, jobs, operator, publication, workshop) import this,
`common` and `convert`, never each other (pyproject.toml, contract
`coordinator-servicers-independent`)."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from google.protobuf import json_format

from services.coordinator import convert
from services.coordinator.identity import auth
from services.coordinator.leases.boxes import FrameBoxes, boxes_json, boxes_json_and_read_many
from services.coordinator.leases.jobs import Lease, job_id, lease_from
from services.coordinator.platform.errors import InvalidField
from services.coordinator.previews.publication import PreviewRecord, Recorded
from services.coordinator.review import queue, reviews
from services.coordinator.review.history import ItemHistory
from services.coordinator.review.reviews import (
    BoxRow,
    ItemFilter,
    ItemRow,
    ItemView,
    PageKey,
    ReviewedBoxRow,
    SightingRow,
)
from services.coordinator.runs.rows import SnapshotRecordingRow
from services.coordinator.servicers.common import split_token
from workshop.kit.box_values import NonFiniteBox
from workshop.kit.errors import WorkshopError
from workshop.kit.status import status_for
from workshop.v1 import common_pb2, run_pb2, snapshot_pb2
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws


def lease(ref: common_pb2.LeaseRef) -> Lease:
    return _lease(ref.run_id, ref.job_id, ref.generation, ref.token)


# A lease is immutable, and a record batch names the same few leases in every preview:
# parsing each once (its token is a UUID) was 1.9 us of 2 a preview.
_lease = functools.lru_cache(maxsize=4096)(lease_from)


def leases(refs: Sequence[common_pb2.LeaseRef]) -> list[Lease]:
    """A batch's leases, a malformed one named by its position."""
    out = []
    for position, ref in enumerate(refs):
        try:
            out.append(lease(ref))
        except InvalidField as error:
            raise InvalidField(f"leases[{position}]: {error.message}") from None
    return out


def snapshot_recording(row: SnapshotRecordingRow) -> snapshot_pb2.SnapshotRecording:
    return snapshot_pb2.SnapshotRecording(
        job_id=job_id(row.job_index),
        job_index=row.job_index,
        recording_id=row.recording_id,
        camera_id=row.camera_id,
        generation=row.generation,
        sha256=row.sha256,
        byte_size=row.byte_size,
        object_key=row.object_key,
        start=convert.ts(row.start_at),
        end=convert.ts(row.end_at),
        fps=row.fps,
        slot_count=row.slot_count,
    )


STATES = {
    "pending": common_pb2.REVIEW_STATE_PENDING,
    "accepted": common_pb2.REVIEW_STATE_ACCEPTED,
    "rejected": common_pb2.REVIEW_STATE_REJECTED,
}
STATE_NAMES = {value: name for name, value in STATES.items()}


def scope_of_run(run_id: str) -> str:
    return hashlib.sha256(f"review|{run_id}".encode()).hexdigest()[:16]


def page_token(scope: str, key: PageKey | None) -> str:
    """The next page's token, bound to what it pages (`scope`); '' on the last page."""
    if key is None:
        return ""
    return f"{scope}|{key.frame_time.isoformat()}|{key.item_id}"


def page_key(token: str, scope: str) -> PageKey | None:
    """Where the page of `token` starts; INVALID_ARGUMENT for a malformed token or one
    written for another run or listing."""
    parts = split_token(token, 3)
    if parts is None:
        return None
    if parts[0] != scope:
        raise InvalidField(
            "page_token belongs to another run or listing; pass the next_page_token of a "
            "previous page of this one.",
            metadata={"field": "page_token"},
        )
    try:
        moment = datetime.fromisoformat(parts[1])
    except ValueError:
        raise InvalidField("page_token is malformed.", metadata={"field": "page_token"}) from None
    if moment.tzinfo is None:
        raise InvalidField("page_token is malformed.", metadata={"field": "page_token"})
    return PageKey(moment, parts[2])


def _states_and_times(
    value: run_pb2.BucketItemFilter | ws.SightingFilter,
) -> tuple[list[str], datetime | None, datetime | None]:
    """A filter's review states (their names, each once) and its frame time range, as the
    item and the sighting filters share them; INVALID_ARGUMENT naming the field."""
    states: list[str] = []
    for state in value.review_states:
        name = STATE_NAMES.get(state)
        if name is None:
            raise InvalidField(
                "filter.review_states may hold PENDING, ACCEPTED or REJECTED only.",
                metadata={"field": "filter.review_states"},
            )
        if name not in states:
            states.append(name)
    start = (
        convert.from_ts("filter.frame_time_from", value.frame_time_from)
        if value.HasField("frame_time_from")
        else None
    )
    end = (
        convert.from_ts("filter.frame_time_to", value.frame_time_to)
        if value.HasField("frame_time_to")
        else None
    )
    if start is not None and end is not None and end <= start:
        raise InvalidField(
            "filter.frame_time_to must be after filter.frame_time_from.",
            metadata={"field": "filter.frame_time_to"},
        )
    return states, start, end


def _names_and_scores(
    value: run_pb2.BucketItemFilter | ws.SightingFilter,
) -> tuple[float | None, float | None]:
    """Checks a filter's class, camera and run (their length) and answers its score range
    (min_score, max_score), as the item and the sighting filters share them."""
    for field in ("class_name", "camera_id", "run_id"):
        if len(getattr(value, field)) > reviews.MAX_CLASS_LENGTH:
            raise InvalidField(
                f"filter.{field} is at most {reviews.MAX_CLASS_LENGTH} characters.",
                metadata={"field": f"filter.{field}"},
            )
    low = value.min_score if value.HasField("min_score") else None
    high = value.max_score if value.HasField("max_score") else None
    for field, found in (("min_score", low), ("max_score", high)):
        if found is not None and not math.isfinite(found):
            raise InvalidField(
                f"filter.{field} must be a number.", metadata={"field": f"filter.{field}"}
            )
    if low is not None and high is not None and high < low:
        raise InvalidField(
            "filter.max_score must be at least filter.min_score.",
            metadata={"field": "filter.max_score"},
        )
    return low, high


def item_filter(value: run_pb2.BucketItemFilter) -> ItemFilter:
    states, start, end = _states_and_times(value)
    low, high = _names_and_scores(value)
    return ItemFilter(
        review_states=tuple(sorted(states)),
        class_name=value.class_name,
        camera_id=value.camera_id,
        frame_time_from=start,
        frame_time_to=end,
        run_id=value.run_id,
        min_score=low,
        max_score=high,
    )


def fill_bucket_item(
    target: run_pb2.BucketItem,
    row: ItemRow,
    boxes: Sequence[BoxRow],
    reviewed: Sequence[ReviewedBoxRow] | None = (),
) -> None:
    """Writes `row` and its `boxes` into `target` in place: a review page holds 1,000 of
    them, and building each as its own message to copy into the page costs a third more.
    `reviewed`: its boxes after review as read; None for an item without a correction,
    whose boxes after review are its detected `boxes` with their reviews (derived here)."""
    target.item_id = row.item_id
    target.bucket_id = row.bucket_id
    target.run_id = row.run_id
    target.job_id = job_id(row.job_index)
    target.slot_index = row.slot_index
    target.camera_id = row.camera_id
    target.recording_id = row.recording_id
    target.recording_generation = row.recording_generation
    target.output_current = row.output_current
    convert.set_ts(target.frame_time, row.frame_time)
    target.review_state = STATES[row.review_state]
    if row.relabel_class is not None:
        target.relabel_class = row.relabel_class
    convert.set_ts(target.saved_at, row.saved_at)
    if row.reviewed_at is not None:
        convert.set_ts(target.reviewed_at, row.reviewed_at)
    for value in row.boxes or ():  # a test run's preview
        convert.fill_box(target.boxes.add(), value)
    if reviewed is None:
        assert row.corrected_boxes is None, "a corrected item's reviewed boxes are read"
    for box in boxes:
        if box.box_index >= 0:
            detected = target.boxes.add()
            fill_box_row(detected, box)
            if reviewed is None:
                _fill_reviewed_as_detected(target, row, box, detected)
        review = target.box_reviews.add(
            box_index=box.box_index,
            sighting_id=box.sighting_id,
            review_state=STATES[box.review_state],
        )
        if box.relabel_class is not None:
            review.relabel_class = box.relabel_class
    target.revision = row.revision
    if row.corrected_boxes is not None:
        correction = target.correction
        correction.SetInParent()
        correction.boxes.extend(corrected_boxes(row.corrected_boxes))
        if row.corrected_by is not None:
            correction.corrected_by.CopyFrom(auth.principal_proto(row.corrected_by))
        if row.corrected_at is not None:
            convert.set_ts(correction.corrected_at, row.corrected_at)
    if row.item_state is not None:
        decision = target.item_decision
        decision.review_state = STATES[row.item_state]
        if row.item_relabel is not None:
            decision.relabel_class = row.item_relabel
        if row.item_decided_by is not None:
            decision.decided_by.CopyFrom(auth.principal_proto(row.item_decided_by))
        if row.item_decided_at is not None:
            convert.set_ts(decision.decided_at, row.item_decided_at)
    for found in reviewed or ():
        entry = target.reviewed_boxes.add(
            source_box_index=found.source_index, review_state=STATES[found.review_state]
        )
        entry.box.class_name = found.class_name
        entry.box.score = found.score
        entry.box.x = found.x
        entry.box.y = found.y
        entry.box.w = found.w
        entry.box.h = found.h
        if found.track_id is not None:
            entry.box.track_id = found.track_id


def _fill_reviewed_as_detected(
    target: run_pb2.BucketItem, row: ItemRow, box: BoxRow, detected: common_pb2.Box
) -> None:
    """Adds a detected box (`detected`, as just written) after review to an item without a
    correction: source itself, class after the relabel (reviews.review_as_detected)."""
    state, relabel = reviews.review_as_detected(row, box)
    entry = target.reviewed_boxes.add(source_box_index=box.box_index, review_state=STATES[state])
    entry.box.CopyFrom(detected)
    if relabel is not None:
        entry.box.class_name = relabel


def item_view(view: ItemView) -> run_pb2.BucketItem:
    target = run_pb2.BucketItem()
    fill_bucket_item(target, view.item, view.boxes, view.reviewed)
    return target


def item_history(history: ItemHistory) -> ws.GetBucketItemResponse:
    """GetBucketItem's answer: the item, its correction and item decision logs, its
    sightings."""
    answer = ws.GetBucketItemResponse(
        item=item_view(history.view),
        sightings=[sighting(row) for row in history.sightings],
    )
    for logged in history.corrections:
        entry = answer.corrections.add(
            revision=logged.revision,
            boxes=corrected_boxes(logged.boxes or ()),
            corrected_by=auth.principal_proto(logged.corrected_by),
            corrected_at=convert.ts(logged.corrected_at),
        )
        if logged.undone_by is not None:
            entry.undone_by.CopyFrom(auth.principal_proto(logged.undone_by))
        if logged.undone_at is not None:
            convert.set_ts(entry.undone_at, logged.undone_at)
    for decided in history.decisions:
        answer.item_decisions.add(
            revision=decided.revision,
            review_state=STATES[decided.review_state] if decided.review_state else 0,
            relabel_class=decided.relabel_class,
            decided_by=auth.principal_proto(decided.decided_by),
            decided_at=convert.ts(decided.decided_at),
        )
    return answer


def corrected_boxes(stored: Iterable[dict[str, Any]]) -> list[run_pb2.CorrectedBox]:
    """A correction's boxes as stored ({"source", "class_name", "x", "y", "w", "h"})."""
    return [
        run_pb2.CorrectedBox(
            source_box_index=int(box["source"]),
            box=common_pb2.Box(
                class_name=box["class_name"], x=box["x"], y=box["y"], w=box["w"], h=box["h"]
            ),
        )
        for box in stored
    ]


def fill_box_row(target: common_pb2.Box, box: BoxRow) -> None:
    target.class_name = box.class_name
    target.score = box.score
    target.x = box.x
    target.y = box.y
    target.w = box.w
    target.h = box.h
    if box.track_id is not None:
        target.track_id = box.track_id


def sighting(row: SightingRow) -> run_pb2.Sighting:
    return run_pb2.Sighting(
        sighting_id=row.sighting_id,
        bucket_id=row.bucket_id,
        camera_id=row.camera_id,
        class_name=row.class_name,
        item_ids=row.item_ids,
        first_frame_time=convert.ts(row.first_frame_time),
        last_frame_time=convert.ts(row.last_frame_time),
        review_state=STATES[row.review_state],
        relabel_class=row.accepted_as,
        pending_items=row.pending,
        decided_at=convert.opt_ts(row.decided_at),
        decided_by=auth.principal_proto(row.decided_by) if row.decided_by else None,
    )


def pinned_models(snapshot: dict[str, object]) -> list[snapshot_pb2.PinnedModel]:
    frozen = json_format.ParseDict(snapshot, snapshot_pb2.RunSnapshot(), ignore_unknown_fields=True)
    return list(frozen.models)


# A preview's boxes as stored (or their refusal), and as the commit's grouping reads them
# (None: not known here; see leases.boxes.boxes_json_and_read_many).
PreviewBoxes = tuple[str | NonFiniteBox, FrameBoxes | None]


def preview_record(
    request: pub.RecordPreviewRequest, boxes: PreviewBoxes | None = None
) -> PreviewRecord:
    """A preview's record (PublicationService.RecordPreview(s), a Session's
    record_previews) as the coordinator records it; INVALID_ARGUMENT for a malformed
    lease, no frame_time, or a box value that is NaN or infinite. `boxes`: its boxes as
    stored (or their refusal) and as read, when the caller wrote a batch's at once
    (`previews_boxes`)."""
    text, read = (boxes_json(request.boxes), None) if boxes is None else boxes
    if isinstance(text, NonFiniteBox):
        raise text
    return PreviewRecord(
        lease=lease(request.lease),
        code_sha256=request.code_sha256,
        key=request.object_key,
        slot=request.slot_index,
        sha256=request.sha256,
        byte_size=request.byte_size,
        content_type=request.content_type,
        frame_time=convert.from_ts("frame_time", request.frame_time),
        boxes=text,
        read=read,
    )


def previews_boxes(requests: Sequence[pub.RecordPreviewRequest]) -> list[PreviewBoxes]:
    """Each preview's boxes as stored and as read, for a batch of records at once
    (boxes_json_and_read_many); a preview with a NaN or infinite box value gets that
    refusal instead."""
    texts, read = boxes_json_and_read_many([request.boxes for request in requests])
    return list(zip(texts, read, strict=True))


def recorded_preview(recorded: Recorded) -> pub.RecordPreviewResponse:
    return pub.RecordPreviewResponse(
        item_id=recorded.item_id, expires_at=convert.opt_ts(recorded.expires_at)
    )


def previews_response(outcomes: Iterable[Recorded | WorkshopError]) -> pub.RecordPreviewsResponse:
    """A record batch's answer: each preview's outcome (`preview_outcome`), a recorded one
    written into the response in place (a third of building and copying its messages)."""
    response = pub.RecordPreviewsResponse()
    add = response.outcomes.add
    for outcome in outcomes:
        if isinstance(outcome, Recorded):
            recorded = add().recorded
            recorded.item_id = outcome.item_id
            if outcome.expires_at is not None:
                convert.set_ts(recorded.expires_at, outcome.expires_at)
        else:
            add().CopyFrom(preview_outcome(outcome))
    return response


def preview_outcome(outcome: Recorded | WorkshopError) -> pub.RecordPreviewOutcome:
    """One preview's outcome; a refusal carries the status RecordPreview would answer."""
    if isinstance(outcome, Recorded):
        return pub.RecordPreviewOutcome(recorded=recorded_preview(outcome))
    return pub.RecordPreviewOutcome(
        refused=pub.Refusal(
            code=status_for(outcome).grpc_code.value[0],
            message=outcome.message,
            reason=outcome.reason,
            metadata=outcome.metadata,
        )
    )


ORDERS = {
    ws.QUEUE_ORDER_UNSPECIFIED: "oldest",
    ws.QUEUE_ORDER_OLDEST: "oldest",
    ws.QUEUE_ORDER_LOWEST_SCORE: "score",
    ws.QUEUE_ORDER_CAMERA: "camera",
}


def queue_order(value: ws.QueueOrder.ValueType) -> str:
    found = ORDERS.get(value)
    if found is None:
        raise InvalidField(
            "order must be OLDEST, LOWEST_SCORE or CAMERA.", metadata={"field": "order"}
        )
    return found


def sighting_filter(value: ws.SightingFilter) -> queue.SightingFilter:
    """A queue's or a bulk decision's filter; INVALID_ARGUMENT naming the field."""
    states, start, end = _states_and_times(value)
    low, high = _names_and_scores(value)
    order = sorted(states, key=queue.STATES.index)
    return queue.SightingFilter(
        review_states=tuple(order),
        class_name=value.class_name,
        camera_id=value.camera_id,
        run_id=value.run_id,
        frame_time_from=start,
        frame_time_to=end,
        min_score=low,
        max_score=high,
    )


def queue_token(scope: str, key: queue.QueueKey | None) -> str:
    """The next queue page's token, bound to its bucket, filter and order; '' on the last."""
    if key is None:
        return ""
    body = json.dumps(
        [
            scope,
            key.score,
            key.camera_id,
            key.first_frame_time.isoformat(),
            key.run_id,
            key.sighting_id,
        ]
    )
    return "q1." + base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def queue_key(token: str, scope: str) -> queue.QueueKey | None:
    """Where the queue page of `token` starts; INVALID_ARGUMENT for a malformed token or one
    of another bucket, filter or order."""
    if not token:
        return None
    malformed = InvalidField(
        "page_token is malformed; pass the next_page_token of a previous page.",
        metadata={"field": "page_token"},
    )
    if not token.startswith("q1."):
        raise malformed
    try:
        text = base64.urlsafe_b64decode(token[3:] + "=" * (-len(token[3:]) % 4)).decode()
        found, score, camera, moment, run, sighting = json.loads(text)
        key = queue.QueueKey(
            float(score), str(camera), datetime.fromisoformat(moment), str(run), str(sighting)
        )
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError):
        raise malformed from None
    # (a score may be NaN or infinite, as a detector's box may be: Postgres orders NaN above
    # every number, so the page after a NaN-scored sighting starts after it like any other)
    if key.first_frame_time.tzinfo is None:
        raise malformed
    if found != scope:
        raise InvalidField(
            "page_token belongs to another queue (bucket, filter or order); pass the "
            "next_page_token of a previous page of this one.",
            metadata={"field": "page_token"},
        )
    return key


def queued_sighting(row: queue.QueuedSightingRow) -> ws.QueuedSighting:
    return ws.QueuedSighting(run_id=row.run_id, sighting=sighting(row.sighting), score=row.score)


def bulk_decision(row: queue.BulkDecisionRow) -> ws.BulkDecision:
    return ws.BulkDecision(
        action_id=row.action_id,
        bucket_id=row.bucket_id,
        review_state=STATES[row.review_state],
        relabel_class=row.relabel_class,
        decided_by=auth.principal_proto(row.decided_by),
        decided_at=convert.ts(row.decided_at),
        sightings_selected=row.sightings_selected,
        sightings_changed=row.sightings_changed,
        items_changed=row.items_changed,
        undone_by=auth.principal_proto(row.undone_by) if row.undone_by else None,
        undone_at=convert.opt_ts(row.undone_at),
    )
