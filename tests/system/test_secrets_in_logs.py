"""No secret reaches a log: a whole run through the real stack, every log line searched.

The coordinator, preview service, gateway and processor run in this process (the
harness's fixtures) and log through `logging`; a handler on the root logger, at DEBUG
and installed before any of them starts, keeps every record each of them and their
libraries (grpc, asyncpg, uvicorn, urllib3 under minio) write, formatted with its
traceback; only the test's own HTTP client is left out (`TEST_CLIENT_LOGGERS`).

The run: a user signs in through the gateway (and fails once with a wrong password),
creates an Agent key of her own with the session, creates a full run with that key, a
real processor labels it with the demo detector on Triton, the user reads a preview
image and her run's detail, revokes her key and signs out, and both are then refused.
Every secret the test created or handed out must be absent from every line: the admin,
processor, preview-service, gateway and Agent keys, the session cookie, its CSRF token,
the password and the wrong guess, and the S3 secret key. Keys and sessions are
searched for their random part (after the `.`): the id before it names the credential
and may be logged.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.coordinator_world import save_workflow
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.gateway import GatewayHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.processor_world import build_world, finished, running_processor, yard_spec
from workshop.kit.auth import AUTHORIZATION_KEY

pytestmark = [pytest.mark.triton, pytest.mark.timeout(240)]

SESSION_COOKIE = "workshop_session"
# The test's own HTTP client (the browser's side): httpcore logs every response header at
# DEBUG, Set-Cookie included. No service uses it (the demo's scripts do, as a client).
TEST_CLIENT_LOGGERS = {"httpx", "httpcore"}


class Everything(logging.Handler):
    """Keeps every record, formatted (message, arguments and traceback)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.partition(".")[0] not in TEST_CLIENT_LOGGERS:
            self.lines.append(self.format(record))


@pytest.fixture
def all_logs() -> Iterator[Everything]:
    root = logging.getLogger()
    handler, level = Everything(), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def random_part(secret: str) -> str:
    """What must never be logged of a key or session secret: the part after its id."""
    return secret.partition(".")[2] or secret


async def test_a_full_run_logs_no_secret(
    all_logs: Everything,  # first: installed before every server starts
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    gateway: GatewayHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path, cameras=["cam-a"])
    await save_workflow(c, "yard", yard_spec(world.model, ["cam-a"]))
    password = f"pw {secrets.token_urlsafe(12)}"
    wrong = f"guess {secrets.token_urlsafe(12)}"
    await gateway.user("ada", password)

    web = gateway.client()
    refused = await web.post("/api/session", json={"user_id": "ada", "password": wrong})
    assert refused.status_code == 401, refused.text
    ada = await gateway.login("ada", password)
    cookie = ada.client.cookies[SESSION_COOKIE]
    created = await ada.client.post(
        "/api/workshop/keys", json={"name": "agent", "scopes": [{"scope": "workshop"}]}
    )
    assert created.status_code == 200, created.text
    agent_secret = created.json()["secret"]
    agent = gateway.client(headers={AUTHORIZATION_KEY: f"Bearer {agent_secret}"})
    body = {
        "id": "r1",
        "workflow_id": "yard",
        "runtime_id": world.runtime_id,
        "revision": 1,
        "mode": "full",
    }
    answer = await agent.post("/v1/workshop/runs", json=body)
    assert answer.status_code == 200, answer.text

    async with running_processor(c, preview, triton_server, world.runtime_id) as processor:
        detail = await finished(c, "r1")
        [(_, processor_bearer)] = processor.credentials
    assert detail.run.status == 3, detail  # RUN_STATUS_COMPLETED
    shown = await agent.get("/v1/workshop/runs/r1")
    assert shown.status_code == 200, shown.text
    images = shown.json()["detail"]["recent_images"]
    assert images, shown.json()
    image = await agent.get(f"/v1/workshop/runs/r1/previews/{images[0]['item_id']}/image")
    assert image.status_code == 200, image.text
    # refusals log too: the revoked Agent key, the signed-out session
    key_id = created.json()["key"]["key_id"]
    assert (await ada.client.delete(f"/api/workshop/keys/{key_id}")).status_code == 200
    assert (await agent.get("/v1/workshop/runs")).status_code == 401
    assert (await ada.client.delete("/api/session")).status_code == 204
    assert (await ada.client.get("/api/workshop/runs")).status_code == 401

    found = {
        "admin key": random_part(dict(c.admin)[AUTHORIZATION_KEY].removeprefix("Bearer ")),
        "processor key": random_part(processor_bearer.removeprefix("Bearer ")),
        "preview service key": random_part(preview.settings.service_key),
        "gateway key": random_part(gateway.app.gateway.settings.key),
        "agent key": random_part(agent_secret),
        "session cookie": random_part(cookie),
        "csrf token": ada.csrf_token,
        "password": password,
        "wrong password": wrong,
        "S3 secret key": preview.bucket.server.secret_key,
    }
    lines = all_logs.lines
    assert len(lines) > 20, lines  # the servers did log
    leaks = {
        name: [line for line in lines if value in line][:3]
        for name, value in found.items()
        if any(value in line for line in lines)
    }
    assert leaks == {}
    print(f"\nsecrets in logs: {len(found)} secrets searched in {len(lines)} log lines: none found")
