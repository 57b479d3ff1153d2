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
"""

from __future__ import annotations

import datetime
import math
import re
import zoneinfo
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from workshop.v1 import common_pb2, workflow_pb2

TRACKING_CAPABILITY = "workshop-v3"
MAX_STEPS = 64
MAX_EDGES = 256
MAX_STEP_ID_LENGTH = 64
MIN_INTERVAL_SECONDS = 0.1
MAX_INTERVAL_SECONDS = 3600
# How far from a whole number of milliseconds `interval * 1000` may be: float noise
# (0.1 * 1000 is 100.00000000000001), never a real fraction of a millisecond.
MILLISECOND_TOLERANCE = 1e-9
SECONDS_PER_DAY = 86_400

_K = workflow_pb2.ValidationProblemKind
_STEP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# Files that zoneinfo loads from the host's zone directory but that are not IANA zone names.
_HOST_ZONE_FILES = frozenset({"localtime", "posixrules"})
_HOST_ZONE_PREFIXES = ("posix/", "right/")
_SHOWN_VALUE_LENGTH = 80

_FLOW = frozenset({"model", "rule", "output", "do_nothing"})
_ALLOWED_TARGETS: Mapping[str, frozenset[str]] = {
    "input": frozenset({"sample"}),
    "sample": _FLOW,
    "model": _FLOW,
    "rule": _FLOW,
    "output": frozenset(),
    "do_nothing": frozenset(),
}
_TERMINAL_KINDS = frozenset({"output", "do_nothing"})
_RULE_BRANCHES = (workflow_pb2.EDGE_BRANCH_MATCH, workflow_pb2.EDGE_BRANCH_NO_MATCH)
_KIND_LABELS: Mapping[str | None, str] = {
    "input": "Input step",
    "sample": "Sample step",
    "model": "Model step",
    "rule": "Rule",
    "output": "Output step",
    "do_nothing": "Do-nothing step",
    None: "Step",
}
_BRANCH_LABELS: Mapping[int, str] = {
    workflow_pb2.EDGE_BRANCH_UNSPECIFIED: "no branch",
    workflow_pb2.EDGE_BRANCH_NEXT: "NEXT",
    workflow_pb2.EDGE_BRANCH_MATCH: "MATCH",
    workflow_pb2.EDGE_BRANCH_NO_MATCH: "NO_MATCH",
}


@dataclass(frozen=True)
class Catalog:
    """What exists, loaded by the caller from the database."""

    camera_ids: frozenset[str]
    bucket_ids: frozenset[str]
    # model name -> version -> class names (in class-index order)
    models: Mapping[str, Mapping[int, tuple[str, ...]]]


@dataclass(frozen=True)
class Problem:
    """One problem: `kind` is a `workflow_pb2.ValidationProblemKind` value."""

    kind: int
    path: str
    step_id: str
    message: str

    def to_proto(self) -> workflow_pb2.ValidationProblem:
        return workflow_pb2.ValidationProblem(
            kind=workflow_pb2.ValidationProblemKind.ValueType(self.kind),
            path=self.path,
            step_id=self.step_id,
            message=self.message,
        )


@dataclass(frozen=True)
class Validation:
    problems: tuple[Problem, ...]
    required_capabilities: tuple[str, ...]

    @property
    def valid(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """Every problem's message, one per line (for the error message a person reads)."""
        return "\n".join(problem.message for problem in self.problems)


def validate_workflow(spec: workflow_pb2.WorkflowSpec, catalog: Catalog) -> Validation:
    """Every problem of `spec` against `catalog`, in document order."""
    found = _Found()
    _check_size(spec.graph, found)
    _check_time_zone(spec.time_zone, found)
    _check_schedule(spec, found)
    _check_steps(spec.graph.steps, catalog, found)
    _check_shape(spec.graph.steps, found)
    graph = _build_graph(spec.graph, found)
    _check_cycles(graph, found)
    reachable = _check_reachability(graph, found)
    _check_dangling(graph, found)
    _check_output_reached(graph, reachable, found)
    _check_rule_classes(graph, catalog, found)
    problems = sorted(found.problems, key=lambda problem: _document_position(problem.path))
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


# --- collecting and ordering ---------------------------------------------------------------


@dataclass
class _Found:
    problems: list[Problem] = field(default_factory=list)

    def add(self, kind: int, path: str, message: str, step_id: str = "") -> None:
        self.problems.append(Problem(kind=kind, path=path, step_id=step_id, message=message))


_TOP_LEVEL_ORDER = {"name": 0, "time_zone": 1, "graph": 2, "schedule": 3}
_GRAPH_ORDER = {"steps": 0, "edges": 1}
_PATH_HEAD = re.compile(r"(?P<top>\w+)(?:\.(?P<list>steps|edges)(?:\[(?P<index>\d+)\])?)?")


def _document_position(path: str) -> tuple[int, int, int]:
    """Where a path sits in the document; a bare list ("graph.steps") comes before its items."""
    head = _PATH_HEAD.match(path)
    if head is None:  # pragma: no cover - every path this module builds matches
        return (len(_TOP_LEVEL_ORDER), 0, 0)
    top = _TOP_LEVEL_ORDER.get(head["top"], len(_TOP_LEVEL_ORDER))
    within = _GRAPH_ORDER.get(head["list"] or "", -1)
    index = int(head["index"]) if head["index"] is not None else -1
    return (top, within, index)


# --- messages --------------------------------------------------------------------------------


def _shown(value: str) -> str:
    """A user value quoted for a message, shortened so one bad value cannot flood the list."""
    if len(value) > _SHOWN_VALUE_LENGTH:
        value = value[: _SHOWN_VALUE_LENGTH - 1] + "…"
    return f"'{value}'"


def _step_name(step: workflow_pb2.Step, index: int) -> str:
    label = _KIND_LABELS[step.WhichOneof("kind")]
    if step.step_id:
        return f"{label} {_shown(step.step_id)}"
    return f"{label} at graph.steps[{index}]"


def _steps_path(index: int) -> str:
    return f"graph.steps[{index}]"


def _edges_path(index: int) -> str:
    return f"graph.edges[{index}]"


def _time_text(value: common_pb2.TimeOfDay) -> str:
    return f"{value.hours:02d}:{value.minutes:02d}:{value.seconds:02d}"


def _listed(names: Sequence[str]) -> str:
    shown = [_shown(name) for name in names]
    if len(shown) <= 1:
        return "".join(shown)
    return ", ".join(shown[:-1]) + " and " + shown[-1]


# --- whole-document checks -------------------------------------------------------------------


def _check_size(graph: workflow_pb2.WorkflowGraph, found: _Found) -> None:
    if len(graph.steps) > MAX_STEPS:
        found.add(
            _K.VALIDATION_PROBLEM_KIND_TOO_LARGE,
            "graph.steps",
            f"The graph has {len(graph.steps)} steps; at most {MAX_STEPS} are allowed.",
        )
    if len(graph.edges) > MAX_EDGES:
        found.add(
            _K.VALIDATION_PROBLEM_KIND_TOO_LARGE,
            "graph.edges",
            f"The graph has {len(graph.edges)} edges; at most {MAX_EDGES} are allowed.",
        )


def is_time_zone(name: str) -> bool:
    """True when `name` is empty (UTC) or an IANA zone name that zoneinfo can load."""
    if not name:
        return True
    if name in _HOST_ZONE_FILES or name.startswith(_HOST_ZONE_PREFIXES):
        return False
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


def _check_time_zone(name: str, found: _Found) -> None:
    if not is_time_zone(name):
        found.add(
            _K.VALIDATION_PROBLEM_KIND_BAD_SCHEDULE,
            "time_zone",
            f"Time zone {_shown(name)} is not an IANA time zone name such as 'Europe/Berlin'.",
        )


def _check_schedule(spec: workflow_pb2.WorkflowSpec, found: _Found) -> None:
    if not spec.HasField("schedule"):
        return
    schedule = spec.schedule
    if not schedule.HasField("time_of_day"):
        found.add(
            _K.VALIDATION_PROBLEM_KIND_BAD_SCHEDULE,
            "schedule.time_of_day",
            "The schedule has no time of day; set when the daily run is created.",
        )
    elif not is_time_of_day(schedule.time_of_day):
        found.add(
            _K.VALIDATION_PROBLEM_KIND_BAD_SCHEDULE,
            "schedule.time_of_day",
            f"The schedule's time of day {_time_text(schedule.time_of_day)} is not a valid time "
            "(hours 0-23, minutes and seconds 0-59).",
        )


def is_time_of_day(value: common_pb2.TimeOfDay) -> bool:
    return 0 <= value.hours <= 23 and 0 <= value.minutes <= 59 and 0 <= value.seconds <= 59


def _seconds_of_day(value: common_pb2.TimeOfDay) -> int:
    return value.hours * 3600 + value.minutes * 60 + value.seconds


# --- per-step checks -------------------------------------------------------------------------


def _check_steps(steps: Sequence[workflow_pb2.Step], catalog: Catalog, found: _Found) -> None:
    window_seconds = _first_window_seconds(steps)
    first_index_of: dict[str, int] = {}
    for index, step in enumerate(steps):
        _check_step_id(step, index, first_index_of, found)
        kind = step.WhichOneof("kind")
        if kind is None:
            found.add(
                _K.VALIDATION_PROBLEM_KIND_MISSING_STEP_KIND,
                _steps_path(index),
                f"{_step_name(step, index)} has no kind; make it an input, sample, model, rule, "
                "output or do-nothing step.",
                step.step_id,
            )
        elif kind == "input":
            _check_input(step, index, catalog, found)
        elif kind == "sample":
            _check_sample(step, index, window_seconds, found)
        elif kind == "model":
            _check_model(step, index, catalog, found)
        elif kind == "rule":
            _check_rule_thresholds(step, index, found)
        elif kind == "output":
            _check_output(step, index, catalog, found)


def _check_step_id(
    step: workflow_pb2.Step, index: int, first_index_of: dict[str, int], found: _Found
) -> None:
    path = f"{_steps_path(index)}.step_id"
    step_id = step.step_id
    if not step_id:
        found.add(_K.VALIDATION_PROBLEM_KIND_BAD_STEP_ID, path, f"Step {index} has no id.")
        return
    if len(step_id) > MAX_STEP_ID_LENGTH or _STEP_ID.fullmatch(step_id) is None:
        found.add(
            _K.VALIDATION_PROBLEM_KIND_BAD_STEP_ID,
            path,
            f"Step id {_shown(step_id)} is malformed: use 1 to {MAX_STEP_ID_LENGTH} letters, "
            "digits, '.', '_' or '-', starting with a letter or digit.",
            step_id,
        )
    first = first_index_of.setdefault(step_id, index)
    if first != index:
        found.add(
            _K.VALIDATION_PROBLEM_KIND_BAD_STEP_ID,
            path,
            f"Step id {_shown(step_id)} is already used by graph.steps[{first}]; "
            "give every step its own id.",
            step_id,
        )


def _check_input(step: workflow_pb2.Step, index: int, catalog: Catalog, found: _Found) -> None:
    _check_cameras(step, index, catalog, found)
    _check_day(step, index, found)
    _check_window(step, index, found)


def _check_cameras(step: workflow_pb2.Step, index: int, catalog: Catalog, found: _Found) -> None:
    path = f"{_steps_path(index)}.input.camera_ids"
    name = _step_name(step, index)
    if not step.input.camera_ids:
        found.add(
            _K.VALIDATION_PROBLEM_KIND_UNKNOWN_CAMERA,
            path,
            f"{name} names no camera; choose at least one.",
            step.step_id,
        )
    for position, camera_id in enumerate(step.input.camera_ids):
        if camera_id not in catalog.camera_ids:
            found.add(
                _K.VALIDATION_PROBLEM_KIND_UNKNOWN_CAMERA,
                f"{path}[{position}]",
                f"{name} reads camera {_shown(camera_id)}, which is not registered.",
                step.step_id,
            )


def _check_day(step: workflow_pb2.Step, index: int, found: _Found) -> None:
    problem = _day_problem(step.input)
    if problem is not None:
        field_name, text = problem
        found.add(
            _K.VALIDATION_PROBLEM_KIND_BAD_DATE,
            f"{_steps_path(index)}.input.{field_name}",
            f"{_step_name(step, index)} {text}",
            step.step_id,
        )


def _day_problem(step: workflow_pb2.InputStep) -> tuple[str, str] | None:
    """(field, sentence ending) describing what is wrong with the day, or None."""
    if step.day == workflow_pb2.INPUT_DAY_UNSPECIFIED:
        return "day", "has no day; choose run-day, previous-day or a date."
    if step.day not in (
        workflow_pb2.INPUT_DAY_RUN_DAY,
        workflow_pb2.INPUT_DAY_PREVIOUS_DAY,
        workflow_pb2.INPUT_DAY_DATE,
    ):
        return "day", f"has an unknown day kind {step.day}."
    has_date = step.HasField("date")
    if step.day != workflow_pb2.INPUT_DAY_DATE:
        if has_date:
            return "date", "sets a date but reads run-day or previous-day; remove the date."
        return None
    if not has_date:
        return "date", "reads a fixed date but sets none."
    if calendar_date(step.date) is None:
        shown = f"{step.date.year:04d}-{step.date.month:02d}-{step.date.day:02d}"
        return "date", f"reads date {shown}, which is not a valid calendar date."
    return None


def calendar_date(value: common_pb2.CalendarDate) -> datetime.date | None:
    """The date a CalendarDate names, or None when it names no real date."""
    try:
        return datetime.date(value.year, value.month, value.day)
    except ValueError:
        return None


def _check_window(step: workflow_pb2.Step, index: int, found: _Found) -> None:
    problem = _window_problem(step.input)
    if problem is not None:
        field_name, text = problem
        found.add(
            _K.VALIDATION_PROBLEM_KIND_BAD_WINDOW,
            f"{_steps_path(index)}.input.{field_name}",
            f"{_step_name(step, index)} {text}",
            step.step_id,
        )


def _window_problem(step: workflow_pb2.InputStep) -> tuple[str, str] | None:
    ends = (
        ("window_start", "start", step.HasField("window_start"), step.window_start),
        ("window_end", "end", step.HasField("window_end"), step.window_end),
    )
    for field_name, label, present, value in ends:
        if not present:
            return field_name, f"has no window {label}."
        if not is_time_of_day(value):
            return field_name, (
                f"has window {label} {_time_text(value)}, which is not a valid time of day "
                "(hours 0-23, minutes and seconds 0-59)."
            )
    if window_seconds(step.window_start, step.window_end) <= 0:
        return "window_end", (
            f"has window end {_time_text(step.window_end)}, which is not after its start "
            f"{_time_text(step.window_start)} (use 00:00:00 for the end of the day)."
        )
    return None


def window_seconds(start: common_pb2.TimeOfDay, end: common_pb2.TimeOfDay) -> int:
    """Wall-clock length of a daily window; an end of 00:00:00 is the end of the day."""
    end_seconds = _seconds_of_day(end) or SECONDS_PER_DAY
    return end_seconds - _seconds_of_day(start)


def _first_window_seconds(steps: Sequence[workflow_pb2.Step]) -> int | None:
    """Length of the first input step's window when it is valid (bounds the interval)."""
    for step in steps:
        if step.HasField("input"):
            if _window_problem(step.input) is None:
                return window_seconds(step.input.window_start, step.input.window_end)
            return None
    return None


def _check_sample(
    step: workflow_pb2.Step, index: int, window_length: int | None, found: _Found
) -> None:
    name = _step_name(step, index)
    path = f"{_steps_path(index)}.sample"
    problem = _interval_problem(step.sample.interval_seconds, window_length)
    if problem is not None:
        found.add(
            _K.VALIDATION_PROBLEM_KIND_BAD_INTERVAL,
            f"{path}.interval_seconds",
            f"{name} samples every {problem}",
            step.step_id,
        )
    if step.sample.HasField("keep_by_change"):
        _check_fraction(
            step.sample.keep_by_change.min_displacement,
            f"{path}.keep_by_change.min_displacement",
            f"{name} keeps frames by change with minimum displacement",
            step.step_id,
            found,
        )


def _check_rule_thresholds(step: workflow_pb2.Step, index: int, found: _Found) -> None:
    path = f"{_steps_path(index)}.rule"
    name = _step_name(step, index)
    _check_fraction(
        step.rule.min_score, f"{path}.min_score", f"{name} has minimum score", step.step_id, found
    )
    if step.rule.HasField("motion"):
        _check_fraction(
            step.rule.motion.min_displacement,
            f"{path}.motion.min_displacement",
            f"{name} routes on motion with minimum displacement",
            step.step_id,
            found,
        )


def _interval_problem(interval: float, window_length: int | None) -> str | None:
    """What is wrong with a sampling interval (the end of a sentence), or None."""
    shown = f"{interval:.15g}"
    limits = f"use {MIN_INTERVAL_SECONDS:g} to {MAX_INTERVAL_SECONDS} seconds"
    if not math.isfinite(interval):
        return f"{shown} seconds, which is not a number of seconds; {limits}."
    if not MIN_INTERVAL_SECONDS <= interval <= MAX_INTERVAL_SECONDS:
        return f"{shown} seconds; {limits}."
    millis = interval * 1000
    if abs(millis - round(millis)) > MILLISECOND_TOLERANCE:
        return (
            f"{shown} seconds, which is not a whole number of milliseconds; use at most "
            "3 decimal places (e.g. 0.5 or 0.25)."
        )
    if window_length is not None and interval > window_length:
        return (
            f"{shown} seconds, longer than the {window_length}-second window; shorten the "
            "interval or widen the window."
        )
    return None


def _check_fraction(value: float, path: str, sentence: str, step_id: str, found: _Found) -> None:
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        found.add(
            _K.VALIDATION_PROBLEM_KIND_BAD_THRESHOLD,
            path,
            f"{sentence} {value:g}; use a value from 0 to 1.",
            step_id,
        )


def _check_model(step: workflow_pb2.Step, index: int, catalog: Catalog, found: _Found) -> None:
    path = f"{_steps_path(index)}.model"
    name = _step_name(step, index)
    model = step.model
    versions = catalog.models.get(model.model_name)
    if versions is None:
        found.add(
            _K.VALIDATION_PROBLEM_KIND_UNKNOWN_MODEL,
            f"{path}.model_name",
            f"{name} uses model {_shown(model.model_name)}, which is not published.",
            step.step_id,
        )
    elif model.HasField("version"):
        if model.version not in versions:
            published = ", ".join(str(version) for version in sorted(versions)) or "none"
            found.add(
                _K.VALIDATION_PROBLEM_KIND_UNKNOWN_MODEL,
                f"{path}.version",
                f"{name} pins model {_shown(model.model_name)} v{model.version}, which is not "
                f"published (published versions: {published}).",
                step.step_id,
            )
    elif not versions:
        found.add(
            _K.VALIDATION_PROBLEM_KIND_UNKNOWN_MODEL,
            f"{path}.model_name",
            f"{name} uses the latest version of model {_shown(model.model_name)}, "
            "which has no published version.",
            step.step_id,
        )


def _resolved_model(
    model: workflow_pb2.ModelStep, catalog: Catalog
) -> tuple[int, tuple[str, ...]] | None:
    """(version, classes) the step runs: its pinned version or the latest; None if unpublished."""
    versions = catalog.models.get(model.model_name)
    if not versions:
        return None
    version = model.version if model.HasField("version") else max(versions)
    classes = versions.get(version)
    return None if classes is None else (version, classes)


def _check_output(step: workflow_pb2.Step, index: int, catalog: Catalog, found: _Found) -> None:
    bucket_id = step.output.bucket_id
    if bucket_id in catalog.bucket_ids:
        return
    name = _step_name(step, index)
    message = (
        f"{name} names no bucket; choose one."
        if not bucket_id
        else f"{name} saves into bucket {_shown(bucket_id)}, which does not exist."
    )
    found.add(
        _K.VALIDATION_PROBLEM_KIND_UNKNOWN_BUCKET,
        f"{_steps_path(index)}.output.bucket_id",
        message,
        step.step_id,
    )


def _check_shape(steps: Sequence[workflow_pb2.Step], found: _Found) -> None:
    for kind, label in (("input", "input"), ("sample", "sample")):
        indexes = [index for index, step in enumerate(steps) if step.WhichOneof("kind") == kind]
        if not indexes:
            found.add(
                _K.VALIDATION_PROBLEM_KIND_BAD_SHAPE,
                "graph.steps",
                f"The graph has no {label} step; it needs exactly one.",
            )
        for extra in indexes[1:]:
            found.add(
                _K.VALIDATION_PROBLEM_KIND_BAD_SHAPE,
                _steps_path(extra),
                f"{_step_name(steps[extra], extra)} is a second {label} step; the graph needs "
                f"exactly one (the first is graph.steps[{indexes[0]}]).",
                steps[extra].step_id,
            )


# --- the graph ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Link:
    """An edge whose endpoints are both addressable steps."""

    edge_index: int
    source: int
    target: int
    branch: int


@dataclass
class _Graph:
    steps: Sequence[workflow_pb2.Step]
    kinds: Sequence[str | None]
    addressable: list[int]  # step indexes edges can name, in document order
    links: list[_Link]
    # Links whose step kinds may follow each other. Only these can close a reportable cycle:
    # an edge back into the input or sample step is already a BAD_CONNECTION.
    flow_links: list[_Link]
    successors: dict[int, list[int]]
    predecessors: dict[int, list[int]]

    def name(self, index: int) -> str:
        return _step_name(self.steps[index], index)


def _build_graph(graph: workflow_pb2.WorkflowGraph, found: _Found) -> _Graph:
    steps = graph.steps
    index_of: dict[str, int] = {}
    for index, step in enumerate(steps):
        if step.step_id:
            index_of.setdefault(step.step_id, index)
    kinds = [step.WhichOneof("kind") for step in steps]
    links: list[_Link] = []
    flow_links: list[_Link] = []
    seen: dict[tuple[int, int, int], int] = {}
    for edge_index, edge in enumerate(graph.edges):
        link = _resolve_edge(edge, edge_index, index_of, found)
        if link is None:
            continue
        key = (link.source, link.target, link.branch)
        if key in seen:
            found.add(
                _K.VALIDATION_PROBLEM_KIND_BAD_CONNECTION,
                _edges_path(edge_index),
                f"Edge from {_shown(edge.from_step_id)} to {_shown(edge.to_step_id)} repeats "
                f"graph.edges[{seen[key]}]; remove one of them.",
            )
            continue  # the first copy is judged (and carries frames) already
        seen[key] = edge_index
        if _check_connection(link, steps, kinds, found):
            flow_links.append(link)
        links.append(link)
    addressable = sorted(index_of.values())
    successors: dict[int, list[int]] = {index: [] for index in addressable}
    predecessors: dict[int, list[int]] = {index: [] for index in addressable}
    for link in links:
        successors[link.source].append(link.target)
        predecessors[link.target].append(link.source)
    return _Graph(steps, kinds, addressable, links, flow_links, successors, predecessors)


def _resolve_edge(
    edge: workflow_pb2.Edge, edge_index: int, index_of: Mapping[str, int], found: _Found
) -> _Link | None:
    source = index_of.get(edge.from_step_id)
    target = index_of.get(edge.to_step_id)
    for end, step_id, resolved in (
        ("from_step_id", edge.from_step_id, source),
        ("to_step_id", edge.to_step_id, target),
    ):
        if resolved is None:
            what = "starts" if end == "from_step_id" else "ends"
            text = (
                f"Edge {edge_index} {what} at no step; name a step id."
                if not step_id
                else f"Edge {edge_index} {what} at {_shown(step_id)}, which is not in the graph."
            )
            found.add(
                _K.VALIDATION_PROBLEM_KIND_UNKNOWN_STEP, f"{_edges_path(edge_index)}.{end}", text
            )
    if source is None or target is None:
        return None
    return _Link(edge_index, source, target, edge.branch)


def _check_connection(
    link: _Link, steps: Sequence[workflow_pb2.Step], kinds: Sequence[str | None], found: _Found
) -> bool:
    """Report what is wrong with one edge; True when its step kinds may follow each other."""
    source_kind, target_kind = kinds[link.source], kinds[link.target]
    path = _edges_path(link.edge_index)
    source, target = steps[link.source], steps[link.target]
    source_name = _step_name(source, link.source)
    target_name = _step_name(target, link.target)
    if source_kind in _TERMINAL_KINDS:
        found.add(
            _K.VALIDATION_PROBLEM_KIND_BAD_CONNECTION,
            f"{path}.from_step_id",
            f"{source_name} ends the flow of frames; no edge may leave it (edge to {target_name}).",
            source.step_id,
        )
        return False
    if source_kind is not None:
        _check_branch(link, source_kind, source, source_name, found)
    if source_kind is None or target_kind is None:
        return True
    if target_kind not in _ALLOWED_TARGETS[source_kind]:
        found.add(
            _K.VALIDATION_PROBLEM_KIND_BAD_CONNECTION,
            f"{path}.to_step_id",
            f"{target_name} cannot follow {source_name}; {_allowed_after(source_kind)}",
            target.step_id,
        )
        return False
    return True


def _allowed_after(source_kind: str) -> str:
    if source_kind == "input":
        return "the input step is followed only by the sample step."
    return "it may be followed by model, rule, output or do-nothing steps."


def _check_branch(
    link: _Link, source_kind: str, source: workflow_pb2.Step, source_name: str, found: _Found
) -> None:
    if source_kind == "rule":
        if link.branch in _RULE_BRANCHES:
            return
        expected = "MATCH or NO_MATCH"
    else:
        if link.branch == workflow_pb2.EDGE_BRANCH_NEXT:
            return
        expected = "NEXT"
    found.add(
        _K.VALIDATION_PROBLEM_KIND_BAD_CONNECTION,
        f"{_edges_path(link.edge_index)}.branch",
        f"Edge {link.edge_index} leaves {source_name} on "
        f"{_BRANCH_LABELS.get(link.branch, str(link.branch))}; it must leave on {expected}.",
        source.step_id,
    )


def _check_cycles(graph: _Graph, found: _Found) -> None:
    flow: dict[int, list[int]] = {index: [] for index in graph.addressable}
    for link in graph.flow_links:
        flow[link.source].append(link.target)
    for component in _strongly_connected(graph.addressable, flow):
        members = set(component)
        closing = [
            link for link in graph.flow_links if link.source in members and link.target in members
        ]
        if not closing:  # a single step without an edge to itself
            continue
        first_edge = min(link.edge_index for link in closing)
        ordered = sorted(members)
        if len(ordered) == 1:
            text = f"{graph.name(ordered[0])} has an edge to itself, which makes a cycle."
        else:
            ids = [graph.steps[index].step_id for index in ordered]
            text = f"Steps {_listed(ids)} form a cycle; frames must flow one way."
        found.add(_K.VALIDATION_PROBLEM_KIND_CYCLE, _edges_path(first_edge), text)


def _strongly_connected(
    nodes: Iterable[int], successors: Mapping[int, Sequence[int]]
) -> list[list[int]]:
    """Tarjan's components, iteratively (a long chain must not hit the recursion limit)."""
    order: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    components: list[list[int]] = []

    def visit(node: int) -> Iterator[int]:
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        return iter(successors[node])

    for root in nodes:
        if root in order:
            continue
        work = [(root, visit(root))]
        while work:
            node, pending = work[-1]
            descended = False
            for successor in pending:
                if successor not in order:
                    work.append((successor, visit(successor)))
                    descended = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], order[successor])
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == order[node]:
                components.append(_pop_component(stack, on_stack, node))
    return components


def _pop_component(stack: list[int], on_stack: set[int], root: int) -> list[int]:
    component: list[int] = []
    while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == root:
            return component


def _walk(starts: Iterable[int], neighbours: Callable[[int], Iterable[int]]) -> set[int]:
    seen = set(starts)
    frontier = list(seen)
    while frontier:
        for neighbour in neighbours(frontier.pop()):
            if neighbour not in seen:
                seen.add(neighbour)
                frontier.append(neighbour)
    return seen


def _check_reachability(graph: _Graph, found: _Found) -> set[int] | None:
    """Steps reached from an input step; None when the graph has no (addressable) input step."""
    inputs = [index for index in graph.addressable if graph.kinds[index] == "input"]
    if not inputs:
        return None
    reachable = _walk(inputs, graph.successors.__getitem__)
    for index in graph.addressable:
        if index not in reachable and graph.kinds[index] is not None:
            found.add(
                _K.VALIDATION_PROBLEM_KIND_UNREACHABLE_STEP,
                _steps_path(index),
                f"{graph.name(index)} cannot be reached from the input step; "
                "connect it or remove it.",
                graph.steps[index].step_id,
            )
    return reachable


def _check_dangling(graph: _Graph, found: _Found) -> None:
    branches_leaving: dict[int, set[int]] = {index: set() for index in graph.addressable}
    for link in graph.links:
        branches_leaving[link.source].add(link.branch)
    for index in graph.addressable:
        kind = graph.kinds[index]
        if kind is None or kind in _TERMINAL_KINDS:
            continue
        leaving = branches_leaving[index]
        if kind == "rule":
            _check_rule_branches(graph, index, leaving, found)
        elif not leaving:
            found.add(
                _K.VALIDATION_PROBLEM_KIND_DANGLING_STEP,
                _steps_path(index),
                f"{graph.name(index)} has no outgoing edge; connect it to the next step.",
                graph.steps[index].step_id,
            )


def _check_rule_branches(graph: _Graph, index: int, leaving: set[int], found: _Found) -> None:
    for branch in _RULE_BRANCHES:
        if branch not in leaving:
            label = _BRANCH_LABELS[branch]
            found.add(
                _K.VALIDATION_PROBLEM_KIND_DANGLING_STEP,
                _steps_path(index),
                f"{graph.name(index)} has no edge on its {label} branch; connect it "
                "(use a do-nothing step to drop those frames).",
                graph.steps[index].step_id,
            )


def _check_output_reached(graph: _Graph, reachable: set[int] | None, found: _Found) -> None:
    outputs = [index for index, kind in enumerate(graph.kinds) if kind == "output"]
    if not outputs:
        found.add(
            _K.VALIDATION_PROBLEM_KIND_NO_OUTPUT,
            "graph.steps",
            "The graph has no output step; add one that saves frames into a bucket.",
        )
    elif reachable is not None and reachable.isdisjoint(outputs):
        found.add(
            _K.VALIDATION_PROBLEM_KIND_NO_OUTPUT,
            "graph.steps",
            "No output step can be reached from the input step, so no frame would be saved.",
        )


def _check_rule_classes(graph: _Graph, catalog: Catalog, found: _Found) -> None:
    for index in graph.addressable:
        if graph.kinds[index] != "rule" or not graph.steps[index].rule.class_names:
            continue
        upstream = _walk(graph.predecessors[index], graph.predecessors.__getitem__)
        models = [other for other in sorted(upstream) if graph.kinds[other] == "model"]
        resolved = [_resolved_model(graph.steps[other].model, catalog) for other in models]
        known = [entry for entry in resolved if entry is not None]
        if len(known) < len(resolved):
            continue  # an unpublished model upstream: its UNKNOWN_MODEL problem explains it
        labels = [
            f"model {_shown(graph.steps[other].model.model_name)} v{entry[0]}"
            for other, entry in zip(models, known, strict=True)
        ]
        emitted = {name for _, classes in known for name in classes}
        _report_unknown_classes(graph, index, emitted, labels, found)


def _report_unknown_classes(
    graph: _Graph, index: int, emitted: set[str], model_labels: Sequence[str], found: _Found
) -> None:
    step = graph.steps[index]
    for position, class_name in enumerate(step.rule.class_names):
        if class_name in emitted:
            continue
        found.add(
            _K.VALIDATION_PROBLEM_KIND_UNKNOWN_CLASS,
            f"{_steps_path(index)}.rule.class_names[{position}]",
            f"{graph.name(index)} names class {_shown(class_name)}, {_lacking(model_labels)}",
            step.step_id,
        )


def _lacking(model_labels: Sequence[str]) -> str:
    if not model_labels:
        return "but no model step comes before it to detect classes."
    if len(model_labels) == 1:
        return f"which {model_labels[0]} lacks."
    return f"which none of the models before it has ({', '.join(model_labels)})."
