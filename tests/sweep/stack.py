"""The real servers the sweep calls, each as a `Target`, and one raw call to any RPC.

The coordinator and the preview service run in this process (as the other tests run
them: `testbed.harness`, real Postgres, real SeaweedFS) on a background event loop,
so the sweep's hypothesis tests can be plain functions; the gateway and the
processor run as their own processes (`python -m services.gateway`, `...processor`).
Calls go through a raw channel with identity (de)serializers, so a request is the
bytes the strategy wrote, whatever they are.

The coordinator's world is `testbed.coordinator_leases.leased`: device gpu-box,
cameras, recordings, workflow `yard`, a full run r1 whose first job a processor key
holds; user `ada` with a password, her sessions and an own key, and the gateway's key. Its
values (ids, the lease's token, a real JPEG) feed the strategies' pools
and a few valid requests per RPC, so some requests get past the field checks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_leases import (
    Setup,
    complete_request,
    empty_result,
    leased,
    on_behalf,
    preview_key,
    record_request,
)
from testbed.coordinator_world import CODE, run_request, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from testbed.harness.preview import jpeg_bytes, publish_request, running_preview, upload_request
from testbed.harness.s3 import S3Bucket
from tests.sweep.strategies import Pools, RequestStrategies
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, identity_pb2, jobs_pb2, operator_pb2, preview_pb2, run_pb2
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]

UNARY_DEADLINE_SECONDS = 10.0
STREAM_DEADLINE_SECONDS = 3.0
# A stream still open this long after its last message is alive: the sweep stops reading.
STREAM_IDLE_SECONDS = 0.05


class BackgroundLoop:
    """An event loop on its own thread, for the in-process servers and every client call."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@dataclasses.dataclass
class Answer:
    """What one call came back with."""

    code: grpc.StatusCode
    details: str
    trailers: tuple[tuple[str, str | bytes], ...]
    seconds: float
    deadline: float
    error: grpc.aio.AioRpcError | None


@dataclasses.dataclass
class Target:
    """One running server as the sweep sees it.

    `credential(method)` is the metadata of a valid credential of the right kind for
    the method (full name `/pkg.Service/Method`); `digest()` the state a refusal must
    leave as it was (None: the server keeps none); `examples` valid requests per method.
    """

    server: str
    port: int
    channel: grpc.aio.Channel
    credential: Callable[[str], Metadata]
    strategies: RequestStrategies
    examples: Mapping[str, list[bytes]] = dataclasses.field(default_factory=dict)
    digest: Callable[[], dict[str, str]] | None = None


async def call(
    channel: grpc.aio.Channel,
    method: MethodDescriptor,
    data: bytes,
    metadata: Metadata,
    deadline: float | None = None,
) -> Answer:
    """Sends `data` as the request of `method` and reads the answer (see the module docstring).

    A server stream is read until it ends, fails, or stays quiet for STREAM_IDLE_SECONDS
    after its first message (a live stream: the sweep cancels it)."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    streaming = method.server_streaming
    if deadline is None:
        deadline = STREAM_DEADLINE_SECONDS if streaming else UNARY_DEADLINE_SECONDS
    began = time.monotonic()
    multicallable: Any = {
        (False, False): channel.unary_unary,
        (False, True): channel.unary_stream,
        (True, False): channel.stream_unary,
        (True, True): channel.stream_stream,
    }[(method.client_streaming, streaming)](path)
    request: Any = iter([data]) if method.client_streaming else data
    rpc = multicallable(request, metadata=metadata, timeout=deadline)
    try:
        if streaming:
            await _read_stream(rpc)
        else:
            await rpc
    except grpc.aio.AioRpcError as error:
        return Answer(
            error.code(),
            error.details() or "",
            tuple(error.trailing_metadata() or ()),
            time.monotonic() - began,
            deadline,
            error,
        )
    return Answer(grpc.StatusCode.OK, "", (), time.monotonic() - began, deadline, None)


async def _read_stream(rpc: Any) -> None:
    if await rpc.read() is grpc.aio.EOF:  # the first message may take up to the deadline
        return
    while True:
        try:
            message = await asyncio.wait_for(rpc.read(), STREAM_IDLE_SECONDS)
        except TimeoutError:
            rpc.cancel()
            return
        if message is grpc.aio.EOF:
            return


# The sweep's website user and her password (Login, SetUserPassword).
USER = "ada"
PASSWORD = "sweep password of ada"
CLIENT_ADDRESS = "203.0.113.9"

# Bookkeeping of the call itself rather than its effect: authenticating a key records its
# last use (at most once a minute), whatever the answer.
BOOKKEEPING_COLUMNS = ("last_used_at",)


async def table_digests(harness: CoordinatorHarness) -> dict[str, str]:
    """md5 of each coordinator table's rows, in order (BOOKKEEPING_COLUMNS aside): what a
    refusal must leave alone."""
    async with harness.db.connection() as connection:
        tables = [
            row["tablename"]
            for row in await connection.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
            )
        ]
        dropped = " - ".join(f"'{name}'" for name in BOOKKEEPING_COLUMNS)
        # The alias names the whole row; a column may not share it (boxes has an `x`).
        row = f"(to_jsonb(digested_row) - {dropped})::text"
        rows = f"md5(coalesce(string_agg({row}, E'\\n' ORDER BY {row}), ''))"
        parts = " UNION ALL ".join(
            f"SELECT '{table}' AS t, {rows} AS d FROM {table} digested_row" for table in tables
        )
        return {row["t"]: row["d"] for row in await connection.fetch(parts)}


# the coordinator and preview service ------------------------------------------------------


@dataclasses.dataclass
class World:
    setup: Setup
    job: jobs_pb2.ClaimedJob
    reader: Metadata  # a workshop key that reads footage of both cameras
    image: bytes
    gateway: Metadata  # the gateway's key (Login)
    session: Metadata  # a session of USER (her own keys)
    leaving: Metadata  # another session of USER, for Logout alone
    own_key_id: str  # a key of USER's own


async def build_world(c: CoordinatorHarness) -> World:
    s, job = await leased(c)
    reader = await c.key(
        Grant(ScopeName.WORKSHOP),
        Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-a", "cam-b")),
        name="reader",
    )
    await c.operator.CreateUser(operator_pb2.CreateUserRequest(user_id=USER), metadata=c.admin)
    await c.operator.SetUserPassword(
        operator_pb2.SetUserPasswordRequest(user_id=USER, password=PASSWORD), metadata=c.admin
    )
    sessions = [
        await c.operator.CreateSession(
            operator_pb2.CreateSessionRequest(user_id=USER), metadata=c.admin
        )
        for _ in range(2)
    ]
    session = bearer_metadata(sessions[0].secret)
    own = await c.identity.CreateOwnKey(
        identity_pb2.CreateOwnKeyRequest(
            name="own", scopes=[common_pb2.KeyScope(scope=common_pb2.SCOPE_WORKSHOP)]
        ),
        metadata=session,
    )
    return World(
        s,
        job,
        bearer_metadata(reader),
        jpeg_bytes(),
        gateway=bearer_metadata(await c.key(Grant(ScopeName.GATEWAY), name="gateway")),
        session=session,
        leaving=bearer_metadata(sessions[1].secret),
        own_key_id=own.key.key_id,
    )


def pools(world: World) -> Pools:
    job, lease = world.job, world.job.lease
    recording = job.input.recording
    strings: dict[str, list[object]] = {
        "run_id": ["r1", "r2"],
        "job_id": [lease.job_id],
        "token": [lease.token],
        "code_sha256": [CODE],
        "runtime_id": [world.setup.world.tracking_runtime, world.setup.world.plain_runtime],
        "workflow_id": ["yard"],
        "camera_id": ["cam-a", "cam-b"],
        "camera_ids": ["cam-a", "cam-b"],
        "device_id": ["gpu-box"],
        "recording_id": [recording.recording_id],
        "bucket_id": ["yard"],
        "model_name": ["detector"],
        "name": ["detector", "yard"],
        "object_key": [preview_key(job, 0, test=False)],
        "content_type": ["image/jpeg", "image/png"],
        "sha256": [hashlib.sha256(world.image).hexdigest(), recording.sha256],
        "service": ["", "workshop.v1.JobService"],
        "file_containing_symbol": ["workshop.v1.JobService", "workshop.v1.ClaimRequest"],
        "file_by_filename": ["workshop/v1/jobs.proto"],
        "list_services": [""],
        "engine": ["workshop-processor"],
        "capabilities": ["workshop-v3"],
        "user_id": [USER],
        "password": [PASSWORD],
        "client_address": [CLIENT_ADDRESS],
        "key_id": [world.own_key_id],
    }
    numbers: dict[str, list[object]] = {
        "generation": [lease.generation],
        "slot_index": [0, 1],
        "revision": [1],
        "expected_revision": [0, 1],
        "percent": [0, 50, 100],
        "version": [1],
    }
    everything = sorted({str(value) for values in strings.values() for value in values if value})
    return Pools(by_field={**strings, **numbers, "image": [world.image]}, strings=everything)


def _then_claim(request: jobs_pb2.CompleteRequest, runtime_id: str) -> jobs_pb2.CompleteRequest:
    """A Complete that also claims the next job (batched leases)."""
    request.then_claim.CopyFrom(
        jobs_pb2.ClaimRequest(runtime_id=runtime_id, code_sha256=CODE, max_jobs=2)
    )
    return request


def examples(world: World) -> dict[str, list[Message]]:
    """Valid requests of the world for some RPCs, which the sweep overrides field by field."""
    job, s = world.job, world.setup
    lease = job.lease
    return {
        "/workshop.v1.WorkshopService/SaveWorkflow": [
            ws.SaveWorkflowRequest(workflow_id="yard", expected_revision=1, spec=workflow_spec())
        ],
        "/workshop.v1.WorkshopService/ValidateWorkflow": [
            ws.ValidateWorkflowRequest(spec=workflow_spec())
        ],
        "/workshop.v1.WorkshopService/CreateRun": [
            run_request("r2", "yard", s.world.tracking_runtime)
        ],
        "/workshop.v1.WorkshopService/GetRun": [ws.GetRunRequest(run_id="r1")],
        "/workshop.v1.WorkshopService/WatchRun": [ws.WatchRunRequest(run_id="r1")],
        "/workshop.v1.JobService/Claim": [
            jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE),
            jobs_pb2.ClaimRequest(
                runtime_id=s.world.tracking_runtime, code_sha256=CODE, max_jobs=3
            ),
        ],
        "/workshop.v1.JobService/Heartbeat": [
            jobs_pb2.HeartbeatRequest(lease=lease),
            jobs_pb2.HeartbeatRequest(leases=[lease, lease]),
        ],
        "/workshop.v1.JobService/ReportProgress": [
            jobs_pb2.ReportProgressRequest(
                lease=lease, percent=10, phase=common_pb2.JOB_PHASE_DECODING
            )
        ],
        "/workshop.v1.JobService/Complete": [
            complete_request(job, empty_result(job)),
            _then_claim(complete_request(job, empty_result(job)), s.world.tracking_runtime),
        ],
        # one message of a processor's session (the sweep sends one, then half-closes)
        "/workshop.v1.JobService/Session": [
            jobs_pb2.SessionRequest(request_id=1, heartbeat=jobs_pb2.HeartbeatRequest(lease=lease)),
            jobs_pb2.SessionRequest(
                request_id=2,
                report_progress=jobs_pb2.ReportProgressRequest(lease=lease, percent=10),
            ),
            jobs_pb2.SessionRequest(
                request_id=3, complete=complete_request(job, empty_result(job))
            ),
        ],
        "/workshop.v1.PublicationService/CheckLease": [
            pub.CheckLeaseRequest(lease=lease, code_sha256=CODE)
        ],
        "/workshop.v1.PublicationService/RecordPreview": [record_request(job, 0, test=False)],
        "/workshop.v1.PreviewService/PublishPreview": [publish_request(job, 0, world.image)],
        "/workshop.v1.PreviewService/StageUpload": [upload_request(job, 1, world.image)],
        "/workshop.v1.PreviewService/GrantPreviewWrites": [
            preview_pb2.GrantPreviewWritesRequest(
                lease=lease, code_sha256=CODE, slot_indices=[2, 3], content_type="image/jpeg"
            ),
            preview_pb2.GrantPreviewWritesRequest(
                lease=lease, code_sha256=CODE, content_type="image/jpeg", lease_grant=True
            ),
        ],
        "/workshop.v1.PreviewService/RecordWrittenPreviews": [
            preview_pb2.RecordWrittenPreviewsRequest(previews=[_written(job, 2, world.image)])
        ],
        "/workshop.v1.PreviewService/ReadImage": [preview_pb2.ReadImageRequest(run_id="r1")],
        "/workshop.v1.PreviewService/ExportBucket": [
            preview_pb2.ExportBucketRequest(bucket_id="yard", format=run_pb2.DATASET_FORMAT_COCO)
        ],
        "/workshop.v1.OperatorService/PutCamera": [
            operator_pb2.PutCameraRequest(camera_id="cam-c", name="gate")
        ],
        "/grpc.health.v1.Health/Check": [health_pb2.HealthCheckRequest()],
        "/workshop.v1.IdentityService/Login": [
            identity_pb2.LoginRequest(
                user_id=USER, password=PASSWORD, client_address=CLIENT_ADDRESS
            )
        ],
        "/workshop.v1.IdentityService/CreateOwnKey": [
            identity_pb2.CreateOwnKeyRequest(
                name="agent",
                scopes=[common_pb2.KeyScope(scope=common_pb2.SCOPE_WORKSHOP)],
            )
        ],
        "/workshop.v1.IdentityService/RevokeOwnKey": [
            identity_pb2.RevokeOwnKeyRequest(key_id=world.own_key_id)
        ],
        "/workshop.v1.OperatorService/SetUserPassword": [
            operator_pb2.SetUserPasswordRequest(user_id=USER, password=PASSWORD)
        ],
    }


def _written(job: jobs_pb2.ClaimedJob, slot: int, image: bytes) -> preview_pb2.WrittenPreview:
    """Slot `slot`'s preview as a processor records it after writing it with a grant."""
    recorded = record_request(job, slot, test=False)
    return preview_pb2.WrittenPreview(
        lease=job.lease,
        code_sha256=CODE,
        slot_index=slot,
        object_key=recorded.object_key,
        frame_time=recorded.frame_time,
        boxes=recorded.boxes,
        byte_size=len(image),
        sha256=hashlib.sha256(image).hexdigest(),
        content_type="image/jpeg",
    )


def coordinator_credentials(c: CoordinatorHarness, world: World) -> Callable[[str], Metadata]:
    by_service = {
        "workshop.v1.IdentityService": world.setup.processor,
        "workshop.v1.OperatorService": c.admin,
        "workshop.v1.WorkshopService": world.reader,
        "workshop.v1.JobService": world.setup.processor,
        "workshop.v1.PublicationService": on_behalf(world.setup),
        "workshop.v1.PreviewService": world.setup.processor,
    }
    by_method = {
        "/workshop.v1.PreviewService/ReadImage": world.reader,
        "/workshop.v1.PreviewService/ExportBucket": world.reader,
        "/workshop.v1.PreviewService/RunCleanup": c.admin,
        # the gateway signs users in; a website session signs out and manages its own keys
        "/workshop.v1.IdentityService/Login": world.gateway,
        "/workshop.v1.IdentityService/Logout": world.leaving,
        "/workshop.v1.IdentityService/CreateOwnKey": world.session,
        "/workshop.v1.IdentityService/ListOwnKeys": world.session,
        "/workshop.v1.IdentityService/RevokeOwnKey": world.session,
    }

    def credential(method: str) -> Metadata:
        service = method.lstrip("/").partition("/")[0]
        return by_method.get(method, by_service.get(service, c.admin))

    return credential


@dataclasses.dataclass
class InProcess:
    """The coordinator and the preview service on `loop`, with the sweep's world."""

    coordinator: Target
    preview: Target


@asynccontextmanager
async def in_process_targets(
    loop: BackgroundLoop, dsn: str, bucket: S3Bucket
) -> AsyncIterator[InProcess]:
    async with AsyncExitStack() as stack:
        c = await stack.enter_async_context(running_coordinator(dsn))
        world = await build_world(c)
        preview = await stack.enter_async_context(running_preview(c, bucket))
        strategies = RequestStrategies(pools(world))
        valid = {
            method: [message.SerializeToString() for message in messages]
            for method, messages in examples(world).items()
        }
        credential = coordinator_credentials(c, world)
        to_coordinator = await stack.enter_async_context(raw_channel(c.port))
        to_preview = await stack.enter_async_context(raw_channel(preview.port))

        def digest() -> dict[str, str]:
            return loop.run(table_digests(c))

        yield InProcess(
            Target("coordinator", c.port, to_coordinator, credential, strategies, valid, digest),
            Target("preview", preview.port, to_preview, credential, strategies, valid, digest),
        )


@contextmanager
def started_in_process(loop: BackgroundLoop, dsn: str, bucket: S3Bucket) -> Iterator[InProcess]:
    """`in_process_targets` entered and left on the background loop."""
    manager = in_process_targets(loop, dsn, bucket)
    targets = loop.run(manager.__aenter__())
    try:
        yield targets
    finally:
        loop.run(manager.__aexit__(None, None, None))


@asynccontextmanager
async def raw_channel(port: int) -> AsyncIterator[grpc.aio.Channel]:
    """A plain channel (no retries, no default deadline: the sweep wants each answer as it
    came), which takes answers up to the servers' 16 MiB."""
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}",
        options=[("grpc.max_receive_message_length", 16 * 1024 * 1024), ("grpc.enable_retries", 0)],
    )
    try:
        yield channel
    finally:
        await channel.close()
