"""An in-process preview service on real gRPC, real SeaweedFS and the in-process coordinator.

The `preview` fixture (this module is a plugin of `tests/conftest.py`) yields a
`PreviewHarness`: a PreviewService stub on loopback, the app and store of the
running service, and the test's bucket to look into. The service talks to the
`coordinator` fixture over its real port with its own `service` key; its cleanup
loop is off (tests run passes with RunCleanup). `running_preview` starts more
replicas, or one with another store (a subclass that counts or hooks), the same
way; it is also what `bench.preview_publish` runs.

`jpeg_bytes` and `png_bytes` make real, complete images of a chosen size.
"""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from fractions import Fraction
from functools import cache
from typing import Any

import av
import numpy as np
import numpy.typing as npt
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.preview.app import PreviewApp, build
from services.preview.settings import PreviewSettings
from services.preview.storage import ObjectStore, RemovalFailure
from testbed.coordinator_world import CODE
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.s3 import S3Bucket, S3Server
from workshop.kit.channels import open_channel
from workshop.kit.server import Server
from workshop.v1 import common_pb2, jobs_pb2, preview_pb2, preview_pb2_grpc

# A fresh request must reach the service itself: over 4 MiB, it answers PAYLOAD_TOO_LARGE.
CLIENT_MESSAGE_BYTES = 16 * 1024 * 1024
S3_TIMEOUT_SECONDS = 2.0
JPEG_COMMENT = 0xFE
JPEG_SEGMENT_MAX = 0xFFFF - 2


@dataclasses.dataclass
class PreviewHarness:
    port: int
    channel: Any
    stub: preview_pb2_grpc.PreviewServiceAsyncStub
    app: PreviewApp
    store: ObjectStore
    settings: PreviewSettings
    bucket: S3Bucket
    metrics_port: int | None = None  # its /metrics

    async def keys(self, prefix: str = "") -> list[str]:
        """Object keys in the bucket (sorted), straight from S3."""

        def listing() -> list[str]:
            client = self.bucket.server.client()
            return sorted(
                item.object_name
                for item in client.list_objects(self.bucket.name, prefix=prefix, recursive=True)
                if item.object_name is not None
            )

        return await asyncio.to_thread(listing)

    async def object_bytes(self, key: str) -> bytes:
        def read() -> bytes:
            response = self.bucket.server.client().get_object(self.bucket.name, key)
            try:
                return response.read()
            finally:
                response.close()
                response.release_conn()

        return await asyncio.to_thread(read)


def preview_settings(
    coordinator: CoordinatorHarness, bucket: S3Bucket, service_key: str, **overrides: Any
) -> PreviewSettings:
    server = bucket.server
    values: dict[str, Any] = {
        "port": 0,
        "drain_seconds": 0.0,
        "grace_seconds": 1.0,
        "s3_endpoint": server.endpoint,
        "s3_access_key": server.access_key,
        "s3_secret_key": server.secret_key,
        "bucket": bucket.name,
        "s3_timeout_seconds": S3_TIMEOUT_SECONDS,
        "coordinator_target": f"127.0.0.1:{coordinator.port}",
        "service_key": service_key,
        "cleanup_interval_seconds": 0.0,
    }
    values.update(overrides)
    return PreviewSettings(**values)


def object_store(server: S3Server, bucket: str) -> ObjectStore:
    """The preview service's store on `bucket`, alone: no coordinator behind it (close it)."""
    return ObjectStore(
        PreviewSettings(
            s3_endpoint=server.endpoint,
            s3_access_key=server.access_key,
            s3_secret_key=server.secret_key,
            bucket=bucket,
            coordinator_target="127.0.0.1:1",
            service_key="unused",
        )
    )


@asynccontextmanager
async def running_preview(
    coordinator: CoordinatorHarness,
    bucket: S3Bucket,
    *,
    store_factory: Callable[[PreviewSettings], ObjectStore] = ObjectStore,
    **overrides: Any,
) -> AsyncIterator[PreviewHarness]:
    """A started preview service; stopped with everything it opened on exit."""
    service_key = await coordinator.key(Grant(ScopeName.SERVICE), name="preview-service")
    settings = preview_settings(coordinator, bucket, service_key, **overrides)
    store = store_factory(settings)
    coordinator_channel = open_channel(settings.coordinator_target)
    channel: Any = None
    server: Server | None = None
    try:
        await store.ensure_bucket()
        app = build(settings, store, coordinator_channel)
        server = Server(
            label="preview-test", settings=settings, services=app.services, workers=app.workers
        )
        port = await server.start()
        channel = open_channel(f"127.0.0.1:{port}", max_attempts=1)
        yield PreviewHarness(
            port=port,
            channel=channel,
            stub=preview_pb2_grpc.PreviewServiceStub(channel),
            app=app,
            store=store,
            settings=settings,
            bucket=bucket,
            metrics_port=server.metrics_port,
        )
    finally:
        if channel is not None:
            await channel.close()
        if server is not None:
            await server.stop()
        await coordinator_channel.close()
        store.close()


@pytest.fixture(name="preview")
async def preview_fixture(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> AsyncIterator[PreviewHarness]:
    async with running_preview(coordinator, s3_bucket) as harness:
        yield harness


# images ---------------------------------------------------------------------------------------


@cache
def _encoded_jpeg(width: int, height: int, seed: int) -> bytes:
    return jpeg_of(np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8))


def jpeg_of(pixels: npt.NDArray[np.uint8]) -> bytes:
    """RGB pixels (height, width, 3) as a JPEG of PyAV's mjpeg encoder, as the processor
    encodes its previews."""
    height, width = pixels.shape[:2]
    codec = av.CodecContext.create("mjpeg", "w")
    codec.width, codec.height = width, height
    codec.pix_fmt = "yuvj420p"
    codec.time_base = Fraction(1, 25)
    frame = av.VideoFrame.from_ndarray(pixels, format="rgb24").reformat(format="yuvj420p")
    packets = [*codec.encode(frame), *codec.encode(None)]
    return b"".join(bytes(packet) for packet in packets)


def jpeg_bytes(width: int = 64, height: int = 48, *, size: int = 0, seed: int = 0) -> bytes:
    """A real JPEG (PyAV's mjpeg encoder), grown to `size` bytes with comment segments."""
    encoded = _encoded_jpeg(width, height, seed)
    missing = size - len(encoded)
    comments = []
    while missing > 0:
        body = min(JPEG_SEGMENT_MAX, max(missing - 4, 0))
        comments.append(
            b"\xff" + bytes([JPEG_COMMENT]) + struct.pack(">H", body + 2) + b"\0" * body
        )
        missing -= body + 4
    return encoded[:2] + b"".join(comments) + encoded[2:]


def png_bytes(width: int = 8, height: int = 6) -> bytes:
    """A real grey PNG, written by hand (signature, IHDR, IDAT, IEND)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    rows = b"".join(b"\0" + bytes([128]) * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


# builders -------------------------------------------------------------------------------------


def box(class_name: str = "person", score: float = 0.9) -> common_pb2.Box:
    return common_pb2.Box(class_name=class_name, score=score, x=0.1, y=0.2, w=0.3, h=0.4)


def publish_request(
    job: jobs_pb2.ClaimedJob,
    slot: int,
    image: bytes | None = None,
    *,
    content_type: str = "image/jpeg",
    code_sha256: str = CODE,
) -> preview_pb2.PublishPreviewRequest:
    """Slot `slot` of `job` as the processor publishes it: a JPEG, its time, one box."""
    return preview_pb2.PublishPreviewRequest(
        lease=job.lease,
        code_sha256=code_sha256,
        slot_index=slot,
        frame_time=job.input.slots[slot].start,
        image=jpeg_bytes(seed=slot) if image is None else image,
        content_type=content_type,
        boxes=[box()],
    )


def upload_request(
    job: jobs_pb2.ClaimedJob, slot: int, image: bytes | None = None, *, sha256: str = ""
) -> preview_pb2.StageUploadRequest:
    return preview_pb2.StageUploadRequest(
        lease=job.lease,
        code_sha256=CODE,
        slot_index=slot,
        image=jpeg_bytes(seed=100 + slot) if image is None else image,
        content_type="image/jpeg",
        sha256=sha256,
    )


class CountingStore(ObjectStore):
    """Records every key this replica handed to the SDK for removal."""

    def __init__(self, settings: PreviewSettings) -> None:
        super().__init__(settings)
        self.removed: list[str] = []
        self.failures: list[RemovalFailure] = []

    async def remove(self, keys: Sequence[str]) -> list[RemovalFailure]:
        self.removed.extend(keys)
        failures = await super().remove(keys)
        self.failures.extend(failures)
        return failures
