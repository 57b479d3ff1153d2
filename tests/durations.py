"""Every run keeps its durations (a plugin of tests/conftest.py).

`--durations=20` prints the slowest tests; this plugin also writes the whole table to
``.test-results/durations.txt`` under the work tree (``WORKSHOP_DURATIONS_FILE``
moves it), so that the suite's growth can be compared run to run: each test's time
(setup + call + teardown, as pytest measured it on whichever xdist worker ran it),
then each file's total. Only the process that reports the run writes it: with xdist
that is the controller, which receives every worker's reports.

`make test` runs the suite in two pytest runs (the tests that must run alone, then the
rest in parallel); the second sets ``WORKSHOP_DURATIONS_CONTINUE=1`` to add its tests
to the first's table (kept as JSON beside it) instead of replacing it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATH = ROOT / ".test-results" / "durations.txt"

_seconds: dict[str, float] = defaultdict(float)
_outcomes: dict[str, str] = {}
_began = time.time()


def durations_path() -> Path:
    return Path(os.environ.get("WORKSHOP_DURATIONS_FILE", DEFAULT_PATH))


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    # A run that does not continue another starts a new table, even one that runs no
    # test (so the next, continuing run never adds to an older run's figures).
    if _is_xdist_worker(session.config) or os.environ.get("WORKSHOP_DURATIONS_CONTINUE") == "1":
        return
    durations_path().with_suffix(".json").unlink(missing_ok=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid] += report.duration
    if report.when == "call" or report.outcome != "passed":
        _outcomes[report.nodeid] = report.outcome


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    config = terminalreporter.config
    if _is_xdist_worker(config) or not _seconds:
        return
    path = durations_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = path.with_suffix(".json")
    seconds, outcomes = dict(_seconds), dict(_outcomes)
    wall_s = time.time() - _began
    workers = str(config.getoption("numprocesses", default=None) or 1)
    if os.environ.get("WORKSHOP_DURATIONS_CONTINUE") == "1" and raw.exists():
        earlier = json.loads(raw.read_text())
        seconds = {**earlier["seconds"], **seconds}
        outcomes = {**earlier["outcomes"], **outcomes}
        wall_s += earlier["wall_s"]
        workers = f"{earlier['workers']}, then {workers}"
    record = {"seconds": seconds, "outcomes": outcomes, "wall_s": wall_s, "workers": workers}
    raw.write_text(json.dumps(record))
    path.write_text(render(seconds, outcomes, wall_s=wall_s, workers=workers))
    terminalreporter.write_line(f"durations of all {len(seconds)} tests: {path}")


def render(
    seconds: dict[str, float], outcomes: dict[str, str], *, wall_s: float, workers: str
) -> str:
    """The table: a header, every test slowest first, then every file slowest first."""
    by_file: dict[str, float] = defaultdict(float)
    for nodeid, spent in seconds.items():
        by_file[nodeid.split("::", 1)[0]] += spent
    lines = [
        f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  commit {_commit()}  "
        f"wall {wall_s:.1f} s  test time {sum(seconds.values()):.1f} s  "
        f"tests {len(seconds)}  workers {workers}",
        "",
        "# seconds  outcome  test",
    ]
    for nodeid, spent in sorted(seconds.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"{spent:9.2f}  {outcomes.get(nodeid, 'passed'):7}  {nodeid}")
    lines += ["", "# seconds  file"]
    for file, spent in sorted(by_file.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"{spent:9.2f}  {file}")
    return "\n".join(lines) + "\n"


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
