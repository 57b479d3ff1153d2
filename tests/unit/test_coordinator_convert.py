"""convert's Timestamps: the same instant as protobuf's own conversion writes."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp

from services.coordinator import convert


def test_set_ts_writes_what_from_datetime_writes() -> None:
    rng = random.Random(34)
    first, last = (
        (datetime(year, 1, 2, tzinfo=UTC) - convert.EPOCH) // convert.MICROSECOND
        for year in (1, 9999)
    )
    instants = [
        convert.EPOCH,
        convert.EPOCH - convert.MICROSECOND,  # the last microsecond before 1970
        datetime(2026, 12, 5, 17, 0, 0, 999_999, tzinfo=UTC),
        datetime(2026, 12, 5, 18, 0, tzinfo=UTC).astimezone(),  # another zone, same instant
        datetime(2026, 12, 5, 17, 0, 0, 1),  # naive: UTC
        *(convert.EPOCH + timedelta(microseconds=rng.randrange(first, last)) for _ in range(500)),
    ]
    for instant in instants:
        written, expected = Timestamp(), Timestamp()
        convert.set_ts(written, instant)
        aware = instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC)
        expected.FromDatetime(aware)
        assert (written.seconds, written.nanos) == (expected.seconds, expected.nanos), instant
        assert written == convert.ts(instant)
