"""Every series the Grafana dashboard (deploy/grafana/workshop.json) and the alert rules
(deploy/prometheus/alerts.yaml) name is one the services export: the names are collected
from the real endpoints, a coordinator's /metrics (its registry and its scrape-time
gauges) and a gateway's (with its live-socket series), in a process that also imports the
preview service's and the processor's metrics modules into the one registry they share
(docs/metrics.md); the PromQL names are every `workshop_...` identifier of the files. A
panel or rule that names a series no service exports would show nothing, or never fire."""

from __future__ import annotations

import re

import httpx
import yaml  # type: ignore[import-untyped]
from prometheus_client.parser import text_string_to_metric_families

import services.preview.metrics
import services.processor.metrics
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.gateway import GatewayHarness
from tests.promtool import RULES, dashboard_expressions

SERIES = re.compile(r"\bworkshop_[a-z0-9_]+\b")
# The series a family of each type is exported as (prometheus_client's text format).
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("_sum", "_count", ""),
    "info": ("_info",),
    "unknown": ("",),
}


def exported(text: str) -> set[str]:
    """The series names a /metrics answer exports, samples or not."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def rule_expressions() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


async def test_the_dashboard_and_the_alerts_name_only_exported_series(
    coordinator: CoordinatorHarness, gateway: GatewayHarness
) -> None:
    # the modules of the services not started here register their series on import
    assert services.preview.metrics.CLEANUP_PASSES is not None
    assert services.processor.metrics.JOBS_IN_FLIGHT is not None
    async with httpx.AsyncClient() as client:
        scraped = await client.get(f"http://127.0.0.1:{coordinator.metrics_port}/metrics")
        gateway_scraped = await client.get(f"{gateway.url}/metrics")
    assert scraped.status_code == gateway_scraped.status_code == 200
    names = exported(scraped.text) | exported(gateway_scraped.text)
    # each service's own series are among them (the registry and the scrape-time ones)
    for own in (
        "workshop_coordinator_claimable_jobs",
        "workshop_coordinator_runtime_last_seen_timestamp_seconds",
        "workshop_gateway_sockets_open",
        "workshop_preview_cleanup_passes_total",
        "workshop_processor_jobs_in_flight",
        "workshop_rpc_requests_total",
    ):
        assert own in names

    dashboard = {name for expr in dashboard_expressions() for name in SERIES.findall(expr)}
    alerts = {name for expr in rule_expressions() for name in SERIES.findall(expr)}
    assert len(dashboard) > 25
    assert dashboard - names == set(), "the dashboard names series no service exports"
    assert alerts - names == set(), "the alert rules name series no service exports"
