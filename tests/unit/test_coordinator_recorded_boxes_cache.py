"""The boxes the coordinator remembers recording, for their commit (leases.recorded)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.coordinator.leases.boxes import NO_BOXES, FrameBoxes
from services.coordinator.leases.recorded import RecordedBoxes

AT = datetime(2026, 12, 6, tzinfo=UTC)
BOX: FrameBoxes = ((0, "person", 0.5, 0.1, 0.2, 0.3, 0.4),)


def test_a_commit_takes_what_was_remembered_and_it_is_forgotten() -> None:
    recorded = RecordedBoxes()
    recorded.remember(AT, [("a", BOX), ("b", NO_BOXES)])
    assert recorded.take(["b", "a"]) == [(AT, NO_BOXES), (AT, BOX)]
    assert len(recorded) == 0
    assert recorded.take(["a"]) is None


def test_a_commit_that_names_one_preview_not_remembered_takes_nothing() -> None:
    recorded = RecordedBoxes()
    recorded.remember(AT, [("a", BOX)])
    assert recorded.take(["a", "elsewhere"]) is None
    assert recorded.take(["a"]) == [(AT, BOX)]  # still there for a commit that names it


def test_a_preview_recorded_again_is_remembered_as_recorded_last() -> None:
    recorded = RecordedBoxes()
    recorded.remember(AT, [("a", BOX)])
    recorded.remember(AT + timedelta(seconds=1), [("a", NO_BOXES)])
    assert recorded.take(["a"]) == [(AT + timedelta(seconds=1), NO_BOXES)]


def test_past_its_limit_the_longest_remembered_is_dropped_first() -> None:
    recorded = RecordedBoxes(limit=2)
    recorded.remember(AT, [("a", BOX), ("b", BOX)])
    recorded.remember(AT, [("c", BOX)])
    assert len(recorded) == 2
    assert recorded.take(["a"]) is None
    assert recorded.take(["b", "c"]) == [(AT, BOX), (AT, BOX)]
