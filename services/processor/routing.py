"""Routing one sampled frame through a run's workflow graph (docs/workflows.md).

Pure and deterministic: no I/O. `Router` compiles the snapshot's graph once per
run; `JobRouter` adds the per-job state (tracker, keep-by-change reference) and
is fed every sampled frame of a job in slot order.

How a frame flows (`workflow.proto` is the contract; where it is silent this
module decides):
- The frame enters the sample step with no boxes and flows along NEXT edges.
- A model step adds its model's boxes to the boxes flowing through it.
- A rule step passes a box when its class is in `class_names` (empty = any),
  its score ≥ `min_score` and, with a motion route, its track moved at least
  `min_displacement` (0 = 0.02) since it was last seen, or it first appears
  (`MotionRoute`: "since the previous sampled frame"). The frame leaves on
  MATCH with only the passing boxes when at least one box passes, otherwise
  on NO_MATCH with its boxes unchanged (no boxes never matches).
- A step with several successors on a branch sends the frame to all of them.
  An output step reached along several paths is reported once, with the union
  of the boxes that arrived there (in the frame's box order).
- Outcome: FRAME when at least one output step is reached; DROPPED when only
  do-nothing steps are reached.
- Keep-by-change is decided after the models (change is only known from
  detections and tracks): an unchanged frame is DROPPED without being routed
  (no outputs), but its boxes are still reported, as `SlotResult.boxes`
  requires for DROPPED slots. Tracks are updated on every sampled frame,
  dropped or not, so the motion route always compares with the previous
  sampled frame.
- Every box carries a track id when the job tracks (the graph keeps frames by
  change or routes on motion, or `JobRouter(track=True)`).
- A graph the coordinator would refuse (no sample step, an edge to an unknown
  step, a branch with no edge, a cycle, a model step without a pinned model)
  raises `RoutingError`; so do detections that do not name exactly the model
  steps, and a motion rule meeting a box with no track id.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from services.processor.tracking import (
    DEFAULT_IOU_THRESHOLD,
    DEFAULT_MAX_MISSED,
    Box,
    ChangeDetector,
    Tracker,
    at_least,
    box_to_proto,
    effective_min_displacement,
)
from workshop.v1 import common_pb2, jobs_pb2, snapshot_pb2, workflow_pb2

__all__ = [
    "Box",
    "JobRouter",
    "Outcome",
    "Routed",
    "Router",
    "RoutingError",
    "empty_slot_result",
    "needs_tracking",
    "to_slot_result",
]

Outcome = Literal["frame", "dropped"]
DropReason = Literal["", "do_nothing", "unchanged"]

_NEXT = workflow_pb2.EDGE_BRANCH_NEXT
_MATCH = workflow_pb2.EDGE_BRANCH_MATCH
_NO_MATCH = workflow_pb2.EDGE_BRANCH_NO_MATCH


class RoutingError(ValueError):
    """The graph or the detections break what a valid run guarantees."""


class Motion(Protocol):
    """How far a track moved since it was last seen; None when it first appears."""

    def displacement(self, track_id: int) -> float | None: ...


@dataclass(frozen=True)
class Routed:
    """Where one frame went.

    `outputs`: output steps reached, in graph step order, each with the boxes that arrived.
    `boxes`: every box of every model step, model steps in graph order (SlotResult.boxes).
    `reason`: why a dropped frame was dropped; empty for frames.
    """

    outcome: Outcome
    outputs: tuple[tuple[str, tuple[Box, ...]], ...]
    boxes: tuple[Box, ...]
    reason: DropReason = ""


def needs_tracking(spec: workflow_pb2.WorkflowSpec) -> bool:
    """True when the graph keeps frames by change or routes on motion."""
    return any(
        (step.HasField("sample") and step.sample.HasField("keep_by_change"))
        or (step.HasField("rule") and step.rule.HasField("motion"))
        for step in spec.graph.steps
    )


class Router:
    """The compiled graph of one run."""

    def __init__(
        self,
        spec: workflow_pb2.WorkflowSpec,
        pinned_models: Sequence[snapshot_pb2.PinnedModel] = (),
    ) -> None:
        steps: dict[str, workflow_pb2.Step] = {}
        for step in spec.graph.steps:
            if not step.step_id or step.step_id in steps:
                raise RoutingError(f"step id {step.step_id!r} is empty or repeated")
            if step.WhichOneof("kind") is None:
                raise RoutingError(f"step {step.step_id!r} has no kind")
            steps[step.step_id] = step
        self._steps = steps
        self._order = {step_id: index for index, step_id in enumerate(steps)}

        samples = [step_id for step_id, step in steps.items() if step.HasField("sample")]
        if len(samples) != 1:
            raise RoutingError(f"the graph has {len(samples)} sample steps, not one")
        self._sample_id = samples[0]
        self._keep_by_change: float | None = None
        sample = steps[self._sample_id].sample
        if sample.HasField("keep_by_change"):
            self._keep_by_change = effective_min_displacement(
                sample.keep_by_change.min_displacement
            )

        self._successors: dict[tuple[str, int], list[str]] = {}
        for edge in spec.graph.edges:
            for end in (edge.from_step_id, edge.to_step_id):
                if end not in steps:
                    raise RoutingError(f"an edge names unknown step {end!r}")
            targets = self._successors.setdefault((edge.from_step_id, edge.branch), [])
            if edge.to_step_id not in targets:
                targets.append(edge.to_step_id)

        pinned = {model.step_id: model for model in pinned_models}
        self._models: list[snapshot_pb2.PinnedModel] = []
        for step_id, step in steps.items():
            if step.HasField("model"):
                if step_id not in pinned:
                    raise RoutingError(f"model step {step_id!r} has no pinned model")
                self._models.append(pinned[step_id])
        self._needs_tracking = needs_tracking(spec)

    @property
    def models(self) -> tuple[snapshot_pb2.PinnedModel, ...]:
        """The pinned model of every model step, in graph step order."""
        return tuple(self._models)

    @property
    def model_step_ids(self) -> tuple[str, ...]:
        return tuple(model.step_id for model in self._models)

    @property
    def needs_tracking(self) -> bool:
        return self._needs_tracking

    @property
    def keep_by_change(self) -> float | None:
        """The effective keep-by-change displacement, or None when every frame is kept."""
        return self._keep_by_change

    def route(
        self,
        detections: Mapping[str, Sequence[Box]],
        *,
        motion: Motion | None = None,
        unchanged: bool = False,
    ) -> Routed:
        """Route one frame.

        `detections` maps every model step id to its boxes (with track ids when
        tracking); `motion` answers the motion route (a `TrackedFrame`);
        `unchanged` marks a frame that keep-by-change drops.
        """
        if set(detections) != set(self.model_step_ids):
            raise RoutingError(
                f"detections name steps {sorted(detections)}, "
                f"the graph's model steps are {list(self.model_step_ids)}"
            )
        boxes: list[Box] = []
        added: dict[str, tuple[int, ...]] = {}
        for step_id in self.model_step_ids:
            start = len(boxes)
            boxes.extend(detections[step_id])
            added[step_id] = tuple(range(start, len(boxes)))
        if unchanged:
            return Routed(outcome="dropped", outputs=(), boxes=tuple(boxes), reason="unchanged")

        reached: dict[str, set[int]] = {}
        reached_do_nothing = False
        seen: set[tuple[str, tuple[int, ...]]] = set()
        # Depth-first walk over (step, boxes flowing in); boxes are indices into `boxes`.
        pending: list[tuple[str, tuple[int, ...], int]] = [(self._sample_id, (), 0)]
        while pending:
            step_id, flowing, depth = pending.pop()
            if (step_id, flowing) in seen:
                continue
            seen.add((step_id, flowing))
            if depth > len(self._steps):
                raise RoutingError("the graph has a cycle")
            step = self._steps[step_id]
            kind = step.WhichOneof("kind")
            if kind == "output":
                reached.setdefault(step_id, set()).update(flowing)
                continue
            if kind == "do_nothing":
                reached_do_nothing = True
                continue
            if kind == "rule":
                passing = tuple(i for i in flowing if self._passes(step, boxes[i], motion))
                branch, flowing = (_MATCH, passing) if passing else (_NO_MATCH, flowing)
            elif kind == "model":
                branch, flowing = _NEXT, tuple(sorted({*flowing, *added[step_id]}))
            elif kind == "sample":
                branch = _NEXT
            else:
                raise RoutingError(f"a frame cannot enter {kind} step {step_id!r}")
            targets = self._successors.get((step_id, branch))
            if not targets:
                name = workflow_pb2.EdgeBranch.Name(branch)
                raise RoutingError(f"step {step_id!r} has no {name} edge; the frame goes nowhere")
            for target in reversed(targets):
                pending.append((target, flowing, depth + 1))

        outputs = tuple(
            (step_id, tuple(boxes[i] for i in sorted(reached[step_id])))
            for step_id in sorted(reached, key=self._order.__getitem__)
        )
        if outputs:
            return Routed(outcome="frame", outputs=outputs, boxes=tuple(boxes))
        if not reached_do_nothing:  # pragma: no cover - every walk ends at a terminal step
            raise RoutingError("the frame reached no output and no do-nothing step")
        return Routed(outcome="dropped", outputs=(), boxes=tuple(boxes), reason="do_nothing")

    @staticmethod
    def _passes(step: workflow_pb2.Step, box: Box, motion: Motion | None) -> bool:
        rule = step.rule
        if rule.class_names and box.class_name not in rule.class_names:
            return False
        if rule.min_score > 0 and not at_least(box.score, rule.min_score):
            return False
        if not rule.HasField("motion"):
            return True
        if box.track_id is None or motion is None:
            raise RoutingError(f"rule {step.step_id!r} routes on motion but the box is not tracked")
        distance = motion.displacement(box.track_id)
        if distance is None:
            return True
        return at_least(distance, effective_min_displacement(rule.motion.min_displacement))


class JobRouter:
    """Routing with the state of one job: feed every sampled frame in slot order."""

    def __init__(
        self,
        router: Router,
        *,
        track: bool | None = None,
        iou_threshold: float = DEFAULT_IOU_THRESHOLD,
        max_missed: int = DEFAULT_MAX_MISSED,
    ) -> None:
        self._router = router
        tracking = router.needs_tracking if track is None else track
        if router.needs_tracking and not tracking:
            raise RoutingError("this graph needs tracking")
        self._tracker = (
            Tracker(iou_threshold=iou_threshold, max_missed=max_missed) if tracking else None
        )
        keep = router.keep_by_change
        self._change = ChangeDetector(keep) if keep is not None else None

    def route(self, detections: Mapping[str, Sequence[Box]]) -> Routed:
        """Track (when tracking), apply keep-by-change, then route the frame."""
        if set(detections) != set(self._router.model_step_ids):
            raise RoutingError(
                f"detections name steps {sorted(detections)}, "
                f"the graph's model steps are {list(self._router.model_step_ids)}"
            )
        ordered = {step_id: detections[step_id] for step_id in self._router.model_step_ids}
        if self._tracker is None:
            return self._router.route(ordered)
        frame = self._tracker.update(ordered)
        unchanged = self._change is not None and not self._change.keep(frame)
        return self._router.route(frame.boxes, motion=frame, unchanged=unchanged)


_OUTCOMES: Mapping[Outcome, common_pb2.SlotOutcome.ValueType] = {
    "frame": common_pb2.SLOT_OUTCOME_FRAME,
    "dropped": common_pb2.SLOT_OUTCOME_DROPPED,
}


def to_slot_result(
    index: int,
    frame_time: datetime.datetime,
    routed: Routed,
    *,
    upload_key: str = "",
    upload_sha256: str = "",
    boxes_recorded: bool = False,
) -> jobs_pb2.SlotResult:
    """The SlotResult of a decoded frame (FRAME or DROPPED). A full run's FRAME carries its
    upload's key and digest; test runs and photos upload nothing (previews are all).

    `boxes_recorded`: the upload is the slot's preview, recorded with the boxes of the
    frame's one output, so the result carries no boxes: the commit copies the recorded
    ones (RoutedOutput.boxes_recorded) and Complete stays small."""
    if frame_time.tzinfo is None:
        raise ValueError("frame_time must be timezone-aware")
    if routed.outcome != "frame" and (upload_key or upload_sha256):
        raise ValueError("only a FRAME slot has an upload")
    if bool(upload_key) != bool(upload_sha256):
        raise ValueError("an upload needs both its key and its digest")
    if boxes_recorded and (not upload_key or len(routed.outputs) != 1):
        raise ValueError("recorded boxes are those of an uploaded frame's one output")
    result = jobs_pb2.SlotResult(slot_index=index, outcome=_OUTCOMES[routed.outcome])
    if boxes_recorded:
        ((step_id, _),) = routed.outputs
        result.outputs.add(step_id=step_id, boxes_recorded=True)
    else:
        result.boxes.extend(box_to_proto(box) for box in routed.boxes)
        for step_id, boxes in routed.outputs:
            result.outputs.add(step_id=step_id, boxes=[box_to_proto(box) for box in boxes])
    result.frame_time.FromDatetime(frame_time.astimezone(datetime.UTC))
    if routed.outcome == "frame":
        result.upload_key = upload_key
        result.upload_sha256 = upload_sha256
    return result


def empty_slot_result(index: int) -> jobs_pb2.SlotResult:
    """The SlotResult of a slot the recorder skipped (EMPTY)."""
    return jobs_pb2.SlotResult(slot_index=index, outcome=common_pb2.SLOT_OUTCOME_EMPTY)
