"""The dev overlay, played (issue 38, item 3): `kubectl kustomize deploy/k8s/overlays/dev`
as rendered, run by `podman kube play` with the images `make images` builds, every pod
ready by its own probes, and the demo's test run completed through the gateway pod.

What runs is the manifests' own env, args, ports, probes, security contexts, volumes and
Secret values; what podman 4.3 cannot play is changed as little as it needs, each change
listed in `playable` (and in docs/deployment.md, "Playing the dev overlay with podman"):
- kinds podman does not play are left out: Namespace, ServiceAccount, Service,
  NetworkPolicy, PodDisruptionBudget, HorizontalPodAutoscaler; the StatefulSets of
  Postgres and MinIO too (their images are in no registry here): the harness's Postgres
  and SeaweedFS stand in, reached at the names and ports the Secrets name (postgres:5432,
  minio:9000) and with the Secrets' credentials;
- the Job `coordinator-migrate` is played as a Pod of its template (restartPolicy Never),
  and waited for, as `kubectl wait --for=condition=complete` does;
- Secrets become podman secrets holding their `data` (podman 4.3 stores a played Secret
  in a form its own secretKeyRef cannot read); names get the test's prefix;
- a native sidecar (init container with restartPolicy Always: Triton) becomes a regular
  container of its pod: podman runs init containers to completion first;
- a memory emptyDir becomes a world-writable host directory in /dev/shm: podman mounts
  it root-owned 0755, which user 10001 cannot write (Kubernetes' is 0777);
- containers' `ports` are dropped: podman 4.3 publishes a containerPort without a
  hostPort on the host under the same number, which any process of the host may hold at
  that moment (an ephemeral port of another test: 50051 and 50052 lie in Linux's
  32768-60999; "bind: address already in use" failed a CI run); the pods are reached at
  their own addresses, as in a cluster, and a probe that names a port gets its number;
- Service names resolve through hostAliases to the pods' fixed addresses on a network of
  the test's own (no cluster DNS); the Deployments, the PVC and the Secrets are prefixed
  with the test's name, so that parallel workers never collide.
readinessProbe and grpc probes are not run by podman: the test runs each readiness probe
itself against its pod's address.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml  # type: ignore[import-untyped]

from tests.containers import (
    Forward,
    built_images,
    grpc_serving,
    podman,
    run_the_demo_scenario,
)
from tests.deploy_render import containers, pod_spec, rendered
from tools.demo.stack import RECORDINGS_BUCKET, DemoUser, Stack, clean_environment
from tools.localstack.postgres import (
    admin_execute,
    postgres_cluster,
    quote_ident,
    run_async,
)
from tools.localstack.s3 import running_s3_server
from tools.localstack.triton import TritonServer
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, operator_pb2_grpc
from workshop.v1 import operator_pb2 as op

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

Document = dict[str, Any]
SKIPPED = {
    "Namespace",
    "ServiceAccount",
    "Service",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "HorizontalPodAutoscaler",
    "StatefulSet",
}
# The order the README's "Deploying" brings them up in: the pods needing `service-keys`
# after the coordinator has made them.
DEPLOYMENTS = ("coordinator", "preview", "gateway", "processor")
STORES = ("postgres", "minio")
READY_TIMEOUT_S = 120.0
USER_ID = "play"


@contextlib.contextmanager
def network(prefix: str) -> Iterator[str]:
    """A podman network of the test's own on a free 10.89.N.0/24; its subnet prefix
    (`10.89.N.`). The bridge exists once a pod joins it."""
    for _ in range(20):
        subnet = f"10.89.{random.randrange(20, 250)}."
        made = podman("network", "create", f"--subnet={subnet}0/24", prefix, check=False)
        if made.returncode == 0:
            break
    else:
        raise AssertionError(f"no free subnet for a podman network: {made.stderr}")
    try:
        yield subnet
    finally:
        podman("network", "rm", "--force", prefix, check=False, timeout=180)


def playable(
    docs: tuple[Document, ...], prefix: str, images: dict[str, str], hosts: dict[str, str]
) -> tuple[list[Document], dict[str, Document], Document, Document]:
    """The rendered overlay as podman plays it: (Secrets, Deployments by name, the
    migrate Job as a Pod, the PVC), every change the module's docstring lists."""
    kept = [copy.deepcopy(doc) for doc in docs if doc["kind"] not in SKIPPED]
    kinds = {doc["kind"] for doc in kept}
    assert kinds == {"Secret", "PersistentVolumeClaim", "Deployment", "Job"}, kinds
    aliases = [{"ip": ip, "hostnames": [name]} for name, ip in hosts.items()]
    image_of = {
        "workshop/coordinator:dev": images["coordinator"],
        "workshop/preview:dev": images["preview"],
        "workshop/gateway:dev": images["gateway"],
        "workshop/processor:dev": images["processor"],
        "nvcr.io/nvidia/tritonserver:25.10-py3": images["triton"],
    }
    secrets: list[Document] = []
    deployments: dict[str, Document] = {}
    job: Document = {}
    claim: Document = {}
    for doc in kept:
        name = doc["metadata"]["name"]
        doc["metadata"] = {"name": f"{prefix}-{name}"}
        if doc["kind"] == "Secret":
            secrets.append(doc)
            continue
        if doc["kind"] == "PersistentVolumeClaim":
            claim = doc
            continue
        spec = pod_spec(doc)
        spec["hostAliases"] = aliases
        for container in containers(spec):
            container["image"] = image_of[container["image"]]
            # not published on the host (module docstring); probes name them by number
            numbers = {port["name"]: port["containerPort"] for port in container.pop("ports", [])}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                get = container.get(probe, {}).get("httpGet")
                if get is not None:
                    get["port"] = numbers.get(get["port"], get["port"])
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    ref["name"] = f"{prefix}-{ref['name']}"
        sidecars = [c for c in spec.pop("initContainers", []) if c.get("restartPolicy")]
        for sidecar in sidecars:
            del sidecar["restartPolicy"]
        spec["containers"] = sidecars + spec["containers"]
        for volume in spec.get("volumes", []):
            if volume.get("emptyDir", {}).get("medium") == "Memory":
                shm = tempfile.mkdtemp(prefix=f"{prefix}-", dir="/dev/shm")
                Path(shm).chmod(0o1777)
                volume.pop("emptyDir")
                volume["hostPath"] = {"path": shm, "type": "Directory"}
            if "persistentVolumeClaim" in volume:
                volume["persistentVolumeClaim"]["claimName"] = f"{prefix}-models"
        if doc["kind"] == "Job":
            spec["restartPolicy"] = "Never"
            job = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{prefix}-{name}"},
                "spec": spec,
            }
        else:
            deployments[name] = doc
    return secrets, deployments, job, claim


def create_secret(name: str, data: dict[str, str]) -> None:
    """A podman secret as podman's secretKeyRef reads it: the Secret's `data` as JSON."""
    podman("secret", "create", name, "-", input=json.dumps(data))


def play(doc: Document, network_name: str, ip: str | None, root: Path) -> None:
    path = root / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    options = [f"--network={network_name}", *([f"--ip={ip}"] if ip else [])]
    podman("kube", "play", *options, str(path), timeout=300)


def pod_containers(pod: str) -> list[str]:
    listed = podman("ps", "--all", f"--filter=pod={pod}", "--format={{.Names}}")
    return [name for name in listed.stdout.split() if not name.endswith("-infra")]


def logs_of(pod: str) -> str:
    parts = []
    for name in pod_containers(pod):
        done = podman("logs", "--tail=40", name, check=False)
        parts.append(f"--- {name}\n{done.stdout}{done.stderr}")
    return "\n".join(parts)


def probe_ready(container: Document, ip: str) -> bool:
    """The container's readinessProbe (grpc or httpGet, as the manifests write them)."""
    probe = container["readinessProbe"]
    ports = {port["name"]: port["containerPort"] for port in container.get("ports", [])}
    if "grpc" in probe:
        return grpc_serving(f"{ip}:{probe['grpc']['port']}")
    get = probe["httpGet"]
    port = ports.get(get["port"], get["port"])
    return httpx.get(f"http://{ip}:{port}{get['path']}", timeout=2).status_code == 200


def wait_ready(deployment: Document, pod: str, ip: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    for container in pod_spec(deployment)["containers"]:
        while True:
            with contextlib.suppress(Exception):
                if probe_ready(container, ip):
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"{pod}/{container['name']} not ready:\n{logs_of(pod)}")
            time.sleep(0.5)


def service_keys(target: str, admin_key: str, device: str) -> dict[str, str]:
    """README "Deploying", step 4: the device, then the three services' keys."""
    metadata = bearer_metadata(admin_key)
    scope = common_pb2.KeyScope
    wanted = {
        "PREVIEW_SERVICE_KEY": ("preview", [scope(scope=common_pb2.SCOPE_SERVICE)]),
        "GATEWAY_KEY": ("gateway", [scope(scope=common_pb2.SCOPE_GATEWAY)]),
        "PROCESSOR_KEY": (
            "processors",
            [scope(scope=common_pb2.SCOPE_WORKSHOP_RUN, device_id=device)],
        ),
    }
    with grpc.insecure_channel(target) as channel:
        operator = operator_pb2_grpc.OperatorServiceStub(channel)
        operator.RegisterDevice(
            op.RegisterDeviceRequest(device_id=device), metadata=metadata, timeout=30
        )
        return {
            key: operator.CreateKey(
                op.CreateKeyRequest(name=name, scopes=scopes), metadata=metadata, timeout=30
            ).secret
            for key, (name, scopes) in wanted.items()
        }


def agent_user(target: str, admin_key: str) -> DemoUser:
    metadata = bearer_metadata(admin_key)
    with grpc.insecure_channel(target) as channel:
        operator = operator_pb2_grpc.OperatorServiceStub(channel)
        operator.CreateUser(op.CreateUserRequest(user_id=USER_ID), metadata=metadata, timeout=30)
        agent = operator.CreateKey(
            op.CreateKeyRequest(
                name="play-agent",
                scopes=[common_pb2.KeyScope(scope=common_pb2.SCOPE_WORKSHOP)],
                user_id=USER_ID,
            ),
            metadata=metadata,
            timeout=30,
        )
    return DemoUser(user_id=USER_ID, password="", agent_key=agent.secret)


def secret_values(secrets: list[Document], prefix: str, name: str) -> dict[str, str]:
    """The values of a generated Secret (`<name>-<hash>`)."""
    (doc,) = [d for d in secrets if d["metadata"]["name"].startswith(f"{prefix}-{name}-")]
    return {k: base64.b64decode(v).decode() for k, v in doc["data"].items()}


def env_value(deployment: Document, variable: str) -> str:
    for container in pod_spec(deployment)["containers"]:
        for entry in container.get("env", []):
            if entry["name"] == variable:
                return str(entry["value"])
    raise KeyError(variable)


def test_the_dev_overlay_plays_and_completes_a_run(tmp_path: Path) -> None:
    images = built_images()
    began = time.monotonic()
    prefix = f"wst{uuid.uuid4().hex[:8]}"
    docs = rendered("overlays/dev")
    pods: list[str] = []
    podman_secrets: list[str] = []
    shm_dirs: list[Path] = []
    forwards: list[Forward] = []
    (tmp_path / "s3").mkdir()
    with contextlib.ExitStack() as cleanup, network(prefix) as subnet:
        gateway_ip = f"{subnet}1"
        ips = {name: f"{subnet}{11 + i}" for i, name in enumerate(DEPLOYMENTS)}
        hosts = {**ips, **dict.fromkeys(STORES, gateway_ip)}
        secrets, deployments, job, claim = playable(docs, prefix, images, hosts)
        for doc in (*deployments.values(), job):
            for volume in pod_spec_of(doc).get("volumes", []):
                if "hostPath" in volume:
                    shm_dirs.append(Path(volume["hostPath"]["path"]))

        @cleanup.callback
        def _remove() -> None:
            # All at once and at once (SIGKILL): the run is over and checked, and a graceful
            # stop of every pod cost the suite about 40 s
            podman("pod", "rm", "--force", "--time=0", *pods, check=False, timeout=300)
            podman("rm", "--force", f"{prefix}-register", check=False)
            for forward in forwards:
                forward.close()
            for name in podman_secrets:
                podman("secret", "rm", name, check=False)
            podman("volume", "rm", "--force", f"{prefix}-models", check=False)
            for shm in shm_dirs:
                shutil.rmtree(shm, ignore_errors=True)

        # The stores the StatefulSets would run, with the Secrets' own names and values.
        database = secret_values(secrets, prefix, "coordinator-database")
        store = secret_values(secrets, prefix, "object-store")
        cluster = cleanup.enter_context(postgres_cluster())
        password = database["POSTGRES_PASSWORD"].replace("'", "''")
        run_async(
            lambda: admin_execute(
                cluster.admin_dsn, f"CREATE ROLE workshop LOGIN PASSWORD '{password}'"
            )
        )
        run_async(
            lambda: admin_execute(
                cluster.admin_dsn, f"CREATE DATABASE workshop OWNER {quote_ident('workshop')}"
            )
        )
        s3 = cleanup.enter_context(
            running_s3_server(
                tmp_path / "s3", credentials=(store["S3_ACCESS_KEY"], store["S3_SECRET_KEY"])
            )
        )
        for secret in secrets:
            create_secret(secret["metadata"]["name"], secret["data"])
            podman_secrets.append(secret["metadata"]["name"])

        # An empty pod brings the network's bridge (and its address) up; the stores are
        # forwarded there, at the ports the Secrets name.
        anchor = f"{prefix}-network"
        pods.append(anchor)
        podman("pod", "create", f"--name={anchor}", f"--network={prefix}")
        podman("pod", "start", anchor)
        forwards.append(Forward((gateway_ip, 5432), (cluster.host, cluster.port)))
        s3_host, s3_port = s3.endpoint.rsplit(":", 1)
        forwards.append(Forward((gateway_ip, 9000), (s3_host, int(s3_port))))

        play(claim, prefix, None, tmp_path)
        pods.append(job["metadata"]["name"])
        play(job, prefix, f"{subnet}20", tmp_path)
        (migrate,) = pod_containers(job["metadata"]["name"])
        waited = podman("wait", migrate, timeout=180)
        migrated = podman("logs", migrate, check=False)
        assert waited.stdout.strip() == "0", migrated.stdout + migrated.stderr
        assert '"migrated"' in migrated.stdout, migrated.stdout
        print(f"migrate job done {time.monotonic() - began:.1f} s after the build")

        def up(name: str) -> str:
            pod = f"{prefix}-{name}-pod-0"
            pods.append(pod)
            play(deployments[name], prefix, ips[name], tmp_path)
            wait_ready(deployments[name], pod, ips[name])
            return pod

        coordinator = up("coordinator")
        target = f"{ips['coordinator']}:{env_value(deployments['coordinator'], 'COORDINATOR_PORT')}"
        printed = podman(
            "exec",
            f"{coordinator}-coordinator",
            "python",
            "-m",
            "services.coordinator",
            "create-admin-key",
            "--name",
            "play",
        ).stdout
        admin_key = next(
            str(json.loads(line)["secret"])
            for line in printed.splitlines()
            if line.startswith("{") and json.loads(line).get("event") == "admin-key"
        )
        device = env_value(deployments["processor"], "PROCESSOR_DEVICE_ID")
        keys = service_keys(target, admin_key, device)
        create_secret(
            f"{prefix}-service-keys",
            {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()},
        )
        podman_secrets.append(f"{prefix}-service-keys")
        registered = podman(
            "run",
            "--rm",
            f"--name={prefix}-register",
            f"--network={prefix}",
            "--read-only",
            "--user=10001:10001",
            f"--env=WORKSHOP_COORDINATOR={target}",
            f"--env=WORKSHOP_KEY={admin_key}",
            images["processor"],
            *("python", "-m", "services.processor", "register-runtime", "--device", device),
        ).stdout
        runtime_id = str(json.loads(registered)["runtime_id"])
        for name in ("preview", "gateway", "processor"):
            up(name)
        print(f"every pod ready {time.monotonic() - began:.1f} s after the build")

        models = Path(
            podman(
                "volume", "inspect", "--format={{.Mountpoint}}", f"{prefix}-models"
            ).stdout.strip()
        )
        s3.client().make_bucket(env_default_bucket())
        http_port = env_value(deployments["gateway"], "GATEWAY_HTTP_PORT")
        stack = Stack(
            workdir=tmp_path,
            logs=tmp_path / "logs",
            base_env=clean_environment(),
            database_url="",
            s3=s3,
            triton=TritonServer(
                grpc_url=f"{ips['processor']}:8001",
                http_url=f"http://{ips['processor']}:8000",
                model_repository=models,
                log_path=tmp_path / "logs" / "triton.log",
                pid=0,
            ),
            coordinator=target,
            preview=f"{ips['preview']}:50052",
            gateway=f"http://{ips['gateway']}:{http_port}",
            processor=f"{ips['processor']}:50054",
            admin_key=admin_key,
            user=agent_user(target, admin_key),
            device_id=device,
            runtime_id=runtime_id,
            pids={},
            metrics={},
            processor_env={},
        )
        (tmp_path / "logs").mkdir()
        try:
            run_the_demo_scenario(stack, full_run=False)
        except BaseException:
            print(logs_of(f"{prefix}-processor-pod-0"))
            raise
        print(f"dev overlay played, a run done: {time.monotonic() - began:.1f} s after the build")


def pod_spec_of(doc: Document) -> Document:
    spec: Document = doc["spec"] if doc["kind"] == "Pod" else pod_spec(doc)
    return spec


def env_default_bucket() -> str:
    """The processor's recordings bucket: its settings' default (the overlay sets none)."""
    return RECORDINGS_BUCKET
