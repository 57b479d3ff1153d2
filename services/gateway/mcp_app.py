"""The MCP server at /v1/mcp (docs/mcp.md): the `mcp` SDK's streamable-HTTP transport,
stateless, behind the gateway's own credential check.

Wiring, and why (the SDK's pitfalls):

- The SDK's Starlette app is not mounted: its one route is rebuilt as a gateway route at
  `streamable_http_path="/v1/mcp"` (a `Mount` would answer a bare /v1/mcp with a 307 that
  strict clients do not follow), and its session manager is run by the gateway's own
  lifespan (`McpEndpoint.running`), since a mounted app's lifespan never runs.
- Answers are SSE (`json_response=False`): progress notifications ride the response of
  the POST that called the tool, and a JSON answer would drop them.
- Stateless: every POST stands alone (no session to keep on one replica), and each call
  carries its caller's bearer.
- DNS-rebinding protection (Host and Origin allow-lists) is a gateway setting
  (GATEWAY_MCP_ALLOWED_HOSTS, GATEWAY_MCP_ALLOWED_ORIGINS), localhost by default.

Before the MCP layer sees a request, its bearer is checked with WhoAmI, so no key or a
rejected one is a 401 in the gateway's error body; what the key may do is decided by the
coordinator on each tool call.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from services.gateway.agent_tools import AgentTools, register
from services.gateway.dispatch import bearer_of
from services.gateway.live import LiveHub
from services.gateway.problems import problem_response
from services.gateway.upstream import Upstream
from workshop.v1 import identity_pb2

MCP_PATH = "/v1/mcp"
INSTRUCTIONS = (
    "Workshop: run saved workflows over stored camera recordings and look at cameras. "
    "`runs` creates (with an id you choose; retrying with it is safe), lists, gets, watches "
    "and cancels runs; `footage` returns a camera's frame at an instant as an image."
)


def split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def transport_security(allowed_hosts: str, allowed_origins: str) -> TransportSecuritySettings:
    """The SDK's Host/Origin checks; `*` as the hosts turns them off (behind a proxy that
    checks the Host itself)."""
    hosts = split(allowed_hosts)
    if hosts == ["*"]:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=split(allowed_origins),
    )


class BearerGate:
    """An ASGI app: refuses a request whose bearer the coordinator does not accept (the
    gateway's 401 body), and hands the others to the transport."""

    def __init__(self, upstream: Upstream, transport: StreamableHTTPASGIApp) -> None:
        self._upstream = upstream
        self._transport = transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            secret = bearer_of(Request(scope))
            # "" sends no credential: the coordinator answers CREDENTIAL_MISSING.
            await self._upstream.call("identity", "WhoAmI", identity_pb2.WhoAmIRequest(), secret)
        except Exception as error:
            await problem_response(error)(scope, receive, send)
            return
        await self._transport(scope, receive, send)


class McpEndpoint:
    """The MCP server, its gateway route and its session manager's lifetime."""

    def __init__(
        self,
        upstream: Upstream,
        hub: LiveHub,
        *,
        allowed_hosts: str,
        allowed_origins: str,
        max_body_bytes: int,
    ) -> None:
        self.server: MCPServer[object] = MCPServer(name="workshop", instructions=INSTRUCTIONS)
        register(self.server, AgentTools(upstream, hub))
        # Builds the session manager (the app it returns is not used: see the docstring).
        self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            json_response=False,
            stateless_http=True,
            max_request_body_size=max_body_bytes,
            transport_security=transport_security(allowed_hosts, allowed_origins),
        )
        transport = StreamableHTTPASGIApp(self.server.session_manager)
        self._gate = BearerGate(upstream, transport)

    def route(self) -> Route:
        # POST only: stateless, there is no GET stream to open and no session to DELETE.
        return Route(MCP_PATH, endpoint=self._gate, methods=["POST"], name="v1_mcp")

    def running(self) -> AbstractAsyncContextManager[None]:
        """Enter for as long as the gateway serves (its lifespan)."""
        return self.server.session_manager.run()
