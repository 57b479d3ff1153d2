"""The gateway's HTTP API on the real stack: a real gateway (uvicorn) in front of a real
coordinator (Postgres) and preview service (SeaweedFS), called with a real HTTP client.

Each route's success and its documented errors; bad bodies and queries answered by the
error catalog with nothing changed; login, cookies and throttling; cross-site refusals.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
from typing import Any

import httpx
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_world import World
from testbed.harness.gateway import PASSWORD, Browser, GatewayHarness, running_gateway
from testbed.harness.preview import PreviewHarness
from tests.processor_gates import until
from tests.sweep.stack import table_digests

pytestmark = pytest.mark.timeout(120)

ADA = {"user_id": "ada", "password": PASSWORD}


def seed_body(run_id: str, runtime: str, revision: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "id": run_id,
        "workflow_id": "night",
        "runtime_id": runtime,
        "revision": revision,
        "mode": "test",
        "image_limit": 20,
        **extra,
    }


@pytest.fixture
async def ada(gateway: GatewayHarness, gateway_world: World) -> Browser:
    return await gateway.login("ada")


def assert_error(answer: httpx.Response, status: int, reason: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    body: dict[str, Any] = answer.json()
    assert set(body) == {"code", "status", "reason", "message", "details"}
    assert (body["status"], body["reason"]) == (status, reason), body
    assert body["message"]
    return body


# runs --------------------------------------------------------------------------------------


async def test_a_run_is_created_with_the_seed_body_and_a_retry_is_safe(
    gateway: GatewayHarness, gateway_world: World, ada: Browser
) -> None:
    body = seed_body("r-1", gateway_world.tracking_runtime)
    created = await ada.client.post("/api/workshop/runs", json=body)
    assert created.status_code == 200, created.text
    run = created.json()
    assert run["created"] is True
    assert run["run"]["run_id"] == "r-1"
    assert run["run"]["mode"] == "test"

    again = await ada.client.post("/api/workshop/runs", json=body)
    assert again.status_code == 200
    assert again.json()["created"] is False

    other = await ada.client.post("/api/workshop/runs", json={**body, "image_limit": 5})
    assert_error(other, 409, "ID_CONFLICT")

    detail = await ada.client.get("/api/workshop/runs/r-1")
    assert detail.status_code == 200
    assert detail.json()["detail"]["run"]["run_id"] == "r-1"
    listed = await ada.client.get("/api/workshop/runs", params={"workflow": "night"})
    assert [entry["run"]["run_id"] for entry in listed.json()["runs"]] == ["r-1"]
    snapshot = await ada.client.get("/api/workshop/runs/r-1/snapshot")
    assert snapshot.status_code == 200
    assert snapshot.json()["snapshot"]

    cancelled = await ada.client.post("/api/workshop/runs/r-1/cancel")
    assert cancelled.status_code == 200, cancelled.text
    after = (await ada.client.get("/api/workshop/runs/r-1")).json()
    assert after["detail"]["run"]["status"] == "cancelled"
    assert_error(await ada.client.get("/api/workshop/runs/nope"), 404, "NOT_FOUND")


async def test_a_stale_revision_is_409_with_the_current_revision(
    gateway: GatewayHarness, gateway_world: World, ada: Browser
) -> None:
    answer = await ada.client.post(
        "/api/workshop/runs", json=seed_body("r-2", gateway_world.tracking_runtime, revision=7)
    )
    body = assert_error(answer, 409, "STALE_REVISION")
    assert body["details"]["metadata"]["current_revision"] == "1"


async def test_agent_keys_create_runs_under_v1(
    gateway: GatewayHarness, gateway_world: World
) -> None:
    agent = await gateway.agent(Grant(ScopeName.WORKSHOP))
    async with agent:
        answer = await agent.post(
            "/v1/workshop/runs", json=seed_body("r-3", gateway_world.tracking_runtime)
        )
        assert answer.status_code == 200, answer.text
        # /v1 reads no cookie: a session cookie alone does not authenticate there
        session = await gateway.login("ada")
        refused = await session.client.get("/v1/workshop/runs/r-3")
        await session.client.aclose()
        assert_error(refused, 401, "CREDENTIAL_MISSING")


# workflows, runtimes ------------------------------------------------------------------------


async def test_workflows_are_saved_against_a_revision_validated_and_deleted(
    gateway: GatewayHarness, gateway_world: World, ada: Browser
) -> None:
    got = await ada.client.get("/api/workshop/workflows/night")
    assert got.status_code == 200
    workflow = got.json()["workflow"]
    spec = workflow["spec"]
    saved = await ada.client.put(
        "/api/workshop/workflows/night", json={"expected_revision": 1, "spec": spec}
    )
    assert saved.status_code == 200, saved.text
    assert saved.json()["workflow"]["revision"] == 2
    stale = await ada.client.put(
        "/api/workshop/workflows/night", json={"expected_revision": 1, "spec": spec}
    )
    metadata = assert_error(stale, 409, "STALE_REVISION")["details"]["metadata"]
    assert metadata["current_revision"] == "2"
    broken = {**spec, "graph": {"steps": [], "edges": []}}
    invalid = await ada.client.put(
        "/api/workshop/workflows/night", json={"expected_revision": 2, "spec": broken}
    )
    body = assert_error(invalid, 422, "VALIDATION_FAILED")
    assert body["details"]["problems"]
    validated = await ada.client.post("/api/workshop/workflows/validate", json={"spec": broken})
    assert validated.status_code == 200
    assert validated.json()["problems"]
    listed = await ada.client.get("/api/workshop/workflows")
    assert [w["workflow_id"] for w in listed.json()["workflows"]] == ["night"]
    deleted = await ada.client.delete(
        "/api/workshop/workflows/night", params={"expected_revision": 2}
    )
    assert deleted.status_code == 200, deleted.text
    assert_error(await ada.client.get("/api/workshop/workflows/night"), 404, "NOT_FOUND")


async def test_runtimes_are_registered_listed_and_chosen(
    gateway: GatewayHarness, gateway_world: World, ada: Browser
) -> None:
    registered = await ada.client.post(
        "/api/workshop/runtimes",
        json={
            "device_id": "gpu-box",
            "engine": "workshop-processor",
            "code_sha256": "cd" * 32,
            "capabilities": ["workshop-v3"],
        },
    )
    assert registered.status_code == 200, registered.text
    runtime_id = registered.json()["runtime"]["runtime_id"]
    listed = await ada.client.get("/api/workshop/runtimes", params={"device_id": "gpu-box"})
    runtimes = {r["runtime_id"]: r for r in listed.json()["runtimes"]}
    assert runtime_id in runtimes
    assert "workshop-v3" in runtimes[runtime_id]["capabilities"]
    devices = await ada.client.get("/api/workshop/devices")
    assert [d["device_id"] for d in devices.json()["devices"]] == ["gpu-box"]
    # The website's rule wants a runtime that checked in within 2 minutes: none has yet.
    chosen = await ada.client.get(
        "/api/workshop/workflows/night/runtime", params={"choice": "recent_capable"}
    )
    assert_error(chosen, 409, "NO_RUNTIME")
    assert_error(
        await ada.client.get("/api/workshop/workflows/night/runtime"), 400, "INVALID_FIELD"
    )
    unknown_device = await ada.client.post(
        "/api/workshop/runtimes",
        json={"device_id": "nope", "engine": "workshop-processor", "code_sha256": "cd" * 32},
    )
    assert_error(unknown_device, 404, "NOT_FOUND")


async def test_recordings_are_listed_for_the_website_and_a_key_of_their_camera(
    gateway: GatewayHarness, gateway_world: World, ada: Browser
) -> None:
    day = {"from": "2026-11-29T00:00:00Z", "to": "2026-11-30T00:00:00Z"}
    listed = await ada.client.get("/api/workshop/recordings", params={"camera_id": "cam-a", **day})
    assert listed.status_code == 200, listed.text
    recordings = listed.json()["recordings"]
    assert [r["recording_id"] for r in recordings] == ["cam-a-0", "cam-a-1"]
    assert (recordings[0]["start"], recordings[0]["end"]) == (
        "2026-11-29T08:00:00Z",
        "2026-11-29T09:00:00Z",
    )
    # A workshop key bound to cam-b reads cam-b's recordings, and no other camera's.
    bound = await gateway.agent(Grant(ScopeName.WORKSHOP, camera_ids=("cam-b",)))
    own = await bound.get("/v1/workshop/recordings", params={"camera_id": "cam-b"})
    assert [r["camera_id"] for r in own.json()["recordings"]] == ["cam-b", "cam-b"]
    other = await bound.get("/v1/workshop/recordings", params={"camera_id": "cam-a"})
    assert (
        "its own cameras only ('cam-b')" in assert_error(other, 403, "PERMISSION_DENIED")["message"]
    )
    assert_error(await bound.get("/v1/workshop/recordings"), 403, "PERMISSION_DENIED")
    footage = await gateway.agent(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-a",)))
    refused = await footage.get("/v1/workshop/recordings", params={"camera_id": "cam-a"})
    assert_error(refused, 403, "SCOPE_MISSING")


# bad input --------------------------------------------------------------------------------


BAD_BODIES = [
    (b"{not json", "application/json", 400, "MALFORMED_JSON"),
    (b'{"id": "r", "revision": "one"}', "application/json", 400, "INVALID_FIELD"),
    (b'{"id": "r", "surprise": 1}', "application/json", 400, "INVALID_FIELD"),
    (b'{"id": "r", "mode": "sideways"}', "application/json", 400, "INVALID_FIELD"),
    (b'{"id": "r", "image_limit": 1.5}', "application/json", 400, "INVALID_FIELD"),
    (b'{"id": "r", "image_limit": 99999999999}', "application/json", 400, "INVALID_FIELD"),
    (b"[]", "application/json", 400, "INVALID_FIELD"),
    (b'{"id": "r"}', "text/plain", 400, "UNSUPPORTED_MEDIA_TYPE"),
    (b"{}", "application/json", 400, "INVALID_FIELD"),
]


@pytest.mark.parametrize(("raw", "content_type", "status", "reason"), BAD_BODIES)
async def test_bad_bodies_get_the_catalogs_answer_and_change_nothing(
    gateway: GatewayHarness,
    gateway_world: World,
    ada: Browser,
    raw: bytes,
    content_type: str,
    status: int,
    reason: str,
) -> None:
    before = await table_digests(gateway.c)
    answer = await ada.client.post(
        "/api/workshop/runs", content=raw, headers={"content-type": content_type}
    )
    body = assert_error(answer, status, reason)
    if reason == "INVALID_FIELD" and raw not in (b"{}",):
        assert body["details"]["field_violations"], body
    assert await table_digests(gateway.c) == before


async def test_field_violations_name_every_bad_field(
    gateway: GatewayHarness, gateway_world: World, ada: Browser
) -> None:
    answer = await ada.client.post(
        "/api/workshop/runs", json={"id": 3, "revision": "x", "extra": True}
    )
    body = assert_error(answer, 400, "INVALID_FIELD")
    fields = {v["field"] for v in body["details"]["field_violations"]}
    assert fields == {"id", "revision", "extra"}


async def test_an_oversized_body_is_413_before_it_is_read(
    gateway: GatewayHarness, gateway_world: World, ada: Browser
) -> None:
    before = await table_digests(gateway.c)
    big = b'{"id": "' + b"x" * (70 * 1024) + b'"}'
    declared = await ada.client.post(
        "/api/workshop/runs", content=big, headers={"content-type": "application/json"}
    )
    assert_error(declared, 413, "PAYLOAD_TOO_LARGE")

    async def chunks() -> Any:  # no Content-Length: the gateway counts
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    streamed = await ada.client.post(
        "/api/workshop/runs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_error(streamed, 413, "PAYLOAD_TOO_LARGE")
    assert await table_digests(gateway.c) == before


async def test_bad_queries_are_field_violations(
    gateway: GatewayHarness, gateway_world: World, ada: Browser
) -> None:
    unknown = await ada.client.get("/api/workshop/runs", params={"colour": "red"})
    assert assert_error(unknown, 400, "INVALID_FIELD")["details"]["field_violations"] == [
        {"field": "colour", "description": "unknown query parameter"}
    ]
    wrong = await ada.client.get("/api/workshop/runs", params={"page_size": "many"})
    assert_error(wrong, 400, "INVALID_FIELD")
    twice = await ada.client.get("/api/workshop/runs?workflow=a&workflow=b")
    assert_error(twice, 400, "INVALID_FIELD")


async def test_unknown_routes_and_methods(gateway: GatewayHarness, ada: Browser) -> None:
    assert_error(await ada.client.get("/api/workshop/nothing"), 404, "ROUTE_NOT_FOUND")
    assert_error(await ada.client.patch("/api/workshop/runs"), 405, "METHOD_NOT_ALLOWED")
    assert_error(await ada.client.get("/api/workshop/runs/r/live"), 426, "UPGRADE_REQUIRED")


# login ------------------------------------------------------------------------------------


async def test_login_sets_an_httponly_cookie_and_logout_revokes_the_session(
    gateway: GatewayHarness, gateway_world: World
) -> None:
    async with gateway.client() as client:
        answer = await client.post("/api/session", json=ADA)
        assert answer.status_code == 200, answer.text
        cookie = answer.headers["set-cookie"]
        assert "workshop_session=ws_" in cookie
        lowered = cookie.lower()
        assert "httponly" in lowered
        assert "samesite=lax" in lowered
        assert "path=/" in lowered
        assert "secure" not in lowered  # GATEWAY_COOKIE_SECURE=0 in the harness
        secret = client.cookies["workshop_session"]
        assert secret not in answer.text  # the page never sees the secret
        me = await client.get("/api/session")
        assert me.status_code == 200
        assert me.json()["user_id"] == "ada"
        token = me.json()["csrf_token"]
        assert token == answer.json()["csrf_token"]

        missing = await client.delete("/api/session")
        assert_error(missing, 403, "CSRF_TOKEN")
        out = await client.delete("/api/session", headers={"x-csrf-token": token})
        assert out.status_code == 204
        # the old cookie is revoked at the coordinator, not just forgotten
        client.cookies.set("workshop_session", secret)
        assert_error(await client.get("/api/workshop/runs"), 401, "CREDENTIAL_REJECTED")


async def test_the_cookie_is_secure_by_default(
    gateway: GatewayHarness, gateway_world: World, preview: PreviewHarness
) -> None:
    async with running_gateway(gateway.c, preview.port, cookie_secure=True) as secure:
        answer = await secure.client().post("/api/session", json=ADA)
        assert answer.status_code == 200, answer.text
        assert "secure" in answer.headers["set-cookie"].lower()


async def test_wrong_passwords_are_throttled_per_user(
    gateway: GatewayHarness, gateway_world: World
) -> None:
    async with gateway.client() as client:
        for _ in range(5):
            wrong = await client.post(
                "/api/session", json={"user_id": "ada", "password": "wrong password!"}
            )
            assert_error(wrong, 401, "LOGIN_FAILED")
        throttled = await client.post("/api/session", json=ADA)
        assert_error(throttled, 429, "LOGIN_THROTTLED")
        assert int(throttled.headers["retry-after"]) > 0


async def test_a_disabled_user_cannot_log_in(gateway: GatewayHarness, gateway_world: World) -> None:
    from workshop.v1 import operator_pb2 as op

    await gateway.c.operator.DisableUser(
        op.DisableUserRequest(user_id="ada"), metadata=gateway.c.admin
    )
    async with gateway.client() as client:
        answer = await client.post("/api/session", json=ADA)
        assert_error(answer, 401, "CREDENTIAL_REJECTED")


# cross-site -------------------------------------------------------------------------------


async def test_cross_site_writes_are_refused_and_change_nothing(
    gateway: GatewayHarness, gateway_world: World, ada: Browser
) -> None:
    before = await table_digests(gateway.c)
    body = seed_body("r-x", gateway_world.tracking_runtime)
    cross = await ada.client.post(
        "/api/workshop/runs", json=body, headers={"sec-fetch-site": "cross-site"}
    )
    assert_error(cross, 403, "CROSS_SITE")
    del ada.client.headers["sec-fetch-site"]
    foreign = await ada.client.post(
        "/api/workshop/runs", json=body, headers={"origin": "https://evil.example"}
    )
    assert_error(foreign, 403, "CROSS_SITE")
    no_token = await ada.client.post(
        "/api/workshop/runs", json=body, headers={"x-csrf-token": "forged"}
    )
    assert_error(no_token, 403, "CSRF_TOKEN")
    assert await table_digests(gateway.c) == before
    same_host = await ada.client.post(
        "/api/workshop/runs", json=body, headers={"origin": gateway.url}
    )
    assert same_host.status_code == 200, same_host.text


async def test_a_websocket_handshake_from_a_foreign_origin_is_refused(
    gateway: GatewayHarness, gateway_world: World, ada: Browser
) -> None:
    import websockets
    from websockets.typing import Origin

    await ada.client.post(
        "/api/workshop/runs", json=seed_body("r-w", gateway_world.tracking_runtime)
    )
    cookie = f"workshop_session={ada.client.cookies['workshop_session']}"
    url = gateway.url.replace("http", "ws") + "/api/workshop/runs/r-w/live"
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        async with websockets.connect(
            url, additional_headers={"cookie": cookie}, origin=Origin("https://evil.example")
        ):
            pass
    assert refused.value.response.status_code == 403
    async with websockets.connect(
        url, additional_headers={"cookie": cookie}, origin=Origin(gateway.url)
    ) as socket:
        first = await socket.recv()
        assert '"run_id":"r-w"' in str(first).replace(" ", "")


# keys -------------------------------------------------------------------------------------


async def test_users_manage_their_own_agent_keys(
    gateway: GatewayHarness, gateway_world: World, ada: Browser
) -> None:
    created = await ada.client.post(
        "/api/workshop/keys",
        json={"name": "my agent", "scopes": [{"scope": "workshop"}]},
    )
    assert created.status_code == 200, created.text
    key = created.json()
    secret = key["secret"]
    async with gateway.client(headers={"authorization": f"Bearer {secret}"}) as agent:
        assert (await agent.get("/v1/workshop/runs")).status_code == 200
        refused = await agent.post(
            "/v1/workshop/keys", json={"name": "more", "scopes": [{"scope": "workshop"}]}
        )
        assert refused.status_code == 403
        listed = await ada.client.get("/api/workshop/keys")
        assert [k["key_id"] for k in listed.json()["keys"]] == [key["key"]["key_id"]]
        revoked = await ada.client.delete(f"/api/workshop/keys/{key['key']['key_id']}")
        assert revoked.status_code == 200, revoked.text
        assert_error(await agent.get("/v1/workshop/runs"), 401, "CREDENTIAL_REJECTED")
    admin_scope = await ada.client.post(
        "/api/workshop/keys", json={"name": "x", "scopes": [{"scope": "admin"}]}
    )
    assert admin_scope.status_code == 403


# openapi ----------------------------------------------------------------------------------


async def test_the_openapi_documents_list_every_route(gateway: GatewayHarness) -> None:
    from services.gateway.routes import OPERATIONS

    async with gateway.client() as client:
        for prefix in ("api", "v1"):
            document = (await client.get(f"/{prefix}/openapi.json")).json()
            assert document["openapi"] == "3.1.0"
            operation_ids = {
                op["operationId"] for item in document["paths"].values() for op in item.values()
            }
            assert {
                f"{prefix}_{o.name}" for o in OPERATIONS if prefix in o.prefixes
            } <= operation_ids


def _tar_names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return archive.getnames()


def test_the_docs_list_every_route() -> None:
    from pathlib import Path

    from services.gateway.routes import OPERATIONS

    text = (Path(__file__).parents[2] / "docs" / "http-api.md").read_text()
    assert [o.path for o in OPERATIONS if f"`{o.method} {o.path}`" not in text] == []


async def test_the_live_page_socket_follows_a_run_to_its_end(
    gateway: GatewayHarness, gateway_world: World, ada: Browser
) -> None:
    import json

    import websockets
    from websockets.typing import Origin

    await ada.client.post(
        "/api/workshop/runs", json=seed_body("r-l", gateway_world.tracking_runtime)
    )
    cookie = f"workshop_session={ada.client.cookies['workshop_session']}"
    url = gateway.url.replace("http", "ws") + "/api/workshop/runs/r-l/live"
    async with websockets.connect(
        url, additional_headers={"cookie": cookie}, origin=Origin(gateway.url)
    ) as socket:
        first = json.loads(await socket.recv())
        assert first["detail"]["run"]["status"] == "queued"
        assert first["final"] is False
        cancelled = await ada.client.post("/api/workshop/runs/r-l/cancel")
        assert cancelled.status_code == 200
        last = json.loads(await asyncio.wait_for(socket.recv(), timeout=10))
        while not last["final"]:
            last = json.loads(await asyncio.wait_for(socket.recv(), timeout=10))
        assert last["detail"]["run"]["status"] == "cancelled"
        assert last["seq"] > first["seq"]
        with pytest.raises(websockets.exceptions.ConnectionClosedOK):
            await asyncio.wait_for(socket.recv(), timeout=10)
    # without a session the handshake is refused with the catalog's status
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        async with websockets.connect(url, origin=Origin(gateway.url)):
            pass
    assert refused.value.response.status_code == 401


async def test_a_live_socket_closes_once_its_session_is_revoked(
    gateway: GatewayHarness, gateway_world: World, preview: PreviewHarness
) -> None:
    import json

    import websockets
    from websockets.typing import Origin

    async with running_gateway(gateway.c, preview.port, live_recheck_seconds=0.2) as quick:
        browser = await quick.login("ada")
        created = await browser.client.post(
            "/api/workshop/runs", json=seed_body("r-v", gateway_world.tracking_runtime)
        )
        assert created.status_code == 200, created.text
        cookie = f"workshop_session={browser.client.cookies['workshop_session']}"
        url = quick.url.replace("http", "ws") + "/api/workshop/runs/r-v/live"
        async with websockets.connect(
            url, additional_headers={"cookie": cookie}, origin=Origin(quick.url)
        ) as socket:
            json.loads(await socket.recv())
            hub = quick.app.hub  # rechecks that pass keep it open
            await until(lambda: hub.stats()["rechecks"] >= 2, "two rechecks passed")
            assert socket.state is websockets.protocol.State.OPEN
            assert (await browser.client.delete("/api/session")).status_code == 204
            await asyncio.wait_for(socket.wait_closed(), timeout=5)
            assert socket.close_code == 1008


async def test_an_unknown_caller_hears_401_before_any_field_is_judged(
    gateway: GatewayHarness, gateway_world: World
) -> None:
    async with gateway.client() as anonymous:
        for path in (
            "/v1/workshop/workflows/night/runtime",  # no choice
            "/v1/workshop/buckets/yard/items?from=2026-11-30T00:00:00Z&to=2026-11-29T00:00:00Z",
        ):
            assert_error(await anonymous.get(path), 401, "CREDENTIAL_MISSING")
        undecided = await anonymous.post("/v1/workshop/runs/r/sightings/s/decision", json={})
        assert_error(undecided, 401, "CREDENTIAL_MISSING")
