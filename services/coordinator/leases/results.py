"""Checks a job's result against its expected slots (docs/runs-and-jobs.md), without the database.

Every expected slot is accounted for exactly once, in slot order: FRAME (a frame
inside its slot and the window, with its upload in a full run), EMPTY (no frame)
or DROPPED (only when the graph has a Do nothing step or keeps frames by change).
The accepted result is turned into what the commit writes: counts, the uploads
to verify and, for full runs, one bucket item per output a frame reached. A box value
that is NaN or infinite, stored or not, refuses the result (INVALID_FIELD naming it).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from itertools import chain

from services.coordinator.leases.boxes import boxes_json
from services.coordinator.platform.errors import InvalidField, ResultInvalid
from workshop.kit.box_values import NonFiniteBox, all_finite, refuse_non_finite
from workshop.kit.hashing import sha256_hex
from workshop.kit.values import hot_value
from workshop.v1 import common_pb2, jobs_pb2


@dataclasses.dataclass(frozen=True)
class JobFacts:
    """What a result is checked against: the job's slots and the run's snapshot."""

    slot_count: int
    first_slot_at: datetime
    interval: timedelta
    window_end: datetime
    dropped_allowed: bool
    full_run: bool
    output_buckets: Mapping[str, str]  # output step id -> bucket id

    def slot_span(self, index: int) -> tuple[datetime, datetime]:
        start = self.first_slot_at + index * self.interval
        return start, min(start + self.interval, self.window_end)


@hot_value
class Item:
    item_id: str
    bucket_id: str
    slot_index: int
    step_id: str
    frame_time: datetime
    boxes: str | None  # JSON text (boxes.boxes_json); None: those recorded with the preview
    object_key: str
    sha256: str


@hot_value
class Upload:
    object_key: str
    sha256: str
    slot_index: int


@dataclasses.dataclass(frozen=True)
class CheckedResult:
    frames: int
    empties: int
    dropped: int
    uploads: list[Upload]
    items: list[Item]


def result_digest(result: jobs_pb2.JobResult) -> str:
    """SHA-256 of the result's deterministic protobuf serialization (the receipt's digest)."""
    return sha256_hex(result.SerializeToString(deterministic=True))


def item_id(run_id: str, job_index: int, slot_index: int, step_id: str) -> str:
    """A bucket item's id: stable for the same run, job, slot and output step."""
    key = f"{run_id}\0{job_index}\0{slot_index}\0{step_id}".encode()
    return "it_" + hashlib.sha256(key).hexdigest()[:24]


def _invalid(slot_index: int, message: str) -> ResultInvalid:
    return ResultInvalid(message, metadata={"slot_index": str(slot_index)})


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _frame_time(slot: jobs_pb2.SlotResult, facts: JobFacts) -> datetime:
    """The frame's time, checked to lie inside its slot (and the window). Worked out in
    whole microseconds, as Timestamp.ToDatetime rounds it (its nanos are 0..999,999,999:
    the request check refuses others): a Complete checks every frame of its job."""
    if not slot.HasField("frame_time"):
        raise _invalid(slot.slot_index, f"Slot {slot.slot_index}: a frame needs its frame_time.")
    stamp = slot.frame_time
    moment = _EPOCH + timedelta(seconds=stamp.seconds, microseconds=stamp.nanos // 1000)
    start, end = facts.slot_span(slot.slot_index)
    if not start <= moment < end:
        raise _invalid(
            slot.slot_index,
            f"Slot {slot.slot_index}: frame_time {moment.isoformat()} is outside the slot "
            f"[{start.isoformat()}, {end.isoformat()}).",
        )
    return moment


def check_result(
    result: jobs_pb2.JobResult, facts: JobFacts, *, run_id: str, job_index: int
) -> CheckedResult:
    """Validates `result`; raises ResultInvalid naming the first bad slot."""
    if len(result.slots) != facts.slot_count:
        raise _invalid(
            min(len(result.slots), facts.slot_count),
            f"The result has {len(result.slots)} slots; the job expects {facts.slot_count}, "
            "each exactly once.",
        )
    frames = empties = dropped = 0
    uploads: list[Upload] = []
    items: list[Item] = []
    for position, slot in enumerate(result.slots):
        if slot.slot_index != position:
            raise _invalid(
                position,
                f"Slot {position} is missing or out of order (found slot {slot.slot_index}); "
                "list every expected slot once, in slot order.",
            )
        if slot.outcome == common_pb2.SLOT_OUTCOME_EMPTY:
            if slot.HasField("frame_time") or slot.boxes or slot.outputs or slot.upload_key:
                raise _invalid(position, f"Slot {position}: an EMPTY slot carries no frame.")
            empties += 1
        elif slot.outcome == common_pb2.SLOT_OUTCOME_DROPPED:
            if not facts.dropped_allowed:
                raise _invalid(
                    position,
                    f"Slot {position}: DROPPED needs a Do nothing step or keep-by-change in "
                    "the run's graph.",
                )
            if slot.outputs or slot.upload_key:
                raise _invalid(position, f"Slot {position}: a DROPPED frame reaches no output.")
            _frame_time(slot, facts)
            if slot.boxes:
                _refuse_non_finite(position, slot.boxes, ())
            dropped += 1
        elif slot.outcome == common_pb2.SLOT_OUTCOME_FRAME:
            moment = _frame_time(slot, facts)
            frames += 1
            items += _frame_items(slot, moment, facts, run_id, job_index, uploads)
        else:
            raise _invalid(position, f"Slot {position}: outcome must be FRAME, EMPTY or DROPPED.")
    return CheckedResult(frames, empties, dropped, uploads, items)


def _frame_items(
    slot: jobs_pb2.SlotResult,
    moment: datetime,
    facts: JobFacts,
    run_id: str,
    job_index: int,
    uploads: list[Upload],
) -> list[Item]:
    # Each field is read from the message once (a Complete checks every frame of its job,
    # and each read of a protobuf field makes a new Python object).
    index = slot.slot_index
    outputs = list(slot.outputs)
    before_rules = slot.boxes
    if before_rules:
        _refuse_non_finite(index, before_rules, ())
    steps = [output.step_id for output in outputs]
    recorded = [output.boxes_recorded for output in outputs]
    upload_key = slot.upload_key
    buckets = facts.output_buckets
    seen_steps = set()
    for step_id in steps:
        if step_id not in buckets:
            raise _invalid(index, f"Slot {index}: {step_id!r} is not an output step.")
        if step_id in seen_steps:
            raise _invalid(index, f"Slot {index}: output {step_id!r} is listed twice.")
        seen_steps.add(step_id)
    if not facts.full_run:
        if upload_key:
            raise _invalid(index, f"Slot {index}: test runs upload nothing; previews are all.")
        if any(recorded):
            raise _invalid(index, f"Slot {index}: boxes_recorded is for a full run's items.")
        _refuse_non_finite(index, (), outputs)  # stored nowhere, refused all the same
        return []
    if not outputs:
        if upload_key:
            raise _invalid(index, f"Slot {index}: a frame that reaches no output is not uploaded.")
        return []
    upload_sha256 = slot.upload_sha256
    if not upload_key or len(upload_sha256) != 64:
        raise _invalid(
            index, f"Slot {index}: a full run's frame needs upload_key and upload_sha256."
        )
    if any(recorded):
        if len(outputs) != 1:
            raise _invalid(
                index,
                f"Slot {index}: boxes_recorded names the preview's boxes, which are those of "
                "a frame with one output; list each output's boxes.",
            )
        if outputs[0].boxes:
            raise _invalid(index, f"Slot {index}: an output with boxes_recorded carries no boxes.")
    uploads.append(Upload(upload_key, upload_sha256, index))
    try:
        return [
            Item(
                item_id=item_id(run_id, job_index, index, step_id),
                bucket_id=buckets[step_id],
                slot_index=index,
                step_id=step_id,
                frame_time=moment,
                boxes=None if boxes_recorded else boxes_json(output.boxes),
                object_key=upload_key,
                sha256=upload_sha256,
            )
            for output, step_id, boxes_recorded in zip(outputs, steps, recorded, strict=True)
        ]
    except NonFiniteBox:  # boxes_json's refusal, which knows no output: named here
        _refuse_non_finite(index, (), outputs)
        raise


def _refuse_non_finite(
    index: int, before_rules: Sequence[common_pb2.Box], outputs: Sequence[jobs_pb2.RoutedOutput]
) -> None:
    """Refuses a frame whose boxes (before rules, or an output's) hold NaN or an infinity,
    stored or not: nothing can show such a value (workshop.kit.box_values). One pass in C
    when every value is finite. A full run's outputs need no call before their items are
    made: boxes_json, which writes their boxes, refuses such a value itself (and this
    then names the output)."""
    sent = [output.boxes for output in outputs]
    if all_finite(chain(before_rules, *sent)):
        return
    refuse_non_finite(before_rules, f"result.slots[{index}].boxes")
    for position, boxes in enumerate(sent):
        refuse_non_finite(boxes, f"result.slots[{index}].outputs[{position}].boxes")


def check_digest(result: jobs_pb2.JobResult, claimed: str) -> str:
    digest = result_digest(result)
    if claimed != digest:
        raise InvalidField(
            "result_sha256 does not match the result: hash its deterministic serialization."
        )
    return digest
