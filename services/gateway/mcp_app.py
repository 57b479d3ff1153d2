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
- DNS-rebinding protection (Host and Origin allow-lists, matched by the SDK's own
  middleware) is a gateway setting (GATEWAY_MCP_ALLOWED_HOSTS, GATEWAY_MCP_ALLOWED_ORIGINS),
  localhost by default.

Before the MCP layer sees a request, the `Gate` checks its Host and Origin, its bearer
(with WhoAmI: no key or a rejected one is a 401) and its size, each refusal in the
gateway's error body; what the key may do is decided by the coordinator on each tool
call. A tool's arguments are read as strictly as an HTTP body, by the same code
(`tool_arguments`), and a refusal is a structured INVALID_FIELD result (`WorkshopServer`).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp_types import CallToolResult, InputRequiredResult, Tool
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from services.gateway.agent_tools import AgentTool, AgentTools, agent_tools, refused
from services.gateway.dispatch import bearer_of, read_body
from services.gateway.guard import CrossSiteRefused
from services.gateway.live import LiveHub
from services.gateway.problems import problem_response
from services.gateway.upstream import Upstream
from workshop.kit import errors
from workshop.v1 import identity_pb2

MCP_PATH = "/v1/mcp"
INSTRUCTIONS = (
    "Workshop: run saved workflows over stored camera recordings and look at cameras. "
    "`runs` creates (with an id you choose; retrying with it is safe), lists, gets, watches "
    "and cancels runs; `footage` returns a camera's frame at an instant as an image."
)


def split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


class HostNotAllowed(errors.InvalidArgument):
    reason = "HOST_NOT_ALLOWED"


def transport_security(allowed_hosts: str, allowed_origins: str) -> TransportSecuritySettings:
    """The Host/Origin allow-lists, as the SDK matches them; `*` as the hosts turns both
    checks off (behind a proxy that checks the Host itself)."""
    hosts = split(allowed_hosts)
    if hosts == ["*"]:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=split(allowed_origins),
    )


class WorkshopServer(MCPServer[object]):
    """The SDK's server with the gateway's tools (`agent_tools.AgentTool`) in place of the
    SDK's own: tools/list publishes their input schemas (`tool_arguments`), and a call
    reads its raw arguments with `ToolArguments.read`, the strict JSON reading of the
    HTTP routes, instead of the SDK's lax pydantic model. Every refusal is a structured
    error result (INVALID_FIELD, NOT_FOUND for an unknown tool) like HTTP's."""

    def __init__(self, tools: tuple[AgentTool, ...], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._agent_tools = {tool.name: tool for tool in tools}

    async def list_tools(self) -> list[Tool]:
        return [tool.listed() for tool in self._agent_tools.values()]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[object, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        tool = self._agent_tools.get(name)
        if tool is None:
            return refused(errors.NotFound(f"No tool {name!r}; see tools/list."))
        if context is None:
            context = Context(mcp_server=self)
        try:
            return await tool.body(context, tool.arguments.read(arguments))
        except Exception as error:  # a bug: the log has it, the caller a plain INTERNAL
            return refused(error)


class Gate:
    """An ASGI app in front of the transport, answering refusals with the gateway's error
    body: a Host or Origin not allowed (421 HOST_NOT_ALLOWED, 403 CROSS_SITE), a bearer the
    coordinator does not accept (401, checked with WhoAmI), a body over the gateway's limit
    (413). Everything else goes to the transport, the body replayed."""

    def __init__(
        self,
        upstream: Upstream,
        transport: StreamableHTTPASGIApp,
        security: TransportSecuritySettings,
        max_body_bytes: int,
    ) -> None:
        self._upstream = upstream
        self._transport = transport
        self._security = TransportSecurityMiddleware(security)
        self._max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            await self._check_host(request)
            secret = bearer_of(request)
            # "" sends no credential: the coordinator answers CREDENTIAL_MISSING.
            await self._upstream.call("identity", "WhoAmI", identity_pb2.WhoAmIRequest(), secret)
            body = await read_body(request, self._max_body_bytes)
        except Exception as error:
            await problem_response(error)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then the disconnect, when it comes

        await self._transport(scope, replay, send)

    async def _check_host(self, request: Request) -> None:
        refusal = await self._security.validate_request(request, is_post=False)
        if refusal is None:
            return
        if refusal.status_code == 421:
            raise HostNotAllowed(
                f"Host {request.headers.get('host', '')[:100]!r} is not one /v1/mcp serves "
                "(GATEWAY_MCP_ALLOWED_HOSTS)."
            )
        raise CrossSiteRefused(
            f"Origin {request.headers.get('origin', '')[:100]!r} may not call /v1/mcp "
            "(GATEWAY_MCP_ALLOWED_ORIGINS)."
        )


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
        tools = agent_tools(AgentTools(upstream, hub))
        self.server = WorkshopServer(tools, name="workshop", instructions=INSTRUCTIONS)
        # Builds the session manager (the app it returns is not used: see the docstring).
        # The Gate checks Host and Origin with the gateway's error body, so the SDK's own
        # check is off here.
        self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            json_response=False,
            stateless_http=True,
            max_request_body_size=max_body_bytes,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        transport = StreamableHTTPASGIApp(self.server.session_manager)
        security = transport_security(allowed_hosts, allowed_origins)
        self._gate = Gate(upstream, transport, security, max_body_bytes)

    def route(self) -> Route:
        # POST only: stateless, there is no GET stream to open and no session to DELETE.
        return Route(MCP_PATH, endpoint=self._gate, methods=["POST"], name="v1_mcp")

    def running(self) -> AbstractAsyncContextManager[None]:
        """Enter for as long as the gateway serves (its lifespan)."""
        return self.server.session_manager.run()
