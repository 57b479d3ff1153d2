"""Preview service settings: `PREVIEW_*` environment variables."""

from __future__ import annotations

import dataclasses

from workshop.kit.server import ServerSettings
from workshop.kit.settings import SettingsError, setting

PREFIX = "PREVIEW"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreviewSettings(ServerSettings):
    port: int = setting(50052, help="gRPC port; 0 picks a free port, announced on stdout.")
    s3_endpoint: str = setting(help="S3 endpoint host:port, e.g. minio:9000 (required).")
    s3_access_key: str = setting(help="S3 access key (required).")
    s3_secret_key: str = setting(help="S3 secret key (required).")
    s3_secure: bool = setting(False, help="1 = HTTPS to the S3 endpoint.")
    s3_region: str = setting("us-east-1", help="S3 region name sent in signatures.")
    bucket: str = setting("workshop", help="Bucket for previews and uploads; created if missing.")
    s3_threads: int = setting(16, help="Threads for blocking S3 SDK calls (bounded pool).")
    coordinator_target: str = setting("127.0.0.1:50051", help="Coordinator gRPC address host:port.")

    def validate(self) -> None:
        if self.s3_threads < 1:
            raise SettingsError(f"{PREFIX}_S3_THREADS", "must be at least 1")
        if "/" in self.s3_endpoint:
            raise SettingsError(f"{PREFIX}_S3_ENDPOINT", "expected host:port without a scheme")
