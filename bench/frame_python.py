"""The coordinator's own Python per published frame of a full run, piece by piece.

    .venv/bin/python -m bench.frame_costs --python [--batch 90] [--boxes 3]

A full run's frame reaches the coordinator twice: in a record batch (the processor's
`record_previews` on its session, `--batch` previews of `--boxes` boxes) and in its job's
Complete (120 slots, each a frame whose one output takes the boxes recorded with
its preview, as `bench.processor_throughput`'s processor sends it). This times, with
`time.process_time` (CPU of this process, which other work on a shared host disturbs far
less than wall time), the handler code each of them runs per frame without the database
or gRPC: the request check (`workshop.kit.requests.field_problem`), the record's fields
and boxes' JSON (`servicers.views.preview_record`, `previews_boxes`), the preview ids,
the batch's answer (`previews_response`), the result check (`leases.results.check_result`)
and the grouping of the job's items into sightings (`review.reviews.plan_grouping`, its
boxes moving a little a frame, so a job holds `--boxes` sightings). No servers; about
10 s. Last line: `RESULT record_us=<r> commit_us=<c> total_us=<t>`, per frame. (Part of
`bench.frame_costs`, as the coordinator's side of the same frames, not a benchmark with
results of its own.)
"""

from __future__ import annotations

import random
import time
import timeit
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from services.coordinator.leases import results
from services.coordinator.leases.boxes import boxes_json_and_read_many
from services.coordinator.leases.jobs import CommitPrepared
from services.coordinator.previews.publication import Recorded, preview_item_id
from services.coordinator.review import reviews
from services.coordinator.servicers.views import preview_record, previews_boxes, previews_response
from workshop.kit.requests import field_problem
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import publication_pb2 as pub

START = datetime(2026, 11, 29, 8, tzinfo=UTC)
INTERVAL = timedelta(milliseconds=500)
ROUNDS = 200


def _us_per_frame(work: Callable[[], object], frames: int) -> float:
    """CPU microseconds of `work` per frame: the best of three timings of ROUNDS calls."""
    return (
        min(timeit.repeat(work, number=ROUNDS, repeat=3, timer=time.process_time))
        / ROUNDS
        / frames
        * 1e6
    )


def _records(batch: int, boxes: int) -> pub.RecordPreviewsRequest:
    lease = common_pb2.LeaseRef(run_id="r1", job_id="j0", generation=1, token=str(uuid.uuid4()))
    request = pub.RecordPreviewsRequest()
    chosen = random.Random(7)
    for slot in range(batch):
        preview = request.previews.add(
            lease=lease,
            code_sha256="a" * 64,
            slot_index=slot,
            object_key=f"previews/r1/j0/1/{slot}.jpg",
            byte_size=40_000,
            sha256="b" * 64,
            content_type="image/jpeg",
        )
        preview.frame_time.FromDatetime(START + slot * INTERVAL)
        for n in range(boxes):
            # a detector's values: floats of 7-9 significant digits, as a model's outputs
            # are (round ones print several times faster)
            preview.boxes.add(
                class_name="person",
                score=chosen.uniform(0.3, 1.0),
                x=0.1 + 0.25 * n + 0.001 * slot + chosen.uniform(0, 1e-3),
                y=0.2 + chosen.uniform(0, 1e-2),
                w=0.05 + chosen.uniform(0, 1e-2),
                h=0.1 + chosen.uniform(0, 1e-2),
            )
    return request


def _record_pieces(request: pub.RecordPreviewsRequest) -> dict[str, Callable[[], object]]:
    previews = request.previews
    boxes = previews_boxes(previews)
    records = [preview_record(one, text) for one, text in zip(previews, boxes, strict=True)]
    recorded = [Recorded(preview_item_id(r.key), START + timedelta(hours=1)) for r in records]
    return {
        "request check": lambda: field_problem(request),
        "boxes' JSON": lambda: previews_boxes(previews),
        "record fields": lambda: [
            preview_record(one, text) for one, text in zip(previews, boxes, strict=True)
        ],
        "preview ids": lambda: [preview_item_id(r.key) for r in records],
        "answer": lambda: previews_response(recorded),
    }


def _complete(frames: int) -> tuple[jobs_pb2.CompleteRequest, results.JobFacts]:
    result = jobs_pb2.JobResult()
    for slot in range(frames):
        out = result.slots.add(slot_index=slot, outcome=common_pb2.SLOT_OUTCOME_FRAME)
        out.frame_time.FromDatetime(START + slot * INTERVAL + timedelta(milliseconds=10))
        out.outputs.add(step_id="save", boxes_recorded=True)
        out.upload_key = f"previews/r1/j0/1/{slot}.jpg"
        out.upload_sha256 = "c" * 64
    facts = results.JobFacts(
        slot_count=frames,
        first_slot_at=START,
        interval=INTERVAL,
        window_end=START + timedelta(hours=1),
        dropped_allowed=False,
        full_run=True,
        output_buckets={"save": "yard"},
    )
    return jobs_pb2.CompleteRequest(result=result, result_sha256="d" * 64), facts


def _commit_pieces(frames: int, boxes: int) -> dict[str, Callable[[], object]]:
    request, facts = _complete(frames)
    checked = results.check_result(request.result, facts, run_id="r1", job_index=0)
    items = checked.items
    # the boxes as the record remembered them (leases.recorded): what the commit groups
    _, read = boxes_json_and_read_many(
        [
            [
                common_pb2.Box(
                    class_name="person", score=0.9, x=0.1 + 0.25 * b + 0.001 * n, y=0.2, w=0.05
                )
                for b in range(boxes)
            ]
            for n in range(frames)
        ]
    )
    remembered = [(START, frame) for frame in read if frame is not None]
    prepared = CommitPrepared(
        "cam-a",
        reviews.ContextColumns([], [], [], [], [], [], [], [], [], [], [], [], []),
        [None for _ in remembered],
        [START for _ in remembered],
    )
    added = prepared.new_items(items, remembered)
    return {
        "request check": lambda: field_problem(request),
        "result check": lambda: results.check_result(
            request.result, facts, run_id="r1", job_index=0
        ),
        "items' boxes": lambda: prepared.new_items(items, remembered),
        "grouping": lambda: reviews.plan_grouping("r1", "cam-a", added, [], ["yard"]),
    }


def report(batch: int, boxes: int, frames: int = 120) -> None:
    """Prints each piece's CPU per frame and the RESULT line."""
    totals = {}
    for side, pieces, count in (
        ("record", _record_pieces(_records(batch, boxes)), batch),
        ("commit", _commit_pieces(frames, boxes), frames),
    ):
        total = 0.0
        for name, work in pieces.items():
            spent = _us_per_frame(work, count)
            total += spent
            print(f"{side:<7} {name:<15} {spent:6.2f} us a frame")
        totals[side] = total
    print(
        f"RESULT record_us={totals['record']:.1f} commit_us={totals['commit']:.1f} "
        f"total_us={totals['record'] + totals['commit']:.1f}"
    )
