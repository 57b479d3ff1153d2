"""Oversized credentials and the statuses a gRPC transport (not a service) produces, on
the real stack: a real gateway (uvicorn) in front of the real coordinator (Postgres)
and preview service (SeaweedFS), and direct gRPC calls to the real coordinator.

A credential (an Agent key, a session secret) is at most `MAX_SECRET_BYTES` (4 KiB): a
longer one is refused 401 `CREDENTIAL_MALFORMED` by the gateway before it is forwarded,
and by every gRPC server's auth for a direct caller, instead of reaching gRPC's own
metadata limit (a 429 `RESOURCE_EXHAUSTED` that no retry can fix).

A status without the `ErrorInfo` every service refusal carries was made by a transport.
The gateway answers those by what they mean for the caller, never by the code's usual
HTTP status: `transport_upstream` below is a plain gRPC server (no Workshop interceptor,
small transport limits) standing where the coordinator would, so each transport failure
is produced by gRPC itself and read through the real gateway.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
import websockets
from websockets.typing import Origin

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.gateway import GatewayHarness, running_gateway
from workshop.kit.auth import MAX_SECRET_BYTES
from workshop.kit.errors import ResourceExhausted, Unavailable
from workshop.kit.interceptors import abort_with
from workshop.v1 import workshop_pb2

pytestmark = pytest.mark.timeout(120)

HUGE = 20_000


def assert_error(answer: httpx.Response, status: int, reason: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    body: dict[str, Any] = answer.json()
    assert (body["status"], body["reason"]) == (status, reason), body
    if status != 429:
        assert "retry-after" not in answer.headers, answer.headers
    return body


def secret_of(length: int) -> str:
    """A key-shaped secret of `length` bytes that names no key."""
    return ("wk_0123456789abcdef." + "x" * length)[:length]


# the gateway ------------------------------------------------------------------------------


async def test_an_oversized_bearer_is_401_on_every_v1_route_kind(gateway: GatewayHarness) -> None:
    bearer = {"authorization": f"Bearer {secret_of(HUGE)}"}
    async with gateway.client(headers=bearer) as client:
        for answer in (
            await client.get("/v1/workshop/runs"),
            await client.get("/v1/workshop/runs/r/previews/p/image"),
            await client.get("/v1/workshop/buckets/b/export", params={"format": "coco"}),
            await client.post(
                "/v1/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"accept": "application/json, text/event-stream"},
            ),
        ):
            body = assert_error(answer, 401, "CREDENTIAL_MALFORMED")
            assert f"{HUGE} bytes" in body["message"], body
            assert body["details"]["metadata"]["limit_bytes"] == str(MAX_SECRET_BYTES)
    await assert_handshakes_refused(gateway, "/v1/workshop/runs/r/live", "authorization", "Bearer ")


async def test_an_oversized_session_cookie_is_401_and_speaks_of_signing_in(
    gateway: GatewayHarness,
) -> None:
    cookie = {"cookie": f"workshop_session={secret_of(HUGE)}", "sec-fetch-site": "same-origin"}
    async with gateway.client(headers=cookie) as client:
        for answer in (
            await client.get("/api/workshop/runs"),
            await client.get("/api/session"),
            await client.get("/api/workshop/runs/r/previews/p/image"),
        ):
            body = assert_error(answer, 401, "CREDENTIAL_MALFORMED")
            assert "sign in" in body["message"].lower(), body
            assert f"{HUGE} bytes" in body["message"], body
            assert "metadata" not in body["message"], body
    await assert_handshakes_refused(
        gateway, "/api/workshop/runs/r/live", "cookie", "workshop_session="
    )


async def test_a_credential_at_the_bound_reaches_the_coordinator_and_one_past_it_does_not(
    gateway: GatewayHarness,
) -> None:
    async with gateway.client() as client:
        for size, reason in (
            (MAX_SECRET_BYTES, "CREDENTIAL_REJECTED"),  # the coordinator saw it: no such key
            (MAX_SECRET_BYTES + 1, "CREDENTIAL_MALFORMED"),  # refused by the gateway
        ):
            secret = secret_of(size)
            bearer = await client.get(
                "/v1/workshop/runs", headers={"authorization": f"Bearer {secret}"}
            )
            assert_error(bearer, 401, reason)
            cookie = await client.get(
                "/api/workshop/runs", headers={"cookie": f"workshop_session={secret}"}
            )
            assert_error(cookie, 401, reason)


async def assert_handshakes_refused(
    gateway: GatewayHarness, path: str, header: str, prefix: str
) -> None:
    """The live route's handshake with an oversized credential: 401 CREDENTIAL_MALFORMED
    from the gateway while the WebSocket layer can read the header (lines up to 8 KiB),
    its own 431 past that (ws_protocol.py), never a handshake left unanswered."""
    url = gateway.url.replace("http", "ws", 1) + path
    for size, status in ((5_000, 401), (HUGE, 431)):
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with websockets.connect(
                url,
                additional_headers={header: prefix + secret_of(size)},
                origin=Origin(gateway.url),
                open_timeout=10,
            ):
                pass
        response = refused.value.response
        assert response.status_code == status, response.body
        if status == 401:
            body = json.loads(response.body or b"{}")
            assert body["reason"] == "CREDENTIAL_MALFORMED", body


# direct gRPC callers ------------------------------------------------------------------------


async def test_a_direct_grpc_caller_with_an_oversized_credential_is_told_so(
    coordinator: CoordinatorHarness,
) -> None:
    """Every credential the server's transport lets through reaches the auth check, which
    refuses one over the bound precisely, every time (gRPC's own soft limit would drop some
    calls at random with RESOURCE_EXHAUSTED); past the transport's hard limit the server
    never sees the call, and gRPC says why."""
    request = workshop_pb2.ListRunsRequest()
    for size in (MAX_SECRET_BYTES + 1, 12_000, 15_000):
        metadata = (("authorization", f"Bearer {secret_of(size)}"),)
        for _ in range(20):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await coordinator.workshop.ListRuns(request, metadata=metadata)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, caught.value.details()
            assert f"{size} bytes" in (caught.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await coordinator.workshop.ListRuns(
            request, metadata=(("authorization", f"Bearer {secret_of(HUGE)}"),)
        )
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "hard limit" in (caught.value.details() or "")


# transport statuses through the gateway --------------------------------------------------

# The transport_upstream server's limits, small enough for a test to pass them.
METADATA_LIMIT = 2048
MESSAGE_LIMIT = 512
# The gateway's deadline in that test: long enough for a loaded machine's answers, and
# the slow behaviour's sleep well past it.
DEADLINE_SECONDS = 2.0
SLOW_SECONDS = 10.0


class _Behaviours(grpc.GenericRpcHandler):
    """Picks what to do by the caller's bearer secret (the one thing the gateway forwards)."""

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        metadata = dict(handler_call_details.invocation_metadata or ())
        secret = str(metadata.get("authorization", "")).removeprefix("Bearer ")
        if secret == "wk_missing":
            return None  # no such method here: gRPC answers UNIMPLEMENTED itself

        async def behave(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            if secret == "wk_raises":
                raise RuntimeError("not a Workshop error")  # gRPC answers UNKNOWN
            if secret == "wk_slow":
                await asyncio.sleep(SLOW_SECONDS)
            if secret == "wk_busy":  # a service's own capacity refusal
                await abort_with(
                    context,
                    ResourceExhausted(
                        "Busy.", reason="CAPACITY", metadata={"retry_after_seconds": "7"}
                    ),
                )
            if secret == "wk_down":  # a service's own "a dependency is down"
                await abort_with(context, Unavailable("The database cannot be reached."))
            if secret == "wk_garbage":
                return b"\xff\xff\xff"  # bytes that are no response message
            return workshop_pb2.ListRunsResponse().SerializeToString()

        return grpc.unary_unary_rpc_method_handler(behave)


@pytest.fixture
async def transport_upstream() -> AsyncIterator[int]:
    server = grpc.aio.server(
        options=[
            ("grpc.max_metadata_size", METADATA_LIMIT),
            ("grpc.absolute_max_metadata_size", METADATA_LIMIT),
            ("grpc.max_receive_message_length", MESSAGE_LIMIT),
        ]
    )
    server.add_generic_rpc_handlers([_Behaviours()])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# (what the caller sends, the status and reason it gets, why)
TRANSPORT_TABLE = [
    ("wk_busy", {}, 429, "CAPACITY", "a service's own RESOURCE_EXHAUSTED: retry later"),
    ("wk_down", {}, 503, "UNAVAILABLE", "a service's own UNAVAILABLE"),
    ("wk_" + "m" * 3000, {}, 502, "BAD_GATEWAY", "RESOURCE_EXHAUSTED: the metadata limit"),
    ("wk_ok", {"workflow": "w" * 1000}, 502, "BAD_GATEWAY", "RESOURCE_EXHAUSTED: message size"),
    ("wk_raises", {}, 502, "BAD_GATEWAY", "UNKNOWN: the server's handler failed"),
    ("wk_missing", {}, 502, "BAD_GATEWAY", "UNIMPLEMENTED: no such method there"),
    ("wk_garbage", {}, 502, "BAD_GATEWAY", "INTERNAL: the answer does not parse"),
    ("wk_slow", {}, 503, "DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED: no answer in time"),
]


async def test_each_transport_status_is_answered_by_what_it_means(
    coordinator: CoordinatorHarness, transport_upstream: int
) -> None:
    async with running_gateway(
        coordinator,
        closed_port(),  # the preview service cannot be reached: UNAVAILABLE
        coordinator_target=f"127.0.0.1:{transport_upstream}",
        rpc_deadline_seconds=DEADLINE_SECONDS,
    ) as gateway:
        client = gateway.client()
        wrong: list[str] = []
        for secret, params, status, reason, why in TRANSPORT_TABLE:
            answer = await client.get(
                "/v1/workshop/runs",
                params=params,
                headers={"authorization": f"Bearer {secret}"},
            )
            body = answer.json()
            got = (answer.status_code, body.get("reason"), answer.headers.get("retry-after"))
            want = (status, reason, "7" if status == 429 else None)
            if got != want:
                wrong.append(f"{why}: got {got}, expected {want}: {body.get('message')}")
        key = await coordinator.key(Grant(ScopeName.WORKSHOP))
        image = await client.get(
            "/v1/workshop/runs/r/previews/p/image", headers={"authorization": f"Bearer {key}"}
        )
        if (image.status_code, image.json()["reason"]) != (503, "UNAVAILABLE"):
            wrong.append(f"UNAVAILABLE (unreachable): {image.status_code} {image.text}")
        assert wrong == [], "\n".join(wrong)
