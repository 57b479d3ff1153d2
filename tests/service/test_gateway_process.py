"""`python -m services.gateway` as its own process in front of a real coordinator: it serves
HTTP and the live WebSocket, and on SIGTERM it closes live sockets with 1001 (going away),
stops accepting and exits."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import websockets

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_world import build_world, run_request, save_workflow, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.processes import ServiceProcess, prefixed

pytestmark = pytest.mark.timeout(90)


async def test_sigterm_closes_live_sockets_with_1001_and_exits(
    coordinator: CoordinatorHarness, tmp_path: Path
) -> None:
    world = await build_world(coordinator)
    await save_workflow(coordinator, "night", workflow_spec())
    await coordinator.workshop.CreateRun(
        run_request("r", "night", world.tracking_runtime), metadata=coordinator.admin
    )
    agent = await coordinator.key(Grant(ScopeName.WORKSHOP), name="agent")
    env = prefixed(
        "GATEWAY",
        {
            "HOST": "127.0.0.1",
            "PORT": "0",
            "HTTP_HOST": "127.0.0.1",
            "HTTP_PORT": "0",
            "DRAIN_SECONDS": "0.5",
            "GRACE_SECONDS": "3",
            "COORDINATOR_TARGET": f"127.0.0.1:{coordinator.port}",
            "PREVIEW_TARGET": "127.0.0.1:9",
            "KEY": await coordinator.key(Grant(ScopeName.GATEWAY), name="gateway"),
        },
    )
    gateway = ServiceProcess("services.gateway", env, tmp_path / "gateway.log")
    try:
        port = int((await asyncio.to_thread(gateway.wait_event, "http"))["port"])
        await asyncio.to_thread(gateway.wait_event, "serving")
        bearer = {"authorization": f"Bearer {agent}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            answer = await client.get("/v1/workshop/runs/r", headers=bearer)
            assert answer.status_code == 200, answer.text
        async with websockets.connect(
            f"ws://127.0.0.1:{port}/v1/workshop/runs/r/live", additional_headers=bearer
        ) as socket:
            first = json.loads(await socket.recv())
            assert first["detail"]["run"]["run_id"] == "r"
            gateway.terminate()
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                await asyncio.wait_for(socket.recv(), timeout=10)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1001
        assert await asyncio.to_thread(gateway.stop, 10.0) == 0
        # it ran its whole graceful shutdown to the end (not killed at stop()'s limit)
        assert gateway.wait_event("stopped", timeout=1)["event"] == "stopped"
    finally:
        gateway.stop()
