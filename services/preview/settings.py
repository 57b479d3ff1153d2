"""Preview service settings: `PREVIEW_*` environment variables."""

from __future__ import annotations

import dataclasses

from workshop.kit.lease_attestation import MIN_KEY_CHARS, key_problem
from workshop.kit.server import ServerSettings
from workshop.kit.settings import at_least, between, setting
from workshop.kit.tls import ClientTlsSettings
from workshop.kit.written_previews import MAX_IMAGE_BYTES, MAX_IMAGE_BYTES_LIMIT

PREFIX = "PREVIEW"


def _host_port(value: str) -> str | None:
    return "expected host:port without a scheme" if "/" in value else None


def _positive(value: float) -> str | None:
    return None if value > 0 else "must be positive"


def _key_secret(value: str) -> str | None:
    blank = not value.strip() or any(ch.isspace() for ch in value)
    return "must be a key secret without spaces" if blank else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreviewSettings(ServerSettings, ClientTlsSettings):
    port: int = setting(50052, help="gRPC port; 0 picks a free port, announced on stdout.")
    s3_endpoint: str = setting(
        help="S3 endpoint host:port, e.g. minio:9000 (required).", check=_host_port
    )
    s3_access_key: str = setting(help="S3 access key (required).")
    s3_secret_key: str = setting(help="S3 secret key (required).", secret=True)
    s3_secure: bool = setting(False, help="1 = HTTPS to the S3 endpoint.")
    s3_region: str = setting("us-east-1", help="S3 region name sent in signatures.")
    bucket: str = setting("workshop", help="Bucket for previews and uploads; created if missing.")
    s3_threads: int = setting(
        16, help="Threads for blocking S3 SDK calls (bounded pool).", check=at_least(1)
    )
    s3_timeout_seconds: float = setting(
        5.0,
        help="Connect and read timeout of one S3 request; a request is retried at most once, "
        "then the call answers UNAVAILABLE.",
        check=_positive,
    )
    coordinator_target: str = setting("127.0.0.1:50051", help="Coordinator gRPC address host:port.")
    service_key: str = setting(
        help="The preview service's own coordinator key, of scope `service` (required).",
        check=_key_secret,
        secret=True,
    )
    cleanup_interval_seconds: float = setting(
        900.0,
        help="Seconds between cleanup passes (expired previews, up to 500 uploads; 0 turns "
        "the loop off, RunCleanup still works).",
        check=at_least(0),
    )
    lease_check_seconds: float = setting(
        10.0,
        help="Seconds a lease's CheckLease answer is reused before writing a preview's bytes "
        "(0 checks every publish); a lease refused meanwhile gets its bytes collected.",
        check=at_least(0),
    )
    lease_attestation_key: str = setting(
        "",
        help="Secret shared with the coordinator (COORDINATOR_LEASE_ATTESTATION_KEY), at least "
        f"{MIN_KEY_CHARS} characters: GrantPreviewWrites then takes the claim's signed lease "
        "attestation for CheckLease's answer for up to PREVIEW_LEASE_CHECK_SECONDS; one that "
        "does not verify falls back to CheckLease. Empty: CheckLease always.",
        check=key_problem,
        secret=True,
    )
    grant_seconds: int = setting(
        60,
        help="Longest life of a direct-write grant (GrantPreviewWrites), seconds; a grant never "
        "outlives its lease either.",
        check=between(1, 600, " s"),
    )
    max_image_bytes: int = setting(
        MAX_IMAGE_BYTES,
        help="Largest image accepted by PublishPreview and StageUpload, bytes.",
        check=between(1, MAX_IMAGE_BYTES_LIMIT, " bytes"),
    )
