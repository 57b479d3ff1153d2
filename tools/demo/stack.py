"""The demo's local stack, all on loopback ports chosen at start and embedded defaults.

Postgres (a throwaway cluster), SeaweedFS and the bundled Triton start in parallel; then the
coordinator (`migrate` and `create-admin-key` first), the preview service with its own
`service` key, the gateway (HTTP and WebSocket) with its `gateway` key, and one processor
with a `workshop:run` key bound to the demo's device, its runtime registered with
`python -m services.processor register-runtime`. The demo user `demo` gets a random
password and an Agent key (scope `workshop`), with which the demo reaches the product
through the gateway as users do. Everything stops, newest first, when the `running_stack`
block ends (see `launcher.Launcher`): services and Triton with SIGTERM then SIGKILL,
SeaweedFS with SIGKILL, Postgres with `pg_ctl stop`.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from tools.demo.launcher import Launcher, Service
from tools.demo.reaper import MARK_VARIABLE
from tools.demo.terminal import Console
from tools.demo.workdir import record_pids
from tools.localstack.postgres import PostgresCluster, create_database, postgres_cluster
from tools.localstack.processes import announcements
from tools.localstack.s3 import S3Server, running_s3_server
from tools.localstack.triton import RestartableTriton, TritonServer, supervised_triton
from workshop.kit.auth import bearer_metadata
from workshop.kit.cli import COORDINATOR_ENV, KEY_ENV
from workshop.v1 import common_pb2, operator_pb2_grpc
from workshop.v1 import operator_pb2 as op

DEVICE_ID = "demo-gpu"
USER_ID = "demo"
DATABASE = "workshop"
PREVIEW_BUCKET = "workshop"
RECORDINGS_BUCKET = "recordings"
CALL_TIMEOUT_S = 30.0
# What the services and operator commands read from the environment: a shell's own values
# must not leak into the demo's stack, which runs on embedded defaults only.
_OWN_PREFIXES = ("COORDINATOR_", "PREVIEW_", "PROCESSOR_", "GATEWAY_", "WORKSHOP_")


@dataclass(frozen=True)
class Keys:
    """Secrets of the services' own keys."""

    preview: str  # scope `service`
    processor: str  # scope `workshop:run`, bound to the demo's device
    gateway: str  # scope `gateway`


@dataclass(frozen=True)
class DemoUser:
    """The website user the demo acts as, and its Agent key (scope `workshop`)."""

    user_id: str
    password: str
    agent_key: str


@dataclass(frozen=True)
class Stack:
    workdir: Path
    logs: Path
    base_env: Mapping[str, str]
    database_url: str
    s3: S3Server
    triton: TritonServer
    coordinator: str
    preview: str
    gateway: str  # the HTTP base URL, http://127.0.0.1:PORT
    processor: str
    admin_key: str
    user: DemoUser
    device_id: str
    runtime_id: str
    pids: Mapping[str, int]
    # Each service's Prometheus endpoint, by name (the gateway's is on its HTTP port).
    metrics: Mapping[str, str]
    # The processor's own settings (PROCESSOR_*), which `workshop doctor` checks a host with.
    processor_env: Mapping[str, str]

    @property
    def admin(self) -> tuple[tuple[str, str]]:
        return bearer_metadata(self.admin_key)

    def operator_env(self) -> dict[str, str]:
        """How the operator command lines find the coordinator and the admin key (kept out
        of their arguments, so it shows in no process list)."""
        return {COORDINATOR_ENV: self.coordinator, KEY_ENV: self.admin_key}


def clean_environment() -> dict[str, str]:
    """This process's environment without the services' own settings; the demo's stack
    mark (tools.demo.reaper) stays, so that the watchdog finds every service it starts."""
    return {
        k: v for k, v in os.environ.items() if k == MARK_VARIABLE or not k.startswith(_OWN_PREFIXES)
    }


@contextmanager
def running_stack(workdir: Path, console: Console) -> Iterator[Stack]:
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    base_env = clean_environment()
    with Launcher(console, logs, base_env) as launch:
        console.line("starting Postgres, SeaweedFS and Triton…")
        postgres = launch.background("Postgres", postgres_cluster, _describe_postgres)
        s3 = launch.background(
            "SeaweedFS", lambda: running_s3_server(_empty_dir(workdir / "s3")), _describe_s3
        )
        # Restarted when it exits on its own, as Kubernetes would restart it.
        triton = launch.background(
            "Triton",
            lambda: supervised_triton(
                _empty_dir(workdir / "triton"), lambda text: console.line(f"  {text}")
            ),
            _describe_triton,
        )
        cluster = postgres.result()
        # Postgres carries no stack mark (tools.demo.reaper): record it at once.
        record_pids(workdir, {"postgres": cluster.pid or 0})
        database_url = create_database(cluster, DATABASE)
        # One secret for both, as a deployment's Secret: claims carry signed lease
        # attestations that spare the preview service a CheckLease per job.
        attestation_key = secrets.token_urlsafe(32)
        coordinator, admin_key = _start_coordinator(launch, console, database_url, attestation_key)
        keys = _device_and_keys(coordinator.target, admin_key)
        server = s3.result()
        preview = _start_preview(launch, server, coordinator.target, keys.preview, attestation_key)
        server.client().make_bucket(RECORDINGS_BUCKET)
        runtime_id = _register_runtime(launch, console, coordinator.target, admin_key)
        user = _demo_user(console, coordinator.target, admin_key)
        preview.wait()
        gateway = _start_gateway(launch, coordinator.target, preview.target, keys.gateway)
        models = triton.result().server
        processor_env = {
            "PROCESSOR_DEVICE_ID": DEVICE_ID,
            "PROCESSOR_KEY": keys.processor,
            "PROCESSOR_COORDINATOR_TARGET": coordinator.target,
            "PROCESSOR_PREVIEW_TARGET": preview.target,
            "PROCESSOR_TRITON_TARGET": models.grpc_url,
            "PROCESSOR_MODEL_REPOSITORY": str(models.model_repository),
            "PROCESSOR_S3_ENDPOINT": server.endpoint,
            "PROCESSOR_S3_ACCESS_KEY": server.access_key,
            "PROCESSOR_S3_SECRET_KEY": server.secret_key,
            "PROCESSOR_RECORDINGS_BUCKET": RECORDINGS_BUCKET,
            # a stop mid-job hands the job back after 3 s: within the launcher's and
            # the reaper's bound before SIGKILL (the default drain is 30 s)
            "PROCESSOR_JOB_GRACE_SECONDS": "3",
        }
        processor = launch.service("processor", "services.processor", processor_env)
        processor.wait()
        gateway_url = gateway.wait_http()
        gateway.wait()
        yield Stack(
            workdir=workdir,
            logs=logs,
            base_env=base_env,
            database_url=database_url,
            s3=server,
            triton=models,
            coordinator=coordinator.target,
            preview=preview.target,
            gateway=gateway_url,
            processor=processor.target,
            admin_key=admin_key,
            user=user,
            device_id=DEVICE_ID,
            runtime_id=runtime_id,
            pids={
                "postgres": cluster.pid or 0,
                "seaweedfs": server.pid or 0,
                "triton": models.pid,
                "coordinator": coordinator.pid,
                "preview": preview.pid,
                "gateway": gateway.pid,
                "processor": processor.pid,
            },
            metrics={
                "coordinator": coordinator.metrics,
                "preview": preview.metrics,
                "gateway": f"{gateway_url}/metrics",  # GATEWAY_HTTP_METRICS: on its HTTP port
                "processor": processor.metrics,
                "triton": models.metrics_url,
            },
            processor_env=processor_env,
        )


def _start_coordinator(
    launch: Launcher, console: Console, database_url: str, attestation_key: str
) -> tuple[Service, str]:
    """Migrate, start the server and, while it starts, create the first admin key."""
    env = {
        "COORDINATOR_DATABASE_URL": database_url,
        "COORDINATOR_LEASE_ATTESTATION_KEY": attestation_key,
    }
    # One coordinator, started after it: both phases at once (docs/upgrading.md).
    with console.stage("migrating the database (python -m services.coordinator migrate)"):
        launch.command("migrate", "services.coordinator", ["migrate", "--phase", "post"], env)
    coordinator = launch.service("coordinator", "services.coordinator", env)
    with console.stage("creating the admin key (services.coordinator create-admin-key)"):
        printed = launch.command(
            "admin-key", "services.coordinator", ["create-admin-key", "--name", "demo"], env
        )
    secrets = [
        line["secret"] for line in announcements(printed) if line.get("event") == "admin-key"
    ]
    coordinator.wait()
    return coordinator, str(secrets[0])


def _start_preview(
    launch: Launcher, server: S3Server, coordinator: str, service_key: str, attestation_key: str
) -> Service:
    env = {
        "PREVIEW_S3_ENDPOINT": server.endpoint,
        "PREVIEW_S3_ACCESS_KEY": server.access_key,
        "PREVIEW_S3_SECRET_KEY": server.secret_key,
        "PREVIEW_BUCKET": PREVIEW_BUCKET,
        "PREVIEW_COORDINATOR_TARGET": coordinator,
        "PREVIEW_SERVICE_KEY": service_key,
        "PREVIEW_LEASE_ATTESTATION_KEY": attestation_key,
    }
    return launch.service("preview", "services.preview", env)


def _start_gateway(launch: Launcher, coordinator: str, preview: str, gateway_key: str) -> Service:
    env = {
        "GATEWAY_HTTP_PORT": "0",
        "GATEWAY_COORDINATOR_TARGET": coordinator,
        "GATEWAY_PREVIEW_TARGET": preview,
        "GATEWAY_KEY": gateway_key,
        "GATEWAY_COOKIE_SECURE": "0",  # plain HTTP on loopback
    }
    return launch.service("gateway", "services.gateway", env)


def _register_runtime(launch: Launcher, console: Console, coordinator: str, admin_key: str) -> str:
    with console.stage("registering the runtime (services.processor register-runtime)"):
        printed = launch.command(
            "register-runtime",
            "services.processor",
            ["register-runtime", "--device", DEVICE_ID],
            {COORDINATOR_ENV: coordinator, KEY_ENV: admin_key},
        )
    return str(json.loads(printed)["runtime_id"])


def _device_and_keys(target: str, admin_key: str) -> Keys:
    """Registers the demo's device; returns new secrets for the preview service (scope
    `service`), the processor (`workshop:run`, bound to the device) and the gateway
    (`gateway`)."""
    metadata = bearer_metadata(admin_key)
    with grpc.insecure_channel(target) as channel:
        operator = operator_pb2_grpc.OperatorServiceStub(channel)
        operator.RegisterDevice(
            op.RegisterDeviceRequest(device_id=DEVICE_ID, description="the demo's processor"),
            metadata=metadata,
            timeout=CALL_TIMEOUT_S,
        )
        service = operator.CreateKey(
            op.CreateKeyRequest(
                name="demo-preview", scopes=[common_pb2.KeyScope(scope=common_pb2.SCOPE_SERVICE)]
            ),
            metadata=metadata,
            timeout=CALL_TIMEOUT_S,
        )
        run = operator.CreateKey(
            op.CreateKeyRequest(
                name="demo-processor",
                scopes=[
                    common_pb2.KeyScope(scope=common_pb2.SCOPE_WORKSHOP_RUN, device_id=DEVICE_ID)
                ],
            ),
            metadata=metadata,
            timeout=CALL_TIMEOUT_S,
        )
        gateway = operator.CreateKey(
            op.CreateKeyRequest(
                name="demo-gateway", scopes=[common_pb2.KeyScope(scope=common_pb2.SCOPE_GATEWAY)]
            ),
            metadata=metadata,
            timeout=CALL_TIMEOUT_S,
        )
    return Keys(preview=service.secret, processor=run.secret, gateway=gateway.secret)


def _demo_user(console: Console, target: str, admin_key: str) -> DemoUser:
    """The user `demo` with a new random password, and an Agent key of scope `workshop`
    that acts for it (OperatorService.CreateUser, SetUserPassword, CreateKey)."""
    metadata = bearer_metadata(admin_key)
    password = secrets.token_urlsafe(18)
    stage = f"creating user {USER_ID} with a password and an Agent key (OperatorService)"
    with console.stage(stage), grpc.insecure_channel(target) as channel:
        operator = operator_pb2_grpc.OperatorServiceStub(channel)
        operator.CreateUser(
            op.CreateUserRequest(user_id=USER_ID, display_name="Demo user"),
            metadata=metadata,
            timeout=CALL_TIMEOUT_S,
        )
        operator.SetUserPassword(
            op.SetUserPasswordRequest(user_id=USER_ID, password=password),
            metadata=metadata,
            timeout=CALL_TIMEOUT_S,
        )
        agent = operator.CreateKey(
            op.CreateKeyRequest(
                name="demo-agent",
                scopes=[common_pb2.KeyScope(scope=common_pb2.SCOPE_WORKSHOP)],
                user_id=USER_ID,
            ),
            metadata=metadata,
            timeout=CALL_TIMEOUT_S,
        )
    return DemoUser(user_id=USER_ID, password=password, agent_key=agent.secret)


def _empty_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _describe_postgres(cluster: PostgresCluster) -> str:
    return f"pid {cluster.pid}, {cluster.host}:{cluster.port}"


def _describe_s3(server: S3Server) -> str:
    return f"pid {server.pid}, S3 on {server.endpoint}"


def _describe_triton(triton: RestartableTriton) -> str:
    return f"pid {triton.server.pid}, gRPC on {triton.server.grpc_url}"
