"""Assembles the coordinator: its servicers over one database pool and one clock.

Services whose issue has not landed are hosted by `unimplemented_service`: the
full contract is listed and described, and every RPC answers UNIMPLEMENTED.
"""

from __future__ import annotations

import dataclasses

from services.coordinator.clock import Clock
from services.coordinator.db import Database
from services.coordinator.operator_api import OperatorApi
from services.coordinator.scheduler import Scheduler
from services.coordinator.servicers.common import Authenticator
from services.coordinator.servicers.operator import OperatorServicer
from services.coordinator.servicers.workshop import WorkshopServicer
from services.coordinator.workshop_api import WorkshopApi
from workshop.kit.server import GrpcService, Worker
from workshop.kit.unimplemented import unimplemented_service
from workshop.v1 import jobs_pb2, operator_pb2_grpc, publication_pb2, workshop_pb2_grpc


@dataclasses.dataclass(frozen=True)
class Coordinator:
    services: list[GrpcService]
    workers: list[Worker]


def build(
    db: Database, clock: Clock, *, job_capacity: int, scheduler_interval_seconds: float = 0.0
) -> Coordinator:
    """The coordinator's services, and its background workers (0 s turns the scheduler off)."""
    workshop_api = WorkshopApi(db, clock, capacity=job_capacity)
    workers: list[Worker] = []
    if scheduler_interval_seconds > 0:
        workers.append(
            Scheduler(db, clock, workshop_api, interval_seconds=scheduler_interval_seconds)
        )
    return Coordinator(grpc_services(db, clock, workshop_api), workers)


def grpc_services(db: Database, clock: Clock, workshop_api: WorkshopApi) -> list[GrpcService]:
    authenticate = Authenticator(db, clock)
    operator = OperatorServicer(OperatorApi(db, clock), authenticate)
    workshop = WorkshopServicer(workshop_api, authenticate)
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
        unimplemented_service(jobs_pb2.DESCRIPTOR.services_by_name["JobService"]),
        unimplemented_service(publication_pb2.DESCRIPTOR.services_by_name["PublicationService"]),
    ]
