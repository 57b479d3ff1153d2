"""The MCP server at /v1/mcp (docs/mcp.md), with the SDK's own client over real HTTP against
a real gateway in front of the coordinator (Postgres) and the preview service (SeaweedFS);
the runs that really complete and the photo are processed by a real processor with Triton."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, ImageContent

from services.coordinator.auth import Grant, ScopeName
from testbed.coordinator_world import build_world as coordinator_world
from testbed.coordinator_world import save_workflow, workflow_spec
from testbed.harness.gateway import GatewayHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.processor_world import START, build_world, running_processor, yard_spec
from workshop.v1 import operator_pb2 as op

pytestmark = pytest.mark.timeout(120)


@asynccontextmanager
async def mcp_client(gateway: GatewayHarness, secret: str) -> AsyncIterator[ClientSession]:
    """An initialized SDK client session on /v1/mcp with `secret` as its bearer."""
    headers = {"authorization": f"Bearer {secret}"} if secret else {}
    timeout = httpx2.Timeout(30.0, read=120.0)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(f"{gateway.url}/v1/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def agent(gateway: GatewayHarness) -> str:
    return await gateway.c.key(Grant(ScopeName.WORKSHOP), name="agent")


def structured(result: CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None, result
    return result.structured_content


def ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    return structured(result)


def error(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error, result
    body = structured(result)
    assert set(body) == {"code", "status", "reason", "message", "details"}, body
    return body


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


async def test_a_key_without_the_scope_is_refused_with_the_catalog_reason(
    gateway: GatewayHarness,
) -> None:
    await coordinator_world(gateway.c)
    footage_only = await gateway.c.key(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-a",)))
    async with mcp_client(gateway, footage_only) as session:
        listed = error(await session.call_tool("runs", {"action": "list"}))
        photo = error(
            await session.call_tool("footage", {"camera_id": "cam-a", "time": "2026-11-29T08:00:00Z"})
        )
    assert (listed["status"], listed["reason"], listed["code"]) == (
        403,
        "SCOPE_MISSING",
        "PERMISSION_DENIED",
    )
    assert (photo["status"], photo["reason"]) == (403, "SCOPE_MISSING")
