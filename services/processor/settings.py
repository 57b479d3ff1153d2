"""Processor settings: `PROCESSOR_*` environment variables."""

from __future__ import annotations

import dataclasses

from workshop.kit.server import ServerSettings
from workshop.kit.settings import setting

PREFIX = "PROCESSOR"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProcessorSettings(ServerSettings):
    port: int = setting(50054, help="gRPC port for health and reflection; 0 picks a free port.")
    device_id: str = setting(help="Registered device this processor runs on, e.g. gpu-box.")
    key: str = setting(help="Secret of a workshop:run key bound to the device (required).")
    coordinator_target: str = setting("127.0.0.1:50051", help="Coordinator gRPC address host:port.")
    preview_target: str = setting("127.0.0.1:50052", help="Preview service gRPC address.")
    triton_target: str = setting("127.0.0.1:8001", help="Triton gRPC address host:port.")
