"""OperatorService over real gRPC and real Postgres (docs/concepts.md, docs/operations.md,
operator.proto).

Every refusal is checked three ways: the gRPC status code, the ErrorInfo reason
in the rich status details (domain "workshop"), and that the database is exactly
as it was before the call.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.harness.coordinator import EPOCH, CoordinatorHarness
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, operator_pb2, workshop_pb2

Code = grpc.StatusCode
Method = Callable[..., Awaitable[object]]
Metadata = tuple[tuple[str, str], ...]

# Every table an OperatorService call can write.
TABLES = (
    "devices",
    "runtimes",
    "cameras",
    "recordings",
    "model_versions",
    "buckets",
    "users",
    "sessions",
    "keys",
    "policy",
    "login_failures",
)

SHA_A = hashlib.sha256(b"a").hexdigest()
SHA_B = hashlib.sha256(b"b").hexdigest()
SHA_C = hashlib.sha256(b"c").hexdigest()


# --- helpers ---------------------------------------------------------------------------------


def ts(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def at(stamp: Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


def duration(value: timedelta) -> Duration:
    result = Duration()
    result.FromTimedelta(value)
    return result


def error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo in the rich status details of a failed call."""
    status = rpc_status.from_call(error)
    assert status is not None, f"no rich status details: {error.code()} {error.details()}"
    assert status.code == error.code().value[0]
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError(f"no ErrorInfo among the details of {error.code()} {error.details()}")


async def table_rows(h: CoordinatorHarness) -> dict[str, list[str]]:
    """Every row of every operator table as JSON text (last_used_at aside: a read may touch it)."""
    rows: dict[str, list[str]] = {}
    async with h.db.connection() as connection:
        for table in TABLES:
            values = await connection.fetch(
                f"SELECT (to_jsonb(t) - 'last_used_at')::text AS v FROM {table} t"
            )
            rows[table] = sorted(value["v"] for value in values)
    return rows


async def refused(
    h: CoordinatorHarness,
    method: Method,
    request: Message,
    code: grpc.StatusCode,
    reason: str,
    *,
    metadata: Metadata | None = None,
) -> error_details_pb2.ErrorInfo:
    """Call `method` (admin credential unless given); it must fail with `code` and `reason`
    and change nothing."""
    before = await table_rows(h)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await method(request, metadata=h.admin if metadata is None else metadata)
    error = caught.value
    info = error_info(error)
    assert (error.code(), info.reason) == (code, reason), error.details()
    assert info.domain == "workshop"
    assert error.details(), "an error needs a message for people"
    assert await table_rows(h) == before, "a refused call changed the database"
    return info


async def invalid(h: CoordinatorHarness, method: Method, request: Message) -> None:
    await refused(h, method, request, Code.INVALID_ARGUMENT, "INVALID_FIELD")


def scope(
    value: common_pb2.Scope.ValueType, device_id: str = "", camera_ids: tuple[str, ...] = ()
) -> common_pb2.KeyScope:
    return common_pb2.KeyScope(scope=value, device_id=device_id, camera_ids=camera_ids)


# --- devices ---------------------------------------------------------------------------------


async def register_device(h: CoordinatorHarness, device_id: str, description: str = "") -> None:
    await h.operator.RegisterDevice(
        operator_pb2.RegisterDeviceRequest(device_id=device_id, description=description),
        metadata=h.admin,
    )


async def test_register_device_is_idempotent_and_conflicts_on_another_description(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    request = operator_pb2.RegisterDeviceRequest(device_id="gpu-box", description="rack 1")
    first = await h.operator.RegisterDevice(request, metadata=h.admin)
    assert first.device.device_id == "gpu-box"
    assert first.device.description == "rack 1"
    assert at(first.device.registered_at) == EPOCH

    h.clock.advance(timedelta(minutes=1))
    again = await h.operator.RegisterDevice(request, metadata=h.admin)
    assert again.device == first.device
    assert await h.count("devices") == 1

    other = operator_pb2.RegisterDeviceRequest(device_id="gpu-box", description="rack 2")
    await refused(h, h.operator.RegisterDevice, other, Code.ABORTED, "ID_CONFLICT")
    for bad_id in ("", "-starts-with-dash", "has space", "x" * 129, "slash/y"):
        bad = operator_pb2.RegisterDeviceRequest(device_id=bad_id)
        await invalid(h, h.operator.RegisterDevice, bad)


async def test_list_devices_pages_by_id(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    for device_id in ("gpu-c", "gpu-a", "gpu-b"):
        await register_device(h, device_id)

    first = await h.operator.ListDevices(
        operator_pb2.ListDevicesRequest(page_size=2), metadata=h.admin
    )
    assert [device.device_id for device in first.devices] == ["gpu-a", "gpu-b"]
    assert first.next_page_token

    second = await h.operator.ListDevices(
        operator_pb2.ListDevicesRequest(page_size=2, page_token=first.next_page_token),
        metadata=h.admin,
    )
    assert [device.device_id for device in second.devices] == ["gpu-c"]
    assert second.next_page_token == ""

    everything = await h.operator.ListDevices(operator_pb2.ListDevicesRequest(), metadata=h.admin)
    assert [device.device_id for device in everything.devices] == ["gpu-a", "gpu-b", "gpu-c"]
    assert everything.next_page_token == ""


# --- runtimes --------------------------------------------------------------------------------


def expected_manifest(engine: str, device_id: str, code_sha256: str) -> str:
    # Written out by hand: sorted keys, no spaces (docs/concepts.md), independent of
    # workshop.kit.hashing.
    return f'{{"code_sha256":"{code_sha256}","device_id":"{device_id}","engine":"{engine}"}}'


def expected_runtime_id(engine: str, device_id: str, code_sha256: str) -> str:
    manifest = expected_manifest(engine, device_id, code_sha256).encode("utf-8")
    return "workshop-" + hashlib.sha256(manifest).hexdigest()[:32]


def runtime_request(
    code_sha256: str = SHA_A, capabilities: tuple[str, ...] = (), device_id: str = "gpu-box"
) -> operator_pb2.RegisterRuntimeRequest:
    return operator_pb2.RegisterRuntimeRequest(
        device_id=device_id,
        engine="dali-triton",
        code_sha256=code_sha256,
        capabilities=capabilities,
    )


async def test_runtime_id_is_the_hash_of_the_canonical_manifest(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await register_device(h, "gpu-box")
    reply = await h.operator.RegisterRuntime(
        runtime_request(capabilities=("workshop-v3",)), metadata=h.admin
    )
    assert reply.created
    assert reply.manifest_json == expected_manifest("dali-triton", "gpu-box", SHA_A)
    assert reply.runtime.runtime_id == expected_runtime_id("dali-triton", "gpu-box", SHA_A)
    assert len(reply.runtime.runtime_id) == len("workshop-") + 32
    assert reply.runtime.device_id == "gpu-box"
    assert reply.runtime.engine == "dali-triton"
    assert reply.runtime.code_sha256 == SHA_A
    assert list(reply.runtime.capabilities) == ["workshop-v3"]
    assert at(reply.runtime.registered_at) == EPOCH
    assert not reply.runtime.HasField("last_seen_at")


async def test_register_runtime_refuses_unknown_devices_and_bad_digests(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    unknown = runtime_request(device_id="nowhere")
    info = await refused(
        h,
        h.operator.RegisterRuntime,
        unknown,
        Code.NOT_FOUND,
        "NOT_FOUND",
    )
    assert info.reason == "NOT_FOUND"
    assert await h.count("runtimes") == 0

    await register_device(h, "gpu-box")
    for digest in ("", "abc", SHA_A[:63], SHA_A + "0", SHA_A.upper(), "g" * 64):
        bad = runtime_request(code_sha256=digest)
        await invalid(h, h.operator.RegisterRuntime, bad)
    assert await h.count("runtimes") == 0


async def test_registering_a_manifest_again_unions_its_capabilities(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await register_device(h, "gpu-box")
    first = await h.operator.RegisterRuntime(
        runtime_request(capabilities=("b-cap", "workshop-v3")), metadata=h.admin
    )
    assert first.created

    h.clock.advance(timedelta(hours=1))
    again = await h.operator.RegisterRuntime(
        runtime_request(capabilities=("a-cap", "workshop-v3")), metadata=h.admin
    )
    assert not again.created
    assert again.runtime.runtime_id == first.runtime.runtime_id
    assert again.manifest_json == first.manifest_json
    assert set(again.runtime.capabilities) == {"a-cap", "b-cap", "workshop-v3"}
    assert len(again.runtime.capabilities) == 3
    assert again.runtime.registered_at == first.runtime.registered_at
    assert await h.count("runtimes") == 1

    listed = await h.operator.ListRuntimes(operator_pb2.ListRuntimesRequest(), metadata=h.admin)
    assert [runtime.runtime_id for runtime in listed.runtimes] == [first.runtime.runtime_id]
    assert set(listed.runtimes[0].capabilities) == {"a-cap", "b-cap", "workshop-v3"}


async def test_list_runtimes_filters_by_device(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    for device_id in ("gpu-box", "gpu-two"):
        await register_device(h, device_id)
    ids: dict[str, set[str]] = {"gpu-box": set(), "gpu-two": set()}
    for device_id, digest in (("gpu-box", SHA_A), ("gpu-box", SHA_B), ("gpu-two", SHA_A)):
        reply = await h.operator.RegisterRuntime(
            runtime_request(code_sha256=digest, device_id=device_id), metadata=h.admin
        )
        ids[device_id].add(reply.runtime.runtime_id)

    for device_id, expected in ids.items():
        listed = await h.operator.ListRuntimes(
            operator_pb2.ListRuntimesRequest(device_id=device_id), metadata=h.admin
        )
        assert {runtime.runtime_id for runtime in listed.runtimes} == expected
        assert {runtime.device_id for runtime in listed.runtimes} == {device_id}
    everything = await h.operator.ListRuntimes(operator_pb2.ListRuntimesRequest(), metadata=h.admin)
    assert len(everything.runtimes) == 3
    nothing = await h.operator.ListRuntimes(
        operator_pb2.ListRuntimesRequest(device_id="nowhere"), metadata=h.admin
    )
    assert list(nothing.runtimes) == []


async def test_list_runtimes_is_newest_registration_first(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await register_device(h, "gpu-box")
    # Register the runtime with the larger id last, so id order and registration order differ.
    older, newer = sorted(
        (SHA_A, SHA_B), key=lambda digest: expected_runtime_id("dali-triton", "gpu-box", digest)
    )
    for digest in (older, newer):
        await h.operator.RegisterRuntime(runtime_request(code_sha256=digest), metadata=h.admin)
        h.clock.advance(timedelta(minutes=1))
    listed = await h.operator.ListRuntimes(operator_pb2.ListRuntimesRequest(), metadata=h.admin)
    assert [runtime.code_sha256 for runtime in listed.runtimes] == [newer, older]


# --- cameras and recordings ------------------------------------------------------------------


DAY = datetime(2026, 11, 29, tzinfo=UTC)
EIGHT = DAY.replace(hour=8)
NINE = DAY.replace(hour=9)


async def put_camera(h: CoordinatorHarness, camera_id: str, name: str = "") -> None:
    await h.operator.PutCamera(
        operator_pb2.PutCameraRequest(camera_id=camera_id, name=name or camera_id),
        metadata=h.admin,
    )


def recording_request(
    recording_id: str = "rec-1",
    camera_id: str = "cam-1",
    start: datetime = EIGHT,
    end: datetime = NINE,
    fps: float = 10.0,
    sha256: str = SHA_A,
    byte_size: int = 1000,
    object_key: str = "recordings/rec-1.mp4",
) -> operator_pb2.PutRecordingRequest:
    return operator_pb2.PutRecordingRequest(
        recording_id=recording_id,
        camera_id=camera_id,
        start=ts(start),
        end=ts(end),
        fps=fps,
        object_key=object_key,
        sha256=sha256,
        byte_size=byte_size,
    )


async def put_recording(
    h: CoordinatorHarness, request: operator_pb2.PutRecordingRequest
) -> operator_pb2.PutRecordingResponse:
    return await h.operator.PutRecording(request, metadata=h.admin)


async def test_cameras_are_put_and_listed(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    reply = await h.operator.PutCamera(
        operator_pb2.PutCameraRequest(camera_id="cam-2", name="Gate"), metadata=h.admin
    )
    assert (reply.camera.camera_id, reply.camera.name) == ("cam-2", "Gate")
    h.clock.advance(timedelta(minutes=5))
    renamed = await h.operator.PutCamera(
        operator_pb2.PutCameraRequest(camera_id="cam-2", name="North gate"), metadata=h.admin
    )
    assert renamed.camera.name == "North gate"
    assert at(renamed.camera.created_at) == EPOCH
    assert at(renamed.camera.updated_at) == EPOCH + timedelta(minutes=5)
    await put_camera(h, "cam-1")
    listed = await h.operator.ListCameras(operator_pb2.ListCamerasRequest(), metadata=h.admin)
    assert [camera.camera_id for camera in listed.cameras] == ["cam-1", "cam-2"]
    bad = operator_pb2.PutCameraRequest(camera_id="not ok")
    await invalid(h, h.operator.PutCamera, bad)


async def test_a_recording_needs_a_registered_camera(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    request = recording_request(camera_id="cam-nowhere")
    await refused(h, h.operator.PutRecording, request, Code.NOT_FOUND, "NOT_FOUND")
    assert await h.count("recordings") == 0


async def test_every_put_is_a_new_generation_kept_40_days(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    await put_camera(h, "cam-1")
    request = recording_request()
    for generation in (1, 2, 3):
        put_at = h.clock.now()
        reply = await put_recording(h, request)
        recording = reply.recording
        assert recording.generation == generation
        assert at(recording.put_at) == put_at
        assert at(recording.expires_at) == put_at + timedelta(days=40)
        assert (recording.recording_id, recording.camera_id) == ("rec-1", "cam-1")
        assert at(recording.start) == EIGHT
        assert at(recording.end) == NINE
        assert (recording.fps, recording.sha256, recording.byte_size) == (10.0, SHA_A, 1000)
        assert recording.object_key == "recordings/rec-1.mp4"
        assert not recording.HasField("deleted_at")
        h.clock.advance(timedelta(days=1))
    assert await h.count("recordings") == 1


async def test_put_recording_refuses_bad_fields(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    await put_camera(h, "cam-1")
    await put_camera(h, "cam-2")
    await put_recording(h, recording_request())
    bad_requests = [
        recording_request(end=EIGHT),  # end == start
        recording_request(end=EIGHT - timedelta(seconds=1)),  # end before start
        recording_request(fps=0.0),
        recording_request(fps=-5.0),
        recording_request(sha256="abc"),
        recording_request(sha256=SHA_A.upper()),
        recording_request(byte_size=-1),
        recording_request(byte_size=0),  # the contract says > 0
        recording_request(object_key=""),
        recording_request(recording_id="bad id"),
        # A replacement keeps its camera.
        recording_request(camera_id="cam-2"),
    ]
    for bad in bad_requests:
        await invalid(h, h.operator.PutRecording, bad)
    no_start = recording_request()
    no_start.ClearField("start")
    await invalid(h, h.operator.PutRecording, no_start)

    listed = await h.operator.ListRecordings(operator_pb2.ListRecordingsRequest(), metadata=h.admin)
    assert [(r.recording_id, r.camera_id, r.generation) for r in listed.recordings] == [
        ("rec-1", "cam-1", 1)
    ]


async def test_delete_recording_ends_it_once(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    await put_camera(h, "cam-1")
    await put_recording(h, recording_request())
    await put_recording(h, recording_request())
    h.clock.advance(timedelta(hours=2))

    reply = await h.operator.DeleteRecording(
        operator_pb2.DeleteRecordingRequest(recording_id="rec-1"), metadata=h.admin
    )
    assert reply.recording.generation == 2
    assert reply.recording.HasField("deleted_at")
    assert at(reply.recording.deleted_at) == EPOCH + timedelta(hours=2)
    async with h.db.connection() as connection:
        deleted_at = await connection.fetchval(
            "SELECT deleted_at FROM recordings WHERE recording_id = 'rec-1'"
        )
    assert deleted_at == EPOCH + timedelta(hours=2)

    again = operator_pb2.DeleteRecordingRequest(recording_id="rec-1")
    await refused(h, h.operator.DeleteRecording, again, Code.NOT_FOUND, "NOT_FOUND")
    unknown = operator_pb2.DeleteRecordingRequest(recording_id="rec-nowhere")
    await refused(
        h,
        h.operator.DeleteRecording,
        unknown,
        Code.NOT_FOUND,
        "NOT_FOUND",
    )
    listed = await h.operator.ListRecordings(operator_pb2.ListRecordingsRequest(), metadata=h.admin)
    assert list(listed.recordings) == []


async def list_recording_ids(
    h: CoordinatorHarness,
    camera_id: str = "",
    overlaps_from: datetime | None = None,
    overlaps_until: datetime | None = None,
) -> list[str]:
    request = operator_pb2.ListRecordingsRequest(camera_id=camera_id)
    if overlaps_from is not None:
        request.overlaps_from.CopyFrom(ts(overlaps_from))
    if overlaps_until is not None:
        request.overlaps_until.CopyFrom(ts(overlaps_until))
    reply = await h.operator.ListRecordings(request, metadata=h.admin)
    assert reply.next_page_token == ""
    return [recording.recording_id for recording in reply.recordings]


async def test_list_recordings_hides_deleted_and_expired_and_filters(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await put_camera(h, "cam-1")
    await put_camera(h, "cam-2")

    def hour(value: float) -> datetime:
        return DAY + timedelta(hours=value)

    for recording_id, camera_id, start, end in (
        ("r1", "cam-1", hour(8), hour(9)),
        ("r2", "cam-1", hour(10), hour(11)),
        ("r3", "cam-2", hour(8.5), hour(9.5)),
        ("gone", "cam-1", hour(7), hour(12)),
    ):
        await put_recording(h, recording_request(recording_id, camera_id, start, end))
    await h.operator.DeleteRecording(
        operator_pb2.DeleteRecordingRequest(recording_id="gone"), metadata=h.admin
    )

    assert await list_recording_ids(h) == ["r1", "r3", "r2"]  # oldest start first
    assert await list_recording_ids(h, camera_id="cam-1") == ["r1", "r2"]
    assert await list_recording_ids(h, camera_id="cam-2") == ["r3"]
    assert await list_recording_ids(h, camera_id="cam-nowhere") == []
    # Overlap bounds are exclusive: r1 ends at 09:00, r3 starts at 08:30.
    assert await list_recording_ids(h, overlaps_from=hour(9)) == ["r3", "r2"]
    assert await list_recording_ids(h, overlaps_until=hour(8.5)) == ["r1"]
    assert await list_recording_ids(h, overlaps_from=hour(9.25), overlaps_until=hour(10.5)) == [
        "r3",
        "r2",
    ]
    assert await list_recording_ids(h, camera_id="cam-1", overlaps_from=hour(11)) == []

    first = await h.operator.ListRecordings(
        operator_pb2.ListRecordingsRequest(page_size=2), metadata=h.admin
    )
    assert [r.recording_id for r in first.recordings] == ["r1", "r3"]
    assert first.next_page_token
    second = await h.operator.ListRecordings(
        operator_pb2.ListRecordingsRequest(page_size=2, page_token=first.next_page_token),
        metadata=h.admin,
    )
    assert [r.recording_id for r in second.recordings] == ["r2"]
    assert second.next_page_token == ""
    malformed = operator_pb2.ListRecordingsRequest(page_token="not-a-token")
    await invalid(h, h.operator.ListRecordings, malformed)

    # r4 is put 20 days later, so it outlives the others by 20 days.
    h.clock.advance(timedelta(days=20))
    await put_recording(h, recording_request("r4", "cam-2", hour(6), hour(7)))
    assert await list_recording_ids(h) == ["r4", "r1", "r3", "r2"]
    h.clock.advance(timedelta(days=21))  # day 41: the first three are past their 40 days
    assert await list_recording_ids(h) == ["r4"]
    h.clock.advance(timedelta(days=20))
    assert await list_recording_ids(h) == []


# --- model versions --------------------------------------------------------------------------


def model_request(
    name: str = "detector",
    version: int = 1,
    weights_sha256: str = SHA_A,
    classes: tuple[str, ...] = ("person", "car"),
    input_shape: tuple[int, ...] = (3, 640, 640),
) -> operator_pb2.PublishModelVersionRequest:
    return operator_pb2.PublishModelVersionRequest(
        name=name,
        version=version,
        weights_sha256=weights_sha256,
        classes=classes,
        input_shape=input_shape,
    )


async def test_model_versions_are_immutable(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    first = await h.operator.PublishModelVersion(model_request(), metadata=h.admin)
    assert first.created
    version = first.model_version
    assert (version.name, version.version, version.weights_sha256) == ("detector", 1, SHA_A)
    assert list(version.classes) == ["person", "car"]
    assert list(version.input_shape) == [3, 640, 640]
    assert at(version.published_at) == EPOCH

    h.clock.advance(timedelta(minutes=1))
    again = await h.operator.PublishModelVersion(model_request(), metadata=h.admin)
    assert not again.created
    assert again.model_version == first.model_version

    for other in (
        model_request(weights_sha256=SHA_B),
        model_request(classes=("car", "person")),
        model_request(classes=("person",)),
        model_request(input_shape=(3, 320, 320)),
    ):
        info = await refused(
            h,
            h.operator.PublishModelVersion,
            other,
            Code.ABORTED,
            "ID_CONFLICT",
        )
        assert info.metadata["name"] == "detector"
    assert await h.count("model_versions") == 1


async def test_publish_model_version_refuses_bad_fields(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    for bad in (
        model_request(classes=()),
        model_request(classes=("person", "person")),
        model_request(classes=("person", "")),
        model_request(input_shape=()),
        model_request(input_shape=(3, 0, 640)),
        model_request(input_shape=(3, -7, 640)),
        model_request(version=0),
        model_request(version=-1),
        model_request(weights_sha256="0" * 63),
        model_request(name=""),
    ):
        await invalid(h, h.operator.PublishModelVersion, bad)
    assert await h.count("model_versions") == 0


async def test_list_model_versions_by_name_then_version(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    for name, version in (("plates", 2), ("detector", 3), ("plates", 1), ("detector", 1)):
        await h.operator.PublishModelVersion(
            model_request(name=name, version=version), metadata=h.admin
        )

    def pairs(reply: operator_pb2.ListModelVersionsResponse) -> list[tuple[str, int]]:
        return [(v.name, v.version) for v in reply.model_versions]

    everything = await h.operator.ListModelVersions(
        operator_pb2.ListModelVersionsRequest(), metadata=h.admin
    )
    assert pairs(everything) == [("detector", 1), ("detector", 3), ("plates", 1), ("plates", 2)]
    plates = await h.operator.ListModelVersions(
        operator_pb2.ListModelVersionsRequest(name="plates"), metadata=h.admin
    )
    assert pairs(plates) == [("plates", 1), ("plates", 2)]

    first = await h.operator.ListModelVersions(
        operator_pb2.ListModelVersionsRequest(page_size=3), metadata=h.admin
    )
    assert pairs(first) == [("detector", 1), ("detector", 3), ("plates", 1)]
    assert first.next_page_token
    second = await h.operator.ListModelVersions(
        operator_pb2.ListModelVersionsRequest(page_size=3, page_token=first.next_page_token),
        metadata=h.admin,
    )
    assert pairs(second) == [("plates", 2)]
    assert second.next_page_token == ""
    for token in ("garbage", "plates|x", "|1"):
        malformed = operator_pb2.ListModelVersionsRequest(page_token=token)
        await invalid(h, h.operator.ListModelVersions, malformed)


# --- buckets ---------------------------------------------------------------------------------


async def list_bucket_ids(h: CoordinatorHarness) -> list[str]:
    reply = await h.operator.ListBuckets(operator_pb2.ListBucketsRequest(), metadata=h.admin)
    return [bucket.bucket_id for bucket in reply.buckets]


async def test_bucket_ids_are_never_reused(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    create = operator_pb2.CreateBucketRequest(bucket_id="cars", name="Cars")
    first = await h.operator.CreateBucket(create, metadata=h.admin)
    assert (first.bucket.bucket_id, first.bucket.name) == ("cars", "Cars")
    assert at(first.bucket.created_at) == EPOCH
    h.clock.advance(timedelta(minutes=1))
    again = await h.operator.CreateBucket(create, metadata=h.admin)
    assert again.bucket == first.bucket

    other_name = operator_pb2.CreateBucketRequest(bucket_id="cars", name="Trucks")
    await refused(
        h,
        h.operator.CreateBucket,
        other_name,
        Code.ABORTED,
        "ID_CONFLICT",
    )
    await h.operator.CreateBucket(
        operator_pb2.CreateBucketRequest(bucket_id="people", name="People"), metadata=h.admin
    )
    assert await list_bucket_ids(h) == ["cars", "people"]

    deleted = await h.operator.DeleteBucket(
        operator_pb2.DeleteBucketRequest(bucket_id="cars"), metadata=h.admin
    )
    assert list(deleted.cancelled_run_ids) == []
    assert await list_bucket_ids(h) == ["people"]

    # The tombstone keeps the id: neither the old body nor a new one may take it.
    for request in (create, other_name):
        await refused(
            h,
            h.operator.CreateBucket,
            request,
            Code.ABORTED,
            "ID_CONFLICT",
        )
    for bucket_id in ("cars", "nowhere"):
        request_delete = operator_pb2.DeleteBucketRequest(bucket_id=bucket_id)
        await refused(
            h,
            h.operator.DeleteBucket,
            request_delete,
            Code.NOT_FOUND,
            "NOT_FOUND",
        )
    bad = operator_pb2.CreateBucketRequest(bucket_id="", name="x")
    await invalid(h, h.operator.CreateBucket, bad)
    assert await list_bucket_ids(h) == ["people"]


# --- keys ------------------------------------------------------------------------------------


async def create_key(
    h: CoordinatorHarness,
    *scopes: common_pb2.KeyScope,
    name: str = "agent",
    user_id: str = "",
    ttl: timedelta | None = None,
) -> operator_pb2.CreateKeyResponse:
    request = operator_pb2.CreateKeyRequest(name=name, scopes=scopes, user_id=user_id)
    if ttl is not None:
        request.ttl.CopyFrom(duration(ttl))
    return await h.operator.CreateKey(request, metadata=h.admin)


CLOCK = operator_pb2.GetClockRequest()


async def get_clock(h: CoordinatorHarness, metadata: Metadata) -> None:
    await h.operator.GetClock(CLOCK, metadata=metadata)


async def test_create_key_shows_its_secret_once_and_stores_only_its_hash(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await register_device(h, "gpu-box")
    await put_camera(h, "cam-1")
    reply = await create_key(
        h,
        scope(common_pb2.SCOPE_ADMIN),
        scope(common_pb2.SCOPE_WORKSHOP_RUN, device_id="gpu-box"),
        scope(common_pb2.SCOPE_FOOTAGE_READ, camera_ids=("cam-1",)),
        name="ops laptop",
    )
    secret = reply.secret
    assert secret
    assert reply.key.name == "ops laptop"
    assert at(reply.key.created_at) == EPOCH
    assert not reply.key.HasField("expires_at")
    assert not reply.key.HasField("revoked_at")
    assert [(s.scope, s.device_id, list(s.camera_ids)) for s in reply.key.scopes] == [
        (common_pb2.SCOPE_ADMIN, "", []),
        (common_pb2.SCOPE_WORKSHOP_RUN, "gpu-box", []),
        (common_pb2.SCOPE_FOOTAGE_READ, "", ["cam-1"]),
    ]

    # The secret authenticates an operator call.
    clock = await h.operator.GetClock(
        operator_pb2.GetClockRequest(), metadata=bearer_metadata(secret)
    )
    assert at(clock.now) == EPOCH

    # ListKeys never shows it.
    listed = await h.operator.ListKeys(operator_pb2.ListKeysRequest(), metadata=h.admin)
    assert reply.key.key_id in [key.key_id for key in listed.keys]
    assert secret.encode() not in listed.SerializeToString()
    assert secret not in str(listed)

    # Only its SHA-256 is stored.
    async with h.db.connection() as connection:
        row = await connection.fetchrow(
            "SELECT secret_hash, to_jsonb(k)::text AS everything FROM keys k WHERE key_id = $1",
            reply.key.key_id,
        )
    assert row["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    random_part = secret.split("_", 1)[-1]
    assert secret not in row["everything"]
    assert random_part not in row["everything"]


async def test_key_id_is_the_first_part_of_its_secret(coordinator: CoordinatorHarness) -> None:
    reply = await create_key(coordinator, scope(common_pb2.SCOPE_WORKSHOP))
    assert reply.secret.startswith(reply.key.key_id + ".")
    assert reply.key.key_id.startswith("wk_")


async def test_create_key_refuses_malformed_scopes(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    await register_device(h, "gpu-box")
    await put_camera(h, "cam-1")
    bad_scope_lists: list[tuple[common_pb2.KeyScope, ...]] = [
        (),
        (scope(common_pb2.SCOPE_WORKSHOP_RUN),),
        (scope(common_pb2.SCOPE_WORKSHOP_RUN, camera_ids=("cam-1",)),),
        (scope(common_pb2.SCOPE_FOOTAGE_READ),),
        (scope(common_pb2.SCOPE_UNSPECIFIED),),
        (scope(common_pb2.SCOPE_ADMIN, device_id="gpu-box"),),
        (scope(common_pb2.SCOPE_WORKSHOP), scope(common_pb2.SCOPE_FOOTAGE_READ)),
    ]
    for scopes in bad_scope_lists:
        request = operator_pb2.CreateKeyRequest(name="bad", scopes=scopes)
        await invalid(h, h.operator.CreateKey, request)
    negative = operator_pb2.CreateKeyRequest(
        name="bad", scopes=[scope(common_pb2.SCOPE_WORKSHOP)], ttl=Duration(seconds=-60)
    )
    await invalid(h, h.operator.CreateKey, negative)


async def test_create_key_refuses_unknown_devices_cameras_and_users(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await register_device(h, "gpu-box")
    await put_camera(h, "cam-1")
    requests = [
        operator_pb2.CreateKeyRequest(
            name="p", scopes=[scope(common_pb2.SCOPE_WORKSHOP_RUN, device_id="gpu-nowhere")]
        ),
        operator_pb2.CreateKeyRequest(
            name="f",
            scopes=[scope(common_pb2.SCOPE_FOOTAGE_READ, camera_ids=("cam-1", "cam-nowhere"))],
        ),
        operator_pb2.CreateKeyRequest(
            name="w", scopes=[scope(common_pb2.SCOPE_WORKSHOP, camera_ids=("cam-nowhere",))]
        ),
        operator_pb2.CreateKeyRequest(
            name="u", scopes=[scope(common_pb2.SCOPE_WORKSHOP)], user_id="nobody"
        ),
    ]
    for request in requests:
        await refused(
            h,
            h.operator.CreateKey,
            request,
            Code.NOT_FOUND,
            "NOT_FOUND",
        )
    # The same scopes with known names are fine.
    await create_key(h, scope(common_pb2.SCOPE_WORKSHOP_RUN, device_id="gpu-box"))
    await create_key(h, scope(common_pb2.SCOPE_FOOTAGE_READ, camera_ids=("cam-1",)))


async def test_a_revoked_key_stops_authenticating_at_once(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    reply = await create_key(h, scope(common_pb2.SCOPE_ADMIN), name="short-lived admin")
    metadata = bearer_metadata(reply.secret)
    await get_clock(h, metadata)

    h.clock.advance(timedelta(seconds=30))
    revoked = await h.operator.RevokeKey(
        operator_pb2.RevokeKeyRequest(key_id=reply.key.key_id), metadata=h.admin
    )
    assert at(revoked.key.revoked_at) == EPOCH + timedelta(seconds=30)
    await refused(
        h,
        h.operator.GetClock,
        CLOCK,
        Code.UNAUTHENTICATED,
        "CREDENTIAL_REJECTED",
        metadata=metadata,
    )

    # Idempotent: the first revocation time stays.
    h.clock.advance(timedelta(seconds=30))
    again = await h.operator.RevokeKey(
        operator_pb2.RevokeKeyRequest(key_id=reply.key.key_id), metadata=h.admin
    )
    assert again.key.revoked_at == revoked.key.revoked_at

    listed = await h.operator.ListKeys(operator_pb2.ListKeysRequest(), metadata=h.admin)
    assert reply.key.key_id not in [key.key_id for key in listed.keys]
    with_revoked = await h.operator.ListKeys(
        operator_pb2.ListKeysRequest(include_revoked=True), metadata=h.admin
    )
    assert reply.key.key_id in [key.key_id for key in with_revoked.keys]

    unknown = operator_pb2.RevokeKeyRequest(key_id="key_nowhere")
    await refused(h, h.operator.RevokeKey, unknown, Code.NOT_FOUND, "NOT_FOUND")


async def test_list_keys_is_newest_first(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    created = []
    for name in ("one", "two", "three"):
        h.clock.advance(timedelta(minutes=1))
        created.append((await create_key(h, scope(common_pb2.SCOPE_WORKSHOP), name=name)).key)
    listed = await h.operator.ListKeys(operator_pb2.ListKeysRequest(), metadata=h.admin)
    assert [key.name for key in listed.keys] == ["three", "two", "one", "admin"]


async def test_credentials_are_checked_before_anything_else(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    devices = operator_pb2.RegisterDeviceRequest(device_id="gpu-box")
    cases: list[tuple[Metadata, str]] = [
        ((), "CREDENTIAL_MISSING"),
        ((("authorization", "Basic dXNlcjpwYXNz"),), "CREDENTIAL_MALFORMED"),
        ((("authorization", "Bearer"),), "CREDENTIAL_MALFORMED"),
        ((("authorization", "Bearer a b"),), "CREDENTIAL_MALFORMED"),
        ((("authorization", "Bearer wk_unknown"),), "CREDENTIAL_REJECTED"),
        ((("authorization", "Bearer ws_unknown"),), "CREDENTIAL_REJECTED"),
    ]
    for metadata, reason in cases:
        await refused(
            h, h.operator.RegisterDevice, devices, Code.UNAUTHENTICATED, reason, metadata=metadata
        )


async def test_operator_calls_need_the_admin_scope(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    await register_device(h, "gpu-box")
    await put_camera(h, "cam-1")
    for grants in (
        (Grant(ScopeName.WORKSHOP),),
        (Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"),),
        (Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-1",)),),
        (Grant(ScopeName.SERVICE),),
        (Grant(ScopeName.GATEWAY),),
    ):
        metadata = bearer_metadata(await h.key(*grants, name="not admin"))
        calls: list[tuple[Method, Message]] = [
            (h.operator.RegisterDevice, operator_pb2.RegisterDeviceRequest(device_id="gpu-two")),
            (h.operator.ListCameras, operator_pb2.ListCamerasRequest()),
            (h.operator.ListBuckets, operator_pb2.ListBucketsRequest()),
            (h.operator.ListModelVersions, operator_pb2.ListModelVersionsRequest()),
            (
                h.operator.CreateKey,
                operator_pb2.CreateKeyRequest(
                    name="escalate", scopes=[scope(common_pb2.SCOPE_ADMIN)]
                ),
            ),
            (h.operator.RaisePolicyRevision, operator_pb2.RaisePolicyRevisionRequest()),
            (h.operator.GetClock, CLOCK),
            (h.operator.AdvanceClock, operator_pb2.AdvanceClockRequest(by=Duration(seconds=1))),
        ]
        if grants[0].scope is not ScopeName.WORKSHOP:  # which may list devices and runtimes
            calls += [
                (h.operator.ListDevices, operator_pb2.ListDevicesRequest()),
                (h.operator.ListRuntimes, operator_pb2.ListRuntimesRequest()),
            ]
        for method, request in calls:
            await refused(
                h, method, request, Code.PERMISSION_DENIED, "SCOPE_MISSING", metadata=metadata
            )


async def test_an_expired_key_is_rejected(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    reply = await create_key(h, scope(common_pb2.SCOPE_ADMIN), ttl=timedelta(hours=1))
    assert at(reply.key.expires_at) == EPOCH + timedelta(hours=1)
    metadata = bearer_metadata(reply.secret)
    h.clock.advance(timedelta(minutes=59, seconds=59))
    await get_clock(h, metadata)
    h.clock.advance(timedelta(seconds=1))
    await refused(
        h,
        h.operator.GetClock,
        CLOCK,
        Code.UNAUTHENTICATED,
        "CREDENTIAL_REJECTED",
        metadata=metadata,
    )
    listed = await h.operator.ListKeys(
        operator_pb2.ListKeysRequest(include_revoked=True), metadata=h.admin
    )
    assert reply.key.key_id in [key.key_id for key in listed.keys]


# --- users and sessions ----------------------------------------------------------------------


async def create_user(h: CoordinatorHarness, user_id: str, display_name: str) -> operator_pb2.User:
    reply = await h.operator.CreateUser(
        operator_pb2.CreateUserRequest(user_id=user_id, display_name=display_name),
        metadata=h.admin,
    )
    return reply.user


async def create_session(
    h: CoordinatorHarness, user_id: str, ttl: timedelta | None = None
) -> operator_pb2.CreateSessionResponse:
    request = operator_pb2.CreateSessionRequest(user_id=user_id)
    if ttl is not None:
        request.ttl.CopyFrom(duration(ttl))
    return await h.operator.CreateSession(request, metadata=h.admin)


WORKFLOWS = workshop_pb2.ListWorkflowsRequest()


async def list_workflows(h: CoordinatorHarness, metadata: Metadata) -> None:
    await h.workshop.ListWorkflows(WORKFLOWS, metadata=metadata)


async def test_create_user_is_idempotent(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    user = await create_user(h, "ana", "Ana")
    assert (user.user_id, user.display_name, user.disabled) == ("ana", "Ana", False)
    assert at(user.created_at) == EPOCH
    assert not user.HasField("disabled_at")
    h.clock.advance(timedelta(minutes=1))
    assert await create_user(h, "ana", "Ana") == user
    other = operator_pb2.CreateUserRequest(user_id="ana", display_name="Ana B.")
    await refused(h, h.operator.CreateUser, other, Code.ABORTED, "ID_CONFLICT")
    bad = operator_pb2.CreateUserRequest(user_id="ana smith", display_name="Ana")
    await invalid(h, h.operator.CreateUser, bad)
    assert await h.count("users") == 1


async def test_a_session_acts_on_the_workshop_until_revoked(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await create_user(h, "ana", "Ana")
    reply = await create_session(h, "ana")
    assert reply.secret
    assert reply.session.user_id == "ana"
    assert at(reply.session.created_at) == EPOCH
    assert at(reply.session.expires_at) == EPOCH + timedelta(hours=12)  # the default lifetime
    metadata = bearer_metadata(reply.secret)
    async with h.db.connection() as connection:
        stored = await connection.fetchval(
            "SELECT to_jsonb(s)::text FROM sessions s WHERE session_id = $1",
            reply.session.session_id,
        )
    assert hashlib.sha256(reply.secret.encode()).hexdigest() in stored
    assert reply.secret not in stored

    await list_workflows(h, metadata)
    await refused(
        h, h.operator.GetClock, CLOCK, Code.PERMISSION_DENIED, "SCOPE_MISSING", metadata=metadata
    )

    h.clock.advance(timedelta(minutes=10))
    revoked = await h.operator.RevokeSession(
        operator_pb2.RevokeSessionRequest(session_id=reply.session.session_id), metadata=h.admin
    )
    assert at(revoked.session.revoked_at) == EPOCH + timedelta(minutes=10)
    await refused(
        h,
        h.workshop.ListWorkflows,
        WORKFLOWS,
        Code.UNAUTHENTICATED,
        "CREDENTIAL_REJECTED",
        metadata=metadata,
    )
    again = await h.operator.RevokeSession(
        operator_pb2.RevokeSessionRequest(session_id=reply.session.session_id), metadata=h.admin
    )
    assert again.session.revoked_at == revoked.session.revoked_at
    unknown = operator_pb2.RevokeSessionRequest(session_id="ses_nowhere")
    await refused(h, h.operator.RevokeSession, unknown, Code.NOT_FOUND, "NOT_FOUND")


async def test_a_session_expires(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    await create_user(h, "ana", "Ana")
    reply = await create_session(h, "ana", ttl=timedelta(hours=2))
    assert at(reply.session.expires_at) == EPOCH + timedelta(hours=2)
    metadata = bearer_metadata(reply.secret)
    h.clock.advance(timedelta(hours=1, minutes=59))
    await list_workflows(h, metadata)
    h.clock.advance(timedelta(minutes=1))
    await refused(
        h,
        h.workshop.ListWorkflows,
        WORKFLOWS,
        Code.UNAUTHENTICATED,
        "CREDENTIAL_REJECTED",
        metadata=metadata,
    )
    for ttl in (timedelta(seconds=-1), timedelta(days=30, seconds=1)):
        bad = operator_pb2.CreateSessionRequest(user_id="ana", ttl=duration(ttl))
        await invalid(h, h.operator.CreateSession, bad)
    longest = await create_session(h, "ana", ttl=timedelta(days=30))
    assert at(longest.session.expires_at) == h.clock.now() + timedelta(days=30)
    unknown = operator_pb2.CreateSessionRequest(user_id="nobody")
    await refused(h, h.operator.CreateSession, unknown, Code.NOT_FOUND, "NOT_FOUND")


async def test_disabling_a_user_ends_their_sessions_and_keys(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await create_user(h, "ana", "Ana")
    session = await create_session(h, "ana")
    session_metadata = bearer_metadata(session.secret)
    agent = await create_key(h, scope(common_pb2.SCOPE_WORKSHOP), name="ana's agent", user_id="ana")
    assert agent.key.user_id == "ana"
    agent_metadata = bearer_metadata(agent.secret)
    await list_workflows(h, session_metadata)
    await list_workflows(h, agent_metadata)

    h.clock.advance(timedelta(minutes=3))
    disabled = await h.operator.DisableUser(
        operator_pb2.DisableUserRequest(user_id="ana"), metadata=h.admin
    )
    assert disabled.user.disabled
    assert at(disabled.user.disabled_at) == EPOCH + timedelta(minutes=3)
    for metadata in (session_metadata, agent_metadata):
        await refused(
            h,
            h.workshop.ListWorkflows,
            WORKFLOWS,
            Code.UNAUTHENTICATED,
            "CREDENTIAL_REJECTED",
            metadata=metadata,
        )

    h.clock.advance(timedelta(minutes=3))
    again = await h.operator.DisableUser(
        operator_pb2.DisableUserRequest(user_id="ana"), metadata=h.admin
    )
    assert again.user == disabled.user

    new_session = operator_pb2.CreateSessionRequest(user_id="ana")
    await refused(
        h,
        h.operator.CreateSession,
        new_session,
        Code.FAILED_PRECONDITION,
        "AUTHORITY_REVOKED",
    )
    unknown = operator_pb2.DisableUserRequest(user_id="nobody")
    await refused(h, h.operator.DisableUser, unknown, Code.NOT_FOUND, "NOT_FOUND")


# --- policy revision and clock ---------------------------------------------------------------


async def test_policy_revision_rises_by_one_and_refuses_stale_expectations(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    current = await h.operator.GetPolicyRevision(
        operator_pb2.GetPolicyRevisionRequest(), metadata=h.admin
    )
    assert current.revision == 1
    raised = await h.operator.RaisePolicyRevision(
        operator_pb2.RaisePolicyRevisionRequest(expected_revision=1), metadata=h.admin
    )
    assert raised.revision == 2
    unconditional = await h.operator.RaisePolicyRevision(
        operator_pb2.RaisePolicyRevisionRequest(), metadata=h.admin
    )
    assert unconditional.revision == 3

    for stale in (1, 2, 4):
        request = operator_pb2.RaisePolicyRevisionRequest(expected_revision=stale)
        info = await refused(
            h,
            h.operator.RaisePolicyRevision,
            request,
            Code.ABORTED,
            "STALE_REVISION",
        )
        assert info.metadata["current_revision"] == "3"
    after = await h.operator.GetPolicyRevision(
        operator_pb2.GetPolicyRevisionRequest(), metadata=h.admin
    )
    assert after.revision == 3


async def test_the_frozen_clock_moves_only_forward(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    clock = await h.operator.GetClock(operator_pb2.GetClockRequest(), metadata=h.admin)
    assert at(clock.now) == EPOCH
    assert clock.manual

    moved = await h.operator.AdvanceClock(
        operator_pb2.AdvanceClockRequest(by=Duration(seconds=300)), metadata=h.admin
    )
    assert at(moved.now) == EPOCH + timedelta(minutes=5)
    clock = await h.operator.GetClock(operator_pb2.GetClockRequest(), metadata=h.admin)
    assert at(clock.now) == EPOCH + timedelta(minutes=5)
    assert h.clock.now() == EPOCH + timedelta(minutes=5)

    target = EPOCH + timedelta(days=1)
    jumped = await h.operator.AdvanceClock(
        operator_pb2.AdvanceClockRequest(to=ts(target)), metadata=h.admin
    )
    assert at(jumped.now) == target
    standing = await h.operator.AdvanceClock(
        operator_pb2.AdvanceClockRequest(by=Duration()), metadata=h.admin
    )
    assert at(standing.now) == target

    for bad in (
        operator_pb2.AdvanceClockRequest(by=Duration(seconds=-1)),
        operator_pb2.AdvanceClockRequest(to=ts(target - timedelta(seconds=1))),
        operator_pb2.AdvanceClockRequest(),
    ):
        await invalid(h, h.operator.AdvanceClock, bad)
    assert h.clock.now() == target


async def test_last_used_at_is_recorded_at_most_once_a_minute(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    secret = await h.key(Grant(ScopeName.ADMIN), name="probe")
    probe = bearer_metadata(secret)

    async def last_used() -> object:
        async with h.db.connection() as connection:
            return await connection.fetchval("SELECT last_used_at FROM keys WHERE name = 'probe'")

    assert await last_used() is None
    await h.operator.GetPolicyRevision(operator_pb2.GetPolicyRevisionRequest(), metadata=probe)
    first = await last_used()
    assert first == h.clock.now()
    h.clock.advance(timedelta(seconds=30))
    await h.operator.GetPolicyRevision(operator_pb2.GetPolicyRevisionRequest(), metadata=probe)
    assert await last_used() == first
    h.clock.advance(timedelta(minutes=1))
    await h.operator.GetPolicyRevision(operator_pb2.GetPolicyRevisionRequest(), metadata=probe)
    assert await last_used() == h.clock.now()
