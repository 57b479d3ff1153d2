"""Gateway settings: `GATEWAY_*` environment variables."""

from __future__ import annotations

import dataclasses

from workshop.kit.server import ServerSettings
from workshop.kit.settings import at_least, between, setting
from workshop.kit.tls import ClientTlsSettings

PREFIX = "GATEWAY"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GatewaySettings(ServerSettings, ClientTlsSettings):
    port: int = setting(50053, help="gRPC port for health and reflection; 0 picks a free port.")
    http_host: str = setting("127.0.0.1", help="Address the HTTP/WebSocket server binds.")
    http_port: int = setting(
        8080, help="HTTP port; 0 picks a free port, announced on stdout.", check=between(0, 65535)
    )
    metrics_port: int = setting(
        -1,
        help="Port of a Prometheus GET /metrics endpoint of its own (on HOST); 0 picks a free "
        "port; -1 (the default) serves /metrics on the HTTP port only (see HTTP_METRICS).",
        check=between(-1, 65535),
    )
    http_metrics: bool = setting(
        True,
        help="1 = serve Prometheus GET /metrics on the HTTP port (without a credential: keep "
        "/metrics off the public ingress); 0 = not on the HTTP port.",
    )
    coordinator_target: str = setting("127.0.0.1:50051", help="Coordinator gRPC address host:port.")
    preview_target: str = setting("127.0.0.1:50052", help="Preview service gRPC address.")
    max_body_bytes: int = setting(
        64 * 1024,
        help="Largest request body accepted, in bytes; larger gets 413 before it is read.",
        check=at_least(1),
    )
    key: str = setting(
        "",
        help="The gateway's own coordinator key, of scope `gateway`: website logins and the "
        "one WatchRun stream per run its live sockets share. Without it, login and live "
        "answer 503.",
        secret=True,
    )
    allowed_origins: str = setting(
        "",
        help="Comma-separated origins (scheme://host[:port]) besides the gateway's own whose "
        "pages may change state through /api and open its WebSockets.",
    )
    cookie_secure: bool = setting(
        True, help="0 drops the session cookie's Secure flag, for plain-HTTP local use only."
    )
    rpc_deadline_seconds: float = setting(
        10.0,
        help="Deadline of each call to the coordinator and preview service.",
        check=at_least(0.1),
    )
    forwarded_allow_ips: str = setting(
        "",
        help="Proxies (comma-separated IPs, or *) whose X-Forwarded-For names the client "
        "address that login throttling counts; empty trusts none.",
    )
    live_recheck_seconds: float = setting(
        30.0,
        help="How often an open WebSocket's own credential is checked again; one revoked "
        "since the handshake closes it (1008).",
        check=at_least(0.05),
    )
    live_stall_seconds: float = setting(
        10.0,
        help="A WebSocket reader that has not taken a message for this long is closed (1013).",
        check=at_least(0.1),
    )
    mcp_allowed_hosts: str = setting(
        "127.0.0.1:*,localhost:*,[::1]:*",
        help="Host header values /v1/mcp accepts (comma-separated; `host:*` is any port), "
        "against DNS rebinding; `*` turns the Host and Origin checks off (behind a proxy "
        "that checks the Host itself). Others get 421.",
    )
    mcp_allowed_origins: str = setting(
        "http://127.0.0.1:*,http://localhost:*,http://[::1]:*",
        help="Origin header values /v1/mcp accepts from browsers (comma-separated; "
        "`scheme://host:*` is any port); a request without Origin passes. Others get 403.",
    )
