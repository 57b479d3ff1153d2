"""Assembles the preview service's gRPC services.

PreviewService is hosted by `unimplemented_service` until the preview issue
lands: every RPC answers UNIMPLEMENTED.
"""

from __future__ import annotations

from workshop.kit.server import GrpcService
from workshop.kit.unimplemented import unimplemented_service
from workshop.v1 import preview_pb2


def grpc_services() -> list[GrpcService]:
    return [unimplemented_service(preview_pb2.DESCRIPTOR.services_by_name["PreviewService"])]
