"""`python -m services.gateway`: HTTP + WebSocket for the website and Agent keys."""

from __future__ import annotations

import asyncio
import os
import sys

from services.gateway.app import LABEL, build
from services.gateway.live_metrics import LiveMetrics
from services.gateway.settings import PREFIX, GatewaySettings
from workshop.kit.server import serve
from workshop.kit.settings import settings_or_exit
from workshop.kit.telemetry import configure_logging, configure_tracing


async def run_server(settings: GatewaySettings) -> None:
    gateway = build(settings)
    # The gateway has no gRPC API of its own: its gRPC port carries health and
    # reflection so that operators and probes treat it like every other service.
    # On SIGTERM, serve() stops the HTTP worker: live sockets get 1001, requests in
    # flight finish, then the channels close.
    try:
        await serve(
            label=LABEL,
            settings=settings,
            services=[],
            workers=[gateway.http],
            collectors=[LiveMetrics(gateway.hub)],  # when METRICS_PORT serves them too
        )
    finally:
        await gateway.upstream.close()


def main() -> None:
    settings = settings_or_exit(GatewaySettings, PREFIX, os.environ)
    configure_logging(LABEL, settings.log_level)
    configure_tracing(LABEL)
    try:
        asyncio.run(run_server(settings))
    except OSError as error:
        print(f"{LABEL}: cannot start: {error}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
