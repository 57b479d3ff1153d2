"""A pytest plugin: the servers a test session starts never outlive it, even killed.

The fixtures stop what they start, also on Ctrl-C and SIGTERM (testbed/harness/sigterm.py),
but a process the OOM killer or a SIGKILL ends runs no teardown: an xdist worker killed
that way left its Postgres, SeaweedFS and Triton (with twelve 250-350 MB Python stubs)
running. This turns on the session's guard (tools/localstack/orphan_guard.py), which
every launcher of tools/localstack tells about the process it starts, and which stops
those still running once this process has ended, however it ended.
"""

from __future__ import annotations

import pytest

from tools.localstack import orphan_guard


def pytest_configure(config: pytest.Config) -> None:
    orphan_guard.GUARD = orphan_guard.Guard()


def pytest_unconfigure(config: pytest.Config) -> None:
    guard, orphan_guard.GUARD = orphan_guard.GUARD, None
    if guard is not None:
        guard.close()
