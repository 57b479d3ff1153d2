"""Stops the servers a process started when that process ends without stopping them.

A test worker that dies (the OOM killer, SIGKILL, a crash) runs no teardown, so the
servers its session started (Postgres, SeaweedFS, Triton and its 250 MB Python stubs, the
services) would run on and hold their memory until someone killed them by hand. The
owner starts a guard process (`Guard`) that shares nothing with it but a pipe, and tells
it each server it starts: its pid and its start time. When the owner's end of the pipe
closes, at its exit whatever the cause, the guard sends SIGTERM to each server still
running, then SIGKILL to those still running after `GRACE_S` (`stop_processes`, which
the demo's watchdog uses too: tools/demo/reaper.py). A server is known by its pid and its
start time together, so the guard never signals a process that merely got a stopped
server's pid. After a clean exit the owner has stopped them all, and the guard finds
nothing to do.

    python -m tools.localstack.orphan_guard [GRACE_S]   (Guard starts it; reads stdin)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

GRACE_S = 15.0  # SIGTERM's grace: Triton unloads its models, Postgres shuts down
_POLL_SECONDS = 0.2
REPO = Path(__file__).resolve().parents[2]


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (the state first); None when
    the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """When the process started (field 22 of its stat, in clock ticks since boot); None
    when it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


@dataclasses.dataclass(frozen=True)
class Watched:
    pid: int
    started: int

    def running(self) -> bool:
        """Still the process that was watched (not one that reuses its pid), not a zombie."""
        fields = _stat_fields(self.pid)
        return fields is not None and int(fields[19]) == self.started and fields[0] != "Z"


class Guard:
    """The owner's side: `watch` each server as it starts; `close` at a clean exit."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self._process: subprocess.Popen[bytes] | None = None

    def watch(self, pid: int) -> None:
        """Stop `pid` if this process ends while it runs."""
        started = start_time(pid)
        if started is None:
            return  # gone already
        if self._process is None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tools.localstack.orphan_guard", str(self.grace_s)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                cwd=REPO,
                # its own session: a Ctrl-C at the terminal or a signal to the owner's
                # group must not end it before the owner
                start_new_session=True,
            )
        assert self._process.stdin is not None
        self._process.stdin.write(f"{pid} {started}\n".encode())
        self._process.stdin.flush()

    def close(self) -> None:
        """The owner's clean exit: the guard stops what still runs (nothing, when every
        server was stopped) and exits."""
        if self._process is None:
            return
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=self.grace_s + 10)
        self._process = None


# The guard of this process, when its owner turned it on (testbed/harness/orphans.py).
GUARD: Guard | None = None


def watch(pid: int | None) -> None:
    """Has this process's guard, if it has one, stop `pid` when this process ends."""
    if GUARD is not None and pid is not None:
        GUARD.watch(pid)


def stop_processes(find: Callable[[], list[int]], grace_seconds: float) -> list[int]:
    """SIGTERM to every process `find` lists, SIGKILL to those it still lists after the
    grace; returns the pids signalled. `find` lists what still runs (a zombie has ended)."""
    signalled: list[int] = []
    deadline = time.monotonic() + grace_seconds
    sig = signal.SIGTERM
    while True:
        live = find()
        if not live:
            return signalled
        if time.monotonic() >= deadline:
            sig = signal.SIGKILL
        for pid in live:
            if pid not in signalled or sig is signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
                if pid not in signalled:
                    signalled.append(pid)
        time.sleep(_POLL_SECONDS)


def main() -> None:
    grace_s = float(sys.argv[1]) if len(sys.argv) > 1 else GRACE_S
    watched: list[Watched] = []
    for line in sys.stdin.buffer:  # until the owner's end closes
        pid, started = (int(field) for field in line.split())
        watched.append(Watched(pid, started))
    stopped = stop_processes(
        lambda: [server.pid for server in watched if server.running()], grace_s
    )
    if stopped:
        with contextlib.suppress(OSError):  # the owner's stderr may be gone with it
            print(f"orphan_guard: stopped {stopped}, left running by their owner", file=sys.stderr)


if __name__ == "__main__":
    main()
