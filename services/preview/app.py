"""Assembles the preview service's gRPC services.

PreviewService is the generated base class until the preview issue lands:
every RPC answers UNIMPLEMENTED.
"""

from __future__ import annotations

from workshop.kit.server import GrpcService
from workshop.v1 import preview_pb2_grpc


def grpc_services() -> list[GrpcService]:
    preview = preview_pb2_grpc.PreviewServiceServicer()
    return [
        GrpcService(
            "workshop.v1.PreviewService",
            lambda server: preview_pb2_grpc.add_PreviewServiceServicer_to_server(preview, server),
        )
    ]
