"""Coordinator settings: `COORDINATOR_*` environment variables."""

from __future__ import annotations

import dataclasses

from services.coordinator.auth import PRINCIPAL_CACHE_MAX_SECONDS, PRINCIPAL_CACHE_SECONDS
from workshop.kit.server import ServerSettings
from workshop.kit.settings import SettingsError, setting

PREFIX = "COORDINATOR"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoordinatorSettings(ServerSettings):
    port: int = setting(50051, help="gRPC port; 0 picks a free port, announced on stdout.")
    database_url: str = setting(
        help="Postgres DSN, e.g. postgresql://workshop@db:5432/workshop (required)."
    )
    database_pool_size: int = setting(10, help="Connections in the coordinator's pool.")
    manual_clock: bool = setting(
        False, help="1 = serve AdvanceClock and follow a clock an admin moves (tests only)."
    )
    job_capacity: int = setting(
        1_000_000, help="Unfinished jobs at which CreateRun refuses new runs (RESOURCE_EXHAUSTED)."
    )
    scheduler_interval_seconds: float = setting(
        30.0, help="Seconds between passes of the daily-schedule loop (0 turns it off)."
    )
    maintenance_interval_seconds: float = setting(
        5.0, help="Seconds between lease-rescue and expiry passes (0 turns them off)."
    )
    principal_cache_seconds: float = setting(
        PRINCIPAL_CACHE_SECONDS,
        help="Seconds a caller's principal is reused by the lease and publication calls, "
        f"whose SQL re-checks the caller's key (0 turns the cache off; at most "
        f"{PRINCIPAL_CACHE_MAX_SECONDS:g}).",
    )

    def validate(self) -> None:
        if not self.database_url.startswith(("postgresql://", "postgres://")):
            raise SettingsError(f"{PREFIX}_DATABASE_URL", "expected a postgresql:// DSN")
        if self.job_capacity < 1:
            raise SettingsError(f"{PREFIX}_JOB_CAPACITY", "must be at least 1")
        if self.maintenance_interval_seconds < 0:
            raise SettingsError(f"{PREFIX}_MAINTENANCE_INTERVAL_SECONDS", "cannot be negative")
        if self.scheduler_interval_seconds < 0:
            raise SettingsError(f"{PREFIX}_SCHEDULER_INTERVAL_SECONDS", "cannot be negative")
        if self.database_pool_size < 1:
            raise SettingsError(f"{PREFIX}_DATABASE_POOL_SIZE", "must be at least 1")
        if not 0 <= self.principal_cache_seconds <= PRINCIPAL_CACHE_MAX_SECONDS:
            raise SettingsError(
                f"{PREFIX}_PRINCIPAL_CACHE_SECONDS",
                f"must be 0..{PRINCIPAL_CACHE_MAX_SECONDS:g} seconds",
            )
