"""An in-process coordinator on real Postgres and real gRPC (loopback), with a frozen clock.

`coordinator` yields a `CoordinatorHarness`: stubs for each service, an admin
credential, the clock to move, and the database for direct assertions.
`coordinator_process` starts one as its own process instead (a replica a test kills),
and `coordinator_client` is the harness on such a one.

`jobs` is JobService's stub, or with `job_transport="session"` a `SessionJobs` that makes
the same calls as messages on Session streams (`testbed.session_jobs`): the `job_transport`
fixture chooses it for `coordinator`, and a test module whose tests must hold on both paths
(the lease and fence tests) overrides that fixture with `JOB_TRANSPORTS` as its params.

Passwords are hashed with argon2id at a low cost (`TEST_PASSWORD_HASHER`: 8 MiB, one pass,
one lane; about 5 ms) unless a test passes `password_hasher`: the suite sets and checks
passwords hundreds of times, and at argon2-cffi's default cost (64 MiB, three passes, four
lanes) each took 0.3 s of CPU. The default cost is what a deployment gets; the tests of it
(tests/service/test_login.py) start their coordinator with `PasswordHasher()`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from argon2 import PasswordHasher

from services.coordinator.app import build
from services.coordinator.identity.accounts import insert_key
from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.identity.passwords import Passwords
from services.coordinator.platform.clock import FrozenClock
from services.coordinator.platform.db import Database
from services.coordinator.runs.events import RunEvents
from testbed.harness.processes import ServiceProcess, running_service
from testbed.session_jobs import JOB_TRANSPORTS, SessionJobs
from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.kit.server import Server, ServerSettings
from workshop.v1 import (
    identity_pb2_grpc,
    jobs_pb2_grpc,
    operator_pb2_grpc,
    publication_pb2_grpc,
    workshop_pb2_grpc,
)

EPOCH = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
TEST_PASSWORD_HASHER = PasswordHasher(time_cost=1, memory_cost=8192, parallelism=1)


@dataclasses.dataclass
class CoordinatorHarness:
    db: Database
    clock: FrozenClock  # the coordinator's, which tests move by hand
    port: int
    channel: Any
    operator: operator_pb2_grpc.OperatorServiceAsyncStub
    workshop: workshop_pb2_grpc.WorkshopServiceAsyncStub
    jobs: jobs_pb2_grpc.JobServiceAsyncStub | SessionJobs
    publication: publication_pb2_grpc.PublicationServiceAsyncStub
    identity: identity_pb2_grpc.IdentityServiceAsyncStub
    admin: tuple[tuple[str, str], ...]
    metrics_port: int | None = None  # its /metrics, when this process started it
    events: RunEvents | None = None  # its run events, when this process started it

    async def key(self, *grants: Grant, name: str = "test", user_id: str = "") -> str:
        """A new key's secret with the given grants (written directly, like the CLI)."""
        async with self.db.transaction() as connection:
            _, secret = await insert_key(connection, name, grants, user_id, None, self.clock.now())
        return secret

    async def count(self, table: str) -> int:
        async with self.db.connection() as connection:
            value: int = await connection.fetchval(f"SELECT count(*) FROM {table}")
            return value


StartCoordinator = Callable[..., Awaitable[CoordinatorHarness]]


@asynccontextmanager
async def running_coordinator(
    dsn: str,
    *,
    clock: FrozenClock | None = None,
    job_capacity: int = 1_000_000,
    pool_size: int = 4,
    port: int = 0,
    job_transport: str = "unary",
    lease_attestation_key: str = "",
    password_hasher: PasswordHasher = TEST_PASSWORD_HASHER,
) -> AsyncIterator[CoordinatorHarness]:
    """A coordinator on `dsn` in this process, on `port` (0: a free one; a given port lets a
    test start it again where its clients point); `job_transport` says what `jobs` is (the
    module docstring); `lease_attestation_key` as COORDINATOR_LEASE_ATTESTATION_KEY;
    `password_hasher` hashes passwords (the module docstring)."""
    clock = clock or FrozenClock(EPOCH)
    async with Database.open(dsn, size=pool_size) as db:
        coordinator = build(
            db,
            clock,
            job_capacity=job_capacity,
            lease_attestation_key=lease_attestation_key,
            passwords=Passwords(password_hasher),
        )
        server = Server(
            label="coordinator-test",
            settings=ServerSettings(port=port, drain_seconds=0.0, grace_seconds=1.0),
            services=coordinator.services,
            workers=coordinator.workers,  # run events only: no scheduler or maintenance loop
            collectors=coordinator.collectors,
        )
        port = await server.start()
        try:
            async with _harness(
                db, clock, port, max_attempts=1, job_transport=job_transport
            ) as harness:
                harness.metrics_port = server.metrics_port
                harness.events = next(w for w in coordinator.workers if isinstance(w, RunEvents))
                yield harness
        finally:
            await server.stop()


@asynccontextmanager
async def coordinator_client(dsn: str, port: int) -> AsyncIterator[CoordinatorHarness]:
    """A CoordinatorHarness on a coordinator running in another process (benchmarks), so
    the test builders work against it. That coordinator follows real time; the harness's
    clock stands at the moment it connected (it dates the keys the builders write)."""
    clock = FrozenClock(datetime.now(UTC))
    async with Database.open(dsn, size=2) as db, _harness(db, clock, port) as harness:
        yield harness


@asynccontextmanager
async def _harness(
    db: Database,
    clock: FrozenClock,
    port: int,
    *,
    max_attempts: int = 5,
    job_transport: str = "unary",
) -> AsyncIterator[CoordinatorHarness]:
    """Stubs on a channel to `port` and a fresh admin key; closes the channel."""
    if job_transport not in JOB_TRANSPORTS:
        raise ValueError(f"job_transport must be one of {JOB_TRANSPORTS}, not {job_transport!r}")
    channel = open_channel(f"127.0.0.1:{port}", max_attempts=max_attempts)
    sessions = SessionJobs(channel) if job_transport == "session" else None
    try:
        harness = CoordinatorHarness(
            db=db,
            clock=clock,
            port=port,
            channel=channel,
            operator=operator_pb2_grpc.OperatorServiceStub(channel),
            workshop=workshop_pb2_grpc.WorkshopServiceStub(channel),
            jobs=sessions or jobs_pb2_grpc.JobServiceStub(channel),
            publication=publication_pb2_grpc.PublicationServiceStub(channel),
            identity=identity_pb2_grpc.IdentityServiceStub(channel),
            admin=(),
        )
        harness.admin = bearer_metadata(await harness.key(Grant(ScopeName.ADMIN), name="admin"))
        yield harness
    finally:
        if sessions is not None:
            await sessions.close()
        await channel.close()


@pytest.fixture
def job_transport() -> str:
    """How `coordinator`'s `jobs` calls JobService: the unary stub. A module whose tests run
    on both paths overrides this fixture: `@pytest.fixture(params=JOB_TRANSPORTS)`."""
    return "unary"


@pytest.fixture
async def coordinator(pg_dsn: str, job_transport: str) -> AsyncIterator[CoordinatorHarness]:
    async with running_coordinator(pg_dsn, job_transport=job_transport) as harness:
        yield harness


@contextmanager
def coordinator_process(
    dsn: str, log_path: Path, **settings: str
) -> Iterator[tuple[ServiceProcess, int]]:
    """`python -m services.coordinator` on `dsn` (system clock, scheduler off; `settings`
    are more COORDINATOR_* variables, without the prefix), and its gRPC port; stopped on
    exit unless the test killed it."""
    env = {
        "COORDINATOR_DATABASE_URL": dsn,
        "COORDINATOR_HOST": "127.0.0.1",
        "COORDINATOR_PORT": "0",
        "COORDINATOR_DRAIN_SECONDS": "0",
        "COORDINATOR_GRACE_SECONDS": "1",
        "COORDINATOR_SCHEDULER_INTERVAL_SECONDS": "0",
        **{f"COORDINATOR_{name.upper()}": value for name, value in settings.items()},
    }
    with running_service("services.coordinator", env, log_path) as (process, serving):
        yield process, int(serving["port"])
