"""The demo's work directory: logs, recordings, preview copies, and the stack's state.

Without `--workdir` every run gets a new temporary directory, so runs never share state.
A chosen directory is reused only when it is empty or was a demo's before and no stack of
that demo still runs (its PIDs are recorded while it runs); its old contents are removed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

MARKER = ".workshop-demo"
PIDS_FILE = "stack-pids.json"


class WorkdirError(RuntimeError):
    pass


def prepare_workdir(chosen: Path | None) -> Path:
    if chosen is None:
        workdir = Path(tempfile.mkdtemp(prefix="workshop-demo-"))
    else:
        workdir = chosen.resolve()
        if workdir.is_dir() and any(workdir.iterdir()):
            _clear_previous(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
    (workdir / MARKER).touch()
    return workdir


def record_pids(workdir: Path, pids: Mapping[str, int]) -> None:
    (workdir / PIDS_FILE).write_text(json.dumps(dict(pids), indent=2) + "\n")


def forget_pids(workdir: Path) -> None:
    (workdir / PIDS_FILE).unlink(missing_ok=True)


def _clear_previous(workdir: Path) -> None:
    if not (workdir / MARKER).exists():
        raise WorkdirError(f"{workdir} is not empty and is not a demo's work directory")
    alive = _live_pids(workdir)
    if alive:
        raise WorkdirError(
            f"a demo stack still runs from {workdir} (pids {', '.join(map(str, alive))}): "
            f"stop it first (Ctrl-C in its terminal), or delete {workdir / PIDS_FILE} "
            "if those processes are not the demo's"
        )
    for entry in workdir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _live_pids(workdir: Path) -> list[int]:
    try:
        recorded = json.loads((workdir / PIDS_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return []
    alive = []
    for pid in recorded.values():
        try:
            os.kill(int(pid), 0)
        except (ProcessLookupError, ValueError):
            continue
        except PermissionError:
            pass  # exists, owned by someone else
        alive.append(int(pid))
    return alive
