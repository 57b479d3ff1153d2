"""The bad-input sweep: every RPC of every served service, fed generated requests.

For each server (coordinator, preview service, gateway, processor) and each RPC it
serves (the services of `libs/workshop/v1`'s descriptors, health and reflection:
`SERVED` below, which `test_the_sweep_covers_every_served_rpc` checks against what
each running server lists over reflection, so a new RPC is swept without a change
here and a served service the sweep does not know fails), hypothesis draws request
bytes from `tests/sweep/strategies.py` (every field type, nested and repeated
fields, maps, oneofs, enum numbers outside their enum, huge strings, bytes and
repeated fields, invalid UTF-8, unknown fields, truncated and random bytes) and
sends each one twice through a raw channel: with a valid credential of the kind
the RPC wants, and with none. Every answer must hold:

- never UNKNOWN or INTERNAL; UNIMPLEMENTED only for the RPCs documented as not
  implemented yet (`NOT_IMPLEMENTED_YET`; none today);
- an answer before the deadline (10 s; 3 s for server streams, which are read until
  they end or stay quiet for 50 ms; 1.5 s for Claim, a long poll);
- an error's message at most `bounds.MESSAGE_MAX_BYTES` (1 KiB) of UTF-8 and its
  trailers, grpc-status-details-bin included, at most `bounds.TRAILERS_MAX_BYTES`
  (9 KiB); a Workshop service's error carries its ErrorInfo;
- a WorkshopService request over 64 KiB is PAYLOAD_TOO_LARGE;
- without a credential, no Workshop RPC succeeds;
- a refusal leaves the coordinator's database as it was (an md5 of every table's
  rows, taken before and after), but for the refusals documented to record
  something (`REFUSALS_THAT_WRITE`).

The default run is small and the same every time (derandomized); for a long one
set WORKSHOP_SWEEP_EXAMPLES, e.g. `WORKSHOP_SWEEP_EXAMPLES=2000 pytest
tests/service/test_sweep.py` (random examples, a different set on each run). A summary
line (RPCs, calls, seconds, answers by code) is printed at the end.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import os
import pkgutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import workshop.v1
from services.coordinator.app import WORKSHOP_REQUEST_MAX_BYTES
from services.coordinator.platform.errors import FENCE_MESSAGES
from testbed.harness.postgres import PostgresTemplate, cloned_database
from testbed.harness.processes import GATEWAY_ALONE, PROCESSOR_ALONE, ServiceProcess, prefixed
from testbed.harness.s3 import S3Server, fresh_bucket
from tests.sweep.report import SUMMARY
from tests.sweep.stack import (
    Answer,
    BackgroundLoop,
    InProcess,
    Metadata,
    Target,
    call,
    raw_channel,
    started_in_process,
)
from tests.sweep.strategies import Pools, RequestStrategies
from workshop.kit import bounds

pytestmark = [
    pytest.mark.filterwarnings("ignore:Generating overly large repr"),
    pytest.mark.timeout(600),
]

EXAMPLES = int(os.environ.get("WORKSHOP_SWEEP_EXAMPLES", "0"))
settings.register_profile(
    "sweep",
    max_examples=EXAMPLES or 6,
    deadline=None,
    derandomize=not EXAMPLES,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)
SWEEP = settings.get_profile("sweep")

HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
REFLECTION = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
# Where each Workshop service is served; the rest are the coordinator's.
SERVER_OF = {
    "workshop.v1.PreviewService": "preview",
    "workshop.v1.EvaluationService": "processor",
}
# RPCs documented as not implemented yet (none today).
NOT_IMPLEMENTED_YET: set[str] = set()
REQUEST_LIMITS = {"workshop.v1.WorkshopService": WORKSHOP_REQUEST_MAX_BYTES}
LONG_POLLS = {"/workshop.v1.JobService/Claim": 1.5}
DEADLINE_SLACK_SECONDS = 2.0
# Refusals documented to write something (method, ErrorInfo reason) -> where it is written
# down: a fenced preview record still records its object, as collectable, so its bytes
# are deleted; a failed login is counted against its user and client address (a row of
# login_failures each). Nothing else may change the coordinator's tables when it refuses.
FENCE_REASONS = tuple(FENCE_MESSAGES)
REFUSALS_THAT_WRITE: dict[tuple[str, str], str] = {
    **{
        (f"/workshop.v1.PublicationService/{method}", reason): "docs/previews-and-uploads.md"
        for method in ("RecordPreview", "RecordPreviews")
        for reason in FENCE_REASONS
    },
    ("/workshop.v1.IdentityService/Login", "LOGIN_FAILED"): "docs/concepts.md#signing-in",
}


def workshop_services() -> list[ServiceDescriptor]:
    """Every service of the generated contracts in libs/workshop/v1."""
    found = []
    for module in pkgutil.iter_modules(workshop.v1.__path__):
        if module.name.endswith("_pb2"):
            contract = importlib.import_module(f"workshop.v1.{module.name}")
            found += contract.DESCRIPTOR.services_by_name.values()
    return sorted(found, key=lambda service: service.full_name)


def served() -> dict[str, list[ServiceDescriptor]]:
    """Each server's services: its Workshop services, health and reflection."""
    servers: dict[str, list[ServiceDescriptor]] = {
        name: [] for name in ("coordinator", "preview", "gateway", "processor")
    }
    for service in workshop_services():
        servers[SERVER_OF.get(service.full_name, "coordinator")].append(service)
    for services in servers.values():
        services += [HEALTH, REFLECTION]
    return servers


SERVED = served()


@dataclasses.dataclass(frozen=True)
class Rpc:
    server: str
    method: MethodDescriptor

    @property
    def path(self) -> str:
        return f"/{self.method.containing_service.full_name}/{self.method.name}"

    @property
    def service(self) -> str:
        return self.method.containing_service.full_name


RPCS = [
    Rpc(server, method)
    for server, services in SERVED.items()
    for service in services
    for method in service.methods
]


class Case:
    """One request's bytes, with a repr short enough to read in a failure report."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        shown = self.data if len(self.data) <= 120 else self.data[:120] + b"..."
        return f"Case({len(self.data)} bytes: {shown!r})"


@dataclasses.dataclass
class Tally:
    rpcs: set[str] = dataclasses.field(default_factory=set)
    calls: int = 0
    seconds: float = 0.0
    codes: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


TALLY = Tally()


# servers ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sweep_loop() -> Iterator[BackgroundLoop]:
    loop = BackgroundLoop()
    began = time.monotonic()
    yield loop
    loop.close()
    if TALLY.calls:
        codes = ", ".join(f"{code} {count}" for code, count in TALLY.codes.most_common())
        SUMMARY.append(
            f"sweep: {len(TALLY.rpcs)} RPCs x {SWEEP.max_examples} cases x 2 credentials = "
            f"{TALLY.calls} calls, {time.monotonic() - began:.1f} s in all "
            f"({TALLY.seconds:.1f} s waiting for answers): {codes}"
        )


@pytest.fixture(scope="module")
def in_process(
    sweep_loop: BackgroundLoop, pg_template: PostgresTemplate, s3_server: S3Server
) -> Iterator[InProcess]:
    with (
        cloned_database(pg_template) as database,
        fresh_bucket(s3_server) as bucket,
        started_in_process(sweep_loop, database.dsn, bucket) as targets,
    ):
        yield targets


@pytest.fixture(scope="module")
def coordinator_target(in_process: InProcess) -> Target:
    return in_process.coordinator


@pytest.fixture(scope="module")
def preview_target(in_process: InProcess) -> Target:
    return in_process.preview


def process_target(
    loop: BackgroundLoop, server: str, env: dict[str, str], log: Path
) -> Iterator[Target]:
    service = ServiceProcess(f"services.{server}", env, log)
    try:
        port = int(service.wait_event("serving", timeout=60)["port"])
        channel_context = raw_channel(port)
        channel = loop.run(channel_context.__aenter__())
        try:
            # health and reflection take no credential; an unknown one must not matter
            yield Target(server, port, channel, lambda _: (), RequestStrategies(Pools()))
        finally:
            loop.run(channel_context.__aexit__(None, None, None))
    finally:
        service.stop()


@pytest.fixture(scope="module")
def gateway_target(
    sweep_loop: BackgroundLoop, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    log = tmp_path_factory.mktemp("sweep") / "gateway.log"
    yield from process_target(sweep_loop, "gateway", prefixed("GATEWAY", GATEWAY_ALONE), log)


@pytest.fixture(scope="module")
def processor_target(
    sweep_loop: BackgroundLoop, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    log = tmp_path_factory.mktemp("sweep") / "processor.log"
    yield from process_target(sweep_loop, "processor", prefixed("PROCESSOR", PROCESSOR_ALONE), log)


# the sweep ----------------------------------------------------------------------------------


@pytest.mark.parametrize("rpc", RPCS, ids=[f"{rpc.server}:{rpc.path}" for rpc in RPCS])
def test_no_request_crashes_a_handler(
    rpc: Rpc, sweep_loop: BackgroundLoop, request: pytest.FixtureRequest
) -> None:
    target: Target = request.getfixturevalue(f"{rpc.server}_target")
    strategy = target.strategies.request(rpc.method.input_type, target.examples.get(rpc.path, ()))
    state = {"digest": target.digest() if target.digest else None}

    @SWEEP
    @given(st.builds(Case, strategy))
    def sweep(case: Case) -> None:
        for metadata in (target.credential(rpc.path), ()):
            before = state["digest"]
            answer = sweep_loop.run(
                call(target.channel, rpc.method, case.data, metadata, LONG_POLLS.get(rpc.path))
            )
            after = target.digest() if target.digest else None
            state["digest"] = after
            _count(rpc, answer)
            check(rpc, case, metadata, answer)
            if answer.code != grpc.StatusCode.OK and before != after:
                _check_write_is_documented(rpc, answer, before or {}, after or {})

    sweep()


def check(rpc: Rpc, case: Case, metadata: Metadata, answer: Answer) -> None:
    code, who = answer.code, "with a credential" if metadata else "without a credential"
    where = f"{rpc.path} {who} answered {code.name} {answer.details[:300]!r}"
    assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), where
    if code == grpc.StatusCode.UNIMPLEMENTED:
        assert rpc.path in NOT_IMPLEMENTED_YET, where
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"{where}: no answer before the deadline"
    assert answer.seconds <= answer.deadline + DEADLINE_SLACK_SECONDS, where
    limit = REQUEST_LIMITS.get(rpc.service)
    if limit is not None and len(case.data) > limit:
        assert (code, _reason(answer)) == (grpc.StatusCode.INVALID_ARGUMENT, "PAYLOAD_TOO_LARGE"), (
            where
        )
    workshop = rpc.service.startswith("workshop.v1.")
    if workshop and not metadata:
        assert code != grpc.StatusCode.OK, f"{where}: a Workshop RPC served no credential"
    if code == grpc.StatusCode.OK:
        return
    assert len(answer.details.encode()) <= bounds.MESSAGE_MAX_BYTES, where
    trailers = sum(len(key) + len(value) for key, value in answer.trailers)
    assert trailers <= bounds.TRAILERS_MAX_BYTES, f"{where}: {trailers} bytes of trailers"
    if workshop:
        assert _reason(answer), f"{where}: no ErrorInfo"


def _reason(answer: Answer) -> str:
    if answer.error is None:
        return ""
    status = rpc_status.from_call(answer.error)
    if status is None or not status.details:
        return ""
    info = error_details_pb2.ErrorInfo()
    if not status.details[0].Unpack(info) or info.domain != "workshop":
        return ""
    assert status.message == answer.details
    return str(info.reason)


def _check_write_is_documented(
    rpc: Rpc, answer: Answer, before: dict[str, str], after: dict[str, str]
) -> None:
    changed = sorted(table for table in after if before.get(table) != after[table])
    reason = _reason(answer)
    if reason in FENCE_REASONS and changed == ["job_attempts"]:
        return  # a fence refusal is counted on its attempt (docs/runs-and-jobs.md, timeline)
    assert (rpc.path, reason) in REFUSALS_THAT_WRITE, (
        f"{rpc.path} refused ({answer.code.name} {reason}: {answer.details[:200]!r}) "
        f"but changed tables {changed}"
    )


def _count(rpc: Rpc, answer: Answer) -> None:
    TALLY.rpcs.add(f"{rpc.server}:{rpc.path}")
    TALLY.calls += 1
    TALLY.seconds += answer.seconds
    TALLY.codes[answer.code.name] += 1


# coverage -----------------------------------------------------------------------------------


@pytest.mark.parametrize("server", list(SERVED))
def test_the_sweep_covers_every_served_rpc(
    server: str, sweep_loop: BackgroundLoop, request: pytest.FixtureRequest
) -> None:
    """What the running server lists over reflection, method by method, is what is swept."""
    target: Target = request.getfixturevalue(f"{server}_target")
    live = sweep_loop.run(_served_methods(target))
    swept = {rpc.path for rpc in RPCS if rpc.server == server}
    assert live == swept


async def _served_methods(target: Target) -> set[str]:
    reflect = target.channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    listing = [reflection_pb2.ServerReflectionRequest(list_services="")]
    names = [
        service.name
        async for reply in reflect(iter(listing), timeout=10)
        for service in reply.list_services_response.service
    ]
    asks = [reflection_pb2.ServerReflectionRequest(file_containing_symbol=name) for name in names]
    methods: set[str] = set()
    async for reply in reflect(iter(asks), timeout=10):
        for data in reply.file_descriptor_response.file_descriptor_proto:
            file = descriptor_pb2.FileDescriptorProto.FromString(data)
            for service in file.service:
                full = f"{file.package}.{service.name}" if file.package else service.name
                if full in names:
                    methods |= {f"/{full}/{method.name}" for method in service.method}
    return methods


def test_every_workshop_service_is_swept_on_some_server() -> None:
    swept = {rpc.service for rpc in RPCS}
    assert {service.full_name for service in workshop_services()} <= swept
    assert set(SERVER_OF.values()) <= set(SERVED)


def test_the_sweep_itself_is_small_by_default() -> None:
    """The default run fits the suite's budget: a handful of examples per RPC, the same
    ones every run."""
    if EXAMPLES:
        pytest.skip("WORKSHOP_SWEEP_EXAMPLES asks for a long run")
    assert SWEEP.max_examples <= 10
    assert SWEEP.derandomize
