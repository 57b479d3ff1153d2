"""Start Workshop services as real processes (from the repository root) and stop exactly the
ones started; the launcher is `tools.localstack.processes`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tools.localstack import processes

REPO = Path(__file__).resolve().parents[2]


class ServiceProcess(processes.ServiceProcess):
    """One running service: `python -m services.<name>` with the given environment."""

    def __init__(self, module: str, env: Mapping[str, str], log_path: Path) -> None:
        super().__init__(module, env, log_path, cwd=REPO)


@contextlib.contextmanager
def running_service(
    module: str, env: Mapping[str, str], log_path: Path, *, ready_timeout: float = 60.0
) -> Iterator[tuple[ServiceProcess, dict[str, Any]]]:
    """Start `module`, wait for its `serving` announcement, and always stop it."""
    service = ServiceProcess(module, env, log_path)
    try:
        serving = service.wait_event("serving", timeout=ready_timeout)
        yield service, serving
    finally:
        service.stop()
