"""The sweep's summary at the end of a pytest run (a plugin of tests/conftest.py): the
sweep's module adds its lines here as it finishes, when output is still captured."""

from __future__ import annotations

import pytest

SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in SUMMARY:
        terminalreporter.write_line(line)
