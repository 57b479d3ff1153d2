"""Assembles the coordinator's gRPC services.

Services whose issue has not landed are hosted by `unimplemented_service`: the
full contract is listed and described, and every RPC answers UNIMPLEMENTED.
"""

from __future__ import annotations

from workshop.kit.server import GrpcService
from workshop.kit.unimplemented import unimplemented_service
from workshop.v1 import jobs_pb2, operator_pb2, publication_pb2, workshop_pb2


def grpc_services() -> list[GrpcService]:
    return [
        unimplemented_service(operator_pb2.DESCRIPTOR.services_by_name["OperatorService"]),
        unimplemented_service(workshop_pb2.DESCRIPTOR.services_by_name["WorkshopService"]),
        unimplemented_service(jobs_pb2.DESCRIPTOR.services_by_name["JobService"]),
        unimplemented_service(publication_pb2.DESCRIPTOR.services_by_name["PublicationService"]),
    ]
