"""The benchmarks' shared statistics and CPU meter (bench/stats.py, bench/proc_stats.py):
one median rule, one percentile rule, and a process family's CPU that keeps what its
exited children used."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import pytest

from bench.proc_stats import CLOCK_TICKS, CpuMeter, family_cpu_s, process_clock_s
from bench.stats import median, percentile

BURN_S = 0.4
# A parent that forks a child, which burns BURN_S of CPU and exits; the parent reaps it,
# says so, and waits for its stdin to close (the way a postmaster outlives a backend).
PARENT = f"""
import os, sys, time
child = os.fork()
if child == 0:
    end = time.process_time() + {BURN_S}
    while time.process_time() < end:
        pass
    os._exit(0)
os.waitpid(child, 0)
print("reaped", flush=True)
sys.stdin.read()
"""

# A process that burns BURN_S of CPU, says so, and waits for its stdin to close.
BURNER = f"""
import sys, time
end = time.process_time() + {BURN_S}
while time.process_time() < end:
    pass
print("done", flush=True)
sys.stdin.read()
"""


def test_the_median_of_an_even_count_is_the_mean_of_the_two_middles() -> None:
    # two baseline passes: neither the slower (40) nor the faster (50) alone
    assert median([50.0, 40.0]) == 45.0
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4, 1, 3, 2]) == 2.5
    with pytest.raises(ValueError, match="no values"):
        median([])


def test_percentiles_are_nearest_rank() -> None:
    samples = [float(n) for n in range(1, 101)]  # 1..100
    assert percentile(samples, 0.99) == 99.0
    assert percentile(samples, 0.5) == 50.0
    assert percentile(samples, 1.0) == 100.0
    assert percentile(samples[:99], 0.99) == 99.0  # 99 samples: the largest
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.99)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        percentile(samples, 0)


@contextmanager
def _waiting_on_stdin(script: str) -> Iterator[tuple[int, IO[str]]]:
    """`script` (PARENT, BURNER) in a Python process of its own: its pid and its stdout
    while it waits; its stdin closed, and the process reaped, at the end."""
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdin is not None
        assert process.stdout is not None
        yield process.pid, process.stdout
        process.stdin.close()
        process.wait(timeout=30)


def test_a_family_keeps_the_cpu_of_a_child_that_exited() -> None:
    with _waiting_on_stdin(PARENT) as (parent, said):
        meter = CpuMeter({"family": parent}, this_process=None)
        before = meter.mark()
        assert said.readline() == "reaped\n"
        after = meter.mark()
        alive = family_cpu_s(parent)
    assert after["family"] - before["family"] >= BURN_S * 0.9
    assert alive >= after["family"]
    assert family_cpu_s(parent) == 0.0  # gone
    assert family_cpu_s(None) == 0.0


def test_a_process_clock_reads_another_process_cpu_finer_than_its_ticks() -> None:
    # its clock, read from here, agrees with its ticks to a tick, in nanoseconds rather
    # than hundredths; gone, it reads None
    with _waiting_on_stdin(BURNER) as (child, said):
        assert said.readline() == "done\n"
        clock = process_clock_s(child)
        with open(f"/proc/{child}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    assert clock is not None
    assert clock >= BURN_S
    assert abs(clock - ticks) <= 2 / CLOCK_TICKS
    assert round(clock * CLOCK_TICKS) != clock * CLOCK_TICKS  # not whole ticks
    assert process_clock_s(child) is None  # reaped: gone
    own = process_clock_s(os.getpid())
    assert own is not None
    assert abs(own - time.process_time()) < 0.05
