"""A real S3 server per test session (SeaweedFS ``weed mini``) and a fresh bucket per test.

Fixtures:

- ``s3_server`` (session): ``weed mini`` from ``tools.localstack.s3`` on free loopback ports
  with one random admin key pair, so request signatures are really checked; skips when no
  ``weed`` binary is installed. ``restart()`` kills it and starts it again on the same
  data and ports.
- ``s3_bucket`` (function): a new, uniquely named bucket; emptied and removed afterwards;
  ``fresh_bucket(s3_server)`` makes one for a fixture of a wider scope.

Outside pytest (benchmarks) the same server comes from the context manager
``running_s3_server(root)``, which the session fixture uses too.
"""

from __future__ import annotations

import contextlib
import statistics
import uuid
from collections.abc import Iterator
from typing import NamedTuple

import pytest
from minio import Minio
from minio.deleteobjects import DeleteObject

from tools.localstack.s3 import (
    REGION,
    TIMINGS,
    S3Server,
    S3Timings,
    WeedNotFound,
    WeedPorts,
    find_weed,
    running_s3_server,
)
from tools.localstack.s3 import S3LaunchError as S3HarnessError

__all__ = [
    "REGION",
    "TIMINGS",
    "S3Bucket",
    "S3HarnessError",
    "S3Server",
    "S3Timings",
    "WeedNotFound",
    "WeedPorts",
    "find_weed",
    "running_s3_server",
]


class S3Bucket(NamedTuple):
    server: S3Server
    name: str


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    try:
        weed = find_weed()
    except WeedNotFound as missing:
        pytest.skip(str(missing))
    with running_s3_server(tmp_path_factory.mktemp("s3"), weed) as server:
        yield server


@contextlib.contextmanager
def fresh_bucket(server: S3Server) -> Iterator[S3Bucket]:
    """A new, uniquely named bucket, emptied and removed on exit (fixtures of any scope)."""
    name = f"workshop-test-{uuid.uuid4().hex[:16]}"
    server.client().make_bucket(name)
    try:
        yield S3Bucket(server=server, name=name)
    finally:
        if server.pid is None:  # the test killed the server and left it down
            server.start()
        _remove_bucket(server.client(), name)


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Iterator[S3Bucket]:
    """A fresh bucket for this test alone, emptied and removed afterwards."""
    with fresh_bucket(s3_server) as bucket:
        yield bucket


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    ready = TIMINGS.ready_s
    if not ready:
        return
    line = f"s3 harness: weed ready in {ready[0]:.2f} s"
    if len(ready) > 1:
        line += f", {len(ready) - 1} restarts: median {statistics.median(ready[1:]):.2f} s"
    terminalreporter.write_line(line)


def _remove_bucket(client: Minio, name: str) -> None:
    doomed = (
        DeleteObject(item.object_name)
        for item in client.list_objects(name, recursive=True)
        if item.object_name is not None
    )
    for failure in client.remove_objects(name, doomed):
        raise S3HarnessError(f"could not empty bucket {name}: {failure}")
    client.remove_bucket(name)
