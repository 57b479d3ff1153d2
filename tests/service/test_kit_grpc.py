"""The server bootstrap, error interceptor and client channel, over real gRPC on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from workshop.kit import bounds, errors
from workshop.kit.channels import open_channel
from workshop.kit.requests import field_problem
from workshop.kit.server import GrpcService, Server, ServerSettings
from workshop.kit.status import status_for
from workshop.v1 import common_pb2, jobs_pb2, operator_pb2

SERVICE = "test.v1.Probe"
PROBE_MAX_REQUEST_BYTES = 1024


def _identity(data: bytes) -> bytes:
    return data


@dataclasses.dataclass
class Probe:
    """Behaviour of the test service: what the next call raises, and call counts."""

    raise_next: BaseException | None = None
    unavailable_first: int = 0
    sleep_seconds: float = 0.0
    calls: int = 0

    async def unary(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        self.calls += 1
        if self.calls <= self.unavailable_first:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        await asyncio.sleep(self.sleep_seconds)
        if self.raise_next is not None:
            raise self.raise_next
        return request

    async def stream(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        yield request
        if self.raise_next is not None:
            raise self.raise_next

    async def typed(
        self, request: jobs_pb2.ReportProgressRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> jobs_pb2.ReportProgressRequest:
        self.calls += 1
        return request

    async def collect(
        self,
        requests: AsyncIterator[jobs_pb2.ReportProgressRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> jobs_pb2.ReportProgressRequest:
        last = jobs_pb2.ReportProgressRequest()
        async for request in requests:
            self.calls += 1
            last = request
        return last

    def register(self, server: grpc.aio.Server) -> None:
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Unary": grpc.unary_unary_rpc_method_handler(self.unary, _identity, _identity),
                "Stream": grpc.unary_stream_rpc_method_handler(self.stream, _identity, _identity),
                "Missing": grpc.unary_unary_rpc_method_handler(
                    _not_implemented, _identity, _identity
                ),
                "Typed": grpc.unary_unary_rpc_method_handler(
                    self.typed,
                    jobs_pb2.ReportProgressRequest.FromString,
                    jobs_pb2.ReportProgressRequest.SerializeToString,
                ),
                "Collect": grpc.stream_unary_rpc_method_handler(
                    self.collect,
                    jobs_pb2.ReportProgressRequest.FromString,
                    jobs_pb2.ReportProgressRequest.SerializeToString,
                ),
            },
        )
        server.add_generic_rpc_handlers((handler,))


def _not_implemented(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    # What a generated base servicer does for an RPC nobody implemented yet.
    context.set_code(grpc.StatusCode.UNIMPLEMENTED)
    raise NotImplementedError("Method not implemented!")


@pytest.fixture
async def probe_server() -> AsyncIterator[tuple[Probe, Server]]:
    probe = Probe()
    server = Server(
        label="probe",
        settings=ServerSettings(port=0, drain_seconds=0.2, grace_seconds=1.0),
        services=[GrpcService(SERVICE, probe.register, max_request_bytes=PROBE_MAX_REQUEST_BYTES)],
    )
    await server.start()
    try:
        yield probe, server
    finally:
        await server.stop()


def _method(channel: grpc.aio.Channel, name: str, *, stream: bool = False) -> Any:
    path = f"/{SERVICE}/{name}"
    return channel.unary_stream(path) if stream else channel.unary_unary(path)


def _unary(channel: grpc.aio.Channel) -> Callable[..., Any]:
    return _method(channel, "Unary")  # type: ignore[no-any-return]


DOMAIN_ERRORS = sorted(
    (
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.WorkshopError)
    ),
    key=str,
)


@pytest.mark.parametrize("error_class", DOMAIN_ERRORS)
async def test_every_domain_error_maps_to_its_status(
    probe_server: tuple[Probe, Server], error_class: type[errors.WorkshopError]
) -> None:
    probe, server = probe_server
    probe.raise_next = error_class("Revision 3 is stale.", metadata={"current_revision": "4"})
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=1) as channel:
        call = _unary(channel)(b"x")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
    assert caught.value.code() == status_for(error_class("x")).grpc_code
    assert caught.value.details() == "Revision 3 is stale."
    status = rpc_status.from_call(caught.value)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.reason == error_class.reason
    assert info.metadata["current_revision"] == "4"


@pytest.mark.parametrize(
    "error",
    [ConnectionRefusedError(111, "refused"), ConnectionResetError(104, "reset"), TimeoutError()],
)
async def test_a_dependency_that_cannot_be_reached_is_unavailable_not_internal(
    probe_server: tuple[Probe, Server], error: BaseException
) -> None:
    """The standard library's own connection errors and timeouts, should one reach a
    servicer without a kit class, are UNAVAILABLE (safe to ask again), not a bug."""
    probe, server = probe_server
    probe.raise_next = error
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=1) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _unary(channel)(b"x")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    status = rpc_status.from_call(caught.value)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.reason == "UNAVAILABLE"


async def test_subclass_inherits_mapping(probe_server: tuple[Probe, Server]) -> None:
    class StaleRevision(errors.Conflict):
        reason = "STALE_REVISION"

    probe, server = probe_server
    probe.raise_next = StaleRevision("stale")
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=1) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _unary(channel)(b"x")
    assert caught.value.code() == grpc.StatusCode.ABORTED


async def test_unexpected_error_is_internal_without_leaking(
    probe_server: tuple[Probe, Server], caplog: pytest.LogCaptureFixture
) -> None:
    probe, server = probe_server
    probe.raise_next = KeyError("secret-table-name")
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=1) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _unary(channel)(b"x")
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "secret-table-name" not in (caught.value.details() or "")
    assert "secret-table-name" in caplog.text


async def test_not_implemented_is_unimplemented(probe_server: tuple[Probe, Server]) -> None:
    _, server = probe_server
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=1) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _method(channel, "Missing")(b"x")
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_stream_errors_are_mapped_after_items(probe_server: tuple[Probe, Server]) -> None:
    probe, server = probe_server
    probe.raise_next = errors.NotFound("run r1 does not exist")
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=1) as channel:
        call = _method(channel, "Stream", stream=True)(b"first")
        assert await call.read() == b"first"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_channel_retries_unavailable(probe_server: tuple[Probe, Server]) -> None:
    probe, server = probe_server
    probe.unavailable_first = 2
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=5) as channel:
        assert await _unary(channel)(b"hello") == b"hello"
    assert probe.calls == 3


async def test_channel_gives_up_after_max_attempts(probe_server: tuple[Probe, Server]) -> None:
    probe, server = probe_server
    probe.unavailable_first = 10
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=3) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _unary(channel)(b"hello")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert probe.calls == 3


async def test_channel_applies_default_deadline(probe_server: tuple[Probe, Server]) -> None:
    probe, server = probe_server
    probe.sleep_seconds = 2.0
    async with open_channel(f"127.0.0.1:{server.port}", deadline_seconds=0.2) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _unary(channel)(b"x")
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_health_goes_not_serving_on_stop(probe_server: tuple[Probe, Server]) -> None:
    _, server = probe_server
    async with open_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=SERVICE))
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        stopping = asyncio.create_task(server.stop())
        second = await watch.read()
        assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
        await stopping


def _reason(error: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(error)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return str(info.reason)


# A ReportProgressRequest whose lease.run_id (field 1 of field 1) is not UTF-8.
INVALID_UTF8 = b"\x0a\x04\x0a\x02\xff\xfe"
VALID = jobs_pb2.ReportProgressRequest(
    lease=common_pb2.LeaseRef(run_id="r1", job_id="j0", generation=1, token="t"), percent=5
).SerializeToString()


@pytest.mark.parametrize(
    "data",
    [VALID[:-3], b"\xff\xff\xff\xff", INVALID_UTF8, b"\x0a\x7f" + b"x" * 10],
    ids=["truncated", "random", "invalid-utf8", "length-past-end"],
)
async def test_undecodable_request_is_invalid_argument(
    probe_server: tuple[Probe, Server], data: bytes
) -> None:
    probe, server = probe_server
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=1) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _method(channel, "Typed")(data)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _reason(caught.value) == "MALFORMED_REQUEST"
    assert "not a valid request of test.v1.Probe/Typed" in (caught.value.details() or "")
    assert probe.calls == 0


async def test_enum_number_outside_its_enum_is_invalid_field(
    probe_server: tuple[Probe, Server],
) -> None:
    probe, server = probe_server
    data = VALID + b"\x18\x63"  # phase (field 3) = 99
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=1) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _method(channel, "Typed")(data)
        # a known phase passes through
        echoed = await _method(channel, "Typed")(VALID + b"\x18\x02")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _reason(caught.value) == "INVALID_FIELD"
    assert caught.value.details() == (
        "phase is 99, which is not a JobPhase; send one of JOB_PHASE_DOWNLOADING, "
        "JOB_PHASE_DECODING, JOB_PHASE_LABELING, JOB_PHASE_PUBLISHING, JOB_PHASE_COMMITTING."
    )
    assert jobs_pb2.ReportProgressRequest.FromString(echoed).phase == 2
    assert probe.calls == 1


def test_enum_check_finds_nested_repeated_and_map_values() -> None:
    request = jobs_pb2.CompleteRequest()
    request.result.slots.add(slot_index=0, outcome=common_pb2.SLOT_OUTCOME_FRAME)
    request.result.slots.add(slot_index=1, outcome=41)
    problem = field_problem(request)
    assert problem is not None
    assert problem.metadata == {"field": "result.slots[1].outcome"}
    request.result.slots[1].outcome = common_pb2.SLOT_OUTCOME_EMPTY
    assert field_problem(request) is None
    # a map of messages (google.protobuf.Struct: map<string, Value>, Value.null_value an enum)
    document = struct_pb2.Struct()
    document.fields["a"].null_value = 3  # type: ignore[assignment]
    problem = field_problem(document)
    assert problem is not None
    assert problem.metadata == {"field": "fields['a'].null_value"}
    # a type that holds itself (Struct -> Value -> ListValue -> Value -> Struct), at depth
    deep = struct_pb2.Struct()
    deep.update({"a": {"b": ["x", {"c": "d\0"}]}})
    problem = field_problem(deep)
    assert problem is not None
    assert problem.metadata == {
        "field": "fields['a'].struct_value.fields['b'].list_value.values[1].struct_value"
        ".fields['c'].string_value"
    }
    deep.update({"a": {"b": ["x", {"c": "d"}]}})
    assert field_problem(deep) is None


def test_timestamps_and_durations_out_of_their_range_are_invalid_fields() -> None:
    request = jobs_pb2.CompleteRequest()
    request.result.slots.add(slot_index=0).frame_time.seconds = 2**40
    problem = field_problem(request)
    assert problem is not None
    assert problem.metadata == {"field": "result.slots[0].frame_time"}
    assert "0001-01-01 to 9999-12-31" in problem.message
    request.result.slots[0].frame_time.seconds = 0
    request.result.slots[0].frame_time.nanos = -1
    assert field_problem(request) is not None
    request.result.slots[0].frame_time.nanos = 999_999_999
    assert field_problem(request) is None
    clock = operator_pb2.AdvanceClockRequest()
    clock.by.seconds, clock.by.nanos = 5, -1
    problem = field_problem(clock)
    assert problem is not None
    assert problem.metadata == {"field": "by"}


async def test_request_limit_counts_unknown_fields(probe_server: tuple[Probe, Server]) -> None:
    probe, server = probe_server
    unknown = b"\xfa\x3f" + bytes([0x80 | 0x7F, 0x07]) + b"u" * 1023  # field 1023, 1023 bytes
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=1) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _method(channel, "Typed")(VALID + unknown)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _reason(caught.value) == "PAYLOAD_TOO_LARGE"
    assert f"at most {PROBE_MAX_REQUEST_BYTES} are accepted" in (caught.value.details() or "")
    assert probe.calls == 0


async def test_a_refused_message_in_a_client_stream_ends_the_call(
    probe_server: tuple[Probe, Server],
) -> None:
    probe, server = probe_server
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=1) as channel:
        collect: Any = channel.stream_unary(f"/{SERVICE}/Collect")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await collect(iter([VALID, INVALID_UTF8, VALID]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _reason(caught.value) == "MALFORMED_REQUEST"
    assert probe.calls == 1


async def test_errors_quoting_huge_values_stay_bounded(probe_server: tuple[Probe, Server]) -> None:
    probe, server = probe_server
    huge = "x" * 8000
    probe.raise_next = errors.NotFound(
        f"Run {huge!r} does not exist; its workflow {'é' * 3000} neither.",
        metadata={"id": huge, **{f"k{index}": huge for index in range(40)}},
    )
    async with open_channel(f"127.0.0.1:{server.port}", max_attempts=1) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _unary(channel)(b"x")
    details = caught.value.details() or ""
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert details.startswith(f"Run '{'x' * bounds.QUOTED_VALUE_MAX_CHARS}…' does not exist")
    assert len(details.encode()) <= bounds.MESSAGE_MAX_BYTES
    trailers = caught.value.trailing_metadata() or ()
    size = sum(len(key) + len(value) for key, value in trailers)
    assert size <= bounds.TRAILERS_MAX_BYTES
    status = rpc_status.from_call(caught.value)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.metadata["id"] == "x" * bounds.QUOTED_VALUE_MAX_CHARS + "…"
    assert len(info.metadata) <= bounds.METADATA_MAX_ENTRIES


def test_bounded_text_keeps_json_valid_and_apostrophes_alone() -> None:
    import json

    problems = json.dumps([{"step_id": "s" * 500, "message": "Step 's' doesn't exist."}])
    assert json.loads(bounds.bounded_text(problems, 4096))[0]["step_id"] == "s" * 200 + "…"
    text = "The user doesn't exist " + "and " * 100 + "so on."
    assert bounds.bounded_text(text, 4096) == text
    assert bounds.bounded_message("\ud800 lone") == "? lone"
