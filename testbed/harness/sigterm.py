"""A pytest plugin: SIGTERM ends a test run as Ctrl-C does, and Ctrl-C works in every run.

pytest turns SIGINT into KeyboardInterrupt, so every fixture tears down and the servers
the tests started (Postgres, SeaweedFS, Triton, the services) are stopped. SIGTERM, what
a CI job's timeout or `kill` sends, would otherwise end the process at once and leave
them running.

A shell starts a background job (`make test &`, `nohup`) with SIGINT ignored, and every
process the tests start inherits that: a `workshop runs watch` the CLI tests stop with
SIGINT then never stops (tests/service/test_cli.py timed out this way). So an ignored SIGINT is
given Python's default handler back for the run. Both handlers are installed when the
run starts and put back when it ends.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

Handler = Callable[[int, FrameType | None], Any] | int | None
_previous: dict[signal.Signals, Handler] = {}


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    _previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        _previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _previous:
        number, handler = _previous.popitem()
        signal.signal(number, handler)
