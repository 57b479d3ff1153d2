"""An in-process gateway on real HTTP (uvicorn on loopback) in front of the in-process
coordinator and preview service.

`running_gateway` starts one on a free port with its own `gateway` key and yields a
`GatewayHarness` (the `gateway` fixture: one in front of the `coordinator` and `preview`
fixtures): the base URL, an httpx client on it, and helpers that sign a user in
the way the website does (`login`) and make Agent keys. The session cookie is sent
without Secure (plain HTTP on loopback).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.gateway.app import GatewayApp, build
from services.gateway.settings import GatewaySettings
from testbed.coordinator_world import World, build_world, save_workflow, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness
from workshop.v1 import operator_pb2 as op

PASSWORD = "correct horse battery staple"


@dataclasses.dataclass
class GatewayHarness:
    url: str
    app: GatewayApp
    c: CoordinatorHarness
    clients: list[httpx.AsyncClient] = dataclasses.field(default_factory=list)

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        """An HTTP client on the gateway, closed with the harness if the test does not."""
        client = httpx.AsyncClient(base_url=self.url, timeout=30.0, **kwargs)
        self.clients.append(client)
        return client

    async def user(self, user_id: str, password: str = PASSWORD) -> None:
        """A user with a password (through the operator RPCs, as an admin would)."""
        await self.c.operator.CreateUser(
            op.CreateUserRequest(user_id=user_id, display_name=user_id.title()),
            metadata=self.c.admin,
        )
        await self.c.operator.SetUserPassword(
            op.SetUserPasswordRequest(user_id=user_id, password=password), metadata=self.c.admin
        )

    async def login(self, user_id: str, password: str = PASSWORD) -> Browser:
        """A client signed in as `user_id` through POST /api/session, holding the cookie
        and sending the CSRF token and a same-origin Sec-Fetch-Site like a page."""
        client = self.client()
        answer = await client.post("/api/session", json={"user_id": user_id, "password": password})
        assert answer.status_code == 200, answer.text
        client.headers["x-csrf-token"] = answer.json()["csrf_token"]
        client.headers["sec-fetch-site"] = "same-origin"
        return Browser(client, answer.json()["csrf_token"])

    async def agent(self, *grants: Grant, user_id: str = "") -> httpx.AsyncClient:
        """A client with a new Agent key of `grants` as its bearer."""
        secret = await self.c.key(*grants, name="agent", user_id=user_id)
        return self.client(headers={"authorization": f"Bearer {secret}"})


@dataclasses.dataclass
class Browser:
    client: httpx.AsyncClient
    csrf_token: str


@asynccontextmanager
async def running_gateway(
    c: CoordinatorHarness, preview_port: int, **overrides: Any
) -> AsyncIterator[GatewayHarness]:
    key = await c.key(Grant(ScopeName.GATEWAY), name="gateway")
    settings = GatewaySettings(
        **{
            "port": 0,
            "http_port": 0,
            "coordinator_target": f"127.0.0.1:{c.port}",
            "preview_target": f"127.0.0.1:{preview_port}",
            "key": key,
            "cookie_secure": False,
            **overrides,
        }
    )
    app = build(settings, label="gateway-test")
    await app.http.start()
    harness = GatewayHarness(f"http://127.0.0.1:{app.http.port}", app, c)
    try:
        yield harness
    finally:
        for client in harness.clients:
            await client.aclose()
        await app.stop()


@pytest.fixture
async def gateway_world(gateway: GatewayHarness) -> World:
    """testbed/coordinator_world.py's world behind the gateway, workflow `night` saved
    (revision 1), and user `ada` with the harness's password."""
    world = await build_world(gateway.c)
    await save_workflow(gateway.c, "night", workflow_spec())
    await gateway.user("ada")
    return world


@pytest.fixture(name="gateway")
async def gateway_fixture(
    coordinator: CoordinatorHarness, preview: PreviewHarness
) -> AsyncIterator[GatewayHarness]:
    async with running_gateway(coordinator, preview.port) as harness:
        yield harness
