"""Session-wide fixtures: real Postgres, real S3 (SeaweedFS), real Triton, started on demand.

Tests live in three layers, by what they need (README, "Tests"): tests/unit (pure
logic: no server, no database), tests/service (one service with its real stores) and
tests/system (several processes, faults, the browser, the demo, images). Each test is
marked with its folder's layer, so `-m unit` selects like `tests/unit`; a test file
outside the three folders is refused at collection. The modules beside this file are
the builders and policies the layers share.
"""

from pathlib import Path

import pytest

pytest_plugins = [
    "testbed.harness.sigterm",
    "testbed.harness.orphans",
    "testbed.harness.postgres",
    "testbed.harness.s3",
    "testbed.harness.triton",
    "testbed.harness.coordinator",
    "testbed.harness.preview",
    "testbed.harness.gateway",
    "testbed.harness.browser",
    "tests.sweep.report",
    "tests.durations",
]

TESTS = Path(__file__).resolve().parent
LAYERS = ("unit", "service", "system")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        layer = item.path.relative_to(TESTS).parts[0]
        if layer not in LAYERS:
            raise pytest.UsageError(
                f"{item.path}: a test belongs in one of tests/{{unit,service,system}}"
            )
        item.add_marker(layer)
    # The slowest layer first: with pytest-xdist the long system tests start while the
    # many short ones remain to fill both workers, instead of ending the run one at a time
    # (a stable sort: each file keeps its order).
    items.sort(key=lambda item: -LAYERS.index(item.path.relative_to(TESTS).parts[0]))
