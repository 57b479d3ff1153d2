"""The guard stops what a killed owner left running, and nothing else
(tools/localstack/orphan_guard.py).

A stand-in owner (a real process) starts three processes in sessions of their own, as the
launchers start servers: it has its guard watch two (one ignores SIGTERM) and not the
third, then is SIGKILLed, as the OOM killer ends an xdist worker. The watched two must
go, the SIGTERM-proof one by SIGKILL after the grace; the third must stay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tools.localstack.orphan_guard import Guard, Watched, start_time

REPO = Path(__file__).resolve().parents[2]
GRACE_S = 1.0
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
OWNER = f"""
import subprocess, sys, time
from tools.localstack.orphan_guard import Guard
guard = Guard(grace_s={GRACE_S})
def start(*command):
    return subprocess.Popen(command, start_new_session=True).pid
plain = start("sleep", "300")
stubborn = start(sys.executable, "-c", {STUBBORN!r})
unwatched = start("sleep", "300")
time.sleep(0.5)  # the stubborn one's handler is set
guard.watch(plain)
guard.watch(stubborn)
print(plain, stubborn, unwatched, flush=True)
time.sleep(300)
"""


def _running(pid: int, started: int | None) -> bool:
    return started is not None and Watched(pid, started).running()


def _gone_within(pids: list[tuple[int, int | None]], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_running(pid, started) for pid, started in pids):
            return True
        time.sleep(0.05)
    return False


@contextmanager
def _killed_at_the_end(pids: list[int]) -> Iterator[None]:
    """SIGKILLs whichever of `pids` still run when the test ends, passed or failed."""
    started = {pid: start_time(pid) for pid in pids}
    try:
        yield
    finally:
        for pid in pids:
            if _running(pid, started[pid]):
                os.kill(pid, signal.SIGKILL)


def test_a_killed_owner_s_watched_processes_are_stopped_and_no_other() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", OWNER], cwd=REPO, stdout=subprocess.PIPE, text=True
    ) as owner:
        assert owner.stdout is not None
        try:
            plain, stubborn, unwatched = (int(pid) for pid in owner.stdout.readline().split())
        finally:
            owner.kill()  # SIGKILL: no teardown runs
    with _killed_at_the_end([plain, stubborn, unwatched]):
        watched = [(plain, start_time(plain)), (stubborn, start_time(stubborn))]
        began = time.monotonic()
        assert _gone_within(watched[:1], 5.0), "SIGTERM did not reach the plain one"
        assert _gone_within(watched, GRACE_S + 5.0), "the stubborn one outlived the grace"
        assert time.monotonic() - began >= GRACE_S * 0.8  # it took the SIGKILL to end it
        assert _running(unwatched, start_time(unwatched)), "an unwatched process was stopped"


def test_a_process_that_only_reuses_a_watched_pid_is_never_signalled() -> None:
    # the guard is told a live process's pid with another start time: a process that got
    # the pid of a server that ended; it must survive the guard's end
    sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
    started = start_time(sleeper.pid)
    assert started is not None
    try:
        guard = subprocess.Popen(
            [sys.executable, "-m", "tools.localstack.orphan_guard", str(GRACE_S)],
            cwd=REPO,
            stdin=subprocess.PIPE,
        )
        assert guard.stdin is not None
        guard.stdin.write(f"{sleeper.pid} {started - 1}\n".encode())
        guard.stdin.close()  # the owner's end closes
        guard.wait(timeout=GRACE_S + 10)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)


def test_a_clean_exit_leaves_the_guard_nothing_to_do() -> None:
    guard = Guard(grace_s=GRACE_S)
    guard.close()  # never started: nothing watched
    sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
    guard.watch(sleeper.pid)
    sleeper.terminate()  # the owner stops its server itself, as a fixture does
    sleeper.wait(timeout=10)
    began = time.monotonic()
    guard.close()
    assert time.monotonic() - began < GRACE_S  # it waited for nothing
    guard.watch(sleeper.pid)  # gone: watching it starts no guard
    guard.close()
