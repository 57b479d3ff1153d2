"""Coordinator settings: `COORDINATOR_*` environment variables."""

from __future__ import annotations

import dataclasses

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

    def validate(self) -> None:
        if not self.database_url.startswith(("postgresql://", "postgres://")):
            raise SettingsError(f"{PREFIX}_DATABASE_URL", "expected a postgresql:// DSN")
        if self.database_pool_size < 1:
            raise SettingsError(f"{PREFIX}_DATABASE_POOL_SIZE", "must be at least 1")
