"""The defects a user's bad-input sweep found, each pinned on the real servers.

The generated sweep (tests/service/test_sweep.py) proves no request crashes a handler; these
say what the right answer is for each case it was built from: undecodable bytes,
ids of 8,000 characters, ids ending in a newline, enum numbers outside their enum,
a request over 64 KiB made of unknown fields, and wording meant for someone else.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.preview.errors import StorageMisconfigured
from services.preview.storage import ObjectStore
from testbed.coordinator_leases import leased, setup
from testbed.coordinator_world import error_reason, run_request, save_workflow, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import preview_settings
from testbed.harness.s3 import S3Bucket
from workshop.kit import bounds
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import workshop_pb2 as ws

CREATE_RUN = "/workshop.v1.WorkshopService/CreateRun"
SAVE_WORKFLOW = "/workshop.v1.WorkshopService/SaveWorkflow"
COMPLETE = "/workshop.v1.JobService/Complete"


async def raw_call(c: CoordinatorHarness, path: str, data: bytes, metadata: Any) -> Any:
    """`data` as the request of `path`, as bytes on the wire; the refusal it gets."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.channel.unary_unary(path)(data, metadata=metadata)
    return caught.value


@pytest.mark.parametrize("path", [CREATE_RUN, SAVE_WORKFLOW, COMPLETE])
@pytest.mark.parametrize(
    "data",
    [b"\x0a\x10only-half", b"\xde\xad\xbe\xef\xff", b"\x0a\x03r\xff1"],
    ids=["truncated", "random", "invalid-utf8"],
)
async def test_undecodable_requests_are_invalid_argument(
    coordinator: CoordinatorHarness, path: str, data: bytes
) -> None:
    refused = await raw_call(coordinator, path, data, coordinator.admin)
    code, reason, _ = error_reason(refused)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST")
    assert details(refused).startswith(f"The request is not a valid request of {path[1:]}")


async def test_a_huge_id_is_quoted_short_and_the_error_arrives(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    huge = "r" * 8000
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.GetRun(ws.GetRunRequest(run_id=huge), metadata=c.admin)
    code, reason, metadata = error_reason(caught.value)
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")  # not "Stream removed"
    assert len(details(caught.value).encode()) <= bounds.MESSAGE_MAX_BYTES
    assert f"'{'r' * bounds.QUOTED_VALUE_MAX_CHARS}…'" in details(caught.value)
    assert metadata["id"] == "r" * bounds.QUOTED_VALUE_MAX_CHARS + "…"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.CreateRun(run_request(huge, "yard", "rt"), metadata=c.admin)
    assert error_reason(caught.value)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    assert len(details(caught.value).encode()) <= bounds.MESSAGE_MAX_BYTES


async def test_ids_ending_in_a_newline_are_refused(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await setup(c)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.CreateRun(
            run_request("nl\n", "yard", s.world.tracking_runtime), metadata=c.admin
        )
    assert error_reason(caught.value)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await save_workflow(c, "wf-nl\n", workflow_spec())
    assert error_reason(caught.value)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    assert await c.count("runs") == 0
    assert await c.count("workflows") == 1  # yard, from the set-up


async def test_an_unknown_phase_is_invalid_argument(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s, job = await leased(c)
    request = jobs_pb2.ReportProgressRequest(lease=job.lease, percent=5)
    data = request.SerializeToString() + b"\x18\x63"  # phase = 99
    refused = await raw_call(c, "/workshop.v1.JobService/ReportProgress", data, s.processor)
    code, reason, metadata = error_reason(refused)
    assert (code, reason, metadata) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
        {"field": "phase"},
    )
    assert "JOB_PHASE_DECODING" in details(refused)


async def test_the_64_kib_limit_counts_unknown_fields(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await setup(c)
    request = run_request("big", "yard", s.world.tracking_runtime).SerializeToString()
    padding = 70_000
    unknown = b"\xfa\x3f" + _varint(padding) + b"u" * padding  # field 1023, never defined
    refused = await raw_call(c, CREATE_RUN, request + unknown, c.admin)
    code, reason, metadata = error_reason(refused)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "PAYLOAD_TOO_LARGE")
    assert metadata == {"limit_bytes": str(64 * 1024)}
    assert await c.count("runs") == 0


async def test_mode_names_the_values_a_grpc_caller_sends(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await setup(c)
    request = run_request("r1", "yard", s.world.tracking_runtime)
    request.mode = common_pb2.RUN_MODE_UNSPECIFIED
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.CreateRun(request, metadata=c.admin)
    assert details(caught.value) == "mode must be RUN_MODE_TEST or RUN_MODE_FULL."


async def test_a_rejected_key_is_not_told_to_sign_in(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.ListRuns(
            ws.ListRunsRequest(), metadata=bearer_metadata("wk_0000000000000000.unknown")
        )
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "sign in" not in details(caught.value)
    assert "valid key" in details(caught.value)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.ListRuns(ws.ListRunsRequest(), metadata=bearer_metadata("ws_nope.x"))
    assert "sign in again" in details(caught.value)


async def test_a_stale_create_run_says_what_to_do(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await setup(c)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.CreateRun(
            run_request("r1", "yard", s.world.tracking_runtime, revision=2), metadata=c.admin
        )
    assert error_reason(caught.value)[:2] == (grpc.StatusCode.ABORTED, "STALE_REVISION")
    assert "apply your change" not in details(caught.value)
    assert "create the run against the current revision" in details(caught.value)


async def test_wrong_s3_keys_are_a_configuration_error(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> None:
    key = await coordinator.key(Grant(ScopeName.SERVICE), name="preview-service")
    settings = preview_settings(coordinator, s3_bucket, key, s3_secret_key="not-the-secret")
    store = ObjectStore(settings)
    try:
        with pytest.raises(StorageMisconfigured) as caught:
            await store.put("previews/x.jpg", b"x", "image/jpeg")
    finally:
        store.close()
    assert "retry later" not in caught.value.message
    assert "configuration error" in caught.value.message


def details(error: grpc.aio.AioRpcError) -> str:
    return error.details() or ""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
