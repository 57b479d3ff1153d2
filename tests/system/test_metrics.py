"""Every service's /metrics while a run goes through (docs/metrics.md): the real stack
(coordinator on Postgres, preview service on SeaweedFS, the gateway on uvicorn, a
processor with the demo detector in Triton), each endpoint scraped before and after,
parsed with prometheus_client's own parser, and the key series have moved.

The services run in this one process, so each endpoint also serves the others'
process-wide series; the RPC series tell them apart by their `service` label."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.leases.maintenance import Maintenance
from testbed.coordinator_leases import claimed, create_run, refused, setup
from testbed.coordinator_world import save_workflow
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.gateway import GatewayHarness
from testbed.harness.preview import PreviewHarness, running_preview
from testbed.harness.s3 import S3Bucket
from testbed.harness.triton import TritonServer
from tests.processor_world import build_world, finished, run_key, running_processor, yard_spec
from tests.service.test_preview_cleanup import cleanup, collectable_objects
from workshop.kit.auth import bearer_metadata
from workshop.kit.server import Server, ServerSettings
from workshop.v1 import common_pb2, jobs_pb2

pytestmark = pytest.mark.triton

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(client: httpx.AsyncClient, url: str) -> Samples:
    answer = await client.get(url)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(value for (n, got), value in samples.items() if n == name and wanted <= got)


@asynccontextmanager
async def metrics_server(label: str) -> AsyncIterator[int]:
    """A kit server with no services, as the processor's __main__ runs: its /metrics port."""
    server = Server(label=label, settings=ServerSettings(drain_seconds=0.0), services=[])
    await server.start()
    try:
        assert server.metrics_port is not None
        yield server.metrics_port
    finally:
        await server.stop()


async def test_every_service_scrape_moves_while_a_run_goes_through(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    gateway: GatewayHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path, cameras=["cam-a"])
    await save_workflow(c, "yard", yard_spec(world.model, ["cam-a"]))
    agent = await gateway.agent(Grant(ScopeName.ADMIN))
    async with metrics_server("processor-test") as processor_port, httpx.AsyncClient() as http:
        urls = {
            "coordinator": f"http://127.0.0.1:{c.metrics_port}/metrics",
            "preview": f"http://127.0.0.1:{preview.metrics_port}/metrics",
            "processor": f"http://127.0.0.1:{processor_port}/metrics",
            "gateway": f"{gateway.url}/metrics",
        }
        before = {name: await scrape(http, url) for name, url in urls.items()}

        created = await agent.post(
            "/v1/workshop/runs",
            json={
                "id": "r1",
                "workflow_id": "yard",
                "runtime_id": world.runtime_id,
                "revision": 1,
                "mode": "full",
            },
        )
        assert created.status_code == 200, created.text
        queued = await scrape(http, urls["coordinator"])
        assert total(queued, "workshop_coordinator_jobs", runtime=world.runtime_id) == 1
        assert total(queued, "workshop_coordinator_claimable_jobs", runtime=world.runtime_id) == 1

        # a claim with another code's digest: a fence refusal, counted by its reason
        with pytest.raises(grpc.aio.AioRpcError):
            await c.jobs.Claim(
                jobs_pb2.ClaimRequest(runtime_id=world.runtime_id, code_sha256="0" * 64),
                metadata=bearer_metadata(await run_key(c)),
            )

        live = gateway.url.replace("http", "ws") + "/v1/workshop/runs/r1/live"
        headers = {"authorization": agent.headers["authorization"]}
        async with connect(live, additional_headers=headers, ping_interval=None) as socket:
            first = json.loads(await socket.recv())
            assert first["detail"]["run"]["run_id"] == "r1"
            during = await scrape(http, urls["gateway"])
            assert total(during, "workshop_gateway_sockets_open") == 1
            async with running_processor(c, preview, triton_server, world.runtime_id):
                detail = await finished(c, "r1")
                assert detail.run.status == common_pb2.RUN_STATUS_COMPLETED, detail
                while not json.loads(await socket.recv())["final"]:
                    pass
                after = {name: await scrape(http, url) for name, url in urls.items()}

    def moved(endpoint: str, name: str, **labels: str) -> float:
        return total(after[endpoint], name, **labels) - total(before[endpoint], name, **labels)

    # coordinator: RPC series by method and code, refusals by reason, its own series
    rpc = {"service": "coordinator-test"}
    create = "workshop.v1.WorkshopService/CreateRun"
    assert moved("coordinator", "workshop_rpc_requests_total", **rpc, method=create, code="OK") == 1
    assert moved("coordinator", "workshop_rpc_duration_seconds_count", **rpc, method=create) == 1
    # the processor claims on its Session stream (its default), where each call is counted
    # as a call of its own; the refused claim below is the test's own, unary
    on_session = {"method": "workshop.v1.JobService/Session/Claim", "code": "OK"}
    assert moved("coordinator", "workshop_rpc_requests_total", **rpc, **on_session) >= 1
    claim = "workshop.v1.JobService/Claim"
    assert (
        moved(
            "coordinator",
            "workshop_rpc_requests_total",
            **rpc,
            method=claim,
            code="FAILED_PRECONDITION",
        )
        == 1
    )
    refused = {"method": claim, "reason": "CODE_MISMATCH"}
    assert moved("coordinator", "workshop_rpc_refusals_total", **rpc, **refused) == 1
    fence = {"reason": "CODE_MISMATCH"}
    assert moved("coordinator", "workshop_coordinator_fence_refusals_total", **fence) == 1
    assert moved("coordinator", "workshop_coordinator_claim_seconds_count") >= 1
    assert moved("coordinator", "workshop_coordinator_previews_recorded_total") == 10
    assert total(after["coordinator"], "workshop_coordinator_jobs", runtime=world.runtime_id) == 0

    # processor: ten slots, each decoded, inferred and published (rate() of these: per second)
    assert moved("processor", "workshop_processor_frames_decoded_total") == 10
    assert moved("processor", "workshop_processor_frames_inferred_total") == 10
    assert moved("processor", "workshop_processor_frames_published_total") == 10
    assert moved("processor", "workshop_processor_decode_seconds_count") >= 1
    model = {"model": world.model}
    assert moved("processor", "workshop_processor_inference_seconds_count", **model) >= 1
    assert ("workshop_processor_jobs_in_flight", frozenset()) in after["processor"]
    assert moved("processor", "workshop_processor_hand_backs_total") == 0

    # preview: each frame's preview written once (in a full run it is also the item's
    # object) by the processor with a grant, and recorded on its session at the
    # coordinator (previews_recorded above): the preview service only granted the writes
    direct = {"kind": "preview", "path": "direct"}
    assert moved("preview", "workshop_preview_puts_total", **direct) == 0
    assert moved("preview", "workshop_preview_puts_total", kind="preview", path="relayed") == 0
    grants = {"service": "preview-test", "method": "workshop.v1.PreviewService/GrantPreviewWrites"}
    assert moved("preview", "workshop_rpc_requests_total", **grants, code="OK") >= 1

    # gateway: the request by its route template, the socket it served, the messages it
    # sent; no slow reader here
    created_route = {"method": "POST", "route": "/v1/workshop/runs"}
    ok = {**created_route, "status": "200"}
    assert moved("gateway", "workshop_gateway_http_requests_total", **ok) == 1
    assert moved("gateway", "workshop_gateway_http_duration_seconds_count", **created_route) == 1
    assert moved("gateway", "workshop_gateway_sockets_served_total") == 1
    assert moved("gateway", "workshop_gateway_messages_sent_total") >= 2
    assert moved("gateway", "workshop_gateway_slow_readers_dropped_total") == 0


async def test_lapsed_leases_and_the_fence_they_meet_are_counted(
    coordinator: CoordinatorHarness,
) -> None:
    """Maintenance takes back two lapsed leases (requeued); the heartbeat of one of them
    after that meets the LEASE_MISMATCH fence. The jobs gauges follow each step; r2's
    jobs are queued but not claimable while r1 is the runtime's head run."""
    c = coordinator
    built = await setup(c)
    await create_run(c, built)
    await create_run(c, built, "r2")
    url = f"http://127.0.0.1:{c.metrics_port}/metrics"
    async with httpx.AsyncClient() as http:
        before = await scrape(http, url)
        job = await claimed(c, built)
        await claimed(c, built)
        leased = await scrape(http, url)
        c.clock.advance(timedelta(minutes=5, seconds=1))
        done = await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
        assert done.requeued == 2
        assert await refused(
            c.jobs.Heartbeat(jobs_pb2.HeartbeatRequest(lease=job.lease), metadata=built.processor)
        ) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_MISMATCH")
        after = await scrape(http, url)

    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    runtime = built.world.tracking_runtime
    assert total(leased, "workshop_coordinator_jobs", runtime=runtime, state="leased") == 2
    assert total(before, "workshop_coordinator_claimable_jobs", runtime=runtime) == 2
    assert total(leased, "workshop_coordinator_claimable_jobs", runtime=runtime) == 0
    assert total(after, "workshop_coordinator_claimable_jobs", runtime=runtime) == 2
    assert total(after, "workshop_coordinator_jobs", runtime=runtime, state="leased") == 0
    assert total(after, "workshop_coordinator_jobs", runtime=runtime, state="queued") == 4
    assert moved("workshop_coordinator_lease_lapses_total", outcome="requeued") == 2
    assert moved("workshop_coordinator_lease_lapses_total", outcome="exhausted") == 0
    fence = {"reason": "LEASE_MISMATCH"}
    assert moved("workshop_coordinator_fence_refusals_total", **fence) == 1
    heartbeat = {"method": "workshop.v1.JobService/Heartbeat", "reason": "LEASE_MISMATCH"}
    assert moved("workshop_rpc_refusals_total", service="coordinator-test", **heartbeat) == 1


async def test_cleanup_deletions_are_counted_by_kind(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> None:
    c = coordinator
    await collectable_objects(c, s3_bucket, "preview", 3)
    await collectable_objects(c, s3_bucket, "upload", 2)
    async with running_preview(c, s3_bucket) as p, httpx.AsyncClient() as http:
        url = f"http://127.0.0.1:{p.metrics_port}/metrics"
        before = await scrape(http, url)
        await cleanup(c, p)
        after = await scrape(http, url)

    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert moved("workshop_preview_cleanup_deletions_total", kind="preview") == 3
    assert moved("workshop_preview_cleanup_deletions_total", kind="upload") == 2
    assert moved("workshop_preview_cleanup_deleted_bytes_total", kind="upload") == 2
    cleanup_rpc = {"service": "preview-test", "method": "workshop.v1.PreviewService/RunCleanup"}
    assert moved("workshop_rpc_requests_total", **cleanup_rpc, code="OK") == 1


async def test_a_metrics_port_answers_only_get_metrics() -> None:
    async with metrics_server("bare") as port, httpx.AsyncClient() as http:
        missing = await http.get(f"http://127.0.0.1:{port}/other")
        assert missing.status_code == 404
        assert (await http.post(f"http://127.0.0.1:{port}/metrics")).status_code == 404
        assert (await http.get(f"http://127.0.0.1:{port}/metrics")).status_code == 200


async def test_metrics_port_minus_one_serves_none() -> None:
    settings = ServerSettings(metrics_port=-1, drain_seconds=0.0)
    server = Server(label="off", settings=settings, services=[])
    await server.start()
    try:
        assert server.metrics_port is None
    finally:
        await server.stop()
