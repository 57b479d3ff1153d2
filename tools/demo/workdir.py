"""The demo's work directory: logs, recordings, preview copies, and the stack's state.

Without `--workdir` every run gets a new temporary directory, so runs never share state;
a kept demo (`--keep`) runs from the default work directory, `$TMPDIR/workshop-demo-$USER`
(`/tmp/workshop-demo-$USER`), the one `make demo-stop` without ARGS stops, so a second
kept demo is told the first still runs. A chosen (or the default) directory is reused only
when it is empty or was a demo's before and no stack of that demo still runs; its old
contents are removed. A demo holds an exclusive lock on
`.workshop-demo.lock` in its directory for as long as it runs, so two demos started on
one directory at once cannot both claim it: the second is told who holds it.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

MARKER = ".workshop-demo"
LOCK_FILE = ".workshop-demo.lock"
PIDS_FILE = "stack-pids.json"
# The open lock file of this process's work directory: the claim lasts as long as it.
_claims: list[int] = []


class WorkdirError(RuntimeError):
    pass


def default_workdir() -> Path:
    """The work directory of a kept demo run without `--workdir`, and the one `demo stop`
    without `--workdir` stops: one per user, under the temporary directory ($TMPDIR)."""
    return Path(tempfile.gettempdir()) / f"workshop-demo-{getpass.getuser()}"


def stop_hint(workdir: Path) -> str:
    """The command that stops the demo running from `workdir`."""
    if workdir == default_workdir().resolve():
        return "make demo-stop"
    return f"make demo-stop ARGS='--workdir {workdir}'"


def prepare_workdir(chosen: Path | None) -> Path:
    if chosen is None:
        workdir = Path(tempfile.mkdtemp(prefix="workshop-demo-"))
    else:
        workdir = chosen.resolve()
        if workdir.is_dir() and any(workdir.iterdir()) and not (workdir / MARKER).exists():
            raise WorkdirError(f"{workdir} is not empty and is not a demo's work directory")
        workdir.mkdir(parents=True, exist_ok=True)
    (workdir / MARKER).touch()
    _claim(workdir)
    _clear_previous(workdir)
    return workdir


def _claim(workdir: Path) -> None:
    descriptor = os.open(workdir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(descriptor, 32).decode(errors="replace").strip() or "another process"
        os.close(descriptor)
        raise WorkdirError(
            f"a demo (pid {holder}) runs from {workdir}: stop it first: "
            f"{stop_hint(workdir)} (or Ctrl-C in its terminal)"
        ) from None
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"{os.getpid()}\n".encode())
    _claims.append(descriptor)


def record_pids(workdir: Path, pids: Mapping[str, int]) -> None:
    """Records the stack's processes, each with its start time, so a pid that was reused
    by another process since is never taken for the demo's."""
    recorded = {name: [pid, _start_time(pid)] for name, pid in pids.items()}
    (workdir / PIDS_FILE).write_text(json.dumps(recorded, indent=2) + "\n")


def forget_pids(workdir: Path) -> None:
    (workdir / PIDS_FILE).unlink(missing_ok=True)


def _clear_previous(workdir: Path) -> None:
    alive = live_recorded_pids(workdir)
    if alive:
        raise WorkdirError(
            f"a demo stack still runs from {workdir} (pids {', '.join(map(str, alive))}): "
            f"stop it first: {stop_hint(workdir)} (or Ctrl-C in its terminal), or delete "
            f"{workdir / PIDS_FILE} if those processes are not the demo's"
        )
    for entry in workdir.iterdir():
        if entry.name in (MARKER, LOCK_FILE):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def live_recorded_pids(workdir: Path) -> list[int]:
    """The recorded processes of `workdir`'s stack that still run."""
    try:
        recorded = json.loads((workdir / PIDS_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return []
    return [
        pid
        for pid, started in recorded.values()
        if started is not None and _start_time(pid) == started
    ]


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] == "Z" else int(fields[19])
