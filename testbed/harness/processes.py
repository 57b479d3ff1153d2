"""Start Workshop services as real processes (from the repository root) and stop exactly the
ones started; the launcher is `tools.localstack.processes`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tools.localstack import processes

REPO = Path(__file__).resolve().parents[2]

# A gateway on free loopback ports, its coordinator and preview service at an address
# where nothing listens (the discard port), so its API answers 503.
GATEWAY_ALONE = {
    "HOST": "127.0.0.1",
    "PORT": "0",
    "HTTP_HOST": "127.0.0.1",
    "HTTP_PORT": "0",
    "COORDINATOR_TARGET": "127.0.0.1:9",
    "PREVIEW_TARGET": "127.0.0.1:9",
}
# A processor with nothing to claim from (no coordinator at its address): it serves health
# and keeps retrying its claims, which is what a processor waiting for its coordinator does.
PROCESSOR_ALONE = {
    "HOST": "127.0.0.1",
    "PORT": "0",
    "DEVICE_ID": "gpu-box",
    "KEY": "wk_unused.unused",
    "RUNTIME_ID": "workshop-" + "0" * 32,
    "COORDINATOR_TARGET": "127.0.0.1:1",
    "PREVIEW_TARGET": "127.0.0.1:1",
    "S3_ENDPOINT": "127.0.0.1:1",
    "S3_ACCESS_KEY": "unused",
    "S3_SECRET_KEY": "unused",
}


def prefixed(prefix: str, values: Mapping[str, str]) -> dict[str, str]:
    """`values` as one service's variables: prefixed("GATEWAY", {"PORT": "0"}) sets
    GATEWAY_PORT."""
    return {f"{prefix}_{key}": value for key, value in values.items()}


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
