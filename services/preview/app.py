"""Assembles the preview service: its gRPC service and the cleanup loop."""

from __future__ import annotations

import dataclasses

import grpc

from services.preview.cleanup import Cleanup, cleanup_worker
from services.preview.coordinator import CoordinatorClient
from services.preview.exporting import BucketExports
from services.preview.publishing import PreviewApi
from services.preview.servicer import PreviewServicer
from services.preview.settings import PreviewSettings
from services.preview.storage import ObjectStore
from workshop.kit.server import GrpcService, Worker
from workshop.v1 import preview_pb2_grpc

SERVICE_NAME = "workshop.v1.PreviewService"


@dataclasses.dataclass(frozen=True)
class PreviewApp:
    services: list[GrpcService]
    workers: list[Worker]
    api: PreviewApi
    cleanup: Cleanup


def build(
    settings: PreviewSettings, store: ObjectStore, coordinator_channel: grpc.aio.Channel
) -> PreviewApp:
    """The service over `store`, calling the coordinator on `coordinator_channel`.

    The cleanup loop is a worker unless `cleanup_interval_seconds` is 0; RunCleanup
    runs a pass either way.
    """
    coordinator = CoordinatorClient(coordinator_channel, settings.service_key)
    api = PreviewApi(
        coordinator,
        store,
        max_image_bytes=settings.max_image_bytes,
        lease_check_seconds=settings.lease_check_seconds,
        lease_attestation_key=settings.lease_attestation_key,
        grant_seconds=settings.grant_seconds,
    )
    cleanup = Cleanup(coordinator, store)
    servicer = PreviewServicer(api, cleanup, coordinator, BucketExports(coordinator, store))
    services = [
        GrpcService(
            SERVICE_NAME,
            lambda server: preview_pb2_grpc.add_PreviewServiceServicer_to_server(servicer, server),
        )
    ]
    workers: list[Worker] = []
    if settings.cleanup_interval_seconds > 0:
        workers.append(cleanup_worker(cleanup, settings.cleanup_interval_seconds))
    return PreviewApp(services, workers, api, cleanup)
