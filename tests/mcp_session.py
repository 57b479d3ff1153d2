"""An MCP client session on a test gateway's /v1/mcp (the SDK's own client over real
HTTP) and readers of tool results, shared by the MCP tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.harness.gateway import GatewayHarness


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
    content: dict[str, Any] | None = result.structured_content
    assert content is not None, result
    return content


def ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    return structured(result)


def error(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error, result
    body = structured(result)
    assert set(body) == {"code", "status", "reason", "message", "details"}, body
    return body
