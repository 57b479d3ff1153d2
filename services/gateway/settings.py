"""Gateway settings: `GATEWAY_*` environment variables."""

from __future__ import annotations

import dataclasses

from workshop.kit.server import ServerSettings
from workshop.kit.settings import at_least, between, setting

PREFIX = "GATEWAY"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GatewaySettings(ServerSettings):
    port: int = setting(50053, help="gRPC port for health and reflection; 0 picks a free port.")
    http_host: str = setting("127.0.0.1", help="Address the HTTP/WebSocket server binds.")
    http_port: int = setting(
        8080, help="HTTP port; 0 picks a free port, announced on stdout.", check=between(0, 65535)
    )
    coordinator_target: str = setting("127.0.0.1:50051", help="Coordinator gRPC address host:port.")
    preview_target: str = setting("127.0.0.1:50052", help="Preview service gRPC address.")
    max_body_bytes: int = setting(
        64 * 1024,
        help="Largest request body accepted, in bytes; larger gets 413.",
        check=at_least(1),
    )
