"""The coordinator and the preview service as their own processes, for benchmarks that
measure them the way they run in a deployment (own interpreter, own CPU accounting)."""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.harness.coordinator import CoordinatorHarness, coordinator_client
from tools.localstack.processes import ServiceProcess, running_service
from tools.localstack.s3 import S3Server

READY_TIMEOUT_S = 60.0
# Port 0, no drain, and no background loops: a benchmark measures only its own traffic.
_COMMON = {"HOST": "127.0.0.1", "PORT": "0", "DRAIN_SECONDS": "0", "GRACE_SECONDS": "1"}


@dataclasses.dataclass(frozen=True)
class SeparateServices:
    coordinator: CoordinatorHarness  # a client harness on the coordinator process
    coordinator_process: ServiceProcess
    preview_process: ServiceProcess
    preview_port: int
    # their /metrics ports (None: turned off)
    metrics_ports: dict[str, int | None] = dataclasses.field(default_factory=dict)


@contextlib.asynccontextmanager
async def separate_services(
    dsn: str,
    s3: S3Server,
    scratch: Path,
    *,
    bucket: str,
    preview_settings: Mapping[str, str] | None = None,
    coordinator_settings: Mapping[str, str] | None = None,
    cpu_steps: Path | None = None,
) -> AsyncIterator[SeparateServices]:
    """Starts both (logs under `scratch`), the preview service with its own service key and
    `PREVIEW_<name>` for each of `preview_settings`, the coordinator with
    `COORDINATOR_<name>` for each of `coordinator_settings`; stops both on exit. With `cpu_steps`
    the coordinator runs under `bench.cpu_steps`, which writes its CPU by call kind there. Both
    get one random lease attestation key, as a deployment gives them (settings may override
    it, "" turning it off)."""
    attestation_key = secrets.token_urlsafe(32)
    coordinator_env = {
        **_COMMON,
        "DATABASE_URL": dsn,
        "SCHEDULER_INTERVAL_SECONDS": "0",
        "MAINTENANCE_INTERVAL_SECONDS": "0",
        "LEASE_ATTESTATION_KEY": attestation_key,
        **(coordinator_settings or {}),
    }
    steps = {} if cpu_steps is None else {"WORKSHOP_CPU_STEPS": str(cpu_steps)}
    with running_service(
        "services.coordinator" if cpu_steps is None else "bench.cpu_steps",
        {f"COORDINATOR_{key}": value for key, value in coordinator_env.items()} | steps,
        scratch / "coordinator.log",
        ready_timeout=READY_TIMEOUT_S,
        args=() if cpu_steps is None else ("services.coordinator",),
    ) as (coordinator, serving):
        async with coordinator_client(dsn, int(serving["port"])) as c:
            preview_env = {
                **_COMMON,
                "S3_ENDPOINT": s3.endpoint,
                "S3_ACCESS_KEY": s3.access_key,
                "S3_SECRET_KEY": s3.secret_key,
                "BUCKET": bucket,
                "COORDINATOR_TARGET": f"127.0.0.1:{c.port}",
                "SERVICE_KEY": await c.key(Grant(ScopeName.SERVICE), name="preview-service"),
                "CLEANUP_INTERVAL_SECONDS": "0",
                "LEASE_ATTESTATION_KEY": attestation_key,
                **(preview_settings or {}),
            }
            with running_service(
                "services.preview",
                {f"PREVIEW_{key}": value for key, value in preview_env.items()},
                scratch / "preview.log",
                ready_timeout=READY_TIMEOUT_S,
            ) as (preview, announced):
                yield SeparateServices(
                    c,
                    coordinator,
                    preview,
                    int(announced["port"]),
                    {
                        "coordinator": serving.get("metrics_port"),
                        "preview": announced.get("metrics_port"),
                    },
                )
