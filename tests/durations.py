"""Every run keeps its durations (a plugin of tests/conftest.py).

`--durations=20` prints the slowest tests; this plugin also writes the whole table to
``.test-results/durations.txt`` under the work tree (``WORKSHOP_DURATIONS_FILE``
moves it), so that the suite's growth can be compared run to run: each test's time
(setup + call + teardown, as pytest measured it on whichever xdist worker ran it),
then each file's total. Only the process that reports the run writes it: with xdist
that is the controller, which receives every worker's reports.

Beside each test's time, the CPU it spent (user + system, from `getrusage`): the worker
process's own (the test and whatever it runs in process), then the processes that ended
and were reaped while it ran (a service, the CLI, the demo). A process is counted where it
is reaped, which is mostly the test that started it; one left to the next `Popen` to reap
lands on a later test. The servers a worker shares between its tests (Postgres,
SeaweedFS, Triton) are in neither. With fewer cores than workers the suite is bound by
CPU, not by waiting: these columns say what to trim.

`make test` runs the suite in two pytest runs (the tests that must run alone, then the
rest in parallel); the second sets ``WORKSHOP_DURATIONS_CONTINUE=1`` to add its tests
to the first's table (kept as JSON beside it) instead of replacing it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path

import pluggy
import pytest

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATH = ROOT / ".test-results" / "durations.txt"

_seconds: dict[str, float] = defaultdict(float)
_cpu: dict[str, tuple[float, float]] = {}  # nodeid -> (own, reaped)
_outcomes: dict[str, str] = {}
_CPU_AT_START = pytest.StashKey[tuple[float, float]]()
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


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds so far: this process's own, and its reaped children's."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_AT_START] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    outcome = yield
    began = item.stash.get(_CPU_AT_START, None)
    if call.when == "teardown" and began is not None:
        # user_properties travel with the report from an xdist worker to the controller
        own, reaped = _cpu_seconds()
        properties = outcome.get_result().user_properties
        properties += [("cpu_own_s", own - began[0]), ("cpu_reaped_s", reaped - began[1])]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid] += report.duration
    properties = dict(report.user_properties)
    own, reaped = properties.get("cpu_own_s"), properties.get("cpu_reaped_s")
    if isinstance(own, float) and isinstance(reaped, float):
        _cpu[report.nodeid] = (own, reaped)
    if report.when == "call" or report.outcome != "passed":
        _outcomes[report.nodeid] = report.outcome


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    config = terminalreporter.config
    if _is_xdist_worker(config) or not _seconds:
        return
    path = durations_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = path.with_suffix(".json")
    seconds, cpu, outcomes = dict(_seconds), dict(_cpu), dict(_outcomes)
    wall_s = time.time() - _began
    workers = str(config.getoption("numprocesses", default=None) or 1)
    if os.environ.get("WORKSHOP_DURATIONS_CONTINUE") == "1" and raw.exists():
        earlier = json.loads(raw.read_text())
        seconds = {**earlier["seconds"], **seconds}
        cpu = {
            **{nodeid: (own, reaped) for nodeid, (own, reaped) in earlier.get("cpu", {}).items()},
            **cpu,
        }
        outcomes = {**earlier["outcomes"], **outcomes}
        wall_s += earlier["wall_s"]
        workers = f"{earlier['workers']}, then {workers}"
    record = {
        "seconds": seconds,
        "cpu": cpu,
        "outcomes": outcomes,
        "wall_s": wall_s,
        "workers": workers,
    }
    raw.write_text(json.dumps(record))
    path.write_text(render(seconds, cpu, outcomes, wall_s=wall_s, workers=workers))
    terminalreporter.write_line(f"durations of all {len(seconds)} tests: {path}")


def render(
    seconds: dict[str, float],
    cpu: dict[str, tuple[float, float]],
    outcomes: dict[str, str],
    *,
    wall_s: float,
    workers: str,
) -> str:
    """The table: a header, every test slowest first, then every file slowest first."""
    by_file: dict[str, float] = defaultdict(float)
    cpu_by_file: dict[str, tuple[float, float]] = defaultdict(lambda: (0.0, 0.0))
    for nodeid, spent in seconds.items():
        file = nodeid.split("::", 1)[0]
        by_file[file] += spent
        own, reaped = cpu.get(nodeid, (0.0, 0.0))
        cpu_by_file[file] = (cpu_by_file[file][0] + own, cpu_by_file[file][1] + reaped)
    lines = [
        f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  commit {_commit()}  "
        f"wall {wall_s:.1f} s  test time {sum(seconds.values()):.1f} s  "
        f"CPU own {sum(own for own, _ in cpu.values()):.1f} s, "
        f"reaped {sum(reaped for _, reaped in cpu.values()):.1f} s  "
        f"tests {len(seconds)}  workers {workers}",
        "",
        "# seconds  cpu own  reaped  outcome  test",
    ]
    for nodeid, spent in sorted(seconds.items(), key=lambda item: (-item[1], item[0])):
        own, reaped = cpu.get(nodeid, (0.0, 0.0))
        lines.append(
            f"{spent:9.2f}  {own:7.1f}  {reaped:6.1f}  {outcomes.get(nodeid, 'passed'):7}  {nodeid}"
        )
    lines += ["", "# seconds  cpu own  reaped  file"]
    for file, spent in sorted(by_file.items(), key=lambda item: (-item[1], item[0])):
        own, reaped = cpu_by_file[file]
        lines.append(f"{spent:9.2f}  {own:7.1f}  {reaped:6.1f}  {file}")
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
