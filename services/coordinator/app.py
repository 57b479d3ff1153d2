"""Assembles the coordinator: its servicers over one database pool and one clock.

A service that is not implemented yet can be hosted by `unimplemented_service`: the
full contract is listed and described, and every RPC answers UNIMPLEMENTED. Today every
coordinator service is implemented; single RPCs that are not (review, sightings, summary)
answer UNIMPLEMENTED from their servicer.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from services.coordinator.clock_control import ClockControl
from services.coordinator.identity.accounts import Accounts
from services.coordinator.identity.auth import PRINCIPAL_CACHE_SECONDS
from services.coordinator.identity.passwords import Passwords
from services.coordinator.identity.signin import IdentityApi, LoginLimits
from services.coordinator.leases.gauges import JobsByState
from services.coordinator.leases.jobs import LEASE, JobsApi
from services.coordinator.leases.maintenance import Maintenance
from services.coordinator.leases.recorded import RecordedBoxes
from services.coordinator.leases.timeline import Timelines
from services.coordinator.platform.clock import Clock, StoredClock
from services.coordinator.platform.db import Database
from services.coordinator.previews.publication import PublicationApi
from services.coordinator.resources.gauges import RuntimeGauges
from services.coordinator.resources.registry import Resources, check_grant_targets
from services.coordinator.review.datasets import DatasetsApi
from services.coordinator.review.reviews import ReviewApi
from services.coordinator.runs.events import RunEvents
from services.coordinator.runs.photos import PhotosApi
from services.coordinator.runs.runs import Runs, cancel_bucket_runs, cancel_workflow_runs
from services.coordinator.runs.scheduler import Scheduler
from services.coordinator.runs.snapshots import SnapshotCache
from services.coordinator.servicers.common import Authenticator
from services.coordinator.servicers.datasets import DatasetServicer
from services.coordinator.servicers.identity import IdentityServicer
from services.coordinator.servicers.jobs import JobServicer
from services.coordinator.servicers.lease_attestation import LeaseAttester
from services.coordinator.servicers.operator import OperatorServicer
from services.coordinator.servicers.publication import PublicationServicer
from services.coordinator.servicers.workshop import WorkshopServicer
from services.coordinator.workflows.documents import Workflows
from workshop.kit.metrics import Cached, ScrapeCollector
from workshop.kit.server import GrpcService, Worker
from workshop.kit.written_previews import MAX_IMAGE_BYTES
from workshop.v1 import (
    dataset_pb2_grpc,
    identity_pb2_grpc,
    jobs_pb2_grpc,
    operator_pb2_grpc,
    publication_pb2_grpc,
    workshop_pb2_grpc,
)

# The Workshop API's requests (a workflow document, a run) are at most 64 KiB, counted on
# the whole request as it arrives, unknown fields included (docs/limits-and-errors.md).
WORKSHOP_REQUEST_MAX_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Coordinator:
    services: list[GrpcService]
    workers: list[Worker]
    collectors: list[ScrapeCollector] = dataclasses.field(default_factory=list)


def build(
    db: Database,
    clock: Clock,
    *,
    job_capacity: int,
    scheduler_interval_seconds: float = 0.0,
    maintenance_interval_seconds: float = 0.0,
    principal_cache_seconds: float = PRINCIPAL_CACHE_SECONDS,
    login_limits: LoginLimits | None = None,
    lease: timedelta = LEASE,
    max_image_bytes: int = MAX_IMAGE_BYTES,
    metrics_max_age_seconds: float = 0.0,
    lease_attestation_key: str = "",
    passwords: Passwords | None = None,
) -> Coordinator:
    """The coordinator's services and background workers (an interval of 0 s turns one off)
    and its scrape-time gauges, each read at most once per `metrics_max_age_seconds`.
    `passwords`: how passwords are hashed (default: argon2-cffi's default cost)."""
    limits = login_limits or LoginLimits()
    runs = Runs(db, clock, capacity=job_capacity)
    events = RunEvents(db.dsn, followers=[clock] if isinstance(clock, StoredClock) else [])
    workers: list[Worker] = [events]
    timelines = Timelines(db)
    if scheduler_interval_seconds > 0:
        workers.append(Scheduler(db, clock, runs, interval_seconds=scheduler_interval_seconds))
    if maintenance_interval_seconds > 0:
        workers.append(
            Maintenance(
                db,
                clock,
                interval_seconds=maintenance_interval_seconds,
                login_window=limits.window,
                attempts_ended=timelines.ended,
            )
        )
    authenticate = Authenticator(db, clock, cache_seconds=principal_cache_seconds)
    return Coordinator(
        grpc_services(
            db,
            clock,
            runs,
            events,
            authenticate,
            limits,
            lease=lease,
            max_image_bytes=max_image_bytes,
            timelines=timelines,
            lease_attestation_key=lease_attestation_key,
            passwords=passwords,
        ),
        workers,
        [
            Cached(JobsByState(db), metrics_max_age_seconds),
            Cached(RuntimeGauges(db, clock), metrics_max_age_seconds),
        ],
    )


def grpc_services(
    db: Database,
    clock: Clock,
    runs: Runs,
    events: RunEvents,
    authenticate: Authenticator,
    login_limits: LoginLimits,
    *,
    lease: timedelta = LEASE,
    max_image_bytes: int = MAX_IMAGE_BYTES,
    timelines: Timelines | None = None,
    lease_attestation_key: str = "",
    passwords: Passwords | None = None,
) -> list[GrpcService]:
    """`lease_attestation_key`: empty, or the secret that signs every claimed job's lease
    for the preview service (servicers/lease_attestation.py)."""
    snapshots = SnapshotCache(db)
    timelines = timelines or Timelines(db)
    passwords = passwords or Passwords()  # one per process: it bounds the hashes in flight
    accounts = Accounts(db, clock, check_grant_targets, passwords)
    operator = OperatorServicer(
        Resources(db, clock, cancel_bucket_runs), accounts, ClockControl(clock), authenticate
    )
    reviews = ReviewApi(db, clock, runs)
    workshop = WorkshopServicer(
        Workflows(db, clock, cancel_workflow_runs),
        runs,
        PhotosApi(db, clock),
        reviews,
        authenticate,
        events,
        timelines,
    )
    # the boxes a full run's previews were recorded with, which their commits group
    recorded = RecordedBoxes()
    previews = PublicationApi(db, clock, snapshots, events, recorded)
    jobs = JobServicer(
        JobsApi(
            db,
            clock,
            snapshots,
            events,
            lease=lease,
            attempts_ended=timelines.ended,
            recorded=recorded,
        ),
        authenticate,
        events,
        previews,
        max_image_bytes=max_image_bytes,
        attester=LeaseAttester(lease_attestation_key, clock) if lease_attestation_key else None,
    )
    datasets = DatasetsApi(db, clock)
    publication = PublicationServicer(previews, reviews, authenticate, datasets)
    dataset_service = DatasetServicer(datasets, authenticate)
    identity = IdentityServicer(
        authenticate, IdentityApi(db, clock, passwords, check_grant_targets, login_limits)
    )
    return [
        GrpcService(
            "workshop.v1.IdentityService",
            lambda server: identity_pb2_grpc.add_IdentityServiceServicer_to_server(
                identity, server
            ),
        ),
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
            max_request_bytes=WORKSHOP_REQUEST_MAX_BYTES,
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
        GrpcService(
            "workshop.v1.DatasetService",
            lambda server: dataset_pb2_grpc.add_DatasetServiceServicer_to_server(
                dataset_service, server
            ),
            max_request_bytes=WORKSHOP_REQUEST_MAX_BYTES,
        ),
    ]
