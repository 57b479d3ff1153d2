"""A pytest plugin: SIGTERM ends a test run as Ctrl-C does.

pytest turns SIGINT into KeyboardInterrupt, so every fixture tears down and the servers
the tests started (Postgres, SeaweedFS, Triton, the services) are stopped. SIGTERM, what
a CI job's timeout or `kill` sends, would otherwise end the process at once and leave
them running. The handler is installed when the run starts and put back when it ends.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

_previous: Callable[[int, FrameType | None], Any] | int | None = None


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    global _previous
    _previous = signal.signal(signal.SIGTERM, _interrupt)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _previous is not None:
        signal.signal(signal.SIGTERM, _previous)
