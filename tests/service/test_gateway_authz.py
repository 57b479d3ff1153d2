"""The gateway's authorization matrix: every route it serves, called with every kind of
credential, on the real stack (gateway, coordinator on Postgres, preview service on
SeaweedFS), each call well formed and aimed at resources that exist, so that the status
says what the credential may do and nothing else.

The table (`ROWS`) has one row per served route (`METHOD path`, as the running app
lists it; a WebSocket is `WS`, a route that takes any method `ANY`); each row holds the
expected status for every kind of credential (`KINDS`). The test fails for a served
route without a row and for a row of a route that is not served. Exempt, as they read
no credential: `GET /healthz`, `GET /metrics`, `GET /api/openapi.json`, `GET
/v1/openapi.json`, the web console's entry page `GET /` and its files (the `/console`
mount, `MOUNT`); HEAD is served with every GET by the same endpoint (Starlette) and is
covered by its GET row.

Credential kinds, presented the way the route's prefix reads them: on `/api` routes in
the `workshop_session` cookie (with that secret's CSRF token and `Sec-Fetch-Site:
same-origin`, so that cross-site checks pass and the matrix tests authorization alone),
on `/v1` routes as `Authorization: Bearer`:

- none: no credential;
- expired_session: a session whose 60 s lifetime the coordinator's clock has passed;
- revoked_session: a session signed out through `DELETE /api/session`;
- disabled_user: a session of a user disabled afterwards (DisableUser);
- key_without_scope: a key holding none of the scopes the route accepts: `footage:read`
  of cam-a (the camera every resource here belongs to) for routes that need `workshop`,
  a `service` key for the footage-reading routes (review, bucket items, export, images),
  which `footage:read` alone satisfies;
- footage_other_camera: `footage:read` of cam-b. The listing routes that take it
  (GetReview, ListBucketItems, ExportBucket) answer 200 with cam-b's items only, i.e.
  none here (checked); the image routes refuse with 403; routes that need `workshop`
  refuse it for the scope, before any camera matters;
- processor_key: `workshop:run` bound to device gpu-box;
- valid: a session of ada on `/api`, a `workshop` Agent key on `/v1`;
- wrong_transport: a valid credential where the other prefix reads it: a `workshop`
  key as bearer on `/api`, ada's session cookie on `/v1`. Each prefix reads only its
  own: 401 CREDENTIAL_MISSING.

`POST /v1/mcp` (the MCP server) checks only the bearer at the HTTP level: any principal
gets 200, and the row's checks read the tool call's own answer inside it: a refusal
SCOPE_MISSING (403) for every credential without `workshop`, the runs for a valid key.

Refusals must change nothing: the coordinator's tables are digested before and after
the refused cells of each write route. Every 401 and 403 must carry an authorization
reason (never CROSS_SITE or CSRF_TOKEN).
"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
import websockets
from google.protobuf.duration_pb2 import Duration
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from websockets.typing import Origin

from services.coordinator.identity.auth import Grant, ScopeName
from services.gateway.guard import csrf_token
from testbed.coordinator_world import CODE, DAY, run_request, save_workflow, stamp
from testbed.harness.gateway import PASSWORD, GatewayHarness
from testbed.harness.preview import jpeg_bytes, publish_request
from testbed.review_world import (
    Frame,
    box,
    commit,
    commit_images,
    review_world,
    start_run,
    watch_spec,
)
from tests.sweep.stack import table_digests
from workshop.kit import jsonmap
from workshop.kit.auth import bearer_metadata
from workshop.v1 import (
    common_pb2,
    dataset_pb2,
    dataset_pb2_grpc,
    identity_pb2,
    jobs_pb2,
    run_pb2,
    workshop_pb2,
)
from workshop.v1 import operator_pb2 as op

pytestmark = pytest.mark.timeout(120)

KINDS = (
    "none",
    "expired_session",
    "revoked_session",
    "disabled_user",
    "key_without_scope",
    "footage_other_camera",
    "processor_key",
    "valid",
    "wrong_transport",
)
# The web console's files (services/gateway/pages.py) hold no data: its entry page and
# the StaticFiles mount of its assets (listed as MOUNT); the pages read data from /api.
# /metrics is scraped by Prometheus without a credential, like a probe: its series name
# methods, codes and counts, never a run, job, key or user (docs/metrics.md).
EXEMPT = {
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/api/openapi.json"),
    ("GET", "/v1/openapi.json"),
    ("GET", "/"),
    ("MOUNT", "/console"),
}
AUTH_REASONS = {
    401: {"CREDENTIAL_MISSING", "CREDENTIAL_REJECTED"},
    403: {"SCOPE_MISSING", "PERMISSION_DENIED"},
}


def statuses(text: str) -> dict[str, int]:
    """A row of statuses in the order of KINDS."""
    values = [int(word) for word in text.split()]
    assert len(values) == len(KINDS), text
    return dict(zip(KINDS, values, strict=True))


# The patterns of the table; columns in the order of KINDS:
#                         none exp  rev  dis  nosc othc proc valid transport
WORKSHOP = statuses("     401  401  401  401  403  403  403  200  401")
FOOTAGE_LIST = statuses(" 401  401  401  401  403  200  403  200  401")
IMAGE = statuses("        401  401  401  401  403  403  403  200  401")
ANY_PRINCIPAL = statuses("401  401  401  401  200  200  200  200  401")
OWN_KEYS_API = statuses(" 401  401  401  401  403  403  403  200  401")
# A key may not list, mint or revoke keys (only a website session may): the valid
# Agent key of /v1 is refused too, so these /v1 routes never succeed for an Agent key.
OWN_KEYS_V1 = statuses("  401  401  401  401  403  403  403  403  401")
# Dataset versions of cam-a's items: a key of another camera is refused the version (403)
VERSION_READ = statuses(" 401  401  401  401  403  403  403  200  401")
# A write that names a stale revision: refused (409) only once the credential may make it.
WORKSHOP_STALE = statuses("401  401  401  401  403  403  403  409  401")
# A write that names what does not exist: 404 only once the credential may make it.
WORKSHOP_MISSING = statuses("401  401  401  401  403  403  403  404  401")
LOGIN = statuses("        200  200  200  200  200  200  200  200  200")
# Signed in or not, GET /api/session answers 200 (`signed_in`, and `ended`: checked below).
SESSION_GET = statuses("  200  200  200  200  200  200  200  200  200")
# Signing out revokes the cookie's session, whatever its state (already expired,
# revoked, or of a disabled user: 204, idempotent); a key in the cookie is no session
# (409 NOT_A_SESSION).
LOGOUT = statuses("       401  204  204  204  409  409  409  204  401")
LIVE = statuses("         401  401  401  401  403  403  403  101  401")
UPGRADE = statuses("      426  426  426  426  426  426  426  426  426")


@dataclasses.dataclass(frozen=True)
class Ids:
    """The world's ids the calls name."""

    tracking_runtime: str
    item_id: str  # an item of run `full`, cam-a
    preview_id: str  # a preview of test run `t`, cam-a
    sighting_id: str  # a sighting of run `full`, cam-a
    photo_id: str
    own_keys: dict[str, str]  # prefix -> a key of ada's to revoke
    version_id: str = ""  # a dataset version of bucket yard (cam-a's items)


@dataclasses.dataclass(frozen=True)
class Row:
    """One served route: the call each cell makes and the status each kind gets."""

    method: str
    route: str  # the path as the app serves it
    expect: dict[str, int]
    path: str  # the concrete path called
    params: tuple[tuple[str, str], ...] = ()
    body: Any = None
    no_scope: str = "footage_a"  # the key of kind key_without_scope
    # Checks of a successful answer by kind (e.g. what footage_other_camera sees).
    checks: dict[str, Callable[[httpx.Response], None]] = dataclasses.field(default_factory=dict)
    valid: str = ""  # a credential of its own for the valid cell (one it consumes)
    headers: tuple[tuple[str, str], ...] = ()  # sent besides the credential's

    @property
    def prefix(self) -> str:
        return self.route.split("/")[1]

    @property
    def writes(self) -> bool:
        return self.method in ("POST", "PUT", "PATCH", "DELETE")


def signed_in(answer: httpx.Response) -> None:
    assert answer.json()["signed_in"] is True, answer.text


def never_signed_in(answer: httpx.Response) -> None:
    assert answer.json() == {"signed_in": False, "ended": False}, answer.text


def session_ended(answer: httpx.Response) -> None:
    assert answer.json() == {"signed_in": False, "ended": True}, answer.text


SESSION_GET_CHECKS: dict[str, Callable[[httpx.Response], None]] = {
    "none": never_signed_in,
    "expired_session": session_ended,
    "revoked_session": session_ended,
    "disabled_user": session_ended,
    "key_without_scope": never_signed_in,  # a key in the cookie is no session
    "footage_other_camera": never_signed_in,
    "processor_key": never_signed_in,
    "valid": signed_in,
    "wrong_transport": never_signed_in,
}


def no_versions(answer: httpx.Response) -> None:
    assert answer.json().get("versions", []) == [], answer.text


def has_versions(answer: httpx.Response) -> None:
    assert answer.json()["versions"], answer.text


def has_item_history(answer: httpx.Response) -> None:
    body = answer.json()
    assert body["item"]["item_id"], answer.text
    assert body["sightings"], answer.text


def no_items(answer: httpx.Response) -> None:
    assert answer.json()["items"] == [], answer.text


def has_items(answer: httpx.Response) -> None:
    assert answer.json()["items"], answer.text


def no_sightings(answer: httpx.Response) -> None:
    assert answer.json()["sightings"] == [], answer.text


def has_sightings(answer: httpx.Response) -> None:
    assert answer.json()["sightings"], answer.text


def _image_count(answer: httpx.Response) -> int:
    with tarfile.open(fileobj=io.BytesIO(answer.content)) as archive:
        return sum(name.startswith("images/") for name in archive.getnames())


def no_images(answer: httpx.Response) -> None:
    assert _image_count(answer) == 0


def has_images(answer: httpx.Response) -> None:
    assert _image_count(answer) > 0


def is_jpeg(answer: httpx.Response) -> None:
    assert answer.headers["content-type"] == "image/jpeg"
    assert answer.content.startswith(b"\xff\xd8")


SPEC = jsonmap.to_json(watch_spec(("cam-a",)))
# The MCP server: one JSON-RPC call of the `runs` tool (list), answered as SSE. The
# gateway checks the bearer before the MCP layer (401); the tool's call decides the scope,
# so a principal without `workshop` gets HTTP 200 carrying the tool's refusal.
MCP_CALL = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"name": "runs", "arguments": {"action": "list"}},
}
MCP_HEADERS = (("accept", "application/json, text/event-stream"),)


def _tool_result(answer: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC result of an MCP answer (an SSE stream whose data lines are messages)."""
    assert answer.headers["content-type"].startswith("text/event-stream"), answer.text
    for line in answer.text.splitlines():
        if line.startswith("data:"):
            message = json.loads(line.removeprefix("data:"))
            if message.get("id") == 1:
                result: dict[str, Any] = message["result"]
                return result
    raise AssertionError(f"no result in {answer.text[:300]}")


def tool_refused_for_scope(answer: httpx.Response) -> None:
    result = _tool_result(answer)
    assert result["isError"] is True, result
    assert result["structuredContent"]["status"] == 403, result
    assert result["structuredContent"]["reason"] == "SCOPE_MISSING", result


def tool_answered(answer: httpx.Response) -> None:
    result = _tool_result(answer)
    assert not result.get("isError"), result
    assert result["structuredContent"]["action"] == "list", result
    assert result["structuredContent"]["runs"], result


def rows(ids: Ids, sessions: dict[str, str]) -> list[Row]:
    """The table: every served route and its statuses by kind."""
    table: list[Row] = [
        Row(
            "POST",
            "/api/session",
            LOGIN,
            "/api/session",
            body={"user_id": "bob", "password": PASSWORD},
        ),
        Row("GET", "/api/session", SESSION_GET, "/api/session", checks=SESSION_GET_CHECKS),
        Row("DELETE", "/api/session", LOGOUT, "/api/session", valid=sessions["leaving"]),
    ]
    for p in ("api", "v1"):
        w = f"/{p}/workshop"
        full = f"{w}/runs/full"
        table += [
            # workflows
            Row("GET", f"{w}/workflows", WORKSHOP, f"{w}/workflows"),
            Row("GET", f"{w}/workflows/{{workflow_id}}", WORKSHOP, f"{w}/workflows/watch"),
            Row(
                "PUT",
                f"{w}/workflows/{{workflow_id}}",
                WORKSHOP,
                f"{w}/workflows/save-{p}",
                body={"expected_revision": 0, "spec": SPEC},
            ),
            Row(
                "DELETE",
                f"{w}/workflows/{{workflow_id}}",
                WORKSHOP,
                f"{w}/workflows/del-{p}",
                params=(("expected_revision", "1"),),
            ),
            Row(
                "POST",
                f"{w}/workflows/validate",
                WORKSHOP,
                f"{w}/workflows/validate",
                body={"spec": SPEC},
            ),
            Row(
                "GET",
                f"{w}/workflows/{{workflow_id}}/runtime",
                WORKSHOP,
                f"{w}/workflows/watch/runtime",
                params=(("choice", "newest"),),
            ),
            Row("GET", f"{w}/catalog", WORKSHOP, f"{w}/catalog"),
            # devices and runtimes
            Row("GET", f"{w}/devices", WORKSHOP, f"{w}/devices"),
            Row(
                "GET",
                f"{w}/runtimes",
                WORKSHOP,
                f"{w}/runtimes",
                params=(("device_id", "gpu-box"),),
            ),
            Row(
                "POST",
                f"{w}/runtimes",
                WORKSHOP,
                f"{w}/runtimes",
                body={
                    "device_id": "gpu-box",
                    "engine": f"engine-{p}",
                    "code_sha256": "cd" * 32,
                    "capabilities": ["workshop-v3"],
                },
            ),
            # cameras' recordings
            Row(
                "GET",
                f"{w}/recordings",
                WORKSHOP,
                f"{w}/recordings",
                params=(("camera_id", "cam-a"),),
            ),
            # runs
            Row(
                "POST",
                f"{w}/runs",
                WORKSHOP,
                f"{w}/runs",
                body={
                    "id": f"new-{p}",
                    "workflow_id": "watch-a",
                    "runtime_id": ids.tracking_runtime,
                    "revision": 1,
                    "mode": "test",
                    "image_limit": 5,
                },
            ),
            Row("GET", f"{w}/runs", WORKSHOP, f"{w}/runs", params=(("workflow", "watch"),)),
            Row("GET", f"{w}/runs/{{run_id}}", WORKSHOP, full),
            Row("POST", f"{w}/runs/{{run_id}}/cancel", WORKSHOP, f"{w}/runs/cancel-{p}/cancel"),
            Row("GET", f"{w}/runs/{{run_id}}/snapshot", WORKSHOP, f"{full}/snapshot"),
            Row("GET", f"{w}/runs/{{run_id}}/timeline", WORKSHOP, f"{full}/timeline"),
            # review and summary
            Row(
                "GET",
                f"{w}/runs/{{run_id}}/review",
                FOOTAGE_LIST,
                f"{full}/review",
                no_scope="service",
                checks={"footage_other_camera": no_items, "valid": has_items},
            ),
            Row(
                "POST",
                f"{w}/runs/{{run_id}}/sightings/{{sighting_id}}/decision",
                WORKSHOP,
                f"{full}/sightings/{ids.sighting_id}/decision",
                body={"decision": "confirm"},
            ),
            Row(
                "POST",
                f"{w}/items/{{item_id}}/correction",
                WORKSHOP,
                f"{w}/items/{ids.item_id}/correction",
                body={"boxes": []},
            ),
            Row(
                "DELETE",
                f"{w}/items/{{item_id}}/correction",
                WORKSHOP_STALE,
                f"{w}/items/{ids.item_id}/correction",
                params=(("expected_revision", "999999"),),
            ),
            Row(
                "POST",
                f"{w}/items/{{item_id}}/decision",
                WORKSHOP,
                f"{w}/items/{ids.item_id}/decision",
                body={"decision": "confirm"},
            ),
            Row(
                "DELETE",
                f"{w}/items/{{item_id}}/decision",
                WORKSHOP_STALE,
                f"{w}/items/{ids.item_id}/decision",
                params=(("expected_revision", "999999"),),
            ),
            Row("GET", f"{w}/summary", WORKSHOP, f"{w}/summary", params=(("time_zone", "UTC"),)),
            # buckets
            Row(
                "GET",
                f"{w}/buckets/{{bucket_id}}/items",
                FOOTAGE_LIST,
                f"{w}/buckets/yard/items",
                no_scope="service",
                checks={"footage_other_camera": no_items, "valid": has_items},
            ),
            # an item of cam-a: a key of another camera is refused it (403)
            Row(
                "GET",
                f"{w}/items/{{item_id}}",
                VERSION_READ,
                f"{w}/items/{ids.item_id}",
                no_scope="service",
                checks={"valid": has_item_history},
            ),
            Row(
                "GET",
                f"{w}/buckets/{{bucket_id}}/queue",
                FOOTAGE_LIST,
                f"{w}/buckets/yard/queue",
                params=(
                    ("order", "lowest_score"),
                    ("review_state", "pending"),
                    ("review_state", "accepted"),
                    ("review_state", "rejected"),
                ),
                no_scope="service",
                checks={"footage_other_camera": no_sightings, "valid": has_sightings},
            ),
            Row(
                "POST",
                f"{w}/buckets/{{bucket_id}}/bulk-decisions",
                WORKSHOP,
                f"{w}/buckets/yard/bulk-decisions",
                body={"decision": "confirm", "dry_run": True},
            ),
            Row(
                "DELETE",
                f"{w}/bulk-decisions/{{action_id}}",
                WORKSHOP_MISSING,
                f"{w}/bulk-decisions/bulk-nothing",
            ),
            Row(
                "GET",
                f"{w}/buckets/{{bucket_id}}/export",
                FOOTAGE_LIST,
                f"{w}/buckets/yard/export",
                params=(
                    ("format", "coco"),
                    ("review_state", "pending"),
                    ("review_state", "accepted"),
                ),
                no_scope="service",
                checks={"footage_other_camera": no_images, "valid": has_images},
            ),
            # dataset versions
            Row(
                "POST",
                f"{w}/buckets/{{bucket_id}}/versions",
                WORKSHOP,
                f"{w}/buckets/yard/versions",
                body={"name": f"authz {p}"},
            ),
            Row(
                "GET",
                f"{w}/buckets/{{bucket_id}}/versions",
                FOOTAGE_LIST,
                f"{w}/buckets/yard/versions",
                no_scope="service",
                checks={"footage_other_camera": no_versions, "valid": has_versions},
            ),
            Row(
                "GET",
                f"{w}/versions/{{version_id}}",
                VERSION_READ,
                f"{w}/versions/{ids.version_id}",
                no_scope="service",
            ),
            Row(
                "GET",
                f"{w}/versions/{{to_version_id}}/diff",
                VERSION_READ,
                f"{w}/versions/{ids.version_id}/diff",
                params=(("from", ids.version_id),),
                no_scope="service",
            ),
            Row(
                "GET",
                f"{w}/items/{{item_id}}/versions",
                VERSION_READ,
                f"{w}/items/{ids.item_id}/versions",
                no_scope="service",
            ),
            Row(
                "GET",
                f"{w}/versions/{{dataset_version_id}}/export",
                VERSION_READ,
                f"{w}/versions/{ids.version_id}/export",
                params=(("format", "yolo"),),
                no_scope="service",
                checks={"valid": has_images},
            ),
            # images
            Row(
                "GET",
                f"{w}/runs/{{run_id}}/previews/{{item_id}}/image",
                IMAGE,
                f"{w}/runs/t/previews/{ids.preview_id}/image",
                no_scope="service",
                checks={"valid": is_jpeg},
            ),
            Row(
                "GET",
                f"{w}/runs/{{run_id}}/items/{{item_id}}/image",
                IMAGE,
                f"{full}/items/{ids.item_id}/image",
                no_scope="service",
                checks={"valid": is_jpeg},
            ),
            # photos
            Row(
                "POST",
                f"{w}/photos",
                WORKSHOP,
                f"{w}/photos",
                body={"camera_id": "cam-a", "time": "2026-11-29T08:00:30Z"},
            ),
            Row("GET", f"{w}/photos/{{photo_id}}", WORKSHOP, f"{w}/photos/{ids.photo_id}"),
            # the caller and a user's own keys
            Row("GET", f"{w}/me", ANY_PRINCIPAL, f"{w}/me"),
            Row("GET", f"{w}/keys", OWN_KEYS_API if p == "api" else OWN_KEYS_V1, f"{w}/keys"),
            Row(
                "POST",
                f"{w}/keys",
                OWN_KEYS_API if p == "api" else OWN_KEYS_V1,
                f"{w}/keys",
                body={"name": f"cell {p}", "scopes": [{"scope": "workshop"}]},
            ),
            Row(
                "DELETE",
                f"{w}/keys/{{key_id}}",
                OWN_KEYS_API if p == "api" else OWN_KEYS_V1,
                f"{w}/keys/{ids.own_keys[p]}",
            ),
            # the live channel: a WebSocket, and the same path without the upgrade
            Row("WS", f"{w}/runs/{{run_id}}/live", LIVE, f"{full}/live"),
            Row("GET", f"{w}/runs/{{run_id}}/live", UPGRADE, f"{full}/live"),
        ]
    table.append(
        Row(
            "POST",
            "/v1/mcp",
            ANY_PRINCIPAL,
            "/v1/mcp",
            body=MCP_CALL,
            headers=MCP_HEADERS,
            checks={
                "key_without_scope": tool_refused_for_scope,
                "footage_other_camera": tool_refused_for_scope,
                "processor_key": tool_refused_for_scope,
                "valid": tool_answered,
            },
        )
    )
    return table


def served(gateway: GatewayHarness) -> set[tuple[str, str]]:
    """(method, path) of every route of the app the gateway is serving."""
    found: set[tuple[str, str]] = set()
    for route in gateway.app.http._app.routes:
        if isinstance(route, WebSocketRoute):
            found.add(("WS", route.path))
        elif isinstance(route, Route):
            if route.methods is None:
                found.add(("ANY", route.path))
                continue
            if "GET" in route.methods:
                assert "HEAD" in route.methods, route.path
            found.update((method, route.path) for method in route.methods - {"HEAD"})
        elif isinstance(route, Mount) and isinstance(route.app, StaticFiles):
            found.add(("MOUNT", route.path))
        else:
            raise AssertionError(f"a route of an unknown kind: {route!r}")
    return found


# the world ---------------------------------------------------------------------------------


@dataclasses.dataclass
class World:
    ids: Ids
    secrets: dict[str, str]  # credential name -> secret
    sessions: dict[str, str]  # throwaway sessions of rows that consume their valid cell


async def session_of(gateway: GatewayHarness, user_id: str, ttl: int = 0) -> str:
    request = op.CreateSessionRequest(user_id=user_id)
    if ttl:
        request.ttl.CopyFrom(Duration(seconds=ttl))
    answer = await gateway.c.operator.CreateSession(request, metadata=gateway.c.admin)
    secret: str = answer.secret
    return secret


async def build(gateway: GatewayHarness) -> World:
    """Run `full` of workflow `watch` (cam-a's first job saved two real JPEGs of one
    person), test run `t` of `watch-a` (cam-a only) with one published preview, a photo,
    runs and workflows for the valid cells that consume them, users ada (valid), eve (to
    disable) and bob (to log in), and every credential of the matrix."""
    c = gateway.c
    md = c.admin
    preview = gateway.app.upstream.preview
    s = await review_world(c)
    # Only the oldest run with work is claimable: test run `t` first, finished, then `full`.
    await save_workflow(c, "watch-a", watch_spec(("cam-a",)))
    await c.workshop.CreateRun(
        run_request("t", "watch-a", s.world.tracking_runtime, image_limit=5), metadata=md
    )
    claimed = await c.jobs.Claim(
        jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE),
        metadata=s.processor,
    )
    assert claimed.job.input.recording.camera_id == "cam-a"
    published = await preview.PublishPreview(publish_request(claimed.job, 0), metadata=s.processor)
    await commit(c, s, claimed.job, [])
    jobs = await start_run(c, s, "full")
    frames = [
        Frame(0, "save", (box("person", 0.2, 0.2, 0.1),)),
        Frame(1, "save", (box("person", 0.22, 0.2, 0.1),)),
    ]
    images = {0: jpeg_bytes(seed=1), 1: jpeg_bytes(seed=2)}
    await commit_images(c, s, preview, jobs[0], frames, images)
    for prefix in ("api", "v1"):
        await c.workshop.CreateRun(
            run_request(f"cancel-{prefix}", "watch-a", s.world.tracking_runtime), metadata=md
        )
        await save_workflow(c, f"del-{prefix}", watch_spec(("cam-a",)))
    photo = await c.workshop.RequestPhoto(
        workshop_pb2.RequestPhotoRequest(
            camera_id="cam-a", time=stamp(DAY + timedelta(hours=8, minutes=1, seconds=30))
        ),
        metadata=md,
    )
    review = await c.workshop.GetReview(workshop_pb2.GetReviewRequest(run_id="full"), metadata=md)
    assert {item.item.camera_id for item in review.items} == {"cam-a"}

    for user in ("ada", "eve", "bob"):
        await gateway.user(user)
    ada = await session_of(gateway, "ada")
    own_keys: dict[str, str] = {}
    for prefix in ("api", "v1"):
        own = await c.identity.CreateOwnKey(
            identity_pb2.CreateOwnKeyRequest(
                name=f"revoke {prefix}",
                scopes=[common_pb2.KeyScope(scope=common_pb2.SCOPE_WORKSHOP)],
            ),
            metadata=bearer_metadata(ada),
        )
        own_keys[prefix] = own.key.key_id

    revoked = await session_of(gateway, "ada")
    async with gateway.client() as client:
        out = await client.delete(
            "/api/session",
            headers={
                "cookie": f"workshop_session={revoked}",
                "x-csrf-token": csrf_token(revoked),
                "sec-fetch-site": "same-origin",
            },
        )
        assert out.status_code == 204, out.text
    disabled = await session_of(gateway, "eve")
    await c.operator.DisableUser(op.DisableUserRequest(user_id="eve"), metadata=md)
    expired = await session_of(gateway, "ada", ttl=60)
    c.clock.advance(timedelta(minutes=2))

    secrets = {
        "expired_session": expired,
        "revoked_session": revoked,
        "disabled_user": disabled,
        "ada": ada,
        "workshop": await c.key(Grant(ScopeName.WORKSHOP), name="agent"),
        "footage_a": await c.key(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-a",))),
        "footage_b": await c.key(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-b",))),
        "service": await c.key(Grant(ScopeName.SERVICE)),
        "processor": await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box")),
    }
    ids = Ids(
        tracking_runtime=s.world.tracking_runtime,
        item_id=review.items[0].item.item_id,
        preview_id=published.item_id,
        sighting_id=review.sightings[0].sighting_id,
        photo_id=photo.photo.photo_id,
        own_keys=own_keys,
        version_id=(
            await dataset_pb2_grpc.DatasetServiceStub(c.channel).CreateDatasetVersion(
                dataset_pb2.CreateDatasetVersionRequest(
                    bucket_id="yard",
                    name="authz",
                    filter=run_pb2.BucketItemFilter(
                        review_states=[common_pb2.REVIEW_STATE_PENDING]
                    ),
                ),
                metadata=md,
            )
        ).version.version_id,
    )
    return World(ids, secrets, {"leaving": await session_of(gateway, "ada")})


# the cells ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Presented:
    """A credential as one request carries it."""

    cookie: str = ""
    bearer: str = ""

    def headers(self) -> dict[str, str]:
        headers = {"sec-fetch-site": "same-origin"}
        if self.cookie:
            headers["cookie"] = f"workshop_session={self.cookie}"
            headers["x-csrf-token"] = csrf_token(self.cookie)
        if self.bearer:
            headers["authorization"] = f"Bearer {self.bearer}"
        return headers


def presented(world: World, row: Row, kind: str) -> Presented:
    s = world.secrets
    api = row.prefix == "api"
    if kind == "wrong_transport":  # a valid credential of the other prefix
        return Presented(bearer=s["workshop"]) if api else Presented(cookie=s["ada"])
    secret = {
        "none": "",
        "expired_session": s["expired_session"],
        "revoked_session": s["revoked_session"],
        "disabled_user": s["disabled_user"],
        "key_without_scope": s[row.no_scope],
        "footage_other_camera": s["footage_b"],
        "processor_key": s["processor"],
        "valid": row.valid or (s["ada"] if api else s["workshop"]),
    }[kind]
    return Presented(cookie=secret) if api else Presented(bearer=secret)


@dataclasses.dataclass
class Outcome:
    status: int
    reason: str
    response: httpx.Response | None


async def call(
    gateway: GatewayHarness, client: httpx.AsyncClient, row: Row, credential: Presented
) -> Outcome:
    if row.method == "WS":
        return await handshake(gateway, row, credential)
    method = "GET" if row.method == "ANY" else row.method
    answer = await client.request(
        method,
        row.path,
        params=list(row.params) or None,
        json=row.body,
        headers={**credential.headers(), **dict(row.headers)},
    )
    client.cookies.clear()  # a login or logout sets one: every cell brings its own
    reason = ""
    if answer.status_code >= 400:
        body = answer.json()
        assert set(body) == {"code", "status", "reason", "message", "details"}, body
        reason = body["reason"]
    return Outcome(answer.status_code, reason, answer)


async def handshake(gateway: GatewayHarness, row: Row, credential: Presented) -> Outcome:
    headers = {key: value for key, value in credential.headers().items() if key != "x-csrf-token"}
    url = gateway.url.replace("http", "ws", 1) + row.path
    try:
        async with websockets.connect(
            url, additional_headers=headers, origin=Origin(gateway.url), open_timeout=10
        ) as socket:
            first = json.loads(await socket.recv(decode=True))
            assert first["detail"]["run"]["run_id"] == "full", first
            return Outcome(101, "", None)
    except websockets.exceptions.InvalidStatus as refused:
        response = refused.response
        reason = json.loads(response.body or b"{}").get("reason", "") if response.body else ""
        return Outcome(response.status_code, reason, None)


def check(row: Row, kind: str, outcome: Outcome) -> str | None:
    """Why the cell is wrong, or None."""
    want = row.expect[kind]
    if outcome.status != want:
        detail = outcome.reason or (outcome.response.text[:120] if outcome.response else "")
        return f"{row.method} {row.route} [{kind}]: {outcome.status} {detail}, expected {want}"
    allowed = AUTH_REASONS.get(want)
    if allowed is not None and outcome.reason not in allowed:
        return f"{row.method} {row.route} [{kind}]: reason {outcome.reason}"
    if (
        kind in ("none", "wrong_transport")
        and want == 401
        and outcome.reason != "CREDENTIAL_MISSING"
    ):
        return f"{row.method} {row.route} [{kind}]: reason {outcome.reason}"
    checker = row.checks.get(kind)
    if checker is not None and outcome.response is not None:
        try:
            checker(outcome.response)
        except AssertionError as error:
            return f"{row.method} {row.route} [{kind}]: {checker.__name__} failed: {error}"
    return None


async def test_every_route_answers_every_credential_as_the_table_says(
    gateway: GatewayHarness,
) -> None:
    world = await build(gateway)
    table = rows(world.ids, world.sessions)
    keys = [(row.method, row.route) for row in table]
    assert len(keys) == len(set(keys)), "a route has two rows"
    routes = served(gateway)
    assert routes >= EXEMPT
    assert sorted(routes - EXEMPT - set(keys)) == [], "served routes without a row"
    assert sorted(set(keys) - routes) == [], "rows of routes that are not served"

    wrong: list[str] = []
    # Refusals first (each write route's between two digests), then the cells that
    # succeed (some consume what they act on); signing out last, since it revokes the
    # sessions of the expired, revoked and disabled cells that later rows present.
    order = sorted(table, key=lambda row: (row.method, row.route) == ("DELETE", "/api/session"))
    async with gateway.client() as client:
        for row in order:
            refused = [kind for kind in KINDS if row.expect[kind] >= 400]
            before = await table_digests(gateway.c) if row.writes else None
            for kind in refused:
                outcome = await call(gateway, client, row, presented(world, row, kind))
                wrong.append(check(row, kind, outcome) or "")
            if before is not None and await table_digests(gateway.c) != before:
                wrong.append(f"{row.method} {row.route}: a refused cell changed the tables")
        for row in order:
            for kind in KINDS:
                if row.expect[kind] < 400:
                    outcome = await call(gateway, client, row, presented(world, row, kind))
                    wrong.append(check(row, kind, outcome) or "")
    problems = [line for line in wrong if line]
    assert problems == [], "\n".join(problems)


async def test_each_prefix_takes_any_secret_in_its_own_transport(gateway: GatewayHarness) -> None:
    """Beyond the matrix: a prefix picks where the credential is read (the cookie, or the
    bearer header), and the coordinator decides by the secret itself. So an Agent key in
    the `workshop_session` cookie acts on `/api` as that key (no session: GET /api/session
    says signed out, and the own-key routes refuse it), and a session secret as bearer acts
    on `/v1` as the session, own-key routes included. Neither adds authority (the holder of
    either can already use it where it belongs), and a bearer header is never sent by a
    browser on its own, so this is no cross-site path."""
    await gateway.user("ada")
    session = await session_of(gateway, "ada")
    key = await gateway.c.key(Grant(ScopeName.WORKSHOP), name="agent")
    key_cookie = Presented(cookie=key).headers()
    session_bearer = Presented(bearer=session).headers()
    async with gateway.client() as client:
        assert (await client.get("/api/workshop/runs", headers=key_cookie)).status_code == 200
        me = await client.get("/api/workshop/me", headers=key_cookie)
        assert me.json()["kind"] == "key"
        no_session = await client.get("/api/session", headers=key_cookie)
        assert no_session.json() == {"signed_in": False, "ended": False}, no_session.text
        minted = await client.post(
            "/api/workshop/keys",
            json={"name": "k", "scopes": [{"scope": "workshop"}]},
            headers=key_cookie,
        )
        assert minted.status_code == 403, minted.text

        assert (await client.get("/v1/workshop/runs", headers=session_bearer)).status_code == 200
        me = await client.get("/v1/workshop/me", headers=session_bearer)
        assert me.json()["kind"] == "session"
        minted = await client.post(
            "/v1/workshop/keys",
            json={"name": "k", "scopes": [{"scope": "workshop"}]},
            headers=session_bearer,
        )
        assert minted.status_code == 200, minted.text
