"""Planning a run's input (docs/runs-and-jobs.md): the day, the window, and one job per recording.

Pure functions; every instant is an aware datetime, and results are in UTC.

Decisions:
- The input day is resolved in the workflow's zone ("" means UTC): run-day is
  the local date of `now`, previous-day the date before it, DATE the given one.
- The window is local wall-clock time on that day. An end of 00:00:00 is the
  end of the day (midnight of the next day). Local times are resolved by
  zoneinfo with fold=0, which is what the InputStep contract asks for: a time
  in a DST gap moves forward by the gap (02:30 on the spring-forward day in
  Europe/Berlin is 03:30 CEST), an ambiguous time takes its first occurrence.
  When the gap makes the end fall before the start (a window inside the gap)
  the window is empty: it ends where it starts.
- Slots: the grid is anchored at the window start, t_k = start + k * interval
  for t_k in [window start, window end). A recording's slots are the grid
  points in [recording start, recording end). Counts are computed with integer
  arithmetic on timedelta, never by walking the grid.
- The interval is an exact integer number of milliseconds (`interval_ms`):
  the contract's interval is a double of seconds (0.5 is two frames a second),
  which validation has checked is a whole number of milliseconds. Converting it
  once with round() keeps every slot instant exact (slot k of 0.1 s is
  start + k * 100 ms), where summing or scaling a float 0.1 would drift.
- Job order is (recording start, camera id, recording id); a recording with no
  slot gets no job.
- Test runs (`image_limit` set) expect only the first `image_limit` slots in
  job order: the job that crosses the limit is truncated, later ones are not
  created. So a test run over many recordings is never refused for their number.
- Errors, checked in this order: no job at all is NoMedia; more than 10,000
  jobs is TooManyJobs; a job over 10,000 slots is TooManySlots (the first such
  job in job order is named).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterable
from dataclasses import dataclass

from services.coordinator.platform import errors
from workshop.v1 import common_pb2, workflow_pb2

MAX_JOBS_PER_RUN = 10_000
MAX_SLOTS_PER_JOB = 10_000
DEFAULT_TIME_ZONE = "UTC"

_MIDNIGHT = dt.time(0, 0, 0)


@dataclass(frozen=True, slots=True)
class RecordingRef:
    """One stored recording as listed for a run: the facts its job and the snapshot need."""

    recording_id: str
    camera_id: str
    generation: int
    start: dt.datetime  # first frame (UTC)
    end: dt.datetime  # just after the last frame (UTC, exclusive)
    fps: float
    object_key: str
    sha256: str
    byte_size: int


@dataclass(frozen=True, slots=True)
class JobPlan:
    """One job: slot k of it is at `first_slot_at + k * interval`."""

    job_index: int
    recording: RecordingRef
    first_slot_at: dt.datetime
    slot_count: int


def zone_of(time_zone: str) -> zoneinfo.ZoneInfo:
    """The workflow's zone; an empty name means UTC."""
    return zoneinfo.ZoneInfo(time_zone or DEFAULT_TIME_ZONE)


def resolve_day(step: workflow_pb2.InputStep, time_zone: str, now: dt.datetime) -> dt.date:
    """The local date an input step reads when a run is created at `now`."""
    _require_aware(now, "now")
    if step.day == workflow_pb2.INPUT_DAY_DATE:
        return dt.date(step.date.year, step.date.month, step.date.day)
    run_day = now.astimezone(zone_of(time_zone)).date()
    if step.day == workflow_pb2.INPUT_DAY_RUN_DAY:
        return run_day
    if step.day == workflow_pb2.INPUT_DAY_PREVIOUS_DAY:
        return run_day - dt.timedelta(days=1)
    raise ValueError(f"input day {step.day} has no date; validate the workflow first")


def window_instants(
    day: dt.date, start: common_pb2.TimeOfDay, end: common_pb2.TimeOfDay, time_zone: str
) -> tuple[dt.datetime, dt.datetime]:
    """UTC instants [start, end) of the local daily window on `day`."""
    zone = zone_of(time_zone)
    start_time, end_time = _wall_time(start), _wall_time(end)
    end_day = day + dt.timedelta(days=1) if end_time == _MIDNIGHT else day
    start_at = _utc_instant(day, start_time, zone)
    end_at = _utc_instant(end_day, end_time, zone)
    return start_at, max(start_at, end_at)


def _wall_time(value: common_pb2.TimeOfDay) -> dt.time:
    return dt.time(value.hours, value.minutes, value.seconds)


def _utc_instant(day: dt.date, wall: dt.time, zone: zoneinfo.ZoneInfo) -> dt.datetime:
    # fold=0: a gap moves forward by its length, an ambiguous time is its first occurrence.
    return dt.datetime.combine(day, wall, tzinfo=zone).astimezone(dt.UTC)


def interval_ms(interval_seconds: float) -> int:
    """A validated interval (seconds, a whole number of milliseconds) as exact milliseconds."""
    return round(interval_seconds * 1000)


def slot_time(first_slot_at: dt.datetime, interval_ms: int, index: int) -> dt.datetime:
    """Instant of slot `index` of a job."""
    return first_slot_at + dt.timedelta(milliseconds=interval_ms * index)


def plan_jobs(
    recordings: Iterable[RecordingRef],
    window: tuple[dt.datetime, dt.datetime],
    interval_ms: int,
    image_limit: int | None,
) -> list[JobPlan]:
    """Jobs in job order, one per recording with at least one expected slot."""
    window_start, window_end = window
    _require_aware(window_start, "window start")
    _require_aware(window_end, "window end")
    if interval_ms < 1:
        raise ValueError(f"interval_ms must be at least 1, not {interval_ms}")
    if image_limit is not None and image_limit < 1:
        raise ValueError(f"image_limit must be at least 1, not {image_limit}")
    interval = dt.timedelta(milliseconds=interval_ms)
    spans = _slot_spans(recordings, window_start, window_end, interval, image_limit)
    _check_limits(spans)
    return [
        JobPlan(
            job_index=job_index,
            recording=recording,
            first_slot_at=window_start + first * interval,
            slot_count=count,
        )
        for job_index, (recording, first, count) in enumerate(spans)
    ]


def _job_order(recording: RecordingRef) -> tuple[dt.datetime, str, str]:
    return (recording.start, recording.camera_id, recording.recording_id)


def _slot_spans(
    recordings: Iterable[RecordingRef],
    window_start: dt.datetime,
    window_end: dt.datetime,
    interval: dt.timedelta,
    image_limit: int | None,
) -> list[tuple[RecordingRef, int, int]]:
    """(recording, first grid index, slot count) per job, in job order, the limit applied."""
    remaining = image_limit
    spans: list[tuple[RecordingRef, int, int]] = []
    for recording in sorted(recordings, key=_job_order):
        lower = max(recording.start, window_start)
        upper = min(recording.end, window_end)
        if upper <= lower:
            continue
        first = _ceil_div(lower - window_start, interval)
        count = _ceil_div(upper - window_start, interval) - first
        if count <= 0:  # the recording falls between two grid points
            continue
        if remaining is not None:
            count = min(count, remaining)
            remaining -= count
        spans.append((recording, first, count))
        if remaining == 0:
            break
    return spans


def _ceil_div(numerator: dt.timedelta, denominator: dt.timedelta) -> int:
    # timedelta // timedelta is exact integer division in microseconds.
    return -(-numerator // denominator)


def _check_limits(spans: list[tuple[RecordingRef, int, int]]) -> None:
    if not spans:
        raise errors.NoMedia(errors.NO_MEDIA_MESSAGE)
    if len(spans) > MAX_JOBS_PER_RUN:
        raise errors.TooManyJobs(
            f"The run would have {len(spans):,} jobs (one per recording); at most "
            f"{MAX_JOBS_PER_RUN:,} are allowed. Choose fewer cameras or a shorter window.",
            metadata={"jobs": str(len(spans)), "limit": str(MAX_JOBS_PER_RUN)},
        )
    for recording, _, count in spans:
        if count > MAX_SLOTS_PER_JOB:
            raise errors.TooManySlots(
                f"Recording '{recording.recording_id}' would have {count:,} slots; a job may "
                f"have at most {MAX_SLOTS_PER_JOB:,}. Choose a longer sampling interval.",
                metadata={
                    "recording_id": recording.recording_id,
                    "slots": str(count),
                    "limit": str(MAX_SLOTS_PER_JOB),
                },
            )


def _require_aware(value: dt.datetime, what: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime, not {value!r}")
