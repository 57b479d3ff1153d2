"""Processor settings: `PROCESSOR_*` environment variables."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from workshop.kit.server import ServerSettings
from workshop.kit.settings import at_least, between, one_of, setting
from workshop.kit.tls import ClientTlsSettings

MAX_CLAIM_WAIT_SECONDS = 50  # the coordinator takes up to 60; the call's deadline is 10 s more
MAX_JOB_GRACE_SECONDS = 3600
MAX_PROGRESS_AFTER_SECONDS = 60  # longer, and a running job shows nothing for over a minute
PREFIX = "PROCESSOR"
DEFAULT_MODEL_REPOSITORY = Path("/models")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProcessorSettings(ServerSettings, ClientTlsSettings):
    port: int = setting(50054, help="gRPC port for health and reflection; 0 picks a free port.")
    device_id: str = setting(help="Registered device this processor runs on, e.g. gpu-box.")
    key: str = setting(
        help="Secret of a workshop:run key bound to the device (required).", secret=True
    )
    coordinator_target: str = setting("127.0.0.1:50051", help="Coordinator gRPC address host:port.")
    preview_target: str = setting("127.0.0.1:50052", help="Preview service gRPC address.")
    triton_target: str = setting("127.0.0.1:8001", help="Triton gRPC address host:port.")
    model_repository: Path = setting(  # noqa: RUF009 - Path is immutable
        DEFAULT_MODEL_REPOSITORY, help="The Triton model repository, shared read-only with Triton."
    )
    runtime_id: str = setting(
        "",
        help="Registered runtime to claim for; empty = this code on DEVICE_ID "
        "(the id `workshop-manifest` prints).",
    )
    s3_endpoint: str = setting(help="S3 endpoint host:port holding the recordings (required).")
    s3_access_key: str = setting(help="S3 access key for reading recordings (required).")
    s3_secret_key: str = setting(
        help="S3 secret key for reading recordings (required).", secret=True
    )
    s3_secure: bool = setting(False, help="1 = HTTPS to the S3 endpoint.")
    recordings_bucket: str = setting("recordings", help="Bucket the recordings' object keys name.")
    in_flight: int = setting(
        3, help="Recordings processed at once (download/decode overlap).", check=between(1, 16)
    )
    claim_wait_seconds: int = setting(
        20,
        help="Seconds a Claim waits at the coordinator for a job when none is queued (a long "
        "poll, 0..50; 0 polls every 2 s instead).",
        check=between(0, MAX_CLAIM_WAIT_SECONDS),
    )
    heartbeat_seconds: float = setting(
        0.0,
        help="Seconds between lease heartbeats; 0 = the coordinator's interval (45 s).",
        check=at_least(0),
    )
    progress_after_seconds: float = setting(
        5.0,
        help="Seconds a job runs before it reports progress, then at most once per as many "
        "seconds (0..60; 0 = every 10 %). A shorter job sends only its Complete; leases are "
        "renewed as ever (a report, or a heartbeat after HEARTBEAT_SECONDS without one).",
        check=between(0, MAX_PROGRESS_AFTER_SECONDS),
    )
    rpc_retry_seconds: float = setting(
        60.0,
        help="How long a call about a job that gets no answer (UNAVAILABLE, deadline, "
        "INTERNAL) is asked again before the job is handed back to the queue.",
        check=at_least(0),
    )
    direct_writes: bool = setting(
        True,
        help="1 = write previews straight to object storage with the preview service's grants "
        "and record them in batches; 0 = send the bytes through PublishPreview (as processors "
        "before grants did).",
    )
    job_transport: str = setting(
        "session",
        help="How the calls about jobs travel: session = as messages on one JobService.Session "
        "stream (falls back to unary, once and for good, against a coordinator without it: "
        "release 0.1); unary = one RPC per call.",
        check=one_of("session", "unary"),
    )
    job_grace_seconds: float = setting(
        30.0,
        help="On SIGTERM: seconds the jobs in flight may run on (leases renewed, nothing new "
        "claimed, NOT_SERVING) before what is left is handed back with Release (no attempt "
        "spent) and the process exits; 0 = at once. A second SIGTERM ends the wait.",
        check=between(0, MAX_JOB_GRACE_SECONDS),
    )
    triton_shared_memory: str = setting(
        "auto",
        help="Frames to Triton through system shared memory: auto (when TRITON_TARGET is "
        "loopback; falls back to gRPC if Triton cannot map it), on (required), off.",
        check=one_of("auto", "on", "off"),
    )
