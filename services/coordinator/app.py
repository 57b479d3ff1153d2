"""Assembles the coordinator's gRPC services.

Servicers whose issue has not landed are the generated base classes: every RPC
answers UNIMPLEMENTED (the error interceptor maps their NotImplementedError).
"""

from __future__ import annotations

from workshop.kit.server import GrpcService
from workshop.v1 import jobs_pb2_grpc, operator_pb2_grpc, publication_pb2_grpc, workshop_pb2_grpc


def grpc_services() -> list[GrpcService]:
    operator = operator_pb2_grpc.OperatorServiceServicer()
    workshop = workshop_pb2_grpc.WorkshopServiceServicer()
    jobs = jobs_pb2_grpc.JobServiceServicer()
    publication = publication_pb2_grpc.PublicationServiceServicer()
    return [
        GrpcService(
            "workshop.v1.OperatorService",
            lambda server: operator_pb2_grpc.add_OperatorServiceServicer_to_server(
                operator, server
            ),
        ),
        GrpcService(
            "workshop.v1.WorkshopService",
            lambda server: workshop_pb2_grpc.add_WorkshopServiceServicer_to_server(
                workshop, server
            ),
        ),
        GrpcService(
            "workshop.v1.JobService",
            lambda server: jobs_pb2_grpc.add_JobServiceServicer_to_server(jobs, server),
        ),
        GrpcService(
            "workshop.v1.PublicationService",
            lambda server: publication_pb2_grpc.add_PublicationServiceServicer_to_server(
                publication, server
            ),
        ),
    ]
