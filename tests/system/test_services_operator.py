"""Operator proof: each service runs as its own process and answers the real grpcurl.

For every service: `list` shows its services, `describe` works and shows the
contracts' comments, health Check says SERVING, an RPC that is not implemented yet
answers UNIMPLEMENTED, and
after SIGTERM it reports NOT_SERVING and exits within its grace period.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.harness.postgres import PostgresCluster
from testbed.harness.processes import GATEWAY_ALONE, PROCESSOR_ALONE, ServiceProcess, prefixed
from testbed.harness.s3 import S3Server

GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or "grpcurl"
DRAIN_SECONDS = 2.0
GRACE_SECONDS = 3.0
COMMON = {
    "HOST": "127.0.0.1",
    "PORT": "0",
    "DRAIN_SECONDS": str(DRAIN_SECONDS),
    "GRACE_SECONDS": str(GRACE_SECONDS),
}


def grpcurl(port: int, *args: str, data: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [GRPCURL, "-plaintext", "-max-time", "10"]
    if data is not None:
        command += ["-d", data]
    command += [f"127.0.0.1:{port}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def coordinator_env(pg_cluster: PostgresCluster, pg_dsn: str) -> dict[str, str]:
    return prefixed("COORDINATOR", {**COMMON, "DATABASE_URL": pg_dsn})


@pytest.fixture
def preview_env(s3_server: S3Server) -> dict[str, str]:
    return prefixed(
        "PREVIEW",
        {
            **COMMON,
            "S3_ENDPOINT": s3_server.endpoint,
            "S3_ACCESS_KEY": s3_server.access_key,
            "S3_SECRET_KEY": s3_server.secret_key,
            "BUCKET": "workshop-operator-test",
            "SERVICE_KEY": "wk_not_used_here.unused",
            # no coordinator there (the discard port): not the default 127.0.0.1:50051, where
            # another test's stack may be listening and refuse this key
            "COORDINATOR_TARGET": "127.0.0.1:9",
            "CLEANUP_INTERVAL_SECONDS": "0",
        },
    )


@pytest.fixture
def gateway_env() -> dict[str, str]:
    return prefixed("GATEWAY", {**GATEWAY_ALONE, **COMMON})


@pytest.fixture
def processor_env() -> dict[str, str]:
    return prefixed("PROCESSOR", {**PROCESSOR_ALONE, **COMMON})


CASES = [
    # module, env fixture, services it hosts, an RPC to call without a credential
    (
        "services.coordinator",
        "coordinator_env",
        [
            "workshop.v1.IdentityService",
            "workshop.v1.OperatorService",
            "workshop.v1.WorkshopService",
            "workshop.v1.JobService",
            "workshop.v1.PublicationService",
        ],
        "workshop.v1.WorkshopService/GetSummary",
    ),
    ("services.preview", "preview_env", ["workshop.v1.PreviewService"], None),
    ("services.gateway", "gateway_env", [], None),
    ("services.processor", "processor_env", [], None),
]


@pytest.mark.parametrize(("module", "env_fixture", "services", "unauthenticated"), CASES)
def test_operator_can_list_describe_check_and_stop(
    module: str,
    env_fixture: str,
    services: list[str],
    unauthenticated: str | None,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    env: dict[str, str] = request.getfixturevalue(env_fixture)
    service = ServiceProcess(module, {**env, "OTEL_TRACES_EXPORTER": "console"}, tmp_path / "log")
    try:
        port = int(service.wait_event("serving", timeout=60)["port"])

        listed = grpcurl(port, "list")
        assert listed.returncode == 0, listed.stderr
        names = set(listed.stdout.split())
        assert {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names
        assert set(services) <= names

        for name in [*services, "grpc.health.v1.Health"]:
            described = grpcurl(port, "describe", name)
            assert described.returncode == 0, described.stderr
            assert f"{name} is a service" in described.stdout
            if name.startswith("workshop."):
                # reflection serves the contracts with their comments
                assert "\n// " in described.stdout, described.stdout

        health = grpcurl(port, "grpc.health.v1.Health/Check", data="{}")
        assert health.returncode == 0, health.stderr
        assert json.loads(health.stdout) == {"status": "SERVING"}

        if unauthenticated is not None:
            called = grpcurl(port, unauthenticated, data="{}")
            assert called.returncode != 0
            assert "Code: Unauthenticated" in called.stderr, called.stderr
            # the OpenTelemetry interceptor traced the call (console exporter on stderr)
            assert unauthenticated.split("/")[1] in service.log_tail(400)

        service.terminate()
        stopped_at = time.monotonic()
        during_drain = grpcurl(port, "grpc.health.v1.Health/Check", data="{}")
        assert json.loads(during_drain.stdout) == {"status": "NOT_SERVING"}, during_drain.stderr
        code = service.process.wait(timeout=DRAIN_SECONDS + GRACE_SECONDS + 5)
        assert code == 0, service.log_tail()
        assert time.monotonic() - stopped_at < DRAIN_SECONDS + GRACE_SECONDS + 2
    finally:
        service.stop()


def test_gateway_alone_answers_health_and_503_for_its_unreachable_services(
    gateway_env: dict[str, str], tmp_path: Path
) -> None:
    import urllib.error
    import urllib.request

    service = ServiceProcess("services.gateway", gateway_env, tmp_path / "log")
    try:
        service.wait_event("serving", timeout=60)
        http_port = int(service.wait_event("http", timeout=10)["port"])
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=5) as reply:
            assert json.load(reply) == {"status": "ok"}
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/workshop/runs", timeout=5)
        # Nothing listens at the coordinator's address: a clear 503, never a 500.
        assert caught.value.code == 503
        body = json.load(caught.value)
        assert (body["code"], body["reason"]) == ("UNAVAILABLE", "UNAVAILABLE")
        caught.value.close()
    finally:
        assert service.stop() == 0


def test_coordinator_without_database_exits_with_a_message(tmp_path: Path) -> None:
    env = prefixed("COORDINATOR", {**COMMON, "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"})
    service = ServiceProcess("services.coordinator", env, tmp_path / "log")
    code = service.process.wait(timeout=30)
    service.stop()
    assert code == 1
    assert "cannot start" in service.log_path.read_text()
