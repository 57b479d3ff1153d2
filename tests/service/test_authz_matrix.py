"""The gRPC authorization matrix: every RPC of every Workshop service x every kind of
credential, against the declared policy (`tests/authz_policy.py`).

The RPCs come from the generated descriptors (`libs/workshop/v1`, as the bad-input sweep
enumerates them), so an RPC without a row in the policy table fails
`test_every_rpc_has_a_policy_row`, and a row of an RPC that does not exist fails too.

Real servers: the in-process coordinator on Postgres and the preview service on
SeaweedFS (`tests/sweep/stack.py`'s world: device gpu-box, cameras cam-a and cam-b, a full
run r1 of cam-a whose first job gpu-box's processor key holds, user ada with sessions).
The credentials are made the way operators make them: keys written like the CLI does
(`CoordinatorHarness.key`), a key revoked with RevokeKey, a key created with a ttl
that the coordinator's clock then passes (AdvanceClock's frozen clock), a session of a
user disabled with DisableUser.

`test_matrix` sends each RPC an empty request with each credential, all cells at once
over one raw channel per server, and compares each answer with the table: REJECTED
credentials UNAUTHENTICATED, VALID principals the row does not list PERMISSION_DENIED,
the ones it lists anything but those (and never INTERNAL or UNKNOWN). An empty request
reaches the scope check but never a resource, so `RESOURCE_CASES` adds the checks that
need one: a key of another camera reading cam-a's footage, a key of another device
claiming or holding gpu-box's jobs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.servicers.jobs import SESSION_CALLS
from services.processor.evaluation import evaluation_service
from testbed.coordinator_leases import complete_request, empty_result
from testbed.coordinator_world import CODE, run_request
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness, publish_request, upload_request
from tests.authz_policy import ALLOWED, CREDENTIALS, POLICY, SESSION, Expectation
from tests.service.test_sweep import SERVER_OF, workshop_services
from tests.sweep.stack import Answer, Metadata, World, build_world, call, raw_channel
from workshop.kit.auth import bearer_metadata
from workshop.kit.server import Server, ServerSettings
from workshop.v1 import common_pb2, jobs_pb2, operator_pb2, preview_pb2, run_pb2
from workshop.v1 import publication_pb2 as pub
from workshop.v1 import workshop_pb2 as ws

pytestmark = pytest.mark.timeout(120)

ON_BEHALF_OF = "workshop-on-behalf-of"
# Cells in flight at once: enough to keep both servers busy, few enough for the
# coordinator's connection pool to answer each well inside its deadline.
CONCURRENCY = 24
DEADLINE_SECONDS = 10.0
NEVER = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
EXPIRED_KEY_TTL = timedelta(seconds=60)
ENDS_CREDENTIAL = {"/workshop.v1.IdentityService/Logout"}


def methods() -> dict[str, MethodDescriptor]:
    return {
        f"/{service.full_name}/{method.name}": method
        for service in workshop_services()
        for method in service.methods
    }


def test_every_rpc_has_a_policy_row() -> None:
    served = set(methods())
    assert sorted(served - set(POLICY)) == [], "RPCs without a row in tests/authz_policy.py"
    assert sorted(set(POLICY) - served) == [], "rows of RPCs that no service has"


def test_every_session_call_has_a_policy_row() -> None:
    calls = {
        field.name for field in jobs_pb2.SessionRequest.DESCRIPTOR.oneofs_by_name["call"].fields
    }
    assert calls == set(SESSION), "Session calls without a row (or rows without a call)"
    assert set(SESSION_CALLS) == calls, "Session calls the coordinator does not answer"


@dataclasses.dataclass
class Matrix:
    coordinator: CoordinatorHarness
    preview: PreviewHarness
    world: World
    credentials: dict[str, Metadata]
    item_id: str  # a preview of run r1 (cam-a)
    channels: dict[str, grpc.aio.Channel]

    def channel(self, path: str) -> grpc.aio.Channel:
        service = path.lstrip("/").partition("/")[0]
        return self.channels[SERVER_OF.get(service, "coordinator")]

    def metadata(self, credential: str, forwards: str = "") -> Metadata:
        metadata = self.credentials[credential]
        if forwards:
            [(_, value)] = self.credentials[forwards]
            metadata = (*metadata, (ON_BEHALF_OF, value))
        return metadata


async def _credentials(
    c: CoordinatorHarness, preview: PreviewHarness, world: World
) -> dict[str, Metadata]:
    admin = c.admin
    await c.operator.RegisterDevice(
        operator_pb2.RegisterDeviceRequest(device_id="other-box"), metadata=admin
    )
    revoked = await c.operator.CreateKey(
        operator_pb2.CreateKeyRequest(
            name="revoked", scopes=[common_pb2.KeyScope(scope=common_pb2.SCOPE_ADMIN)]
        ),
        metadata=admin,
    )
    await c.operator.RevokeKey(
        operator_pb2.RevokeKeyRequest(key_id=revoked.key.key_id), metadata=admin
    )
    ttl = Duration()
    ttl.FromTimedelta(EXPIRED_KEY_TTL)
    expired = await c.operator.CreateKey(
        operator_pb2.CreateKeyRequest(
            name="expired", scopes=[common_pb2.KeyScope(scope=common_pb2.SCOPE_ADMIN)], ttl=ttl
        ),
        metadata=admin,
    )
    c.clock.advance(EXPIRED_KEY_TTL + timedelta(seconds=1))
    await c.operator.CreateUser(operator_pb2.CreateUserRequest(user_id="dora"), metadata=admin)
    disabled = await c.operator.CreateSession(
        operator_pb2.CreateSessionRequest(user_id="dora"), metadata=admin
    )
    await c.operator.DisableUser(operator_pb2.DisableUserRequest(user_id="dora"), metadata=admin)
    footage_other = await c.key(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-b",)), name="b")
    run_other = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="other-box"), name="other")
    credentials: dict[str, Metadata] = {
        "none": (),
        "malformed": (("authorization", "Basic YWRhOnBhc3N3b3Jk"),),
        "unknown": bearer_metadata("wk_00000000deadbeef.never-issued-secret-of-43-characters"),
        "revoked": bearer_metadata(revoked.secret),
        "expired": bearer_metadata(expired.secret),
        "disabled_session": bearer_metadata(disabled.secret),
        "session": world.session,
        "workshop": bearer_metadata(await c.key(Grant(ScopeName.WORKSHOP), name="workshop")),
        "footage_other": bearer_metadata(footage_other),
        "run_device": world.setup.processor,
        "run_other_device": bearer_metadata(run_other),
        "service": bearer_metadata(preview.settings.service_key),
        "gateway": world.gateway,
        "admin": admin,
    }
    assert set(credentials) == set(CREDENTIALS)
    return credentials


@pytest.fixture
async def matrix(coordinator: CoordinatorHarness, preview: PreviewHarness) -> AsyncIterator[Matrix]:
    world = await build_world(coordinator)
    published = await preview.stub.PublishPreview(
        publish_request(world.job, 0), metadata=world.setup.processor
    )
    credentials = await _credentials(coordinator, preview, world)
    # the processor's EvaluationService: its calls refused or answered before Triton is used
    evaluation = Server(
        label="processor-test",
        settings=ServerSettings(port=0, drain_seconds=0.0, grace_seconds=1.0, metrics_port=-1),
        services=[
            evaluation_service(
                coordinator.channel, preview.channel, "127.0.0.1:9", Path("/nonexistent")
            )
        ],
    )
    processor_port = await evaluation.start()
    try:
        async with (
            raw_channel(coordinator.port) as to_coordinator,
            raw_channel(preview.port) as to_preview,
            raw_channel(processor_port) as to_processor,
        ):
            yield Matrix(
                coordinator,
                preview,
                world,
                credentials,
                published.item_id,
                {"coordinator": to_coordinator, "preview": to_preview, "processor": to_processor},
            )
    finally:
        await evaluation.stop()


def verdict(expected: Expectation, answer: Answer) -> str:
    """'' when `answer` meets `expected`, else what went wrong."""
    code = answer.code
    if code in NEVER:
        return f"{code.name}: {answer.details}"
    if expected == ALLOWED:
        return f"refused {code.name}: {answer.details}" if code in REFUSED else ""
    if code is not expected:
        return f"expected {expected.name}, got {code.name}: {answer.details}"  # type: ignore[union-attr]
    return ""


async def _cells(
    m: Matrix, cells: list[tuple[str, str, bytes, Metadata, Expectation]]
) -> tuple[list[str], dict[str, int]]:
    """Sends every cell (label, path, request, metadata, expected) CONCURRENCY at a time;
    the failures, and the answers by code."""
    by_path = methods()
    limit = asyncio.Semaphore(CONCURRENCY)
    failures: list[str] = []
    codes: dict[str, int] = {}

    async def one(
        label: str, path: str, data: bytes, metadata: Metadata, expected: Expectation
    ) -> None:
        async with limit:
            answer = await call(m.channel(path), by_path[path], data, metadata, DEADLINE_SECONDS)
        codes[answer.code.name] = codes.get(answer.code.name, 0) + 1
        wrong = verdict(expected, answer)
        if wrong:
            failures.append(f"{path} x {label}: {wrong}")

    await asyncio.gather(*(one(*cell) for cell in cells))
    return sorted(failures), codes


async def test_matrix(matrix: Matrix, capsys: pytest.CaptureFixture[str]) -> None:
    m = matrix
    requests = {path: probe(m).SerializeToString() for path, probe in PROBES.items()}
    cells = [
        (
            credential,
            path,
            requests.get(path, b""),
            m.metadata(credential, rule.forwards),
            rule.expected(credential),
        )
        for path, rule in POLICY.items()
        for credential in CREDENTIALS
    ]
    # Logout ends the session it is called with: those cells go last.
    ending = [cell for cell in cells if cell[1] in ENDS_CREDENTIAL]
    began = time.monotonic()
    failures, codes = await _cells(m, [cell for cell in cells if cell not in ending])
    more, more_codes = await _cells(m, ending)
    failures += more
    for code, count in more_codes.items():
        codes[code] = codes.get(code, 0) + count
    seconds = time.monotonic() - began
    with capsys.disabled():
        print(
            f"\nauthz matrix: {len(POLICY)} RPCs x {len(CREDENTIALS)} credentials = "
            f"{len(cells)} calls in {seconds:.1f} s: {codes}"
        )
    assert failures == [], "\n".join(failures)


def _foreign_lease(m: Matrix) -> common_pb2.LeaseRef:
    """r1's leased job under a token nobody holds: well formed, so the call reaches the
    scope check, and fenced, so an allowed cell changes nothing."""
    lease = common_pb2.LeaseRef()
    lease.CopyFrom(m.world.job.lease)
    lease.token = str(uuid.uuid4())
    return lease


def _complete(m: Matrix) -> Message:
    request = complete_request(m.world.job, empty_result(m.world.job))
    request.lease.CopyFrom(_foreign_lease(m))
    return request


def _recording(m: Matrix) -> Message:
    start = Timestamp(seconds=1_700_000_000)
    return operator_pb2.PutRecordingRequest(
        recording_id="matrix-recording",
        camera_id="cam-a",
        start=start,
        end=Timestamp(seconds=start.seconds + 3600),
        fps=30,
        object_key="recordings/matrix-recording.mp4",
        sha256=hashlib.sha256(b"matrix-recording").hexdigest(),
        byte_size=1000,
    )


# RPCs that check a request's shape before the caller's scope (the coordinator's job
# calls parse the lease first; the preview service checks the request before it forwards
# the credential, so a malformed request costs no coordinator call). An empty request
# would stop there, so these get a well-formed one that reaches the scope check.
PROBES: dict[str, Callable[[Matrix], Message]] = {
    "/workshop.v1.JobService/Heartbeat": lambda m: jobs_pb2.HeartbeatRequest(
        lease=_foreign_lease(m)
    ),
    "/workshop.v1.JobService/ReportProgress": lambda m: jobs_pb2.ReportProgressRequest(
        lease=_foreign_lease(m), percent=10
    ),
    "/workshop.v1.JobService/Complete": _complete,
    "/workshop.v1.JobService/Fail": lambda m: jobs_pb2.FailRequest(
        lease=_foreign_lease(m), reason=common_pb2.FAILURE_REASON_PROCESSOR_FAILED
    ),
    "/workshop.v1.JobService/Release": lambda m: jobs_pb2.ReleaseRequest(lease=_foreign_lease(m)),
    # a request with a call, so that an allowed cell runs one (not a shape check: a Session
    # checks its credential when it opens)
    "/workshop.v1.JobService/Session": lambda m: jobs_pb2.SessionRequest(
        request_id=1, heartbeat=jobs_pb2.HeartbeatRequest(lease=_foreign_lease(m))
    ),
    "/workshop.v1.OperatorService/PutRecording": _recording,
    "/workshop.v1.PublicationService/ListCollectableObjects": lambda m: (
        pub.ListCollectableObjectsRequest(kind=common_pb2.OBJECT_KIND_PREVIEW, limit=1)
    ),
    "/workshop.v1.WorkshopService/ChooseRuntime": lambda m: ws.ChooseRuntimeRequest(
        workflow_id="yard", choice=ws.RUNTIME_CHOICE_NEWEST
    ),
    "/workshop.v1.WorkshopService/CreateRun": lambda m: run_request(
        "matrix-run", "yard", m.world.setup.world.tracking_runtime
    ),
    "/workshop.v1.WorkshopService/DecideSighting": lambda m: ws.DecideSightingRequest(
        run_id="r1", sighting_id="no-such-sighting", decision=ws.REVIEW_DECISION_CONFIRM
    ),
    # a preview of a bulk decision (changes nothing) and an action that does not exist: the
    # camera checks are test_review_queue's
    "/workshop.v1.WorkshopService/BulkDecideSightings": lambda m: ws.BulkDecideSightingsRequest(
        bucket_id="yard", decision=ws.REVIEW_DECISION_CONFIRM, dry_run=True
    ),
    "/workshop.v1.WorkshopService/UndoBulkDecision": lambda m: ws.UndoBulkDecisionRequest(
        action_id="no-such-action"
    ),
    # an item that does not exist: the camera check is test_review_corrections'
    "/workshop.v1.WorkshopService/DecideItem": lambda m: ws.DecideItemRequest(
        item_id="no-such-item", decision=ws.REVIEW_DECISION_CONFIRM
    ),
    "/workshop.v1.WorkshopService/CorrectItemBoxes": lambda m: ws.CorrectItemBoxesRequest(
        item_id="no-such-item"
    ),
    "/workshop.v1.WorkshopService/UndoItemCorrection": lambda m: ws.UndoItemCorrectionRequest(
        item_id="no-such-item"
    ),
    "/workshop.v1.WorkshopService/ClearItemDecision": lambda m: ws.ClearItemDecisionRequest(
        item_id="no-such-item"
    ),
    "/workshop.v1.WorkshopService/GetBucketItem": lambda m: ws.GetBucketItemRequest(
        item_id="no-such-item"
    ),
    "/workshop.v1.WorkshopService/RequestPhoto": lambda m: ws.RequestPhotoRequest(
        camera_id="cam-a", time=Timestamp(seconds=1_700_000_000)
    ),
    "/workshop.v1.PreviewService/PublishPreview": lambda m: publish_request(m.world.job, 1),
    "/workshop.v1.PreviewService/StageUpload": lambda m: upload_request(m.world.job, 1),
    "/workshop.v1.PreviewService/GrantPreviewWrites": lambda m: (
        preview_pb2.GrantPreviewWritesRequest(
            lease=m.world.job.lease, code_sha256=CODE, slot_indices=[1], content_type="image/jpeg"
        )
    ),
    "/workshop.v1.PreviewService/RecordWrittenPreviews": lambda m: (
        preview_pb2.RecordWrittenPreviewsRequest(previews=[_written(m)])
    ),
    # an item that does not exist: the camera check is RESOURCE_CASES'
    "/workshop.v1.PreviewService/ReadImage": lambda m: preview_pb2.ReadImageRequest(
        run_id="r1", item_id="no-such-item"
    ),
    "/workshop.v1.PreviewService/ExportBucket": lambda m: preview_pb2.ExportBucketRequest(
        bucket_id="yard", format=run_pb2.DATASET_FORMAT_COCO
    ),
}


def _written(m: Matrix) -> preview_pb2.WrittenPreview:
    """Slot 1 of the world's lease as a processor records it after writing it with a
    grant (under a key that is not the lease's: an allowed cell refuses it, changing
    nothing)."""
    job = m.world.job
    return preview_pb2.WrittenPreview(
        lease=job.lease,
        code_sha256=CODE,
        slot_index=1,
        object_key="matrix/not-the-lease-key.jpg",
        content_type="image/jpeg",
        frame_time=job.input.slots[1].start,
        byte_size=3,
        sha256=hashlib.sha256(b"abc").hexdigest(),
    )


@dataclasses.dataclass(frozen=True)
class ResourceCase:
    """One call aimed at a real resource of the world: `request(matrix)` is its request."""

    path: str
    credential: str
    request: Callable[[Matrix], Message]
    expected: Expectation
    forwards: str = ""


def _claim(m: Matrix) -> Message:
    return jobs_pb2.ClaimRequest(runtime_id=m.world.setup.world.tracking_runtime, code_sha256=CODE)


def _heartbeat(m: Matrix) -> Message:
    return jobs_pb2.HeartbeatRequest(lease=m.world.job.lease)


def _review(m: Matrix) -> Message:
    return ws.GetReviewRequest(run_id="r1")


def _read(m: Matrix) -> Message:
    return preview_pb2.ReadImageRequest(run_id="r1", item_id=m.item_id)


def _authorize(m: Matrix) -> Message:
    return pub.AuthorizeImageReadRequest(run_id="r1", item_id=m.item_id)


def _check_lease(m: Matrix) -> Message:
    return pub.CheckLeaseRequest(lease=m.world.job.lease, code_sha256=CODE)


def _run(m: Matrix) -> Message:
    return ws.GetRunRequest(run_id="r1")


DENIED = grpc.StatusCode.PERMISSION_DENIED
RESOURCE_CASES = [
    # workshop:run for another device: its key may not claim gpu-box's runtime
    ResourceCase("/workshop.v1.JobService/Claim", "run_other_device", _claim, DENIED),
    ResourceCase("/workshop.v1.JobService/Claim", "run_device", _claim, ALLOWED),
    # ... nor hold gpu-box's lease, even with its token: fence 4 (REPORTER_NOT_AUTHORIZED)
    # refuses it as it refuses a key that lost its authority mid-lease
    ResourceCase(
        "/workshop.v1.JobService/Heartbeat",
        "run_other_device",
        _heartbeat,
        grpc.StatusCode.FAILED_PRECONDITION,
    ),
    ResourceCase("/workshop.v1.JobService/Heartbeat", "run_device", _heartbeat, ALLOWED),
    # footage:read for another camera: cam-a's images are refused
    ResourceCase("/workshop.v1.PreviewService/ReadImage", "footage_other", _read, DENIED),
    ResourceCase("/workshop.v1.PreviewService/ReadImage", "workshop", _read, ALLOWED),
    ResourceCase(
        "/workshop.v1.PublicationService/AuthorizeImageRead",
        "service",
        _authorize,
        DENIED,
        forwards="footage_other",
    ),
    ResourceCase(
        "/workshop.v1.PublicationService/AuthorizeImageRead",
        "service",
        _authorize,
        ALLOWED,
        forwards="workshop",
    ),
    # ... and the review of a cam-a run shows it nothing (an allowed, empty answer)
    ResourceCase("/workshop.v1.WorkshopService/GetReview", "footage_other", _review, ALLOWED),
    # the gateway follows any run; a processor key does not read runs
    ResourceCase("/workshop.v1.WorkshopService/GetRun", "gateway", _run, ALLOWED),
    ResourceCase("/workshop.v1.WorkshopService/GetRun", "run_device", _run, DENIED),
    # the preview service speaking for a rejected credential: refused as if it had called
    *(
        ResourceCase(path, "service", request, grpc.StatusCode.UNAUTHENTICATED, forwards=bad)
        for path, request in (
            ("/workshop.v1.PublicationService/CheckLease", _check_lease),
            ("/workshop.v1.PublicationService/AuthorizeImageRead", _authorize),
        )
        for bad in ("malformed", "unknown", "revoked", "expired", "disabled_session")
    ),
]


def _records(m: Matrix) -> Message:
    """record_previews of slot 1 under a key that is not the lease's: an allowed cell is
    answered (the preview refused in its outcome), changing nothing."""
    written = _written(m)
    return pub.RecordPreviewsRequest(
        previews=[pub.RecordPreviewRequest.FromString(written.SerializeToString())]
    )


async def test_session_calls(matrix: Matrix) -> None:
    """Each call on a Session stream x each credential, against the SESSION table: the
    stream (the call's one message, then a half-close) ends OK where the row allows the
    credential (the call answered, or refused in its answer), and is refused when it
    opens elsewhere."""
    m = matrix
    session = "/workshop.v1.JobService/Session"
    probes: dict[str, Callable[[Matrix], Message]] = {"record_previews": _records}
    cells = []
    for kind, rule in SESSION.items():
        rpc = SESSION_CALLS[kind][0]
        probe = probes.get(kind) or PROBES.get(f"/workshop.v1.JobService/{rpc}")
        request = jobs_pb2.SessionRequest(request_id=1)
        if probe is not None:
            getattr(request, kind).CopyFrom(probe(m))
        else:
            getattr(request, kind).SetInParent()
        for credential in CREDENTIALS:
            cells.append(
                (
                    f"{credential} ({kind})",
                    session,
                    request.SerializeToString(),
                    m.metadata(credential, ""),
                    rule.expected(credential),
                )
            )
    failures, _ = await _cells(m, cells)
    assert failures == [], "\n".join(failures)


async def test_resource_bound_credentials(matrix: Matrix) -> None:
    m = matrix
    cells = [
        (
            f"{case.credential}{' for ' + case.forwards if case.forwards else ''}",
            case.path,
            case.request(m).SerializeToString(),
            m.metadata(case.credential, case.forwards),
            case.expected,
        )
        for case in RESOURCE_CASES
    ]
    failures, _ = await _cells(m, cells)
    assert failures == [], "\n".join(failures)
