"""Offline checks of deploy/k8s: every overlay renders, every document is valid for the
last three Kubernetes minor versions kubernetes-validate bundles, and the policies the
services rely on hold (probes, settings, ports, /dev/shm, GPUs, security contexts)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from kubernetes_validate import utils as k8s_schemas  # type: ignore[import-untyped]

from services.coordinator.settings import PREFIX as COORDINATOR
from services.coordinator.settings import CoordinatorSettings
from services.gateway.settings import PREFIX as GATEWAY
from services.gateway.settings import GatewaySettings
from services.preview.settings import PREFIX as PREVIEW
from services.preview.settings import PreviewSettings
from services.processor.leases import RELEASE_SECONDS
from services.processor.settings import PREFIX as PROCESSOR
from services.processor.settings import ProcessorSettings
from tests.deploy_render import (
    OVERLAYS,
    WORKLOADS,
    Document,
    containers,
    named,
    of_kind,
    pod_spec,
    rendered,
)
from workshop.kit.settings import variable_name

# The service each Workshop image runs: its settings class and variable prefix.
SERVICES: dict[str, tuple[type[Any], str]] = {
    "coordinator": (CoordinatorSettings, COORDINATOR),
    "preview": (PreviewSettings, PREVIEW),
    "gateway": (GatewaySettings, GATEWAY),
    "processor": (ProcessorSettings, PROCESSOR),
}
GRPC_SERVICES = frozenset(SERVICES)
GPU = "nvidia.com/gpu"


def last_minor_versions(count: int = 3) -> list[str]:
    minors = {k8s_schemas.major_minor(v) for v in k8s_schemas.all_versions()}
    newest = sorted(minors, key=lambda minor: tuple(int(part) for part in minor.split(".")))
    return [f"{minor}.0" for minor in newest[-count:]]


def workshop_service(container: Document) -> str | None:
    """`coordinator` for an image workshop/coordinator[:tag] (any registry), else None."""
    image: str = container["image"]
    path = image.split("@")[0].rsplit(":", 1)[0] if "/" in image else image
    parts = path.split("/")
    if len(parts) >= 2 and parts[-2] == "workshop" and parts[-1] in SERVICES:
        return parts[-1]
    return None


def env_of(container: Document) -> dict[str, Document]:
    return {item["name"]: item for item in container.get("env", [])}


def literal(container: Document, variable: str) -> str | None:
    item = env_of(container).get(variable)
    return None if item is None else item.get("value")


def setting_value(container: Document, service: str, field: str) -> Any:
    """The setting as the container's environment sets it, else its default."""
    cls, prefix = SERVICES[service]
    raw = literal(container, variable_name(prefix, field))
    if raw is not None:
        return raw
    return {f.name: f.default for f in dataclasses.fields(cls)}[field]


def workshop_containers(
    documents: tuple[Document, ...],
) -> list[tuple[Document, Document, str]]:
    """(workload, container, service) for every container running a Workshop image."""
    found = []
    for workload in of_kind(documents, *WORKLOADS):
        for container in containers(pod_spec(workload)):
            service = workshop_service(container)
            if service is not None:
                found.append((workload, container, service))
    return found


# KEDA's custom resources are in no bundled schema: these are the fields of keda.sh/v1alpha1
# that the overlays use (KEDA 2.x documentation), closed to anything else.
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}},
}
KEDA_SCHEMAS: dict[str, dict[str, Any]] = {
    "ScaledObject": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "kind": {"const": "ScaledObject"},
            "metadata": _OBJECT_META,
            "spec": {
                "type": "object",
                "required": ["scaleTargetRef", "triggers"],
                "additionalProperties": False,
                "properties": {
                    "scaleTargetRef": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "kind": {"type": "string"},
                            "apiVersion": {"type": "string"},
                        },
                    },
                    "minReplicaCount": {"type": "integer", "minimum": 0},
                    "maxReplicaCount": {"type": "integer", "minimum": 1},
                    "pollingInterval": {"type": "integer", "minimum": 1},
                    "cooldownPeriod": {"type": "integer", "minimum": 0},
                    "triggers": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["type", "metadata"],
                            "additionalProperties": False,
                            "properties": {
                                "type": {"type": "string"},
                                "metadata": _STRING_MAP,
                                "authenticationRef": {
                                    "type": "object",
                                    "required": ["name"],
                                    "additionalProperties": False,
                                    "properties": {"name": {"type": "string"}},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
# Fields the prometheus scaler needs (KEDA's scaler documentation).
PROMETHEUS_TRIGGER_FIELDS = {"serverAddress", "query", "threshold", "activationThreshold"}


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", last_minor_versions())
def test_every_document_is_valid(overlay: str, version: str) -> None:
    for doc in rendered(overlay):
        if doc["apiVersion"].startswith("keda.sh/"):
            jsonschema.validate(doc, KEDA_SCHEMAS[doc["kind"]])
            continue
        # strict: an unknown field anywhere is an error, not ignored
        k8s_schemas.validate(doc, version, strict=True)


def test_keda_scales_processors_on_the_coordinators_queue_depth() -> None:
    """The prometheus scaler on the coordinators' gauges: KEDA reads no database (what the
    query counts: tests/service/test_deploy_scaling.py)."""
    documents = rendered("overlays/prod-gpu")
    scaled = named(documents, "ScaledObject", "processor")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "processor"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"].keys() >= PROMETHEUS_TRIGGER_FIELDS
    assert "workshop_coordinator_claimable_jobs" in trigger["metadata"]["query"]
    assert "authenticationRef" not in trigger
    assert not of_kind(documents, "TriggerAuthentication")
    processor = named(documents, "Deployment", "processor")
    # KEDA owns the replica count; one in the Deployment would fight it on every apply
    assert "replicas" not in processor["spec"]


# Postgres' default max_connections is 100; the migrate Job and operators need some.
COORDINATOR_CONNECTIONS_AT_MOST = 80


def test_coordinators_scale_on_the_core_their_event_loop_uses() -> None:
    """prod-gpu: an HPA at 70 % CPU of a one-core request (docs/scaling.md's sizing of a
    replica), the Deployment without a replica count to fight it, and every replica's
    database pool within Postgres' default connection limit at the most replicas."""
    documents = rendered("overlays/prod-gpu")
    hpa = named(documents, "HorizontalPodAutoscaler", "coordinator")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "coordinator"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["averageUtilization"] == 70
    coordinator = named(documents, "Deployment", "coordinator")
    assert "replicas" not in coordinator["spec"]
    (container,) = containers(pod_spec(coordinator))
    assert container["resources"]["requests"]["cpu"] == "1"
    pool = int(setting_value(container, "coordinator", "database_pool_size"))
    assert hpa["spec"]["maxReplicas"] * pool <= COORDINATOR_CONNECTIONS_AT_MOST


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workshop_container_sets_only_its_settings(overlay: str) -> None:
    for workload, container, service in workshop_containers(rendered(overlay)):
        cls, prefix = SERVICES[service]
        known = {variable_name(prefix, f.name) for f in dataclasses.fields(cls)}
        where = f"{workload['metadata']['name']}/{container['name']}"
        unknown = set(env_of(container)) - known
        assert not unknown, f"{where} sets variables {service} never reads: {sorted(unknown)}"
        assert not container.get("envFrom"), f"{where}: envFrom hides what is set"
        required = {
            variable_name(prefix, f.name)
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING
        }
        if "migrate" in container["args"]:  # the migrate Job needs only the database
            required = {variable_name(prefix, "database_url")}
        missing = required - set(env_of(container))
        assert not missing, f"{where} does not set required {sorted(missing)}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_rollout_applies_only_pre_migrations(overlay: str) -> None:
    """Applied with the new image while the old coordinators serve, the migrate Job runs
    the pre phase alone; the post phase is a command run after the rollout
    (docs/upgrading.md#rolling-upgrade)."""
    migrating = [
        (workload["kind"], workload["metadata"]["name"], container["args"])
        for workload, container, _ in workshop_containers(rendered(overlay))
        if "migrate" in container["args"]
    ]
    assert migrating == [
        (
            "Job",
            "coordinator-migrate",
            ["python", "-m", "services.coordinator", "migrate", "--phase", "pre"],
        )
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grpc_services_have_grpc_probes_on_their_port(overlay: str) -> None:
    servers = [
        (w, c, s) for w, c, s in workshop_containers(rendered(overlay)) if w["kind"] != "Job"
    ]
    assert {s for _, _, s in servers} == GRPC_SERVICES
    for workload, container, service in servers:
        where = f"{workload['metadata']['name']}/{container['name']}"
        port = int(setting_value(container, service, "port"))
        assert literal(container, variable_name(SERVICES[service][1], "host")) == "0.0.0.0"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["grpc"] == port, where
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == port, f"{where} {probe}"
        if service == "gateway":
            assert ports["http"] == int(setting_value(container, service, "http_port"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_is_scraped_on_its_metrics_port_and_only_there(overlay: str) -> None:
    """Each server's /metrics is on a fixed port named `metrics` that its pod announces
    (prometheus.io annotations) and a NetworkPolicy opens to Prometheus alone; the
    gateway's is off its public HTTP port."""
    documents = rendered(overlay)
    policies = of_kind(documents, "NetworkPolicy")
    for workload, container, service in workshop_containers(documents):
        if workload["kind"] == "Job":
            continue
        where = workload["metadata"]["name"]
        port = int(setting_value(container, service, "metrics_port"))
        assert port > 0, where
        assert {"name": "metrics", "containerPort": port} in container["ports"], where
        template = workload["spec"]["template"]["metadata"]
        assert template["annotations"]["prometheus.io/port"] == str(port), where
        if service == "gateway":
            assert setting_value(container, service, "http_metrics") == "0"
        labels = template["labels"]
        opened = [
            rule
            for policy in policies
            if selects(policy["spec"]["podSelector"], labels)
            for rule in policy["spec"].get("ingress", [])
            if {"port": "metrics", "protocol": "TCP"} in rule.get("ports", [])
        ]
        assert opened, f"no NetworkPolicy opens {where}'s metrics port"
        for rule in opened:
            assert all("podSelector" in peer for peer in rule["from"]), where


def selects(selector: Document, labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions with In) selects `labels`."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression  # the only operator used here
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_target_ports_their_pods_serve(overlay: str) -> None:
    documents = rendered(overlay)
    for service in of_kind(documents, "Service"):
        selector = service["spec"]["selector"]
        pods = [
            pod_spec(w)
            for w in of_kind(documents, *WORKLOADS)
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert pods, f"Service {service['metadata']['name']} selects no pod"
        for port in service["spec"]["ports"]:
            for spec in pods:
                served = {
                    p.get("name"): p["containerPort"]
                    for c in containers(spec)
                    for p in c.get("ports", [])
                }
                target = port["targetPort"]
                assert target in served or target in served.values(), (
                    service["metadata"]["name"],
                    port,
                )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_targets_name_a_service_port_or_a_container_of_the_pod(overlay: str) -> None:
    documents = rendered(overlay)
    service_ports = {
        (s["metadata"]["name"], p["port"])
        for s in of_kind(documents, "Service")
        for p in s["spec"]["ports"]
    }
    for workload, container, service in workshop_containers(documents):
        cls, _ = SERVICES[service]
        for field in dataclasses.fields(cls):
            if not field.name.endswith("_target"):
                continue
            host, port = str(setting_value(container, service, field.name)).rsplit(":", 1)
            if host == "127.0.0.1":  # a sidecar of the same pod
                served = [
                    p["containerPort"]
                    for c in containers(pod_spec(workload))
                    for p in c.get("ports", [])
                ]
                assert int(port) in served, (workload["metadata"]["name"], field.name)
            else:
                assert (host, int(port)) in service_ports, (service, field.name)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_dev_shm_is_one_memory_volume_for_processor_and_triton(overlay: str) -> None:
    spec = pod_spec(named(rendered(overlay), "Deployment", "processor"))
    mounts = {
        c["name"]: {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        for c in containers(spec)
    }
    shm = {mounts["processor"]["/dev/shm"], mounts["triton"]["/dev/shm"]}
    assert len(shm) == 1
    (volume,) = [v for v in spec["volumes"] if v["name"] in shm]
    assert volume["emptyDir"]["medium"] == "Memory"
    processor = next(c for c in containers(spec) if c["name"] == "processor")
    assert literal(processor, "PROCESSOR_TRITON_TARGET") == "127.0.0.1:8001"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpus_only_for_the_processor_and_triton(overlay: str) -> None:
    gpus = []
    for workload in of_kind(rendered(overlay), *WORKLOADS):
        for container in containers(pod_spec(workload)):
            resources = container.get("resources", {})
            if GPU in resources.get("limits", {}) or GPU in resources.get("requests", {}):
                gpus.append((workload["metadata"]["name"], container["name"]))
    assert set(gpus) <= {("processor", "processor"), ("processor", "triton")}
    if overlay == "overlays/prod-gpu":
        # the device plugin gives a GPU to one container of a pod: Triton's
        assert gpus == [("processor", "triton")]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_and_containers_are_locked_down(overlay: str) -> None:
    for workload in of_kind(rendered(overlay), *WORKLOADS):
        spec = pod_spec(workload)
        name = workload["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec.get("automountServiceAccountToken") is False, name
        for container in containers(spec):
            where = f"{name}/{container['name']}"
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert "privileged" not in context, where
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= container["resources"][kind].keys(), where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_termination_grace_outlasts_drain_and_grace(overlay: str) -> None:
    """A pod is never killed while it still lets calls or jobs finish: a processor lets its
    jobs run on for JOB_GRACE_SECONDS (alongside DRAIN_SECONDS), then hands back what is
    left (each Release bounded by RELEASE_SECONDS) before its server's grace."""
    for workload, container, service in workshop_containers(rendered(overlay)):
        if workload["kind"] == "Job":
            continue
        wait = float(setting_value(container, service, "drain_seconds")) + float(
            setting_value(container, service, "grace_seconds")
        )
        if service == "processor":
            wait += float(setting_value(container, service, "job_grace_seconds"))
            wait += RELEASE_SECONDS
        grace = pod_spec(workload)["terminationGracePeriodSeconds"]
        assert grace > wait, f"{workload['metadata']['name']}: {grace} s <= {wait} s"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_gateway_is_reachable_from_outside(overlay: str) -> None:
    policies = of_kind(rendered(overlay), "NetworkPolicy")
    deny = [p for p in policies if p["spec"]["podSelector"] == {} and "ingress" not in p["spec"]]
    assert deny, "no default-deny ingress policy"
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            opened = peers is None or any("podSelector" not in peer for peer in peers)
            if opened:
                assert policy["spec"]["podSelector"] == {"matchLabels": {"app": "gateway"}}


def test_dev_stores_are_reached_only_by_their_owners() -> None:
    documents = rendered("overlays/dev")
    owners = {"postgres": {"coordinator", "coordinator-migrate"}, "minio": {"preview", "processor"}}
    for store, expected in owners.items():
        (policy,) = [
            p
            for p in of_kind(documents, "NetworkPolicy")
            if p["spec"]["podSelector"] == {"matchLabels": {"app": store}}
        ]
        peers = {
            peer["podSelector"]["matchLabels"]["app"]
            for rule in policy["spec"]["ingress"]
            for peer in rule["from"]
        }
        assert peers == expected, store


def test_prod_gateway_serves_mcp_on_its_ingress_host() -> None:
    documents = rendered("overlays/prod-gpu")
    (ingress,) = of_kind(documents, "Ingress")
    hosts = {rule["host"] for rule in ingress["spec"]["rules"]}
    gateway = pod_spec(named(documents, "Deployment", "gateway"))["containers"][0]
    allowed = set(str(literal(gateway, "GATEWAY_MCP_ALLOWED_HOSTS")).split(","))
    assert {"gateway", "gateway:*"} | hosts <= allowed
