"""Preview service settings: `PREVIEW_*` environment variables."""

from __future__ import annotations

import dataclasses

from workshop.kit.server import ServerSettings
from workshop.kit.settings import SettingsError, setting

PREFIX = "PREVIEW"
MIB = 1024 * 1024
# The server and channels accept 16 MiB messages; an image must leave room for the rest.
MAX_IMAGE_BYTES_LIMIT = 15 * MIB


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
    s3_timeout_seconds: float = setting(
        5.0,
        help="Connect and read timeout of one S3 request; a request is retried at most once, "
        "then the call answers UNAVAILABLE.",
    )
    coordinator_target: str = setting("127.0.0.1:50051", help="Coordinator gRPC address host:port.")
    service_key: str = setting(
        help="The preview service's own coordinator key, of scope `service` (required)."
    )
    cleanup_interval_seconds: float = setting(
        900.0,
        help="Seconds between cleanup passes (expired previews, up to 500 uploads; 0 turns "
        "the loop off, RunCleanup still works).",
    )
    lease_check_seconds: float = setting(
        10.0,
        help="Seconds a lease's CheckLease answer is reused before writing a preview's bytes "
        "(0 checks every publish); a lease refused meanwhile gets its bytes collected.",
    )
    max_image_bytes: int = setting(
        4 * MIB, help="Largest image accepted by PublishPreview and StageUpload, bytes."
    )

    def validate(self) -> None:
        if self.s3_threads < 1:
            raise SettingsError(f"{PREFIX}_S3_THREADS", "must be at least 1")
        if "/" in self.s3_endpoint:
            raise SettingsError(f"{PREFIX}_S3_ENDPOINT", "expected host:port without a scheme")
        if self.s3_timeout_seconds <= 0:
            raise SettingsError(f"{PREFIX}_S3_TIMEOUT_SECONDS", "must be positive")
        if self.lease_check_seconds < 0:
            raise SettingsError(f"{PREFIX}_LEASE_CHECK_SECONDS", "cannot be negative")
        if self.cleanup_interval_seconds < 0:
            raise SettingsError(f"{PREFIX}_CLEANUP_INTERVAL_SECONDS", "cannot be negative")
        if not 1 <= self.max_image_bytes <= MAX_IMAGE_BYTES_LIMIT:
            raise SettingsError(
                f"{PREFIX}_MAX_IMAGE_BYTES", f"must be 1..{MAX_IMAGE_BYTES_LIMIT} bytes"
            )
        if not self.service_key.strip() or any(ch.isspace() for ch in self.service_key):
            raise SettingsError(f"{PREFIX}_SERVICE_KEY", "must be a key secret without spaces")
