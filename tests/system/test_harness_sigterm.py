"""SIGTERM ends a pytest run with its fixtures torn down (testbed/harness/sigterm.py): the
servers tests start are stopped when a CI job's timeout or `kill` ends the run, as they
are on Ctrl-C. And a run started with SIGINT ignored (a shell's background job) starts
processes that Ctrl-C stops. Checked on real pytest processes; without the plugin the
teardown never runs and the children ignore SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0

MODULE = """
import os
import time
from pathlib import Path

import pytest


@pytest.fixture
def server():
    marker = Path(os.environ["MARKER"])
    marker.write_text("started")
    yield
    marker.write_text("torn down")


def test_runs_until_killed(server):
    time.sleep(120)
"""


# A test whose child process must be one SIGINT stops (as tests/service/test_cli.py's watch is).
CHILD_MODULE = """
import signal
import subprocess
import sys


def test_a_child_takes_ctrl_c():
    answer = subprocess.run(
        [sys.executable, "-c",
         "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"],
        capture_output=True, text=True, check=True,
    )
    assert answer.stdout.strip() == "True"
"""

# Starts the rest of the command line with SIGINT ignored, as a shell starts `make test &`.
SIGINT_IGNORED = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def _pytest(plugin: bool) -> list[str]:
    command = [sys.executable, "-m", "pytest", "-q", "-c", os.devnull, "-p", "no:cacheprovider"]
    return [*command, "-p", "testbed.harness.sigterm"] if plugin else command


def _environment(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'libs'}", **extra}


def _run_and_terminate(tmp_path: Path, plugin: bool) -> tuple[int, str]:
    module = tmp_path / "test_inner.py"
    module.write_text(MODULE, encoding="utf-8")
    marker = tmp_path / "marker"
    process = subprocess.Popen(
        [*_pytest(plugin), str(module)],
        cwd=tmp_path,
        env=_environment(MARKER=str(marker)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        # "started" written, not merely the file made: a SIGTERM between the two (a loaded
        # machine) would end the fixture's setup before it yields, with nothing to tear down
        while not (marker.exists() and marker.read_text() == "started"):
            if time.monotonic() > deadline or process.poll() is not None:
                pytest.fail("the inner test run never started its fixture")
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return code, marker.read_text()


def test_sigterm_tears_the_fixtures_down(tmp_path: Path) -> None:
    code, marker = _run_and_terminate(tmp_path, plugin=True)
    assert marker == "torn down"
    assert code == pytest.ExitCode.INTERRUPTED


def test_without_the_plugin_sigterm_leaves_them_up(tmp_path: Path) -> None:
    code, marker = _run_and_terminate(tmp_path, plugin=False)
    assert marker == "started"
    assert code == -signal.SIGTERM


def _run_with_sigint_ignored(tmp_path: Path, plugin: bool) -> int:
    module = tmp_path / "test_child.py"
    module.write_text(CHILD_MODULE, encoding="utf-8")
    command = [sys.executable, "-c", SIGINT_IGNORED, *_pytest(plugin)[1:], str(module)]
    done = subprocess.run(
        command, cwd=tmp_path, env=_environment(), capture_output=True, timeout=WAIT_S
    )
    return done.returncode


def test_a_run_started_with_sigint_ignored_starts_processes_ctrl_c_stops(tmp_path: Path) -> None:
    assert _run_with_sigint_ignored(tmp_path, plugin=True) == pytest.ExitCode.OK


def test_without_the_plugin_they_ignore_it(tmp_path: Path) -> None:
    assert _run_with_sigint_ignored(tmp_path, plugin=False) == pytest.ExitCode.TESTS_FAILED
