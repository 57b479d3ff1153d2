"""Validation of workflow documents (docs/workflows.md): every problem at once, in document order.

`validate_workflow` never stops at the first problem: a person fixing a workflow
should see the whole list. Problems are sorted by where they sit in the document
(`time_zone`, graph-wide step problems, each step in order, each edge in order,
then `schedule`); problems at the same place keep the order of the checks.

The contract (`workflow.proto`, the comments on `ValidationProblemKind` and the
step messages) defines the rules; where it is silent this module decides:

Size
- more than 64 steps or more than 256 edges is TOO_LARGE; every other check
  still runs.

Step ids and kinds
- an id is 1..64 characters of [A-Za-z0-9._-] starting with a letter or digit
  (the Step message caps step ids at 64, tighter than other client ids);
  otherwise BAD_STEP_ID. A repeated id is BAD_STEP_ID on every repetition after
  the first.
- edges address a step by the first step carrying that id; repetitions and
  steps with an empty id cannot be addressed and are left out of the graph
  checks (their id problem says enough).
- a step with no kind is MISSING_STEP_KIND; it still carries frames for
  reachability, but edges to or from it are not judged, and it is never reported
  unreachable or dangling.

Shape
- no input step, or no sample step, is one BAD_SHAPE at `graph.steps`; each
  input or sample step after the first is one BAD_SHAPE at that step.
- "the input step is followed by the sample step" is enforced through the
  connection table: an edge from the input to anything else is BAD_CONNECTION,
  an input with no edge is DANGLING_STEP.
- NO_OUTPUT when the graph has no output step, or (when it has an input step)
  when no output step can be reached from an input step.

Edges
- an endpoint that names no addressable step is UNKNOWN_STEP (both endpoints
  are reported when both are unknown, and the edge is not judged further).
- allowed: input -> sample; sample|model|rule -> model|rule|output|do_nothing;
  nothing leaves output or do_nothing; nothing enters input; only input enters
  sample. A forbidden target is BAD_CONNECTION at `to_step_id`, a terminal
  source at `from_step_id`.
- branches: rule edges leave on MATCH or NO_MATCH, every other edge on NEXT;
  UNSPECIFIED is never valid (the EdgeBranch contract says so). Wrong branch is
  BAD_CONNECTION at `branch`.
- a second edge with the same source, target and branch is BAD_CONNECTION (it
  would deliver each frame twice).
- `step_id` of an edge problem is the step named by the path's field (the
  source for `from_step_id` and `branch`, the target for `to_step_id`) and
  empty when the path names the whole edge or an unknown step.

Structure (over every edge whose endpoints are addressable, bad connections
included, so that one wrong edge is reported once and not also as unreachable
or dangling steps downstream)
- CYCLE once per strongly connected component (or self-loop); the path names
  the component's first edge in document order, the message names its steps.
  Edges whose step kinds may not follow each other are left out here: an edge
  back into the sample step is one BAD_CONNECTION, not also a cycle.
- UNREACHABLE_STEP: a step that no input step reaches; only checked when the
  graph has an input step (otherwise every step would be reported).
- DANGLING_STEP: input, sample or model with no outgoing edge; a rule with no
  MATCH edge, and separately with no NO_MATCH edge (the contract requires both
  branches; frames are dropped only through an explicit do-nothing step).
  Any edge leaving the step counts, even one reported for another reason.

References
- an input with no cameras is UNKNOWN_CAMERA at `input.camera_ids`; each
  unregistered camera at `input.camera_ids[k]`.
- an unknown model name is UNKNOWN_MODEL at `model.model_name`; a pinned
  version that is not published (or below 1) at `model.version`; a known name
  with no published version when "latest" is asked at `model.model_name`.
- an unknown or empty bucket is UNKNOWN_BUCKET at `output.bucket_id`.
- UNKNOWN_CLASS: a rule's class that no model step upstream of it (any step
  with a path to the rule) has in its class list, using the pinned version or
  the latest one. When an upstream model cannot be resolved the rule's classes
  are not judged: the UNKNOWN_MODEL problem explains it.

Values
- window start and end must both be set and valid (0..23, 0..59, 0..59), and
  the start before the end, where an end of 00:00:00 means the end of the day;
  otherwise BAD_WINDOW. Lengths are wall-clock (a DST day is not special here).
- day UNSPECIFIED, DATE without a valid date, or a date set with another day
  kind is BAD_DATE.
- interval_seconds (fractional allowed) that is not finite, outside 0.1..3600,
  not a whole number of milliseconds (jobs count slots in exact integer
  milliseconds; x * 1000 within 1e-9 of an integer passes, so 0.1 and 0.1 + 0.2
  do and 0.1005 does not), or longer than the (valid) window of the first input
  step, is BAD_INTERVAL; one problem per step, the first of these that applies.
- rule.min_score, keep_by_change.min_displacement and motion.min_displacement
  outside 0..1 (or NaN) is BAD_THRESHOLD; 0 displacement means the default.
- time_zone: empty means UTC; otherwise it must be an IANA zone name that
  zoneinfo loads (host aliases such as "localtime" are refused): BAD_SCHEDULE,
  which the contract assigns to time zones. A schedule without a valid time of
  day is BAD_SCHEDULE at `schedule.time_of_day`.

The checks, one job to a module: `problems` (a problem, collecting them, document order,
the wording messages share), `document` (size, time zone, schedule), `steps` (each step
on its own and the graph's shape), `references` (cameras, models, classes and buckets
against the `Catalog`), `graph` (edges, cycles, reachability, dangling steps, outputs).
This module runs them in order and is what callers import.
"""

from __future__ import annotations

from services.coordinator.workflows.validation.document import (
    MAX_EDGES,
    MAX_STEPS,
    check_schedule,
    check_size,
    check_time_zone,
    is_time_zone,
)
from services.coordinator.workflows.validation.graph import (
    build_graph,
    check_cycles,
    check_dangling,
    check_output_reached,
    check_reachability,
)
from services.coordinator.workflows.validation.problems import (
    Found,
    Problem,
    Validation,
    document_position,
)
from services.coordinator.workflows.validation.references import Catalog, check_rule_classes
from services.coordinator.workflows.validation.steps import (
    MAX_INTERVAL_SECONDS,
    MAX_STEP_ID_LENGTH,
    MILLISECOND_TOLERANCE,
    MIN_INTERVAL_SECONDS,
    SECONDS_PER_DAY,
    calendar_date,
    check_shape,
    check_steps,
    is_time_of_day,
    window_seconds,
)
from workshop.v1 import workflow_pb2

__all__ = [
    "MAX_EDGES",
    "MAX_INTERVAL_SECONDS",
    "MAX_STEPS",
    "MAX_STEP_ID_LENGTH",
    "MILLISECOND_TOLERANCE",
    "MIN_INTERVAL_SECONDS",
    "SECONDS_PER_DAY",
    "TRACKING_CAPABILITY",
    "Catalog",
    "Problem",
    "Validation",
    "calendar_date",
    "dropped_allowed",
    "is_time_of_day",
    "is_time_zone",
    "required_capabilities",
    "validate_workflow",
    "window_seconds",
]

TRACKING_CAPABILITY = "workshop-v3"


def validate_workflow(spec: workflow_pb2.WorkflowSpec, catalog: Catalog) -> Validation:
    """Every problem of `spec` against `catalog`, in document order."""
    found = Found()
    check_size(spec.graph, found)
    check_time_zone(spec.time_zone, found)
    check_schedule(spec, found)
    check_steps(spec.graph.steps, catalog, found)
    check_shape(spec.graph.steps, found)
    graph = build_graph(spec.graph, found)
    check_cycles(graph, found)
    reachable = check_reachability(graph, found)
    check_dangling(graph, found)
    check_output_reached(graph, reachable, found)
    check_rule_classes(graph, catalog, found)
    problems = sorted(found.problems, key=lambda problem: document_position(problem.path))
    return Validation(problems=tuple(problems), required_capabilities=required_capabilities(spec))


def required_capabilities(spec: workflow_pb2.WorkflowSpec) -> tuple[str, ...]:
    """("workshop-v3",) when the graph keeps frames by change or routes on motion."""
    return (TRACKING_CAPABILITY,) if _needs_tracking(spec) else ()


def dropped_allowed(spec: workflow_pb2.WorkflowSpec) -> bool:
    """True when DROPPED is an allowed outcome: a do-nothing step or keep-by-change."""
    return any(
        step.HasField("do_nothing")
        or (step.HasField("sample") and step.sample.HasField("keep_by_change"))
        for step in spec.graph.steps
    )


def _needs_tracking(spec: workflow_pb2.WorkflowSpec) -> bool:
    return any(
        (step.HasField("sample") and step.sample.HasField("keep_by_change"))
        or (step.HasField("rule") and step.rule.HasField("motion"))
        for step in spec.graph.steps
    )
