"""One trace spans gateway -> coordinator for a CreateRun (docs/metrics.md#traces), and each
job attempt is a trace of its own linked to it: a real
coordinator and gateway process export over OTLP/gRPC to a receiver this test runs (the
collector's TraceService from opentelemetry-proto); the gateway's request span, its
client span of the call and the coordinator's server span share one trace id, each
the parent of the next. Without an OTLP endpoint, a process exports nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf.duration_pb2 import Duration
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_leases import claimed, complete_request, create_run, empty_result, setup
from testbed.coordinator_world import CODE, build_world, save_workflow, workflow_spec
from testbed.harness.coordinator import coordinator_client
from testbed.harness.processes import ServiceProcess, prefixed
from workshop.kit.auth import bearer_metadata
from workshop.kit.telemetry import client_interceptors, configure_tracing, tracing_enabled
from workshop.v1 import jobs_pb2
from workshop.v1 import operator_pb2 as op

pytestmark = pytest.mark.timeout(90)

CREATE_RUN = "workshop.v1.WorkshopService/CreateRun"


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver keeping every span it is sent, with its service's name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, trace_pb2.Span]] = []

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append((attributes.get("service.name", ""), span))
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, int]]:
    server = grpc.aio.server()
    found = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(found, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield found, port
    finally:
        await server.stop(0)


def otlp_env(port: int) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: the batches go out while the test waits
    }


async def wait_for_spans(found: Receiver, names: set[str], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not names <= {span.name for _, span in found.spans}:
        assert time.monotonic() < deadline, [(s, span.name) for s, span in found.spans]
        await asyncio.sleep(0.1)


async def test_a_create_run_is_one_trace_from_the_gateway_to_the_coordinator(
    pg_dsn: str, receiver: tuple[Receiver, int], tmp_path: Path
) -> None:
    found, otlp_port = receiver
    coordinator = ServiceProcess(
        "services.coordinator",
        {
            **otlp_env(otlp_port),
            **prefixed(
                "COORDINATOR",
                {
                    "DATABASE_URL": pg_dsn,
                    "HOST": "127.0.0.1",
                    "PORT": "0",
                    "DRAIN_SECONDS": "0",
                    "GRACE_SECONDS": "1",
                    "SCHEDULER_INTERVAL_SECONDS": "0",
                    "MAINTENANCE_INTERVAL_SECONDS": "0",
                },
            ),
        },
        tmp_path / "coordinator.log",
    )
    gateway: ServiceProcess | None = None
    try:
        port = int((await asyncio.to_thread(coordinator.wait_event, "serving"))["port"])
        async with coordinator_client(pg_dsn, port) as c:
            world = await build_world(c)
            await save_workflow(c, "night", workflow_spec())
            agent = await c.key(Grant(ScopeName.WORKSHOP), name="agent")
            gateway_key = await c.key(Grant(ScopeName.GATEWAY), name="gateway")
        gateway = ServiceProcess(
            "services.gateway",
            {
                **otlp_env(otlp_port),
                **prefixed(
                    "GATEWAY",
                    {
                        "HOST": "127.0.0.1",
                        "PORT": "0",
                        "HTTP_HOST": "127.0.0.1",
                        "HTTP_PORT": "0",
                        "DRAIN_SECONDS": "0",
                        "COORDINATOR_TARGET": f"127.0.0.1:{port}",
                        "PREVIEW_TARGET": "127.0.0.1:9",
                        "KEY": gateway_key,
                    },
                ),
            },
            tmp_path / "gateway.log",
        )
        http_port = int((await asyncio.to_thread(gateway.wait_event, "http"))["port"])
        await asyncio.to_thread(gateway.wait_event, "serving")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}") as client:
            created = await client.post(
                "/v1/workshop/runs",
                headers={"authorization": f"Bearer {agent}"},
                json={
                    "id": "r-traced",
                    "workflow_id": "night",
                    "runtime_id": world.tracking_runtime,
                    "revision": 1,
                    "mode": "test",
                    "image_limit": 20,
                },
            )
        assert created.status_code == 200, created.text
        await wait_for_spans(found, {"POST /v1/workshop/runs", f"/{CREATE_RUN}"})
    finally:
        if gateway is not None:
            gateway.stop()
        coordinator.stop()

    [request] = [s for name, s in found.spans if name == "gateway" and s.name.startswith("POST")]
    [client_call] = [
        s for name, s in found.spans if name == "gateway" and s.name == f"/{CREATE_RUN}"
    ]
    [served] = [
        s for name, s in found.spans if name == "coordinator" and s.name == f"/{CREATE_RUN}"
    ]
    assert request.name == "POST /v1/workshop/runs"
    assert request.kind == trace_pb2.Span.SPAN_KIND_SERVER
    assert client_call.kind == trace_pb2.Span.SPAN_KIND_CLIENT
    assert served.kind == trace_pb2.Span.SPAN_KIND_SERVER
    assert request.trace_id == client_call.trace_id == served.trace_id
    assert client_call.parent_span_id == request.span_id
    assert served.parent_span_id == client_call.span_id


@pytest.mark.parametrize(
    "env",
    [{}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none"}],
)
def test_without_an_endpoint_nothing_is_traced(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    configure_tracing("quiet")
    assert not tracing_enabled()
    assert client_interceptors() == []


async def test_each_job_attempt_is_a_trace_linked_to_its_runs_creation(
    pg_dsn: str, receiver: tuple[Receiver, int], tmp_path: Path
) -> None:
    """A job's lease lapses under one processor (the manual clock moves past it, the
    coordinator's maintenance takes it back) and another claims and completes it: two
    attempt traces, each one root span from its claim to its end, with its outcome, and
    each linked to the span of the CreateRun that made the run."""
    found, otlp_port = receiver
    coordinator = ServiceProcess(
        "services.coordinator",
        {
            **otlp_env(otlp_port),
            **prefixed(
                "COORDINATOR",
                {
                    "DATABASE_URL": pg_dsn,
                    "HOST": "127.0.0.1",
                    "PORT": "0",
                    "DRAIN_SECONDS": "0",
                    "GRACE_SECONDS": "1",
                    "SCHEDULER_INTERVAL_SECONDS": "0",
                    "MAINTENANCE_INTERVAL_SECONDS": "0.2",
                    "MANUAL_CLOCK": "1",
                },
            ),
        },
        tmp_path / "coordinator.log",
    )
    try:
        port = int((await asyncio.to_thread(coordinator.wait_event, "serving"))["port"])
        async with coordinator_client(pg_dsn, port) as c:
            s = await setup(c)
            other = bearer_metadata(
                await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="b")
            )
            await create_run(c, s, "r-attempts", full=False)
            first = await claimed(c, s)
            await c.operator.AdvanceClock(
                op.AdvanceClockRequest(by=Duration(seconds=6 * 60)), metadata=c.admin
            )
            claim = jobs_pb2.ClaimRequest(
                runtime_id=s.world.tracking_runtime, code_sha256=CODE, wait_seconds=10
            )
            while True:  # maintenance (every 0.2 s) takes the lapsed lease back
                second = (await c.jobs.Claim(claim, metadata=other)).job
                if second.lease.job_id == first.lease.job_id:
                    break
            assert second.lease.generation == first.lease.generation + 1
            await c.jobs.Complete(complete_request(second, empty_result(second)), metadata=other)
            await wait_for_spans(found, {"job attempt", f"/{CREATE_RUN}"})
            deadline = time.monotonic() + 20
            while len(attempt_spans(found)) < 2:
                assert time.monotonic() < deadline, attempt_spans(found)
                await asyncio.sleep(0.1)
    finally:
        coordinator.stop()

    [created] = [
        s for name, s in found.spans if name == "coordinator" and s.name == f"/{CREATE_RUN}"
    ]
    lapsed, completed = sorted(attempt_spans(found), key=generation)
    assert attributes(lapsed)["workshop.attempt.outcome"] == "lapsed"
    assert attributes(lapsed)["workshop.job_id"] == first.lease.job_id
    assert lapsed.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert attributes(completed)["workshop.attempt.outcome"] == "completed"
    assert attributes(completed)["workshop.run_id"] == "r-attempts"
    for span in (lapsed, completed):
        assert span.parent_span_id == b""  # the root of a trace of its own
        assert span.trace_id != created.trace_id
        [link] = span.links
        assert (link.trace_id, link.span_id) == (created.trace_id, created.span_id)
        assert span.end_time_unix_nano > span.start_time_unix_nano
    assert lapsed.trace_id != completed.trace_id
    # the lapsed attempt ran from its claim until maintenance took it back, 6 minutes on
    assert lapsed.end_time_unix_nano - lapsed.start_time_unix_nano >= 6 * 60 * 10**9


def attempt_spans(found: Receiver) -> list[trace_pb2.Span]:
    return [s for name, s in found.spans if name == "coordinator" and s.name == "job attempt"]


def generation(span: trace_pb2.Span) -> int:
    value = attributes(span)["workshop.lease.generation"]
    assert isinstance(value, int)
    return value


def attributes(span: trace_pb2.Span) -> dict[str, object]:
    def value(v: Any) -> object:
        return v.int_value if v.HasField("int_value") else v.string_value

    return {a.key: value(a.value) for a in span.attributes}
