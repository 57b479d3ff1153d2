"""Run planning (docs/runs-and-jobs.md): days, windows across DST, the slot grid, job order
and limits."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.coordinator.platform import errors
from services.coordinator.runs.planning import (
    MAX_JOBS_PER_RUN,
    MAX_SLOTS_PER_JOB,
    JobPlan,
    RecordingRef,
    interval_ms,
    plan_jobs,
    resolve_day,
    slot_time,
    window_instants,
)
from workshop.v1 import common_pb2, workflow_pb2

UTC = dt.UTC
BERLIN = "Europe/Berlin"


def at(text: str) -> dt.datetime:
    """A UTC instant from 'YYYY-MM-DD HH:MM[:SS[.ffffff]]'."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def tod(hours: int, minutes: int = 0, seconds: int = 0) -> common_pb2.TimeOfDay:
    return common_pb2.TimeOfDay(hours=hours, minutes=minutes, seconds=seconds)


def recording(
    start: dt.datetime,
    end: dt.datetime,
    camera_id: str = "cam-1",
    recording_id: str | None = None,
) -> RecordingRef:
    return RecordingRef(
        recording_id=recording_id or f"{camera_id}-{start:%H%M%S%f}",
        camera_id=camera_id,
        generation=1,
        start=start,
        end=end,
        fps=25.0,
        object_key=f"recordings/{camera_id}/{start:%Y%m%dT%H%M%S}.mp4",
        sha256="0" * 64,
        byte_size=1_000,
    )


def day_step(day: int, date: dt.date | None = None) -> workflow_pb2.InputStep:
    step = workflow_pb2.InputStep(camera_ids=["cam-1"], day=workflow_pb2.InputDay.ValueType(day))
    if date is not None:
        step.date.CopyFrom(common_pb2.CalendarDate(year=date.year, month=date.month, day=date.day))
    return step


def slots_of(job: JobPlan, interval_ms: int) -> list[dt.datetime]:
    return [slot_time(job.first_slot_at, interval_ms, k) for k in range(job.slot_count)]


WINDOW = (at("2024-05-01 08:00"), at("2024-05-01 09:00"))


# --- days --------------------------------------------------------------------------------------


def test_run_day_and_previous_day_follow_the_zone_across_midnight() -> None:
    now = at("2024-03-09 23:30")  # already 00:30 on the 10th in Berlin
    assert resolve_day(day_step(workflow_pb2.INPUT_DAY_RUN_DAY), BERLIN, now) == dt.date(
        2024, 3, 10
    )
    assert resolve_day(day_step(workflow_pb2.INPUT_DAY_PREVIOUS_DAY), BERLIN, now) == dt.date(
        2024, 3, 9
    )
    assert resolve_day(day_step(workflow_pb2.INPUT_DAY_RUN_DAY), "UTC", now) == dt.date(2024, 3, 9)


def test_run_day_west_of_utc_is_still_the_day_before() -> None:
    now = at("2024-01-01 03:30")  # 22:30 on New Year's Eve in New York
    step = day_step(workflow_pb2.INPUT_DAY_RUN_DAY)
    assert resolve_day(step, "America/New_York", now) == dt.date(2023, 12, 31)
    previous = day_step(workflow_pb2.INPUT_DAY_PREVIOUS_DAY)
    assert resolve_day(previous, "America/New_York", now) == dt.date(2023, 12, 30)


def test_empty_zone_is_utc() -> None:
    now = at("2024-03-09 23:30")
    assert resolve_day(day_step(workflow_pb2.INPUT_DAY_RUN_DAY), "", now) == dt.date(2024, 3, 9)


def test_fixed_date_ignores_now() -> None:
    step = day_step(workflow_pb2.INPUT_DAY_DATE, dt.date(2024, 2, 29))
    assert resolve_day(step, BERLIN, at("2030-01-01 00:00")) == dt.date(2024, 2, 29)


def test_unresolvable_day_and_naive_now_are_refused() -> None:
    with pytest.raises(ValueError, match="validate the workflow"):
        resolve_day(day_step(workflow_pb2.INPUT_DAY_UNSPECIFIED), BERLIN, at("2024-01-01 00:00"))
    with pytest.raises(ValueError, match="aware"):
        resolve_day(day_step(workflow_pb2.INPUT_DAY_RUN_DAY), BERLIN, dt.datetime(2024, 1, 1))


# --- windows -----------------------------------------------------------------------------------


def test_window_in_winter_and_summer_time() -> None:
    assert window_instants(dt.date(2024, 1, 15), tod(8), tod(18), BERLIN) == (
        at("2024-01-15 07:00"),
        at("2024-01-15 17:00"),
    )
    assert window_instants(dt.date(2024, 7, 15), tod(8), tod(18, 30), BERLIN) == (
        at("2024-07-15 06:00"),
        at("2024-07-15 16:30"),
    )


def test_results_are_utc() -> None:
    start, end = window_instants(dt.date(2024, 1, 15), tod(8), tod(18), BERLIN)
    assert start.tzinfo is UTC
    assert end.tzinfo is UTC


def test_end_of_day_window_on_the_spring_forward_day_is_23_hours() -> None:
    start, end = window_instants(dt.date(2024, 3, 31), tod(0), tod(0), BERLIN)
    assert (start, end) == (at("2024-03-30 23:00"), at("2024-03-31 22:00"))
    assert end - start == dt.timedelta(hours=23)


def test_end_of_day_window_on_the_fall_back_day_is_25_hours() -> None:
    start, end = window_instants(dt.date(2024, 10, 27), tod(0), tod(0), BERLIN)
    assert end - start == dt.timedelta(hours=25)


def test_time_in_the_gap_moves_forward_by_the_gap() -> None:
    # 02:30 does not exist on 2024-03-31 in Berlin; it is read as 03:30 CEST (01:30 UTC).
    start, end = window_instants(dt.date(2024, 3, 31), tod(2, 30), tod(4), BERLIN)
    assert (start, end) == (at("2024-03-31 01:30"), at("2024-03-31 02:00"))


def test_ambiguous_time_takes_its_first_occurrence() -> None:
    # 02:30 happens twice on 2024-10-27 in Berlin; the first is CEST (00:30 UTC).
    start, _ = window_instants(dt.date(2024, 10, 27), tod(2, 30), tod(4), BERLIN)
    assert start == at("2024-10-27 00:30")


def test_window_that_the_gap_inverts_is_empty() -> None:
    start, end = window_instants(dt.date(2024, 3, 31), tod(2, 30), tod(3), BERLIN)
    assert start == end == at("2024-03-31 01:30")


# --- the slot grid -----------------------------------------------------------------------------


def test_grid_is_anchored_at_the_window_start() -> None:
    job = plan_jobs(
        [recording(at("2024-05-01 08:00:30"), at("2024-05-01 08:05:30"))], WINDOW, 60_000, None
    )[0]
    assert job.first_slot_at == at("2024-05-01 08:01")
    assert job.slot_count == 5  # 08:01 .. 08:05


def test_recording_start_on_a_grid_point_is_included_and_its_end_excluded() -> None:
    job = plan_jobs(
        [recording(at("2024-05-01 08:02"), at("2024-05-01 08:05"))], WINDOW, 60_000, None
    )[0]
    assert slots_of(job, 60_000) == [
        at("2024-05-01 08:02"),
        at("2024-05-01 08:03"),
        at("2024-05-01 08:04"),
    ]


def test_window_end_is_excluded() -> None:
    job = plan_jobs(
        [recording(at("2024-05-01 07:00"), at("2024-05-01 10:00"))], WINDOW, 600_000, None
    )[0]
    assert job.first_slot_at == at("2024-05-01 08:00")
    assert job.slot_count == 6  # 08:00 .. 08:50, not 09:00
    assert slots_of(job, 600_000)[-1] == at("2024-05-01 08:50")


def test_recording_partly_before_the_window() -> None:
    job = plan_jobs(
        [recording(at("2024-05-01 07:30"), at("2024-05-01 08:10"))], WINDOW, 60_000, None
    )[0]
    assert (job.first_slot_at, job.slot_count) == (at("2024-05-01 08:00"), 10)


def test_recording_partly_after_the_window() -> None:
    job = plan_jobs(
        [recording(at("2024-05-01 08:55"), at("2024-05-01 09:30"))], WINDOW, 60_000, None
    )[0]
    assert (job.first_slot_at, job.slot_count) == (at("2024-05-01 08:55"), 5)


def test_recordings_without_a_slot_get_no_job() -> None:
    recordings = [
        recording(at("2024-05-01 06:00"), at("2024-05-01 08:00")),  # ends where the window starts
        recording(at("2024-05-01 09:00"), at("2024-05-01 10:00")),  # starts where it ends
        recording(at("2024-05-01 08:10:01"), at("2024-05-01 08:10:59")),  # between grid points
        recording(at("2024-05-01 08:20"), at("2024-05-01 08:20")),  # empty
        recording(at("2024-05-01 08:30"), at("2024-05-01 08:30:00.000001")),
    ]
    jobs = plan_jobs(recordings, WINDOW, 60_000, None)
    assert [(job.recording.start, job.slot_count) for job in jobs] == [(at("2024-05-01 08:30"), 1)]


def test_sub_second_starts_round_up_to_the_next_grid_point() -> None:
    job = plan_jobs(
        [recording(at("2024-05-01 08:00:00.000001"), at("2024-05-01 08:00:20"))],
        WINDOW,
        10_000,
        None,
    )[0]
    assert (job.first_slot_at, job.slot_count) == (at("2024-05-01 08:00:10"), 1)


def test_job_order_is_start_then_camera_then_recording() -> None:
    recordings = [
        recording(at("2024-05-01 08:10"), at("2024-05-01 08:20"), "cam-a", "r1"),
        recording(at("2024-05-01 08:00"), at("2024-05-01 08:20"), "cam-b", "r2"),
        recording(at("2024-05-01 08:00"), at("2024-05-01 08:20"), "cam-a", "r4"),
        recording(at("2024-05-01 08:00"), at("2024-05-01 08:20"), "cam-a", "r3"),
    ]
    jobs = plan_jobs(recordings, WINDOW, 60_000, None)
    assert [job.recording.recording_id for job in jobs] == ["r3", "r4", "r2", "r1"]
    assert [job.job_index for job in jobs] == [0, 1, 2, 3]


def test_whole_spring_forward_day_in_berlin_has_23_hourly_slots() -> None:
    window = window_instants(dt.date(2024, 3, 31), tod(0), tod(0), BERLIN)
    job = plan_jobs(
        [recording(at("2024-03-30 12:00"), at("2024-04-01 12:00"))], window, 3_600_000, None
    )[0]
    assert job.slot_count == 23
    assert job.first_slot_at == at("2024-03-30 23:00")
    assert slot_time(job.first_slot_at, 3_600_000, 22) == at("2024-03-31 21:00")


def test_slot_time() -> None:
    assert slot_time(at("2024-05-01 08:00"), 90_000, 3) == at("2024-05-01 08:04:30")


# --- fractional intervals (exact integer milliseconds) --------------------------------------


@pytest.mark.parametrize(
    ("seconds", "ms"),
    [
        (0.1, 100),
        (0.25, 250),
        (0.5, 500),
        (0.1 + 0.2, 300),
        (2.5, 2_500),
        (60.0, 60_000),
        (3599.999, 3_599_999),
        (3600.0, 3_600_000),
    ],
)
def test_interval_ms_is_the_exact_whole_number_of_milliseconds(seconds: float, ms: int) -> None:
    assert interval_ms(seconds) == ms


def test_half_second_slots_over_a_sixty_second_window_are_exact() -> None:
    start = at("2024-05-01 08:00")
    window = (start, start + dt.timedelta(seconds=60))
    job = plan_jobs([recording(at("2024-05-01 07:59"), at("2024-05-01 08:02"))], window, 500, None)
    assert [(j.first_slot_at, j.slot_count) for j in job] == [(start, 120)]
    slots = slots_of(job[0], interval_ms(0.5))
    # slot k is start + k * 500 ms to the microsecond: no float drift at slot 119
    assert slots == [start + dt.timedelta(milliseconds=500 * k) for k in range(120)]
    assert slots[1] == at("2024-05-01 08:00:00.5")
    assert slots[-1] == at("2024-05-01 08:00:59.5")


def test_half_second_slots_of_a_recording_inside_the_window() -> None:
    # 08:00:10.2 to 08:00:13.0: the grid points 10.5, 11.0, 11.5, 12.0 and 12.5
    rec = recording(at("2024-05-01 08:00:10.2"), at("2024-05-01 08:00:13"))
    job = plan_jobs([rec], WINDOW, 500, None)[0]
    assert (job.first_slot_at, job.slot_count) == (at("2024-05-01 08:00:10.5"), 5)
    assert slots_of(job, 500)[-1] == at("2024-05-01 08:00:12.5")


def test_tenth_of_a_second_slots_stay_on_the_grid_where_floats_drift() -> None:
    start = at("2024-05-01 00:00")
    window = (start, start + dt.timedelta(seconds=1_000))
    job = plan_jobs([recording(start, window[1])], window, interval_ms(0.1), None)[0]
    assert job.slot_count == MAX_SLOTS_PER_JOB
    assert sum([0.1] * 9_999) != 999.9  # what adding a float interval would give
    assert slot_time(job.first_slot_at, interval_ms(0.1), 9_999) == at("2024-05-01 00:16:39.9")


# --- test runs ---------------------------------------------------------------------------------


def _three_ten_slot_recordings() -> list[RecordingRef]:
    return [
        recording(
            at(f"2024-05-01 08:{minute:02d}"), at(f"2024-05-01 08:{minute + 10:02d}"), "cam-1"
        )
        for minute in (0, 20, 40)
    ]


def test_test_limit_truncates_the_job_that_crosses_it_and_drops_later_ones() -> None:
    jobs = plan_jobs(_three_ten_slot_recordings(), WINDOW, 60_000, 25)
    assert [job.slot_count for job in jobs] == [10, 10, 5]
    jobs = plan_jobs(_three_ten_slot_recordings(), WINDOW, 60_000, 10)
    assert [job.slot_count for job in jobs] == [10]
    jobs = plan_jobs(_three_ten_slot_recordings(), WINDOW, 60_000, 1)
    assert [(job.first_slot_at, job.slot_count) for job in jobs] == [(at("2024-05-01 08:00"), 1)]


def test_test_limit_above_the_available_slots_keeps_them_all() -> None:
    jobs = plan_jobs(_three_ten_slot_recordings(), WINDOW, 60_000, 100)
    assert [job.slot_count for job in jobs] == [10, 10, 10]


def test_test_limit_counts_in_job_order_not_input_order() -> None:
    recordings = list(reversed(_three_ten_slot_recordings()))
    jobs = plan_jobs(recordings, WINDOW, 60_000, 15)
    assert [job.recording.start for job in jobs] == [at("2024-05-01 08:00"), at("2024-05-01 08:20")]


def test_a_test_run_over_many_recordings_is_not_refused_for_their_number() -> None:
    recordings = [
        recording(at("2024-05-01 08:00"), at("2024-05-01 08:01"), f"cam-{n:05d}")
        for n in range(MAX_JOBS_PER_RUN + 1)
    ]
    assert len(plan_jobs(recordings, WINDOW, 60_000, 20)) == 20


# --- errors ------------------------------------------------------------------------------------


def test_no_recording_is_no_media() -> None:
    with pytest.raises(errors.NoMedia) as caught:
        plan_jobs([], WINDOW, 60_000, None)
    assert caught.value.message == "The selected input has no available media."
    assert caught.value.reason == "NO_MEDIA"


def test_recordings_outside_the_window_are_no_media() -> None:
    outside = [recording(at("2024-05-01 10:00"), at("2024-05-01 11:00"))]
    with pytest.raises(errors.NoMedia, match=r"^The selected input has no available media\.$"):
        plan_jobs(outside, WINDOW, 60_000, 20)


def test_too_many_jobs() -> None:
    recordings = [
        recording(at("2024-05-01 08:00"), at("2024-05-01 08:01"), f"cam-{n:05d}")
        for n in range(MAX_JOBS_PER_RUN + 1)
    ]
    with pytest.raises(errors.TooManyJobs) as caught:
        plan_jobs(recordings, WINDOW, 60_000, None)
    error = caught.value
    assert "10,001 jobs" in error.message
    assert "at most 10,000" in error.message
    assert "fewer cameras or a shorter window" in error.message
    assert error.metadata == {"jobs": "10001", "limit": "10000"}
    assert error.reason == "TOO_MANY_JOBS"


def test_exactly_the_job_limit_is_fine() -> None:
    recordings = [
        recording(at("2024-05-01 08:00"), at("2024-05-01 08:01"), f"cam-{n:05d}")
        for n in range(MAX_JOBS_PER_RUN)
    ]
    assert len(plan_jobs(recordings, WINDOW, 60_000, None)) == MAX_JOBS_PER_RUN


def test_too_many_slots_names_the_recording() -> None:
    window = (at("2024-05-01 00:00"), at("2024-05-02 00:00"))
    fits = recording(window[0], window[0] + dt.timedelta(seconds=MAX_SLOTS_PER_JOB), "cam-1", "ok")
    long_one = recording(
        window[0], window[0] + dt.timedelta(seconds=MAX_SLOTS_PER_JOB + 1), "cam-2", "long"
    )
    assert plan_jobs([fits], window, 1_000, None)[0].slot_count == MAX_SLOTS_PER_JOB
    with pytest.raises(errors.TooManySlots) as caught:
        plan_jobs([fits, long_one], window, 1_000, None)
    error = caught.value
    assert "Recording 'long' would have 10,001 slots" in error.message
    assert "at most 10,000" in error.message
    assert "longer sampling interval" in error.message
    assert error.metadata == {"recording_id": "long", "slots": "10001", "limit": "10000"}
    assert error.reason == "TOO_MANY_SLOTS"


@pytest.mark.parametrize(
    ("window", "interval", "limit", "words"),
    [
        ((dt.datetime(2024, 5, 1, 8), WINDOW[1]), 60, None, "aware"),
        (WINDOW, 0, None, "interval_ms"),
        (WINDOW, 60_000, 0, "image_limit"),
    ],
)
def test_bad_arguments_are_programming_errors(
    window: tuple[dt.datetime, dt.datetime], interval: int, limit: int | None, words: str
) -> None:
    rec = recording(at("2024-05-01 08:00"), at("2024-05-01 08:10"))
    with pytest.raises(ValueError, match=words):
        plan_jobs([rec], window, interval, limit)


# --- scale (speed is measured in bench/run_create.py, never asserted here) ------------------


def test_ten_thousand_recordings_of_sixty_slots() -> None:
    start = at("2024-05-01 00:00")
    recordings = [
        recording(
            start + dt.timedelta(seconds=n),
            start + dt.timedelta(seconds=n + 600),
            f"cam-{n % 50}",
            f"rec-{n}",
        )
        for n in range(10_000)
    ]
    random.Random(7).shuffle(recordings)
    jobs = plan_jobs(recordings, (start, start + dt.timedelta(days=1)), 10_000, None)
    assert len(jobs) == 10_000
    assert {job.slot_count for job in jobs} == {60}
    assert [job.recording.recording_id for job in jobs[:3]] == ["rec-0", "rec-1", "rec-2"]


# --- properties --------------------------------------------------------------------------------

ANCHOR = at("2024-05-01 08:00")


@st.composite
def plans(
    draw: st.DrawFn,
) -> tuple[list[RecordingRef], tuple[dt.datetime, dt.datetime], int, int | None]:
    """Small cases: a window of up to 2 hours, recordings around it, any interval (ms, from
    0.1 s, fractional or whole seconds) and limit; at most 1,000 grid points for the oracle."""
    interval = draw(
        st.integers(min_value=100, max_value=900_000)
        | st.integers(min_value=1, max_value=900).map(lambda seconds: seconds * 1000)
    )
    window_ms = draw(st.integers(min_value=0, max_value=min(7_200_000, interval * 1_000)))
    window = (ANCHOR, ANCHOR + dt.timedelta(milliseconds=window_ms))
    limit = draw(st.none() | st.integers(min_value=1, max_value=100))
    spans = draw(
        st.lists(
            st.tuples(
                st.integers(min_value=-1_800_000, max_value=8_000_000),  # start, ms from the anchor
                st.integers(min_value=0, max_value=3_600_000),  # length, ms
                st.sampled_from(["cam-a", "cam-b", "cam-c"]),
            ),
            max_size=12,
        )
    )
    recordings = [
        recording(
            ANCHOR + dt.timedelta(milliseconds=offset),
            ANCHOR + dt.timedelta(milliseconds=offset + length),
            camera,
            f"rec-{n}",
        )
        for n, (offset, length, camera) in enumerate(spans)
    ]
    return recordings, window, interval, limit


def grid_points_in(
    rec: RecordingRef, window: tuple[dt.datetime, dt.datetime], interval: int
) -> int:
    """The oracle: walk the grid (fine for small cases)."""
    count, point = 0, window[0]
    while point < window[1]:
        count += rec.start <= point < rec.end
        point += dt.timedelta(milliseconds=interval)
    return count


@settings(max_examples=300, deadline=None)
@given(plans())
def test_planned_slots_are_the_first_grid_points_of_each_recording(
    case: tuple[list[RecordingRef], tuple[dt.datetime, dt.datetime], int, int | None],
) -> None:
    recordings, window, interval, limit = case
    covered = sum(grid_points_in(rec, window, interval) for rec in recordings)
    expected = covered if limit is None else min(limit, covered)
    if expected == 0:
        with pytest.raises(errors.NoMedia):
            plan_jobs(recordings, window, interval, limit)
        return
    jobs = plan_jobs(recordings, window, interval, limit)
    assert sum(job.slot_count for job in jobs) == expected
    assert [job.job_index for job in jobs] == list(range(len(jobs)))
    orders = [
        (job.recording.start, job.recording.camera_id, job.recording.recording_id) for job in jobs
    ]
    assert orders == sorted(orders)
    step = dt.timedelta(milliseconds=interval)
    for job in jobs:
        assert job.slot_count >= 1
        first, last = job.first_slot_at, slot_time(job.first_slot_at, interval, job.slot_count - 1)
        assert (first - window[0]) % step == dt.timedelta(0)  # on the grid
        # Inside both the recording and the window.
        assert max(job.recording.start, window[0]) <= first <= last
        assert last < min(job.recording.end, window[1])
        # The first slot is the recording's first grid point, so nothing before it was skipped.
        assert first - step < max(job.recording.start, window[0])
        if limit is None:
            assert job.slot_count == grid_points_in(job.recording, window, interval)
