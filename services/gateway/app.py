"""Assembling the gateway: its gRPC clients, its live hub and its HTTP worker."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterable

from services.gateway.live import LiveHub
from services.gateway.settings import GatewaySettings
from services.gateway.upstream import Upstream, credential_metadata
from services.gateway.web import Gateway, HttpWorker
from workshop.kit import jsonmap
from workshop.kit.tls import client_tls
from workshop.v1 import workshop_pb2

LABEL = "gateway"


@dataclasses.dataclass
class GatewayApp:
    gateway: Gateway
    http: HttpWorker
    upstream: Upstream
    hub: LiveHub

    async def stop(self) -> None:
        """Stops serving (the hub's sockets get 1001 first), then closes the channels."""
        await self.http.stop()
        await self.upstream.close()


def build(settings: GatewaySettings, *, label: str = LABEL) -> GatewayApp:
    upstream = Upstream(
        settings.coordinator_target,
        settings.preview_target,
        settings.rpc_deadline_seconds,
        tls=client_tls(settings),
    )

    def open_watch(run_id: str) -> AsyncIterable[workshop_pb2.WatchRunResponse]:
        # The one stream per run that every socket of the run shares, under the
        # gateway's own key (each socket was authorized with its own credential).
        call: AsyncIterable[workshop_pb2.WatchRunResponse] = upstream.workshop.WatchRun(
            workshop_pb2.WatchRunRequest(run_id=run_id),
            metadata=credential_metadata(settings.key),
        )
        return call

    hub = LiveHub(
        open_watch,
        jsonmap.to_json,
        stall_seconds=settings.live_stall_seconds,
        recheck_seconds=settings.live_recheck_seconds,
    )
    gateway = Gateway(settings, upstream, hub)
    http = HttpWorker(
        gateway.app(),
        host=settings.http_host,
        port=settings.http_port,
        label=label,
        before_stop=hub.close,
        forwarded_allow_ips=settings.forwarded_allow_ips,
    )
    return GatewayApp(gateway, http, upstream, hub)
