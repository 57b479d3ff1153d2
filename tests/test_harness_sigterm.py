"""SIGTERM ends a pytest run with its fixtures torn down (testbed/harness/sigterm.py): the
servers tests start are stopped when a CI job's timeout or `kill` ends the run, as they
are on Ctrl-C. Checked on a real pytest process; without the plugin the teardown never
runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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


def _run_and_terminate(tmp_path: Path, plugin: bool) -> tuple[int, str]:
    module = tmp_path / "test_inner.py"
    module.write_text(MODULE, encoding="utf-8")
    marker = tmp_path / "marker"
    env = {**os.environ, "MARKER": str(marker), "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'libs'}"}
    command = [sys.executable, "-m", "pytest", "-q", "-c", os.devnull, "-p", "no:cacheprovider"]
    if plugin:
        command += ["-p", "testbed.harness.sigterm"]
    process = subprocess.Popen(
        [*command, str(module)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not marker.exists():
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
