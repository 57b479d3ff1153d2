"""One source for every page size, job limit and image limit (`workshop.kit.limits`):
the proto comments, the real gateway's OpenAPI document and MCP input schemas and the
docs say what it says, and the server, through the real gateway, keeps what the
published contract says."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from services.coordinator.identity.auth import Grant, ScopeName
from services.gateway.routes import OPERATIONS
from testbed.coordinator_world import (
    DAY,
    build_world,
    put_recording,
    run_request,
    save_workflow,
    workflow_spec,
)
from testbed.harness.gateway import GatewayHarness
from tests.mcp_session import agent, mcp_client
from workshop.kit import jsonmap, limits
from workshop.v1 import common_pb2
from workshop.v1 import operator_pb2 as op

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
STATED = re.compile(r"0 means ([\d,]+)(?: \([a-z]+\))?, at most ([\d,]+)")
# Names of the request fields that size an answer; each must be in limits.FIELDS.
SIZING = ("page_size", "job_limit", "image_limit", "limit")
MORE_THAN_A_PAGE = 101


def request_fields() -> dict[str, descriptor_pb2.FieldDescriptorProto]:
    """Every field of every message of workshop.v1 named like a sizing field."""
    import importlib

    found: dict[str, descriptor_pb2.FieldDescriptorProto] = {}
    for module in ("workshop", "operator", "identity", "preview", "publication", "jobs"):
        file = importlib.import_module(f"workshop.v1.{module}_pb2").DESCRIPTOR
        for message in file.message_types_by_name.values():
            for field in message.fields:
                if field.name in SIZING:
                    found[field.full_name] = field
    return found


def test_every_sizing_field_has_one_limit_and_its_comment_states_it() -> None:
    fields = request_fields()
    assert set(fields) == set(limits.FIELDS), "a sizing field without a limit, or a stale entry"
    for name, limit in limits.FIELDS.items():
        text = " ".join(jsonmap.comment(name).split())
        assert limit.phrase() in text, f"{name}: {text!r} does not say {limit.phrase()!r}"


def test_the_docs_state_the_limits() -> None:
    table = " ".join((ROOT / "docs" / "limits-and-errors.md").read_text().split())
    for limit in (limits.PAGE, limits.JOB_LIMIT, limits.IMAGE_LIMIT, limits.REVIEW_PAGE):
        assert limit.phrase() in table, limit.phrase()
    mcp = " ".join((ROOT / "docs" / "mcp.md").read_text().split())
    for limit in (limits.PAGE, limits.JOB_LIMIT, limits.IMAGE_LIMIT):
        assert limit.phrase() in mcp, limit.phrase()
    # Any other "0 means N, at most M" in the docs is one of the limits.
    phrases = {limit.phrase() for limit in limits.FIELDS.values()}
    for page in (ROOT / "docs").glob("*.md"):
        for match in STATED.finditer(" ".join(page.read_text().split())):
            assert match.group(0) in phrases, f"{page.name}: {match.group(0)!r}"


def bounds(schema: dict[str, Any]) -> tuple[Any, Any, Any]:
    return schema.get("minimum"), schema.get("maximum"), schema.get("default")


def expected(limit: limits.Limit) -> tuple[int, int, int]:
    return limit.minimum, limit.maximum, limit.default


async def test_the_gateways_openapi_and_mcp_schemas_state_the_limits(
    gateway: GatewayHarness,
) -> None:
    async with gateway.client() as http:
        document = (await http.get("/v1/openapi.json")).json()
    checked = 0
    for operation in OPERATIONS:
        for parameter, path in operation.query.items():
            limit = limits.FIELDS.get(operation.field(path).full_name)
            if limit is None:
                continue
            route = document["paths"][f"/v1{operation.path}"][operation.method.lower()]
            [described] = [p for p in route["parameters"] if p["name"] == parameter]
            assert bounds(described["schema"]) == expected(limit), (operation.name, described)
            assert limit.phrase() in " ".join(described["description"].split())
            checked += 1
    assert checked >= 9
    async with mcp_client(gateway, await agent(gateway)) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    arguments = tools["runs"].input_schema["properties"]
    for name, limit in (
        ("page_size", limits.PAGE),
        ("job_limit", limits.JOB_LIMIT),
        ("image_limit", limits.IMAGE_LIMIT),
    ):
        assert bounds(arguments[name]) == expected(limit), (name, arguments[name])
        assert limit.phrase() in " ".join(arguments[name]["description"].split()), name


def documented(document: dict[str, Any], path: str, name: str) -> tuple[int, int]:
    """(default, maximum) as the published contract states them: the parameter's
    description in the real gateway's OpenAPI document (from the proto comment)."""
    [parameter] = [p for p in document["paths"][path]["get"]["parameters"] if p["name"] == name]
    match = STATED.search(" ".join(parameter["description"].split()))
    assert match is not None, parameter
    return int(match.group(1).replace(",", "")), int(match.group(2).replace(",", ""))


async def test_the_server_keeps_the_documented_page_size_and_job_limit(
    gateway: GatewayHarness,
) -> None:
    c = gateway.c
    world = await build_world(c)
    await c.operator.PutCamera(op.PutCameraRequest(camera_id="cam-c"), metadata=c.admin)
    for index in range(MORE_THAN_A_PAGE):
        start = DAY + timedelta(hours=8, minutes=5 * index)
        await put_recording(c, f"cam-c-{index}", "cam-c", start, timedelta(minutes=5))
    spec = workflow_spec(cameras=("cam-c",))
    for index in range(MORE_THAN_A_PAGE):
        await save_workflow(c, f"w{index:03}", spec)
    full = run_request("big", "w000", world.tracking_runtime, mode=common_pb2.RUN_MODE_FULL)
    await c.workshop.CreateRun(full, metadata=c.admin)
    async with await gateway.agent(Grant(ScopeName.WORKSHOP)) as http:
        document = (await http.get("/v1/openapi.json")).json()
        default, maximum = documented(document, "/v1/workshop/workflows", "page_size")
        page = (await http.get("/v1/workshop/workflows")).json()
        assert len(page["workflows"]) == min(MORE_THAN_A_PAGE, default)
        largest = await http.get("/v1/workshop/workflows", params={"page_size": maximum})
        assert len(largest.json()["workflows"]) == min(MORE_THAN_A_PAGE, maximum)
        over = await http.get("/v1/workshop/workflows", params={"page_size": maximum + 1})
        assert (over.status_code, over.json()["reason"]) == (400, "INVALID_FIELD"), over.text
        assert over.json()["details"]["field_violations"][0]["field"] == "page_size"

        default, maximum = documented(document, "/v1/workshop/runs/{run_id}", "job_limit")
        detail = (await http.get("/v1/workshop/runs/big")).json()["detail"]
        assert len(detail["jobs"]) == min(MORE_THAN_A_PAGE, default)
        assert detail["jobs_truncated"] is (default < MORE_THAN_A_PAGE)
        over = await http.get("/v1/workshop/runs/big", params={"job_limit": maximum + 1})
        assert (over.status_code, over.json()["reason"]) == (400, "INVALID_FIELD"), over.text
        assert over.json()["details"]["field_violations"][0]["field"] == "job_limit"
