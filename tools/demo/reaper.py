"""Nothing the demo starts outlives it.

The demo marks its environment with `WORKSHOP_DEMO_STACK=<work dir>|<demo pid>` before it
starts anything, so every process of its stack (Postgres, SeaweedFS, Triton, the
services; each in its own session, out of reach of the terminal's signals) carries
the mark. A watchdog, `python -m tools.demo.reaper <mark>`, runs beside the demo in
a session of its own and reads a pipe whose writing end only the demo holds. When
the demo ends in any way (done, Ctrl-C, SIGTERM, SIGHUP when its terminal closes,
SIGKILL) the pipe closes, and the watchdog stops every process that still carries
the mark, and those recorded in the work directory's stack-pids.json (Postgres
rewrites its environment for its process titles, so it is found by its record):
SIGTERM, then SIGKILL after `GRACE_SECONDS`. `python -m tools.demo stop` finds a
stack the same way.

Only processes carrying this demo's mark are ever signalled.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tools.demo.workdir import live_recorded_pids
from tools.localstack.orphan_guard import stop_processes

MARK_VARIABLE = "WORKSHOP_DEMO_STACK"
GRACE_SECONDS = 10.0
# The writing end of the watchdog's pipe: held, never written, closed by the process's end.
_held: list[int] = []


def mark_for(workdir: Path, demo_pid: int) -> str:
    return f"{workdir}|{demo_pid}"


def demo_pid_of(mark: str) -> int:
    return int(mark.rsplit("|", 1)[1])


def workdir_of(mark: str) -> Path:
    return Path(mark.rsplit("|", 1)[0])


def mark_stack(workdir: Path) -> str:
    """Marks every process this one starts from now on as part of its stack."""
    mark = mark_for(workdir, os.getpid())
    os.environ[MARK_VARIABLE] = mark
    return mark


def start_watchdog(mark: str) -> int:
    """Starts the watchdog that stops the marked processes once this process ends."""
    read_end, write_end = os.pipe()
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "tools.demo.reaper", mark],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        env={k: v for k, v in os.environ.items() if k != MARK_VARIABLE},
    )
    os.close(read_end)
    _held.append(write_end)
    return watchdog.pid


def marks_of_live_processes() -> dict[int, str]:
    """pid -> demo mark, for every live process of this user that carries one."""
    found: dict[int, str] = {}
    prefix = f"{MARK_VARIABLE}=".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or another user's
        for variable in environ.split(b"\0"):
            if variable.startswith(prefix):
                found[int(entry.name)] = variable[len(prefix) :].decode(errors="replace")
                break
    return found


def stacks_of(workdir: Path | None) -> dict[str, list[int]]:
    """mark -> its live processes, for the demos run from `workdir` (None: every demo)."""
    stacks: dict[str, list[int]] = {}
    for pid, mark in marks_of_live_processes().items():
        if workdir is None or workdir_of(mark) == workdir.resolve():
            stacks.setdefault(mark, []).append(pid)
    return stacks


def stack_processes(mark: str) -> list[int]:
    """The live processes of the stack that `mark` names: marked or recorded."""
    marked = [pid for pid, found in marks_of_live_processes().items() if found == mark]
    recorded = live_recorded_pids(workdir_of(mark))
    return sorted(set(marked) | set(recorded))


def stop_stack(mark: str, grace_seconds: float = GRACE_SECONDS) -> list[int]:
    """Stops the stack that `mark` names; returns the pids signalled. (A zombie carries
    no environment, so `stack_processes` counts it as gone.)"""
    return stop_processes(lambda: stack_processes(mark), grace_seconds)


def main(argv: list[str]) -> int:
    (mark,) = argv
    # Wait for the demo's end: EOF once the only writer is gone.
    while sys.stdin.buffer.read(4096):
        pass
    stop_stack(mark)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
