"""MCP tool arguments are as strict as the /v1 routes (docs/mcp.md#tools), over the SDK's
own client on the real /v1/mcp endpoint of a real gateway (coordinator on Postgres,
preview service on SeaweedFS).

The cases are generated from what the gateway publishes: every property of every tool's
input schema (`tools/list`) gets values of each JSON type its schema does not admit (a
string for an integer, true for an integer, a number for a string, an object for an
array...), each on top of a call that is otherwise valid and would create a run. Each
must be 400 INVALID_FIELD naming exactly that argument, and no run may exist afterwards.
A body that both front doors take gets the same refusal from each: the same violations,
the same message.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_world import build_world, save_workflow, workflow_spec
from testbed.harness.gateway import GatewayHarness
from tests.mcp_session import agent, error, mcp_client, ok

pytestmark = pytest.mark.timeout(120)

TIME = "2026-11-29T08:00:07Z"
# Values of each JSON type; a property gets those of every type its schema refuses.
SAMPLES: dict[str, list[Any]] = {
    "string": ["20", "true"],
    "integer": [20, -3],
    "number": [1.5],
    "boolean": [True, False],
    "array": [[], [1]],
    "object": [{}, {"a": 1}],
}
# JSON Schema's "number" admits integers too.
ADMITS = {"number": {"number", "integer"}, "integer": {"integer"}}


def admitted(schema: dict[str, Any]) -> set[str]:
    """The JSON types a property's schema admits, null left aside (null means absent)."""
    found: set[str] = set()
    kinds = schema.get("type", [])
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        found |= ADMITS.get(kind, {kind})
    for branch in schema.get("anyOf", []) + schema.get("oneOf", []):
        found |= admitted(branch)
    return found - {"null"}


def wrong_values(schema: dict[str, Any]) -> list[Any]:
    types = admitted(schema)
    assert types, f"a property without a type: {schema}"
    return [value for kind, values in SAMPLES.items() if kind not in types for value in values]


async def create_body(gateway: GatewayHarness) -> dict[str, Any]:
    """A valid POST /v1/workshop/runs body (the world's tracking runtime, workflow night)."""
    world = await build_world(gateway.c)
    await save_workflow(gateway.c, "night", workflow_spec())
    return {
        "id": "r1",
        "workflow_id": "night",
        "runtime_id": world.tracking_runtime,
        "revision": 1,
        "mode": "test",
        "image_limit": 5,
    }


async def test_every_argument_of_every_tool_refuses_a_wrong_type(gateway: GatewayHarness) -> None:
    body = await create_body(gateway)
    secret = await agent(gateway)
    valid = {
        "runs": {"action": "create", **body},
        "footage": {"camera_id": "cam-a", "time": TIME, "timeout_seconds": 1},
    }
    refused: list[str] = []
    async with mcp_client(gateway, secret) as session:
        tools = (await session.list_tools()).tools
        assert {tool.name for tool in tools} == set(valid)
        for tool in tools:
            properties = tool.input_schema["properties"]
            assert set(valid[tool.name]) <= set(properties)
            for name, schema in properties.items():
                for n, value in enumerate(wrong_values(schema)):
                    arguments = {**valid[tool.name], name: value}
                    if tool.name == "runs" and name != "id":
                        arguments["id"] = f"{name}-{n}"  # a new run, were it accepted
                    result = await session.call_tool(tool.name, arguments)
                    case = f"{tool.name}.{name}={value!r}"
                    assert result.is_error, f"{case} was accepted: {result.structured_content}"
                    answer = error(result)
                    assert (answer["status"], answer["reason"]) == (400, "INVALID_FIELD"), case
                    fields = [v["field"] for v in answer["details"]["field_violations"]]
                    assert fields == [name], (case, answer)
                    refused.append(case)
    # Every integer argument met a string and true, every string one a number.
    assert "runs.image_limit='20'" in refused
    assert "runs.image_limit=True" in refused
    assert "runs.revision='20'" in refused
    assert "footage.time=20" in refused
    async with await gateway.agent(Grant(ScopeName.WORKSHOP)) as http:
        listed = await http.get("/v1/workshop/runs")
    assert listed.status_code == 200, listed.text
    assert listed.json()["runs"] == [], "a refused call created a run"


def refusal(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 400, answer.text
    body: dict[str, Any] = answer.json()
    return body


def same_refusal(http: dict[str, Any], mcp: dict[str, Any]) -> None:
    keys = ("code", "status", "reason", "message")
    assert {k: mcp[k] for k in keys} == {k: http[k] for k in keys}, (http, mcp)
    violations = mcp["details"]["field_violations"]
    assert violations == http["details"]["field_violations"], (http, mcp)


async def test_a_body_both_front_doors_take_gets_the_same_refusal(gateway: GatewayHarness) -> None:
    body = await create_body(gateway)
    secret = await agent(gateway)
    wrong_creates: list[dict[str, Any]] = [
        {"image_limit": "20"},
        {"image_limit": True},
        {"image_limit": 1.0},
        {"image_limit": -1},
        {"revision": "1"},
        {"revision": 2**63},
        {"mode": "later"},
        {"mode": 1},
        {"workflow_id": 7},
        {"runtime_id": ["a"]},
        {"id": 5},
        {"revision": "1", "image_limit": True, "workflow_id": {}},
    ]
    wrong_photos: list[dict[str, Any]] = [
        {"time": "2026-11-29T08:00"},
        {"time": 5},
        {"camera_id": False},
    ]
    async with (
        mcp_client(gateway, secret) as session,
        await gateway.agent(Grant(ScopeName.WORKSHOP)) as http,
    ):
        for n, wrong in enumerate(wrong_creates):
            sent = {**body, "id": f"same-{n}", **wrong}
            over_http = refusal(await http.post("/v1/workshop/runs", json=sent))
            over_mcp = error(await session.call_tool("runs", {"action": "create", **sent}))
            same_refusal(over_http, over_mcp)
        for wrong in wrong_photos:
            sent = {"camera_id": "cam-a", "time": TIME, **wrong}
            over_http = refusal(await http.post("/v1/workshop/photos", json=sent))
            over_mcp = error(await session.call_tool("footage", sent))
            same_refusal(over_http, over_mcp)
        # Query parameters are strings: the ones that read as the same JSON value.
        for query, argument in (("abc", "abc"), ("-1", -1), ("4294967296", 2**32)):
            listed = refusal(await http.get("/v1/workshop/runs", params={"page_size": query}))
            over_mcp = error(
                await session.call_tool("runs", {"action": "list", "page_size": argument})
            )
            same_refusal(listed, over_mcp)
            got = refusal(await http.get("/v1/workshop/runs/r0", params={"job_limit": query}))
            over_mcp = error(
                await session.call_tool(
                    "runs", {"action": "get", "id": "r0", "job_limit": argument}
                )
            )
            same_refusal(got, over_mcp)
        listed_runs = ok(await session.call_tool("runs", {"action": "list"}))
    assert listed_runs["runs"] == []


async def test_null_is_absent_and_json_in_a_string_stays_a_string(gateway: GatewayHarness) -> None:
    """null means absent, as in a /v1 body; a string argument is never parsed as JSON (the
    SDK's own reading turns the string "null" into null)."""
    body = await create_body(gateway)
    async with mcp_client(gateway, await agent(gateway)) as session:
        created = ok(
            await session.call_tool("runs", {"action": "create", **body, "image_limit": None})
        )
        null_id = error(await session.call_tool("runs", {"action": "get", "id": "null"}))
        token = error(await session.call_tool("runs", {"action": "list", "page_token": "null"}))
    assert created["run"]["image_limit"] == 20
    assert (null_id["status"], null_id["reason"]) == (404, "NOT_FOUND")
    assert token["reason"] == "INVALID_FIELD"
    assert "page_token" in token["message"]
