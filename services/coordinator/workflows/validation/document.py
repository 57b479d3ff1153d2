"""Checks of the whole document: its size, its time zone and its schedule."""

from __future__ import annotations

import zoneinfo

from services.coordinator.workflows.validation.problems import Found, K, quoted, time_text
from services.coordinator.workflows.validation.steps import is_time_of_day
from workshop.v1 import workflow_pb2

MAX_STEPS = 64
MAX_EDGES = 256
# Files that zoneinfo loads from the host's zone directory but that are not IANA zone names.
_HOST_ZONE_FILES = frozenset({"localtime", "posixrules"})
_HOST_ZONE_PREFIXES = ("posix/", "right/")


def check_size(graph: workflow_pb2.WorkflowGraph, found: Found) -> None:
    if len(graph.steps) > MAX_STEPS:
        found.add(
            K.VALIDATION_PROBLEM_KIND_TOO_LARGE,
            "graph.steps",
            f"The graph has {len(graph.steps)} steps; at most {MAX_STEPS} are allowed.",
        )
    if len(graph.edges) > MAX_EDGES:
        found.add(
            K.VALIDATION_PROBLEM_KIND_TOO_LARGE,
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


def check_time_zone(name: str, found: Found) -> None:
    if not is_time_zone(name):
        found.add(
            K.VALIDATION_PROBLEM_KIND_BAD_SCHEDULE,
            "time_zone",
            f"Time zone {quoted(name)} is not an IANA time zone name such as 'Europe/Berlin'.",
        )


def check_schedule(spec: workflow_pb2.WorkflowSpec, found: Found) -> None:
    if not spec.HasField("schedule"):
        return
    schedule = spec.schedule
    if not schedule.HasField("time_of_day"):
        found.add(
            K.VALIDATION_PROBLEM_KIND_BAD_SCHEDULE,
            "schedule.time_of_day",
            "The schedule has no time of day; set when the daily run is created.",
        )
    elif not is_time_of_day(schedule.time_of_day):
        found.add(
            K.VALIDATION_PROBLEM_KIND_BAD_SCHEDULE,
            "schedule.time_of_day",
            f"The schedule's time of day {time_text(schedule.time_of_day)} is not a valid time "
            "(hours 0-23, minutes and seconds 0-59).",
        )
