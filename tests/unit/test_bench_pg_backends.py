"""bench.pg_backends' accounting of Postgres' CPU by process (pure: no cluster; the
samples are set by hand, a live pid is this test's own and a gone one is out of range)."""

from __future__ import annotations

import os

from bench.pg_backends import BackendCpu, _Seen

GONE = 2**22 + 1  # above the kernel's largest pid: never alive


def accounting(seen: dict[int, _Seen], labels: dict[int, str], reaped_s: float) -> BackendCpu:
    backends = BackendCpu("postgresql://unused", postmaster=1, clients={})
    backends.seen, backends.labels, backends.reaped_s = seen, labels, reaped_s
    return backends


def test_a_process_counts_its_cpu_in_the_window_by_its_name() -> None:
    live = os.getpid()
    backends = accounting(
        {live: _Seen("postgres: walwriter", first_s=2.0, last_s=2.5)},
        {live: "client backend of the coordinator (x)"},
        reaped_s=0.0,
    )
    assert backends.by_label() == {"client backend of the coordinator (x)": (1, 0.5)}


def test_what_an_exited_process_spent_after_its_last_sample_is_counted_apart() -> None:
    # born before the window with 3 s spent, sampled at 3.2 s, then gone: the postmaster
    # reaped its whole life, 3.3 s, so 0.1 s fell after its last sample
    backends = accounting(
        {GONE: _Seen("autovacuum worker", first_s=3.0, last_s=3.2)}, {}, reaped_s=3.3
    )
    found = backends.by_label()
    assert found["autovacuum worker"][0] == 1
    assert abs(found["autovacuum worker"][1] - 0.2) < 1e-9
    assert abs(found["exited, after its last sample"][1] - 0.1) < 1e-9


def test_a_process_that_spent_nothing_in_the_window_is_left_out() -> None:
    live = os.getpid()
    backends = accounting({live: _Seen("checkpointer", 1.0, 1.0)}, {}, reaped_s=0.0)
    assert backends.by_label() == {}
