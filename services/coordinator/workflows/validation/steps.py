"""Checks of each step on its own: its id and kind, an input's day and window, a
sample's interval, a rule's thresholds; and the graph's shape (one input, one sample).
What a step names in the catalog (cameras, models, buckets) is `references`'."""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Sequence

from services.coordinator.workflows.validation.problems import (
    Found,
    K,
    quoted,
    step_name,
    steps_path,
    time_text,
)
from services.coordinator.workflows.validation.references import (
    Catalog,
    check_cameras,
    check_model,
    check_output,
)
from workshop.v1 import common_pb2, workflow_pb2

MAX_STEP_ID_LENGTH = 64
MIN_INTERVAL_SECONDS = 0.1
MAX_INTERVAL_SECONDS = 3600
# How far from a whole number of milliseconds `interval * 1000` may be: float noise
# (0.1 * 1000 is 100.00000000000001), never a real fraction of a millisecond.
MILLISECOND_TOLERANCE = 1e-9
SECONDS_PER_DAY = 86_400
_STEP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_steps(steps: Sequence[workflow_pb2.Step], catalog: Catalog, found: Found) -> None:
    window_seconds = _first_window_seconds(steps)
    first_index_of: dict[str, int] = {}
    for index, step in enumerate(steps):
        _check_step_id(step, index, first_index_of, found)
        kind = step.WhichOneof("kind")
        if kind is None:
            found.add(
                K.VALIDATION_PROBLEM_KIND_MISSING_STEP_KIND,
                steps_path(index),
                f"{step_name(step, index)} has no kind; make it an input, sample, model, rule, "
                "output or do-nothing step.",
                step.step_id,
            )
        elif kind == "input":
            _check_input(step, index, catalog, found)
        elif kind == "sample":
            _check_sample(step, index, window_seconds, found)
        elif kind == "model":
            check_model(step, index, catalog, found)
        elif kind == "rule":
            _check_rule_thresholds(step, index, found)
        elif kind == "output":
            check_output(step, index, catalog, found)


def _check_step_id(
    step: workflow_pb2.Step, index: int, first_index_of: dict[str, int], found: Found
) -> None:
    path = f"{steps_path(index)}.step_id"
    step_id = step.step_id
    if not step_id:
        found.add(K.VALIDATION_PROBLEM_KIND_BAD_STEP_ID, path, f"Step {index} has no id.")
        return
    if len(step_id) > MAX_STEP_ID_LENGTH or _STEP_ID.fullmatch(step_id) is None:
        found.add(
            K.VALIDATION_PROBLEM_KIND_BAD_STEP_ID,
            path,
            f"Step id {quoted(step_id)} is malformed: use 1 to {MAX_STEP_ID_LENGTH} letters, "
            "digits, '.', '_' or '-', starting with a letter or digit.",
            step_id,
        )
    first = first_index_of.setdefault(step_id, index)
    if first != index:
        found.add(
            K.VALIDATION_PROBLEM_KIND_BAD_STEP_ID,
            path,
            f"Step id {quoted(step_id)} is already used by graph.steps[{first}]; "
            "give every step its own id.",
            step_id,
        )


def _check_input(step: workflow_pb2.Step, index: int, catalog: Catalog, found: Found) -> None:
    check_cameras(step, index, catalog, found)
    _check_day(step, index, found)
    _check_window(step, index, found)


def _check_day(step: workflow_pb2.Step, index: int, found: Found) -> None:
    problem = _day_problem(step.input)
    if problem is not None:
        field_name, text = problem
        found.add(
            K.VALIDATION_PROBLEM_KIND_BAD_DATE,
            f"{steps_path(index)}.input.{field_name}",
            f"{step_name(step, index)} {text}",
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


def _check_window(step: workflow_pb2.Step, index: int, found: Found) -> None:
    problem = _window_problem(step.input)
    if problem is not None:
        field_name, text = problem
        found.add(
            K.VALIDATION_PROBLEM_KIND_BAD_WINDOW,
            f"{steps_path(index)}.input.{field_name}",
            f"{step_name(step, index)} {text}",
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
                f"has window {label} {time_text(value)}, which is not a valid time of day "
                "(hours 0-23, minutes and seconds 0-59)."
            )
    if window_seconds(step.window_start, step.window_end) <= 0:
        return "window_end", (
            f"has window end {time_text(step.window_end)}, which is not after its start "
            f"{time_text(step.window_start)} (use 00:00:00 for the end of the day)."
        )
    return None


def window_seconds(start: common_pb2.TimeOfDay, end: common_pb2.TimeOfDay) -> int:
    """Wall-clock length of a daily window; an end of 00:00:00 is the end of the day."""
    end_seconds = seconds_of_day(end) or SECONDS_PER_DAY
    return end_seconds - seconds_of_day(start)


def _first_window_seconds(steps: Sequence[workflow_pb2.Step]) -> int | None:
    """Length of the first input step's window when it is valid (bounds the interval)."""
    for step in steps:
        if step.HasField("input"):
            if _window_problem(step.input) is None:
                return window_seconds(step.input.window_start, step.input.window_end)
            return None
    return None


def _check_sample(
    step: workflow_pb2.Step, index: int, window_length: int | None, found: Found
) -> None:
    name = step_name(step, index)
    path = f"{steps_path(index)}.sample"
    problem = _interval_problem(step.sample.interval_seconds, window_length)
    if problem is not None:
        found.add(
            K.VALIDATION_PROBLEM_KIND_BAD_INTERVAL,
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


def _check_rule_thresholds(step: workflow_pb2.Step, index: int, found: Found) -> None:
    path = f"{steps_path(index)}.rule"
    name = step_name(step, index)
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


def _check_fraction(value: float, path: str, sentence: str, step_id: str, found: Found) -> None:
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        found.add(
            K.VALIDATION_PROBLEM_KIND_BAD_THRESHOLD,
            path,
            f"{sentence} {value:g}; use a value from 0 to 1.",
            step_id,
        )


def is_time_of_day(value: common_pb2.TimeOfDay) -> bool:
    return 0 <= value.hours <= 23 and 0 <= value.minutes <= 59 and 0 <= value.seconds <= 59


def seconds_of_day(value: common_pb2.TimeOfDay) -> int:
    return value.hours * 3600 + value.minutes * 60 + value.seconds


def check_shape(steps: Sequence[workflow_pb2.Step], found: Found) -> None:
    for kind, label in (("input", "input"), ("sample", "sample")):
        indexes = [index for index, step in enumerate(steps) if step.WhichOneof("kind") == kind]
        if not indexes:
            found.add(
                K.VALIDATION_PROBLEM_KIND_BAD_SHAPE,
                "graph.steps",
                f"The graph has no {label} step; it needs exactly one.",
            )
        for extra in indexes[1:]:
            found.add(
                K.VALIDATION_PROBLEM_KIND_BAD_SHAPE,
                steps_path(extra),
                f"{step_name(steps[extra], extra)} is a second {label} step; the graph needs "
                f"exactly one (the first is graph.steps[{indexes[0]}]).",
                steps[extra].step_id,
            )
