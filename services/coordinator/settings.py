"""Coordinator settings: `COORDINATOR_*` environment variables."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from services.coordinator.identity.auth import PRINCIPAL_CACHE_MAX_SECONDS, PRINCIPAL_CACHE_SECONDS
from services.coordinator.identity.signin import (
    LOGIN_ADDRESS_FAILURES,
    LOGIN_USER_FAILURES,
    LOGIN_WINDOW,
    LoginLimits,
)
from services.coordinator.leases.jobs import LEASE
from workshop.kit.lease_attestation import MIN_KEY_CHARS, key_problem
from workshop.kit.server import ServerSettings
from workshop.kit.settings import at_least, between, setting
from workshop.kit.written_previews import MAX_IMAGE_BYTES, MAX_IMAGE_BYTES_LIMIT

PREFIX = "COORDINATOR"


def _postgres_dsn(value: str) -> str | None:
    return (
        None
        if value.startswith(("postgresql://", "postgres://"))
        else "expected a postgresql:// DSN"
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoordinatorSettings(ServerSettings):
    port: int = setting(50051, help="gRPC port; 0 picks a free port, announced on stdout.")
    database_url: str = setting(
        help="Postgres DSN, e.g. postgresql://workshop@db:5432/workshop (required).",
        check=_postgres_dsn,
        secret=True,
    )
    # Statements running at once, not calls: a replica's calls queue for a connection in
    # the process, which costs nothing, while more statements than the database's cores
    # are time-sliced by the kernel, with their row locks held (bench.claim_cycle's claim
    # p99: 18.6-18.8 ms with 3 connections, 27.2-29.2 with 4, 32.5-58.7 with 10, at the
    # same cycles a second; docs/scaling.md, "Connections").
    database_pool_size: int = setting(
        3,
        help="Connections in the coordinator's pool: about the Postgres cores one replica "
        "keeps busy (1-2), plus one.",
        check=at_least(1),
    )
    manual_clock: bool = setting(
        False, help="1 = serve AdvanceClock and follow a clock an admin moves (tests only)."
    )
    job_capacity: int = setting(
        1_000_000,
        help="Unfinished jobs at which CreateRun refuses new runs (RESOURCE_EXHAUSTED).",
        check=at_least(1),
    )
    scheduler_interval_seconds: float = setting(
        30.0,
        help="Seconds between passes of the daily-schedule loop (0 turns it off).",
        check=at_least(0),
    )
    maintenance_interval_seconds: float = setting(
        5.0,
        help="Seconds between lease-rescue and expiry passes (0 turns them off).",
        check=at_least(0),
    )
    lease_seconds: float = setting(
        LEASE.total_seconds(),
        help="Seconds a lease lasts from its claim or last renewal (Claim hands out a "
        "heartbeat interval of 0.15 of it, at most 45 s); shorter only for fault-injection "
        "soaks, where a dead processor's jobs must come back quickly.",
        check=between(10, 3600, " seconds"),
    )
    max_image_bytes: int = setting(
        MAX_IMAGE_BYTES,
        help="Largest preview a processor may record on its Session (record_previews), bytes: "
        "set it to the preview service's PREVIEW_MAX_IMAGE_BYTES, which bounds the grants its "
        "bytes were written with.",
        check=between(1, MAX_IMAGE_BYTES_LIMIT, " bytes"),
    )
    metrics_max_age_seconds: float = setting(
        5.0,
        help="Seconds a scrape of /metrics reuses the jobs and runtime gauges read by an "
        "earlier one (one query each per this long, however often scrapers come; 0 reads on "
        "every scrape).",
        check=between(0, 300, " seconds"),
    )
    lease_attestation_key: str = setting(
        "",
        help="Secret shared with the preview service (PREVIEW_LEASE_ATTESTATION_KEY), at least "
        f"{MIN_KEY_CHARS} characters: every claimed job then carries a signed statement that its "
        "lease held, which spares the preview service a CheckLease call per job. Empty: none.",
        check=key_problem,
        secret=True,
    )
    principal_cache_seconds: float = setting(
        PRINCIPAL_CACHE_SECONDS,
        help="Seconds a caller's principal is reused by the lease and publication calls, "
        f"whose SQL re-checks the caller's key (0 turns the cache off; at most "
        f"{PRINCIPAL_CACHE_MAX_SECONDS:g}).",
        check=between(0, PRINCIPAL_CACHE_MAX_SECONDS, " seconds"),
    )
    login_window_seconds: float = setting(
        LOGIN_WINDOW.total_seconds(),
        help="Seconds a failed login counts against its user and its client address "
        "(IdentityService.Login's sliding window).",
        check=at_least(1),
    )
    login_user_failures: int = setting(
        LOGIN_USER_FAILURES,
        help="Failed logins of one user within the window after which Login refuses it "
        "(RESOURCE_EXHAUSTED LOGIN_THROTTLED) without checking the password.",
        check=at_least(1),
    )
    login_address_failures: int = setting(
        LOGIN_ADDRESS_FAILURES,
        help="Failed logins from one client address within the window after which Login "
        "refuses it (RESOURCE_EXHAUSTED LOGIN_THROTTLED) without checking the password.",
        check=at_least(1),
    )

    @property
    def login_limits(self) -> LoginLimits:
        return LoginLimits(
            window=timedelta(seconds=self.login_window_seconds),
            user_failures=self.login_user_failures,
            address_failures=self.login_address_failures,
        )
