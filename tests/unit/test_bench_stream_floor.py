"""The session stream's floor (bench/stream_floor.py): its messages and how it splits work.
No servers: the packing the server unpacks into the record statement's arrays."""

from __future__ import annotations

import pytest

from bench.stream_floor import (
    ANSWER,
    ASSIGNMENT_BYTES,
    COMPLETE,
    COMPLETE_BYTES,
    HEADER,
    RECORDS,
    answer,
    batch_sizes,
    frame_jobs,
    job_frames,
    message,
    pack_records,
    unpack_records,
)

TOKEN = bytes(range(16))


def test_records_come_back_as_the_statements_columns() -> None:
    frames = job_frames(3, 42, 5)
    packed = pack_records(42, TOKEN, frames)
    assert HEADER.unpack_from(packed) == (RECORDS, 42, 5, TOKEN)
    slots, keys, shas, boxes = unpack_records(packed, 5)
    assert slots == [0, 1, 2, 3, 4]
    assert keys == [frame.object_key for frame in frames]
    assert keys[4] == "runs/00000003/jobs/000000000042/00004.jpg"
    assert shas == [frame.sha256 for frame in frames]
    assert all(len(sha) == 32 for sha in shas)
    assert boxes == [frame.boxes for frame in frames]


def test_records_that_do_not_fill_the_message_exactly_are_refused() -> None:
    packed = pack_records(1, TOKEN, job_frames(1, 1, 3))
    with pytest.raises(ValueError, match="bytes after 2 records"):
        unpack_records(packed, 2)


def test_a_job_is_split_into_full_messages_then_the_rest() -> None:
    assert batch_sizes(120, 32) == [32, 32, 32, 24]
    assert batch_sizes(120, 8) == [8] * 15
    assert batch_sizes(120, 1) == [1] * 120
    assert batch_sizes(0, 8) == []
    with pytest.raises(ValueError, match="in messages of 0"):
        batch_sizes(10, 0)


def test_more_jobs_per_client_at_larger_batches() -> None:
    assert [frame_jobs(16, k) for k in (1, 8, 32)] == [16, 64, 96]


def test_messages_are_padded_to_the_unary_cycles_sizes() -> None:
    sent = message(COMPLETE, 7, TOKEN, 0, COMPLETE_BYTES)
    assert len(sent) == COMPLETE_BYTES
    assert HEADER.unpack_from(sent) == (COMPLETE, 7, 0, TOKEN)
    reply = answer(8, TOKEN)
    assert len(reply) == ASSIGNMENT_BYTES
    assert ANSWER.unpack_from(reply) == (0, 8, TOKEN)
