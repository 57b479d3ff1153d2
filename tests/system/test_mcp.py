"""The MCP server at /v1/mcp (docs/mcp.md), with the SDK's own client over real HTTP against
a real gateway in front of the coordinator (Postgres) and the preview service (SeaweedFS);
the runs that really complete and the photo are processed by a real processor with Triton."""

from __future__ import annotations

import asyncio
import base64
from contextlib import AsyncExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from mcp_types import ImageContent

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_world import build_world as coordinator_world
from testbed.coordinator_world import save_workflow, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.gateway import GatewayHarness, running_gateway
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.mcp_session import agent, error, mcp_client, ok
from tests.processor_gates import until
from tests.processor_world import START, build_world, running_processor, yard_spec
from workshop.v1 import operator_pb2 as op

pytestmark = pytest.mark.timeout(120)


async def test_the_tools_are_listed_with_their_schemas(gateway: GatewayHarness) -> None:
    async with mcp_client(gateway, await agent(gateway)) as session:
        listed = await session.list_tools()
    tools = {tool.name: tool for tool in listed.tools}
    assert set(tools) == {"runs", "footage"}
    runs, footage = tools["runs"], tools["footage"]
    assert runs.input_schema["required"] == ["action"]
    assert set(runs.input_schema["properties"]["action"]["enum"]) == {
        "create",
        "list",
        "get",
        "watch",
        "cancel",
    }
    assert runs.input_schema["properties"]["timeout_seconds"]["maximum"] == 60
    assert runs.output_schema is not None
    assert {"detail", "cursor", "progress_percent", "final", "run", "created"} <= set(
        runs.output_schema["properties"]
    )
    assert set(footage.input_schema["required"]) == {"camera_id", "time"}
    assert footage.output_schema is not None
    assert {"photo", "taken", "expires_at"} <= set(footage.output_schema["properties"])


async def test_no_bearer_or_a_rejected_one_is_401_before_the_mcp_layer(
    gateway: GatewayHarness,
) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"accept": "application/json, text/event-stream"}
    async with gateway.client() as http:
        missing = await http.post("/v1/mcp", json=body, headers=headers)
        rejected = await http.post(
            "/v1/mcp", json=body, headers={**headers, "authorization": "Bearer wk_nope.nope"}
        )
        other_method = await http.get("/v1/mcp", headers=headers)
    assert missing.status_code == 401, missing.text
    assert missing.json()["reason"] == "CREDENTIAL_MISSING"
    assert rejected.status_code == 401, rejected.text
    assert rejected.json()["reason"] in ("CREDENTIAL_REJECTED", "CREDENTIAL_MALFORMED")
    assert other_method.status_code == 405
    assert other_method.json()["reason"] == "METHOD_NOT_ALLOWED"


async def test_arguments_the_schema_refuses_are_structured_errors(gateway: GatewayHarness) -> None:
    async with mcp_client(gateway, await agent(gateway)) as session:
        action = error(await session.call_tool("runs", {"action": "explode"}))
        limit = error(
            await session.call_tool("runs", {"action": "watch", "id": "r", "timeout_seconds": 61})
        )
        extra = error(await session.call_tool("runs", {"action": "get", "id": "r", "run": "r"}))
        cursor = error(
            await session.call_tool("runs", {"action": "watch", "id": "r", "cursor": "x"})
        )
        tool = error(await session.call_tool("photos", {}))
        when = error(
            await session.call_tool("footage", {"camera_id": "cam-a", "time": "2026-11-29T08:00"})
        )
    named = ((action, "action"), (limit, "timeout_seconds"), (extra, "run"), (when, "time"))
    for body, field in named:
        assert (body["status"], body["reason"]) == (400, "INVALID_FIELD"), body
        assert [v["field"] for v in body["details"]["field_violations"]] == [field], body
    assert cursor["reason"] == "INVALID_FIELD"
    assert (tool["status"], tool["reason"]) == (404, "NOT_FOUND")


async def test_host_origin_and_size_are_refused_before_the_mcp_layer(
    gateway: GatewayHarness,
) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {
        "accept": "application/json, text/event-stream",
        "authorization": f"Bearer {await agent(gateway)}",
    }
    async with gateway.client() as http:
        host = await http.post("/v1/mcp", json=body, headers={**headers, "host": "evil.example"})
        origin = await http.post(
            "/v1/mcp", json=body, headers={**headers, "origin": "https://evil.example"}
        )
        large = await http.post(
            "/v1/mcp",
            content=b" " * (64 * 1024 + 1),
            headers={**headers, "content-type": "application/json"},
        )
        listed = await http.post("/v1/mcp", json=body, headers={**headers, "origin": gateway.url})
    assert (host.status_code, host.json()["reason"]) == (421, "HOST_NOT_ALLOWED")
    assert (origin.status_code, origin.json()["reason"]) == (403, "CROSS_SITE")
    assert (large.status_code, large.json()["reason"]) == (413, "PAYLOAD_TOO_LARGE")
    assert listed.status_code == 200
    assert listed.headers["content-type"].startswith("text/event-stream")
    assert '"name":"runs"' in listed.text


async def test_create_is_idempotent_by_id_and_another_body_conflicts(
    gateway: GatewayHarness,
) -> None:
    world = await coordinator_world(gateway.c)
    await save_workflow(gateway.c, "night", workflow_spec())
    create = {
        "action": "create",
        "id": "r1",
        "workflow_id": "night",
        "runtime_id": world.tracking_runtime,
        "revision": 1,
        "mode": "test",
        "image_limit": 5,
    }
    async with mcp_client(gateway, await agent(gateway)) as session:
        first = ok(await session.call_tool("runs", create))
        again = ok(await session.call_tool("runs", create))
        other = error(await session.call_tool("runs", {**create, "image_limit": 6}))
        no_id = error(await session.call_tool("runs", {**create, "id": None}))
        bad_mode = error(await session.call_tool("runs", {**create, "id": "r2", "revision": -1}))
        listed = ok(await session.call_tool("runs", {"action": "list", "workflow_id": "night"}))
    assert first["created"] is True
    assert first["run"]["run_id"] == "r1"
    assert first["run"]["status"] == "queued"
    assert again["created"] is False
    assert again["run"]["run_id"] == "r1"
    assert again["run"]["created_at"] == first["run"]["created_at"]
    assert (other["status"], other["reason"], other["code"]) == (409, "ID_CONFLICT", "ABORTED")
    assert (no_id["status"], no_id["reason"]) == (400, "INVALID_FIELD")
    assert no_id["details"]["field_violations"][0]["field"] == "id"
    assert bad_mode["status"] == 400
    assert [entry["run"]["run_id"] for entry in listed["runs"]] == ["r1"]


async def test_get_shows_the_runs_a_queued_run_waits_behind(gateway: GatewayHarness) -> None:
    world = await coordinator_world(gateway.c)
    await save_workflow(gateway.c, "night", workflow_spec())
    base = {
        "action": "create",
        "workflow_id": "night",
        "runtime_id": world.tracking_runtime,
        "revision": 1,
        "mode": "test",
    }
    async with mcp_client(gateway, await agent(gateway)) as session:
        ok(await session.call_tool("runs", {**base, "id": "older"}))
        ok(await session.call_tool("runs", {**base, "id": "newer"}))
        got = ok(await session.call_tool("runs", {"action": "get", "id": "newer"}))
        cancelled = ok(await session.call_tool("runs", {"action": "cancel", "id": "older"}))
        missing = error(await session.call_tool("runs", {"action": "get", "id": "nope"}))
    assert got["detail"]["run"]["status"] == "queued"
    assert got["detail"]["run"]["waiting_behind"] == ["older"]
    assert cancelled["run"]["status"] == "cancelled"
    assert cancelled["jobs_cancelled"] >= 1
    assert (missing["status"], missing["reason"]) == (404, "NOT_FOUND")


@pytest.mark.parametrize("live", [True, False], ids=["live-hub", "stream-refused"])
async def test_watch_returns_when_the_run_finishes_before_its_time_limit(
    coordinator: CoordinatorHarness, preview: PreviewHarness, live: bool
) -> None:
    """A watch waiting on the hub returns as soon as the run is final (here: cancelled by
    another call). A gateway whose hub cannot follow runs (no `gateway` key, so the shared
    stream is refused) still answers it, asking the coordinator each second instead."""
    overrides = {} if live else {"key": ""}
    async with running_gateway(coordinator, preview.port, **overrides) as gateway:
        world = await coordinator_world(coordinator)
        await save_workflow(coordinator, "night", workflow_spec())
        create = {
            "action": "create",
            "id": "r1",
            "workflow_id": "night",
            "runtime_id": world.tracking_runtime,
            "revision": 1,
            "mode": "test",
        }
        secret = await agent(gateway)
        async with mcp_client(gateway, secret) as session, mcp_client(gateway, secret) as other:
            ok(await session.call_tool("runs", create))
            hub = gateway.app.hub
            watching = asyncio.create_task(
                session.call_tool("runs", {"action": "watch", "id": "r1", "timeout_seconds": 30})
            )
            await until(lambda: hub.stats()["streams_opened"] >= 1, "the watch on the hub")
            ok(await other.call_tool("runs", {"action": "cancel", "id": "r1"}))
            answer = ok(await asyncio.wait_for(watching, timeout=25))
        stats = hub.stats()
    assert answer["final"] is True
    assert answer["detail"]["run"]["status"] == "cancelled"
    assert answer["progress_percent"] == 100
    assert stats["streams_opened"] >= 1
    if live:  # the hub's stream delivered the cancellation
        assert stats["stream_messages"] >= 1, stats
    else:  # the stream was refused: only the coordinator's answer to a poll can have
        assert stats["stream_messages"] == 0, stats


async def test_a_watch_in_flight_answers_when_the_gateway_stops(
    coordinator: CoordinatorHarness, preview: PreviewHarness
) -> None:
    """Stopping the gateway closes the hub first: a watch waiting on it answers at once
    with the state it has (not final) instead of holding the shutdown for its limit."""
    world = await coordinator_world(coordinator)
    await save_workflow(coordinator, "night", workflow_spec())
    async with AsyncExitStack() as client_stack:
        async with running_gateway(coordinator, preview.port) as gateway:
            session = await client_stack.enter_async_context(
                mcp_client(gateway, await agent(gateway))
            )
            create = {
                "action": "create",
                "id": "r1",
                "workflow_id": "night",
                "runtime_id": world.tracking_runtime,
                "revision": 1,
                "mode": "test",
            }
            ok(await session.call_tool("runs", create))
            watching = asyncio.create_task(
                session.call_tool("runs", {"action": "watch", "id": "r1", "timeout_seconds": 30})
            )
            hub = gateway.app.hub
            await until(lambda: hub.stats()["streams_opened"] >= 1, "the watch on the hub")
            loop = asyncio.get_running_loop()
            stopping = loop.time()
        # the gateway has stopped
        stopped = loop.time() - stopping
        answer = ok(await asyncio.wait_for(watching, timeout=5))
    assert stopped < 5, stopped
    assert answer["final"] is False
    assert answer["detail"]["run"]["status"] == "queued"
    assert answer["cursor"].startswith("w1.0.")


async def test_a_key_without_the_scope_is_refused_with_the_catalog_reason(
    gateway: GatewayHarness,
) -> None:
    await coordinator_world(gateway.c)
    footage_only = await gateway.c.key(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-a",)))
    async with mcp_client(gateway, footage_only) as session:
        listed = error(await session.call_tool("runs", {"action": "list"}))
        asked = {"camera_id": "cam-a", "time": "2026-11-29T08:00:00Z"}
        photo = error(await session.call_tool("footage", asked))
    assert (listed["status"], listed["reason"], listed["code"]) == (
        403,
        "SCOPE_MISSING",
        "PERMISSION_DENIED",
    )
    assert (photo["status"], photo["reason"]) == (403, "SCOPE_MISSING")


async def runtime_checked_in(gateway: GatewayHarness) -> None:
    """A photo goes to the runtime that checked in most recently: wait for the first claim."""
    c = gateway.c
    for _ in range(100):
        runtimes = await c.operator.ListRuntimes(op.ListRuntimesRequest(), metadata=c.admin)
        if any(runtime.HasField("last_seen_at") for runtime in runtimes.runtimes):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("no runtime checked in")


@pytest.mark.triton
async def test_a_run_is_watched_to_completion_over_bounded_calls_with_progress(
    gateway: GatewayHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    c = gateway.c
    world = await build_world(c, preview, triton_server, tmp_path)
    await save_workflow(c, "yard", yard_spec(world.model))
    notified: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        assert total == 100
        notified.append(progress)

    calls: list[dict[str, Any]] = []
    async with mcp_client(gateway, await agent(gateway)) as session:
        created = ok(
            await session.call_tool(
                "runs",
                {
                    "action": "create",
                    "id": "r1",
                    "workflow_id": "yard",
                    "runtime_id": world.runtime_id,
                    "revision": 1,
                    "mode": "test",
                    "image_limit": 20,
                },
            )
        )
        assert created["run"]["status"] == "queued"
        watch: dict[str, Any] = {"action": "watch", "id": "r1", "timeout_seconds": 1}
        # No processor yet: the call returns after its second, not final, with a cursor.
        calls.append(ok(await session.call_tool("runs", watch, progress_callback=on_progress)))
        async with running_processor(c, preview, triton_server, world.runtime_id):
            while not calls[-1]["final"] and len(calls) < 60:
                watch["cursor"] = calls[-1]["cursor"]
                answer = await session.call_tool("runs", watch, progress_callback=on_progress)
                calls.append(ok(answer))
        # Watching a finished run answers at once, the same state, unchanged.
        watch["cursor"] = calls[-1]["cursor"]
        again = ok(await session.call_tool("runs", watch))
        one = ok(await session.call_tool("runs", {**watch, "job_limit": 1}))
    first, last = calls[0], calls[-1]
    assert (first["final"], first["progress_percent"], first["changed"]) == (False, 0, True)
    assert first["cursor"].startswith("w1.0.")
    assert len(calls) >= 2
    assert last["final"] is True
    assert last["detail"]["run"]["status"] == "completed"
    assert last["detail"]["run"]["counts"]["slots_frame"] == 20
    assert last["progress_percent"] == 100
    assert (again["final"], again["changed"], again["cursor"]) == (True, False, last["cursor"])
    assert len(last["detail"]["jobs"]) == 2
    assert (len(one["detail"]["jobs"]), one["detail"]["jobs_truncated"]) == (1, True)
    # Progress notifications were received, in 0..100, never going down, ending at 100.
    assert notified, "no progress notifications"
    assert notified == sorted(notified)
    assert notified[0] >= 0
    assert notified[-1] == 100
    assert [call["progress_percent"] for call in calls] == sorted(
        call["progress_percent"] for call in calls
    )
    # Every watch waited on the gateway's live hub: one WatchRun stream for all the calls.
    assert gateway.app.hub.stats()["streams_opened"] == 1


@pytest.mark.triton
async def test_a_photo_comes_back_as_an_image_with_its_expiry(
    gateway: GatewayHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    c = gateway.c
    world = await build_world(c, preview, triton_server, tmp_path, cameras=["cam-a"])
    asked = (START + timedelta(seconds=7)).isoformat().replace("+00:00", "Z")
    async with running_processor(c, preview, triton_server, world.runtime_id):
        await runtime_checked_in(gateway)
        async with mcp_client(gateway, await agent(gateway)) as session:
            result = await session.call_tool("footage", {"camera_id": "cam-a", "time": asked})
            unknown = error(
                await session.call_tool("footage", {"camera_id": "cam-z", "time": asked})
            )
    answer = ok(result)
    images = [block for block in result.content if isinstance(block, ImageContent)]
    assert len(images) == 1
    assert images[0].mime_type == "image/jpeg"
    assert base64.b64decode(images[0].data).startswith(b"\xff\xd8")
    assert answer["taken"] is True
    assert answer["content_type"] == "image/jpeg"
    assert answer["photo"]["status"] == "completed"
    assert answer["photo"]["camera_id"] == "cam-a"
    assert answer["expires_at"] == answer["photo"]["expires_at"]
    assert answer["frame_time"].startswith("2026-11-29T08:00:07")
    assert (unknown["status"], unknown["reason"]) == (404, "NOT_FOUND")
