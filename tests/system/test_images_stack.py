"""The whole stack from its images (issue 38, item 2), as `make demo` runs it from the
venv: `make images` (cached), then Postgres and SeaweedFS from the harness, migrations
through the coordinator image's `migrate`, and the coordinator, preview, gateway,
processor (DALI on the CPU) and Triton (the bundled server's python backend) images, each
container as the manifests run it: user 10001, read-only root filesystem with a tmpfs
/tmp, no capabilities; the processor and Triton share a memory /dev/shm and the model
repository (read-only for the processor). Host networking, every port picked free, so
parallel workers never collide. Each service answers grpc.health.v1 and serves /metrics;
a test run and a full run go through the gateway container as the demo's do. Each image
holds its own service's extra and none of the others'.

Mostly waiting (containers starting, the run), so it runs in the parallel pool.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.containers import (
    assert_no_build_secrets,
    built_images,
    containers,
    grpc_serving,
    run_the_demo_scenario,
)
from tools.demo.stack import (
    DEVICE_ID,
    RECORDINGS_BUCKET,
    Stack,
    _demo_user,
    _device_and_keys,
    clean_environment,
)
from tools.demo.terminal import Console
from tools.localstack.host import free_ports
from tools.localstack.postgres import PostgresCluster, create_database
from tools.localstack.processes import announcements
from tools.localstack.s3 import running_s3_server
from tools.localstack.triton import TritonServer
from workshop.kit.cli import COORDINATOR_ENV, KEY_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

SHORT_GRACE = {"GRACE_SECONDS": "2", "DRAIN_SECONDS": "0"}


# What each service's image must not hold: the other services' extras (each image installs
# its own lock alone, so a missing dependency of a service fails here, in its own image).
OTHER_EXTRAS = {
    "coordinator": ["minio", "starlette", "nvidia", "tritonclient"],
    "preview": ["asyncpg", "starlette", "nvidia", "tritonclient"],
    "gateway": ["asyncpg", "minio", "nvidia", "tritonclient"],
    "processor": ["asyncpg", "starlette"],
}


def only_its_extra(run: Any, image: str, service: str, absent: list[str]) -> bool:
    """The image imports its service, from its installed copy, and none of `absent`."""
    probe = (
        f"import importlib.util, json, services.{service}; print(json.dumps("
        f"[m for m in {absent!r} if importlib.util.find_spec(m)]))"
    )
    present = json.loads(run.command(f"extras-{service}", image, ["python", "-c", probe]))
    assert present == [], f"{service}'s image holds {present}"
    return True


def service_env(prefix: str, values: dict[str, str]) -> dict[str, str]:
    return {f"{prefix}_{key}": value for key, value in {**SHORT_GRACE, **values}.items()}


def test_the_stack_runs_from_its_images(pg_cluster: PostgresCluster, tmp_path: Path) -> None:
    images = built_images()
    for name in images.values():
        assert_no_build_secrets(name)
    began = time.monotonic()
    logs = tmp_path / "logs"
    logs.mkdir()
    database_url = create_database(pg_cluster, f"images_{uuid.uuid4().hex[:8]}")
    (c_grpc, c_metrics, p_grpc, p_metrics, g_grpc, g_metrics, g_http, w_grpc, w_metrics) = (
        free_ports(9)
    )
    t_http, t_grpc, t_metrics = free_ports(3)
    models = tmp_path / "models"
    models.mkdir()
    # The pod's memory emptyDir for /dev/shm, shared by the processor and Triton.
    (tmp_path / "s3").mkdir()
    shm = Path(tempfile.mkdtemp(prefix="wst-shm-", dir="/dev/shm"))
    shm.chmod(0o1777)
    try:
        with running_s3_server(tmp_path / "s3") as s3, containers(logs) as run:
            coordinator_env = service_env(
                "COORDINATOR",
                {
                    "HOST": "127.0.0.1",
                    "PORT": str(c_grpc),
                    "METRICS_PORT": str(c_metrics),
                    "DATABASE_URL": database_url,
                },
            )
            migrated = run.command(
                "migrate",
                images["coordinator"],
                ["python", "-m", "services.coordinator", "migrate", "--phase", "post"],
                coordinator_env,
            )
            assert json.loads(migrated.splitlines()[-1])["event"] == "migrated", migrated
            for service, absent in OTHER_EXTRAS.items():
                assert only_its_extra(run, images[service], service, absent)
            coordinator = run.start("coordinator", images["coordinator"], env=coordinator_env)
            printed = run.command(
                "admin-key",
                images["coordinator"],
                ["python", "-m", "services.coordinator", "create-admin-key", "--name", "images"],
                coordinator_env,
            )
            admin_key = next(
                str(line["secret"])
                for line in announcements(printed)
                if line.get("event") == "admin-key"
            )
            c_target = f"127.0.0.1:{c_grpc}"
            run.wait_until(coordinator, lambda: grpc_serving(c_target))
            keys = _device_and_keys(c_target, admin_key)

            preview = run.start(
                "preview",
                images["preview"],
                env=service_env(
                    "PREVIEW",
                    {
                        "HOST": "127.0.0.1",
                        "PORT": str(p_grpc),
                        "METRICS_PORT": str(p_metrics),
                        "COORDINATOR_TARGET": c_target,
                        "SERVICE_KEY": keys.preview,
                        "S3_ENDPOINT": s3.endpoint,
                        "S3_ACCESS_KEY": s3.access_key,
                        "S3_SECRET_KEY": s3.secret_key,
                    },
                ),
            )
            s3.client().make_bucket(RECORDINGS_BUCKET)
            runtime = run.command(
                "register-runtime",
                images["processor"],
                ["python", "-m", "services.processor", "register-runtime", "--device", DEVICE_ID],
                {COORDINATOR_ENV: c_target, KEY_ENV: admin_key},
            )
            runtime_id = str(json.loads(runtime)["runtime_id"])
            user = _demo_user(Console(), c_target, admin_key)
            p_target = f"127.0.0.1:{p_grpc}"
            run.wait_until(preview, lambda: grpc_serving(p_target))

            gateway = run.start(
                "gateway",
                images["gateway"],
                env=service_env(
                    "GATEWAY",
                    {
                        "HOST": "127.0.0.1",
                        "PORT": str(g_grpc),
                        "METRICS_PORT": str(g_metrics),
                        "HTTP_METRICS": "0",
                        "HTTP_HOST": "127.0.0.1",
                        "HTTP_PORT": str(g_http),
                        "COORDINATOR_TARGET": c_target,
                        "PREVIEW_TARGET": p_target,
                        "KEY": keys.gateway,
                        "COOKIE_SECURE": "0",
                    },
                ),
            )
            triton = run.start(
                "triton",
                images["triton"],
                [
                    "tritonserver",
                    "--model-repository=/models",
                    "--model-control-mode=explicit",
                    "--exit-on-error=false",
                    "--http-address=127.0.0.1",
                    "--grpc-address=127.0.0.1",
                    "--metrics-address=127.0.0.1",
                    f"--http-port={t_http}",
                    f"--grpc-port={t_grpc}",
                    f"--metrics-port={t_metrics}",
                    "--allow-gpu-metrics=false",
                    "--pinned-memory-pool-byte-size=0",
                    f"--backend-config=python,shm-region-prefix-name={shm.name}-",
                ],
                volumes=[f"{models}:/models", f"{shm}:/dev/shm"],
            )
            processor = run.start(
                "processor",
                images["processor"],
                env=service_env(
                    "PROCESSOR",
                    {
                        "HOST": "127.0.0.1",
                        "PORT": str(w_grpc),
                        "METRICS_PORT": str(w_metrics),
                        "DEVICE_ID": DEVICE_ID,
                        "KEY": keys.processor,
                        "COORDINATOR_TARGET": c_target,
                        "PREVIEW_TARGET": p_target,
                        "TRITON_TARGET": f"127.0.0.1:{t_grpc}",
                        "TRITON_SHARED_MEMORY": "on",
                        "MODEL_REPOSITORY": "/models",
                        "S3_ENDPOINT": s3.endpoint,
                        "S3_ACCESS_KEY": s3.access_key,
                        "S3_SECRET_KEY": s3.secret_key,
                        "RECORDINGS_BUCKET": RECORDINGS_BUCKET,
                        "JOB_GRACE_SECONDS": "3",
                    },
                ),
                volumes=[f"{models}:/models:ro", f"{shm}:/dev/shm"],
            )
            grpc_ports = {
                coordinator: c_grpc,
                preview: p_grpc,
                gateway: g_grpc,
                processor: w_grpc,
                triton: t_grpc,
            }
            for name, port in grpc_ports.items():
                run.wait_until(name, functools.partial(grpc_serving, f"127.0.0.1:{port}"))
            print(f"stack serving {time.monotonic() - began:.1f} s after the build")

            metrics = {
                "coordinator": c_metrics,
                "preview": p_metrics,
                "gateway": g_metrics,
                "processor": w_metrics,
                "triton": t_metrics,
            }
            for service, port in metrics.items():
                scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
                assert scraped.status_code == 200, (service, scraped.text[:300])
                family = "nv_" if service == "triton" else "workshop_"
                assert f"# TYPE {family}" in scraped.text, (service, scraped.text[:300])

            stack = Stack(
                workdir=tmp_path,
                logs=logs,
                base_env=clean_environment(),
                database_url=database_url,
                s3=s3,
                triton=TritonServer(
                    grpc_url=f"127.0.0.1:{t_grpc}",
                    http_url=f"http://127.0.0.1:{t_http}",
                    model_repository=models,
                    log_path=logs / "triton.log",
                    pid=0,
                    metrics_url=f"http://127.0.0.1:{t_metrics}/metrics",
                ),
                coordinator=c_target,
                preview=p_target,
                gateway=f"http://127.0.0.1:{g_http}",
                processor=f"127.0.0.1:{w_grpc}",
                admin_key=admin_key,
                user=user,
                device_id=DEVICE_ID,
                runtime_id=runtime_id,
                pids={},
                metrics={k: f"http://127.0.0.1:{v}/metrics" for k, v in metrics.items()},
                processor_env={},
            )
            run_the_demo_scenario(stack, full_run=True)
            processed = httpx.get(f"http://127.0.0.1:{w_metrics}/metrics", timeout=10).text
            assert "workshop_processor_" in processed
            print(f"stack from images: {time.monotonic() - began:.1f} s after the build")
    finally:  # after every container is gone
        shutil.rmtree(shm, ignore_errors=True)
