"""The whole stack under faults, then checked by SQL and by listing S3.

`python -m bench.chaos_soak` starts Postgres, SeaweedFS and Triton, 2 coordinators, 2
preview services, a gateway and 3 processors (each its own process, on ports chosen at
start that a restart keeps), then for `--seconds` (default 540; `--short`: 120):

- a workload through the gateway (the demo user's Agent key) and the operator API (admin
  key): test and full runs, photos, cancellations, recording replacements (a new
  generation of a recording some run admitted) and policy raises;
- a fault injector, seeded (`--seed`), that goes through the fault kinds in a shuffled
  order, again and again: SIGKILL or SIGSTOP one processor, coordinator, preview service
  or the gateway (a killed process is started again on its ports after a second or
  two; a stopped one gets SIGCONT after a pause, up to 1.5 leases for a processor and
  0.4 of a lease for the others), restart Postgres (`pg_ctl stop -m fast`: a crash
  would lose acknowledged commits with the test cluster's `synchronous_commit=off`),
  terminate every client connection of the database, restart SeaweedFS (SIGKILL), kill
  Triton (SIGKILL to its process group) and start it again.

Leases last `COORDINATOR_LEASE_SECONDS` = 15 s here (maintenance every second), so a
dead or paused processor's jobs come back within the soak. Then the workload and the
injector stop, every process is up, the soak waits for the jobs to end, runs cleanup
passes (`RunCleanup`) and checks (bench/chaos_soak.sql; a trigger it installs records
every change of a job's state or lease generation with its holder and instant):

- every job ended exactly once (or is still live); every completed job has one receipt
  from its last lease; every run the gateway acknowledged exists;
- no bucket item without its job's receipt, no receipt whose item count differs from
  the items kept (no bucket holding part of a job), every item's image an object of the
  receipt's lease, present in S3 and never collectable;
- no object published or staged outside its lease generation's lifetime, no receipt
  from a lease other than the one the completion ended;
- no job failed by a fault that was not its own: `processor_failed` never (the soak's
  recordings and model are good), `source_changed` only for a replaced recording,
  `authority_lost` only after a policy raise, `attempts_exhausted` only when each lapse
  is explained;
- every lease lapse explained: its holder (the claiming key, one per processor) was
  killed or stopped while it held the lease;
- every S3 object known and not collectable after the cleanup passes (bytes written but
  never recorded, under a job that ended less than 10 minutes ago, are reported as
  awaiting their sweep, not as orphans);
- every run's status, as the gateway answers it, agrees with its jobs.

It prints the faults, a table of the checks with the first offending ids, and last
`RESULT jobs=... faults=... lost=... duplicated=... stale_accepted=... partial_jobs=...
wrongly_failed=... orphans_after_cleanup=... unexplained_lapses=... status_mismatch=...`.
`--check` exits 1 when a count other than jobs and faults is not 0. Everything it
started stops on exit, error, Ctrl-C or SIGTERM (stopped processes get SIGCONT first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import asyncpg
import grpc
import httpx
from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from bench.chaos_checks import QUERIES
from bench.footage import DEFAULT_CACHE, cached_recordings
from services.coordinator.runs.status import RunCounts
from tools.demo.script import MODEL, MODEL_VERSION, workflow_spec
from tools.demo.stack import clean_environment
from tools.localstack.host import free_ports
from tools.localstack.postgres import PostgresCluster, create_database, postgres_cluster
from tools.localstack.processes import ServiceProcess, announcements, run_module
from tools.localstack.s3 import S3Server, running_s3_server
from tools.localstack.triton import RestartableTriton, restartable_triton
from workshop.kit.auth import bearer_metadata
from workshop.kit.cli import COORDINATOR_ENV, KEY_ENV
from workshop.v1 import common_pb2, operator_pb2_grpc, preview_pb2_grpc
from workshop.v1 import operator_pb2 as op
from workshop.v1 import preview_pb2 as pv

T = TypeVar("T")
LEASE_SECONDS = 15.0
DEFAULT_SECONDS = 540
SHORT_SECONDS = 120
DEVICE = "chaos-gpu"
DATABASE = "workshop"
PREVIEW_BUCKET = "workshop"
RECORDINGS_BUCKET = "recordings"
BUCKET_ID = "yard"  # tools.demo.script.workflow_spec's output bucket
WORKFLOW_ID = "chaos"
CAMERAS = ("cam-0", "cam-1")
RECORDINGS_PER_CAMERA = 3
CLIP_SECONDS = 20
CLIP_SPACING = timedelta(seconds=40)
TEST_IMAGE_LIMIT = 20
READY_S = 120.0
CALL_RETRY_S = 45.0
# No more runs are created while this many jobs are queued or leased.
BACKLOG_JOBS = 3 * len(CAMERAS) * RECORDINGS_PER_CAMERA
FINAL_STATES = ("completed", "failed", "cancelled", "expired")
PROCESS_KINDS = ("processor", "coordinator", "preview", "gateway")
FAULT_KINDS = (
    *(f"{kind}-{action}" for kind in PROCESS_KINDS for action in ("kill", "stop")),
    "postgres-restart",
    "postgres-terminate",
    "seaweedfs-restart",
    "triton-kill",
)
SHOWN = 5  # offending ids printed per check


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


# --- processes -------------------------------------------------------------------------


class Slot:
    """One service process of the stack that the injector may kill or stop; started again
    with the same environment (and so the same ports)."""

    def __init__(
        self,
        kind: str,
        index: int,
        module: str,
        env: dict[str, str],
        logs: Path,
        base: dict[str, str],
    ) -> None:
        self.kind = kind
        self.index = index
        self.module = module
        self.env = env
        self.log_path = logs / f"{kind}-{index}.log"
        self.base = base
        self.key_id = ""
        self.process: ServiceProcess | None = None
        self.stopped = False
        self.expected_down = False
        self.unexpected_exits = 0

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"

    @property
    def pid(self) -> int:
        return self.process.pid if self.process else 0

    def start(self, *, wait: bool = True) -> None:
        self.process = ServiceProcess(self.module, self.env, self.log_path, base_env=self.base)
        self.expected_down = False
        if wait:
            self.process.wait_event("serving", timeout=READY_S)

    def alive(self) -> bool:
        return self.process is not None and self.process.process.poll() is None

    def kill(self) -> None:
        assert self.process is not None
        self.expected_down = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.stop(timeout=10)

    def pause(self) -> None:
        assert self.process is not None
        self.stopped = True
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
        self.stopped = False

    def stop(self) -> None:
        self.resume()
        if self.process is not None:
            self.expected_down = True
            self.process.stop(timeout=10)


@dataclasses.dataclass
class Stack:
    work: Path
    logs: Path
    cluster: PostgresCluster
    dsn: str
    s3: S3Server
    triton: RestartableTriton
    admin_key: str
    coordinator_target: str  # every coordinator: ipv4:host:port,host:port
    preview_targets: list[str]
    gateway_url: str
    agent_key: str
    runtime_id: str
    revision: int
    recordings: list[op.PutRecordingRequest]
    slots: dict[str, list[Slot]]
    processor_keys: dict[str, str]  # key id -> processor slot name

    @property
    def admin(self) -> tuple[tuple[str, str]]:
        return bearer_metadata(self.admin_key)

    def all_slots(self) -> list[Slot]:
        return [slot for kind in PROCESS_KINDS for slot in self.slots.get(kind, [])]


def sql(dsn: str, name: str, *args: object, timeout: float = 15.0) -> list[asyncpg.Record]:
    async def fetch() -> list[asyncpg.Record]:
        connection = await asyncpg.connect(dsn, timeout=timeout)
        try:
            return list(await connection.fetch(QUERIES[name], *args, timeout=timeout))
        finally:
            await connection.close()

    return asyncio.run(fetch())


def sql_script(dsn: str, name: str) -> None:
    async def execute() -> None:
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(QUERIES[name])
        finally:
            await connection.close()

    asyncio.run(execute())


def multi_target(ports: list[int], first: int = 0) -> str:
    """A gRPC target naming every replica, `first` first (pick_first goes on to the next
    when one does not answer)."""
    rotated = ports[first:] + ports[:first]
    return "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in rotated)


@contextlib.contextmanager
def running_stack(work: Path, stack: contextlib.ExitStack) -> Iterator[Stack]:
    logs = work / "logs"
    logs.mkdir(parents=True)
    base = clean_environment()
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="chaos-start")

    def background(start: Callable[[], contextlib.AbstractContextManager[T]]) -> Future[T]:
        def enter() -> T:
            manager = start()
            value = manager.__enter__()
            stack.push(manager.__exit__)
            return value

        return pool.submit(enter)

    log("starting Postgres, SeaweedFS and Triton; encoding footage (cached)")
    postgres = background(postgres_cluster)
    seaweed = background(lambda: running_s3_server(_mkdir(work / "s3")))
    models = background(lambda: restartable_triton(_mkdir(work / "triton")))
    clips = pool.submit(cached_recordings, DEFAULT_CACHE, len(CAMERAS), CLIP_SECONDS, "h264")
    cluster = postgres.result()
    dsn = create_database(cluster, DATABASE)
    db_env = {"COORDINATOR_DATABASE_URL": dsn}
    run_module("services.coordinator", ["migrate"], db_env, logs / "migrate.log", base_env=base)
    sql_script(dsn, "install_history")
    printed = run_module(
        "services.coordinator",
        ["create-admin-key", "--name", "chaos"],
        db_env,
        logs / "admin-key.log",
        base_env=base,
    )
    admin_key = next(
        str(line["secret"]) for line in announcements(printed) if line.get("event") == "admin-key"
    )
    ports = free_ports(5)
    coordinator_ports, preview_ports, http_port = ports[:2], ports[2:4], ports[4]
    slots: dict[str, list[Slot]] = {kind: [] for kind in PROCESS_KINDS}

    def add(kind: str, module: str, env: dict[str, str]) -> Slot:
        prefix = module.rsplit(".", 1)[-1].upper()
        common = {"HOST": "127.0.0.1", "DRAIN_SECONDS": "0", "GRACE_SECONDS": "1", "PORT": "0"}
        full = {f"{prefix}_{key}": value for key, value in common.items()} | env
        slot = Slot(kind, len(slots[kind]), module, full, logs, base)
        slots[kind].append(slot)
        stack.callback(slot.stop)
        return slot

    for port in coordinator_ports:
        add(
            "coordinator",
            "services.coordinator",
            {
                **db_env,
                "COORDINATOR_PORT": str(port),
                "COORDINATOR_LEASE_SECONDS": str(LEASE_SECONDS),
                "COORDINATOR_MAINTENANCE_INTERVAL_SECONDS": "1",
                "COORDINATOR_SCHEDULER_INTERVAL_SECONDS": "0",
                "COORDINATOR_DATABASE_POOL_SIZE": "6",
            },
        ).start(wait=False)
    for slot in slots["coordinator"]:
        assert slot.process is not None
        slot.process.wait_event("serving", timeout=READY_S)
    target = multi_target(coordinator_ports)
    keys = _operator_setup(target, admin_key)
    runtime = json.loads(
        run_module(
            "services.processor",
            ["register-runtime", "--device", DEVICE],
            {COORDINATOR_ENV: target, KEY_ENV: admin_key},
            logs / "register-runtime.log",
            base_env=base,
        )
    )["runtime_id"]
    server = seaweed.result()
    server.client().make_bucket(RECORDINGS_BUCKET)
    for index, port in enumerate(preview_ports):
        add(
            "preview",
            "services.preview",
            {
                "PREVIEW_PORT": str(port),
                "PREVIEW_S3_ENDPOINT": server.endpoint,
                "PREVIEW_S3_ACCESS_KEY": server.access_key,
                "PREVIEW_S3_SECRET_KEY": server.secret_key,
                "PREVIEW_BUCKET": PREVIEW_BUCKET,
                "PREVIEW_COORDINATOR_TARGET": multi_target(coordinator_ports, index),
                "PREVIEW_SERVICE_KEY": keys["preview"],
                "PREVIEW_CLEANUP_INTERVAL_SECONDS": "20",
            },
        ).start(wait=False)
    gateway = add(
        "gateway",
        "services.gateway",
        {
            "GATEWAY_HTTP_PORT": str(http_port),
            "GATEWAY_COORDINATOR_TARGET": target,
            "GATEWAY_PREVIEW_TARGET": multi_target(preview_ports),
            "GATEWAY_KEY": keys["gateway"],
            "GATEWAY_COOKIE_SECURE": "0",
        },
    )
    gateway.start(wait=False)
    operator_env = {COORDINATOR_ENV: target, KEY_ENV: admin_key}
    triton = models.result()
    published = json.loads(
        run_module(
            "tools.cli",
            [
                "-o",
                "json",
                "models",
                "publish",
                "--repository",
                str(triton.server.model_repository),
                "--name",
                MODEL,
                "--version",
                str(MODEL_VERSION),
                "--demo-detector",
            ],
            operator_env,
            logs / "publish-model.log",
            base_env=base,
        )
    )
    classes = [str(name) for name in published["classes"]]
    recordings = _recordings(server, target, admin_key, clips.result())
    revision = _save_workflow(work, logs, base, operator_env, classes)
    for index in range(3):
        slot = add(
            "processor",
            "services.processor",
            {
                "PROCESSOR_DEVICE_ID": DEVICE,
                "PROCESSOR_KEY": keys[f"processor-{index}"],
                "PROCESSOR_COORDINATOR_TARGET": multi_target(coordinator_ports, index % 2),
                "PROCESSOR_PREVIEW_TARGET": multi_target(preview_ports, index % 2),
                "PROCESSOR_TRITON_TARGET": triton.server.grpc_url,
                "PROCESSOR_MODEL_REPOSITORY": str(triton.server.model_repository),
                "PROCESSOR_S3_ENDPOINT": server.endpoint,
                "PROCESSOR_S3_ACCESS_KEY": server.access_key,
                "PROCESSOR_S3_SECRET_KEY": server.secret_key,
                "PROCESSOR_RECORDINGS_BUCKET": RECORDINGS_BUCKET,
                # two jobs each, so that a run's jobs spread over the three processors and a
                # processor's kill or pause finds leases to lose
                "PROCESSOR_IN_FLIGHT": "2",
            },
        )
        slot.key_id = keys[f"processor-{index}-id"]
        slot.start(wait=False)
    for slot in [*slots["preview"], gateway, *slots["processor"]]:
        assert slot.process is not None
        slot.process.wait_event("serving", timeout=READY_S)
    pool.shutdown()
    yield Stack(
        work=work,
        logs=logs,
        cluster=cluster,
        dsn=dsn,
        s3=server,
        triton=triton,
        admin_key=admin_key,
        coordinator_target=target,
        preview_targets=[f"127.0.0.1:{port}" for port in preview_ports],
        gateway_url=f"http://127.0.0.1:{http_port}",
        agent_key=keys["agent"],
        runtime_id=str(runtime),
        revision=revision,
        recordings=recordings,
        slots=slots,
        processor_keys={slot.key_id: slot.name for slot in slots["processor"]},
    )


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _operator_setup(target: str, admin_key: str) -> dict[str, str]:
    """The device, the services' keys (one `workshop:run` key per processor, so a lease's
    holder names its processor), the user `chaos` and its Agent key, the cameras."""
    metadata = bearer_metadata(admin_key)
    keys: dict[str, str] = {}
    with grpc.insecure_channel(target) as channel:
        operator = operator_pb2_grpc.OperatorServiceStub(channel)
        operator.RegisterDevice(
            op.RegisterDeviceRequest(device_id=DEVICE, description="chaos soak"),
            metadata=metadata,
            timeout=30,
        )

        def key(name: str, scope: common_pb2.KeyScope, user_id: str = "") -> op.CreateKeyResponse:
            return operator.CreateKey(
                op.CreateKeyRequest(name=name, scopes=[scope], user_id=user_id),
                metadata=metadata,
                timeout=30,
            )

        keys["preview"] = key(
            "chaos-preview", common_pb2.KeyScope(scope=common_pb2.SCOPE_SERVICE)
        ).secret
        keys["gateway"] = key(
            "chaos-gateway", common_pb2.KeyScope(scope=common_pb2.SCOPE_GATEWAY)
        ).secret
        for index in range(3):
            made = key(
                f"chaos-processor-{index}",
                common_pb2.KeyScope(scope=common_pb2.SCOPE_WORKSHOP_RUN, device_id=DEVICE),
            )
            keys[f"processor-{index}"] = made.secret
            keys[f"processor-{index}-id"] = made.key.key_id
        operator.CreateUser(
            op.CreateUserRequest(user_id="chaos", display_name="Chaos soak"),
            metadata=metadata,
            timeout=30,
        )
        keys["agent"] = key(
            "chaos-agent", common_pb2.KeyScope(scope=common_pb2.SCOPE_WORKSHOP), user_id="chaos"
        ).secret
        for camera in CAMERAS:
            operator.PutCamera(
                op.PutCameraRequest(camera_id=camera, name=f"chaos {camera}"),
                metadata=metadata,
                timeout=30,
            )
    return keys


def _recordings(
    server: S3Server, target: str, admin_key: str, clips: list[Any]
) -> list[op.PutRecordingRequest]:
    """Each camera's clip uploaded once and registered as RECORDINGS_PER_CAMERA recordings
    of yesterday from 08:00, CLIP_SPACING apart."""
    yesterday = (datetime.now(UTC) - timedelta(days=1)).date()
    first = datetime(yesterday.year, yesterday.month, yesterday.day, 8, tzinfo=UTC)
    client = server.client()
    made = []
    with grpc.insecure_channel(target) as channel:
        operator = operator_pb2_grpc.OperatorServiceStub(channel)
        for camera, clip in zip(CAMERAS, clips, strict=True):
            key = f"chaos/{camera}{clip.path.suffix}"
            client.fput_object(RECORDINGS_BUCKET, key, str(clip.path))
            for index in range(RECORDINGS_PER_CAMERA):
                start = first + index * CLIP_SPACING
                request = op.PutRecordingRequest(
                    recording_id=f"{camera}-{index}",
                    camera_id=camera,
                    start=_ts(start),
                    end=_ts(start + timedelta(seconds=CLIP_SECONDS)),
                    fps=10.0,
                    object_key=key,
                    sha256=clip.sha256,
                    byte_size=clip.byte_size,
                )
                operator.PutRecording(request, metadata=bearer_metadata(admin_key), timeout=30)
                made.append(request)
    return made


def _save_workflow(
    work: Path, logs: Path, base: dict[str, str], env: dict[str, str], classes: list[str]
) -> int:
    def cli(*args: str) -> Any:
        printed = run_module(
            "tools.cli", ["-o", "json", *args], env, logs / "workflow.log", base_env=base
        )
        return json.loads(printed)

    cli("buckets", "create", BUCKET_ID, "--name", "Yard")
    document = work / "chaos.workflow.json"
    spec = workflow_spec(list(CAMERAS), classes)
    document.write_text(
        json.dumps(json_format.MessageToDict(spec, preserving_proto_field_name=True))
    )
    saved = cli("workflows", "save", WORKFLOW_ID, str(document), "--expected-revision", "0")
    return int(saved["revision"])


def _ts(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


# --- workload --------------------------------------------------------------------------


@dataclasses.dataclass
class Workload:
    stack: Stack
    rng: random.Random
    acknowledged: dict[str, str] = dataclasses.field(default_factory=dict)  # run -> mode
    unanswered: list[str] = dataclasses.field(default_factory=list)
    cancelled: set[str] = dataclasses.field(default_factory=set)
    photos: set[str] = dataclasses.field(default_factory=set)
    replaced: Counter[str] = dataclasses.field(default_factory=Counter)
    policy_raises: list[float] = dataclasses.field(default_factory=list)
    refused: Counter[str] = dataclasses.field(default_factory=Counter)
    internal: list[str] = dataclasses.field(default_factory=list)  # 5xx, INTERNAL, UNKNOWN
    errors: list[str] = dataclasses.field(default_factory=list)

    def run(self, stop: threading.Event, seconds: float) -> None:
        http = httpx.Client(
            base_url=self.stack.gateway_url,
            headers={"Authorization": f"Bearer {self.stack.agent_key}"},
            timeout=10.0,
        )
        channel = grpc.insecure_channel(self.stack.coordinator_target)
        operator = operator_pb2_grpc.OperatorServiceStub(channel)
        policy_every = max(40.0, seconds / 3)
        last_policy = time.monotonic()
        serial = 0
        try:
            while not stop.wait(self.rng.uniform(0.5, 2.0)):
                action = self.rng.choices(
                    ("run", "photo", "cancel", "replace", "policy"), weights=(45, 20, 15, 15, 5)
                )[0]
                try:
                    if action == "run":
                        serial += 1
                        self._create_run(http, stop, f"chaos-{serial:04d}")
                    elif action == "photo":
                        self._photo(http, stop)
                    elif action == "cancel" and self.acknowledged:
                        run_id = self.rng.choice(sorted(self.acknowledged)[-4:])
                        if self._http(http, stop, "POST", f"/v1/workshop/runs/{run_id}/cancel"):
                            self.cancelled.add(run_id)
                    elif action == "replace":
                        self._replace(operator, stop)
                    elif action == "policy" and time.monotonic() - last_policy > policy_every:
                        last_policy = time.monotonic()
                        if _operator_call(
                            stop,
                            lambda: operator.RaisePolicyRevision(
                                op.RaisePolicyRevisionRequest(),
                                metadata=self.stack.admin,
                                timeout=10,
                            ),
                            self.internal,
                        ):
                            self.policy_raises.append(time.time())
                except Exception as error:  # the soak goes on; reported at the end
                    self.errors.append(f"{action}: {error!r}"[:300])
        finally:
            http.close()
            channel.close()

    def _backlog(self) -> int:
        try:
            return int(sql(self.stack.dsn, "live_jobs", timeout=3)[0][0])
        except Exception:  # the database may be restarting
            return BACKLOG_JOBS

    def _create_run(self, http: httpx.Client, stop: threading.Event, run_id: str) -> None:
        if self._backlog() >= BACKLOG_JOBS:
            return
        mode = self.rng.choice(("test", "full"))
        body: dict[str, Any] = {
            "id": run_id,
            "workflow_id": WORKFLOW_ID,
            "runtime_id": self.stack.runtime_id,
            "revision": self.stack.revision,
            "mode": mode,
        }
        if mode == "test":
            body["image_limit"] = TEST_IMAGE_LIMIT
        if self._http(http, stop, "POST", "/v1/workshop/runs", body):
            self.acknowledged[run_id] = mode
        else:
            self.unanswered.append(run_id)

    def _photo(self, http: httpx.Client, stop: threading.Event) -> None:
        recording = self.rng.choice(self.stack.recordings)
        start = recording.start.ToDatetime(tzinfo=UTC)
        at = start + timedelta(seconds=self.rng.randrange(CLIP_SECONDS))
        body = {"camera_id": recording.camera_id, "time": at.isoformat().replace("+00:00", "Z")}
        answer = self._http(http, stop, "POST", "/v1/workshop/photos", body)
        if answer:
            self.photos.add(str(answer["photo"]["photo_id"]))

    def _replace(
        self, operator: operator_pb2_grpc.OperatorServiceStub, stop: threading.Event
    ) -> None:
        recording = self.rng.choice(self.stack.recordings)
        if _operator_call(
            stop,
            lambda: operator.PutRecording(recording, metadata=self.stack.admin, timeout=10),
            self.internal,
        ):
            self.replaced[recording.recording_id] += 1

    def _http(
        self, http: httpx.Client, stop: threading.Event, method: str, path: str, body: Any = None
    ) -> dict[str, Any] | None:
        """The answer's JSON; retried (same request: these are idempotent) while the gateway
        or what is behind it is down; None when refused or never answered."""
        deadline = time.monotonic() + CALL_RETRY_S
        while time.monotonic() < deadline:
            try:
                response = http.request(method, path, json=body)
            except httpx.HTTPError:
                time.sleep(0.5)
                continue
            if response.status_code < 300:
                answer: dict[str, Any] = response.json() if response.content else {}
                return answer
            if response.status_code in (502, 503, 504):
                time.sleep(0.5)
                continue
            reason = _reason(response)
            what = f"{method} {path.split('/')[3]} {response.status_code} {reason}"
            self.refused[what] += 1
            if response.status_code >= 500:
                self.internal.append(f"{what} at {time.strftime('%H:%M:%S')}")
            return None
        return None


def _reason(response: httpx.Response) -> str:
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return str(response.json().get("reason") or response.json().get("code") or "")
    return ""


def _operator_call(
    stop: threading.Event, call: Callable[[], object], internal: list[str] | None = None
) -> bool:
    deadline = time.monotonic() + CALL_RETRY_S
    while time.monotonic() < deadline:
        try:
            call()
        except grpc.RpcError as error:
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                time.sleep(0.5)
                continue
            if internal is not None and error.code() in (
                grpc.StatusCode.INTERNAL,
                grpc.StatusCode.UNKNOWN,
            ):
                internal.append(
                    f"{error.code().name} {error.details()} at {time.strftime('%H:%M:%S')}"
                )
            return False
        return True
    return False


# --- faults ----------------------------------------------------------------------------


@dataclasses.dataclass
class Fault:
    number: int
    kind: str
    target: str
    began: float  # time.time()
    ended: float = 0.0
    key_id: str = ""
    note: str = ""


@dataclasses.dataclass
class Injector:
    stack: Stack
    rng: random.Random
    faults: list[Fault] = dataclasses.field(default_factory=list)
    unexpected: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)

    def run(self, stop: threading.Event) -> None:
        order: list[str] = []
        while not stop.wait(self.rng.uniform(2.0, 5.0)):
            try:
                self.revive()
            except Exception as error:  # a service that cannot start: noted, tried again
                self.errors.append(f"revive: {error!r}"[:300])
                continue
            if not order:
                order = list(FAULT_KINDS)
                self.rng.shuffle(order)
            kind = order.pop()
            try:
                self.inject(kind)
            except Exception as error:  # reported; the soak goes on
                self.errors.append(f"{kind}: {error!r}"[:300])
        self.revive()

    def revive(self) -> None:
        """Start again any service that exited without being killed here (a finding)."""
        for slot in self.stack.all_slots():
            if not slot.alive():
                if not slot.expected_down:
                    code = slot.process.process.returncode if slot.process else None
                    self.unexpected.append(f"{slot.name} exited by itself ({code})")
                    slot.unexpected_exits += 1
                slot.start()

    def inject(self, kind: str) -> None:
        fault = Fault(len(self.faults) + 1, kind, "", time.time())
        self.faults.append(fault)
        what, _, action = kind.partition("-")
        if what in PROCESS_KINDS:
            slot = self.rng.choice(self.stack.slots[what])
            fault.target, fault.key_id = slot.name, slot.key_id
            if action == "kill":
                down = self.rng.uniform(0.5, 3.0)
                log(
                    f"fault {fault.number}: SIGKILL {slot.name} (pid {slot.pid}), "
                    f"back in {down:.1f} s"
                )
                slot.kill()
                time.sleep(down)
                slot.start()
            else:
                limit = 1.5 * LEASE_SECONDS if what == "processor" else 0.4 * LEASE_SECONDS
                pause = self.rng.uniform(1.0, limit)
                log(f"fault {fault.number}: SIGSTOP {slot.name} (pid {slot.pid}) for {pause:.1f} s")
                slot.pause()
                try:
                    time.sleep(pause)
                finally:
                    slot.resume()
        elif kind == "postgres-restart":
            fault.target = "postgres"
            took = self.stack.cluster.restart("fast")
            fault.note = f"{took:.1f} s"
            log(f"fault {fault.number}: Postgres restarted (fast) in {took:.1f} s")
        elif kind == "postgres-terminate":
            fault.target = "postgres"
            ended = sql(self.stack.dsn, "terminate_connections")[0][0]
            fault.note = f"{ended} connections"
            log(f"fault {fault.number}: terminated {ended} Postgres connections")
        elif kind == "seaweedfs-restart":
            fault.target = "seaweedfs"
            took = self.stack.s3.restart()
            fault.note = f"{took:.1f} s"
            log(f"fault {fault.number}: SeaweedFS killed and restarted in {took:.1f} s")
        elif kind == "triton-kill":
            fault.target = "triton"
            down = self.rng.uniform(0.5, 3.0)
            self.stack.triton.kill()
            time.sleep(down)
            took = self.stack.triton.start()
            fault.note = f"down {down:.1f} s, ready in {took:.1f} s"
            log(f"fault {fault.number}: Triton killed, back after {down:.1f} + {took:.1f} s")
        fault.ended = time.time()


# --- checks ----------------------------------------------------------------------------


@dataclasses.dataclass
class Findings:
    rows: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # check -> offenders
    category: dict[str, str] = dataclasses.field(default_factory=dict)  # check -> RESULT field

    def add(self, check: str, category: str, offenders: list[str]) -> None:
        self.rows.setdefault(check, []).extend(offenders)
        self.category[check] = category

    def count(self, category: str) -> int:
        return sum(len(v) for k, v in self.rows.items() if self.category[k] == category)


def check(stack: Stack, workload: Workload, injector: Injector, cleanup_at: datetime) -> Findings:
    found = Findings()

    def rows(name: str) -> list[str]:
        return [f"{row['id']} ({row['what']})" for row in sql(stack.dsn, name)]

    found.add("job ended more than once", "duplicated", rows("check_ended_twice"))
    found.add("receipt not of the job's last lease", "duplicated", rows("check_receipt_state"))
    found.add("completed without receipt", "lost", rows("check_completed_without_receipt"))
    found.add("item without its job's receipt", "partial_jobs", rows("check_items_without_receipt"))
    found.add("receipt items != bucket items", "partial_jobs", rows("check_items_count"))
    images = rows("check_item_images")
    found.add(
        "item image of another lease", "stale_accepted", [r for r in images if "object of g" in r]
    )
    found.add(
        "item image gone or collectable", "lost", [r for r in images if "object of g" not in r]
    )
    found.add("object recorded outside its lease", "stale_accepted", rows("check_stale_writes"))
    found.add("receipt from a stale lease", "stale_accepted", rows("check_receipt_in_lease"))

    existing = {row["run_id"] for row in sql(stack.dsn, "run_states")}
    found.add(
        "acknowledged run missing",
        "lost",
        [run_id for run_id in workload.acknowledged if run_id not in existing],
    )

    lapses = sql(stack.dsn, "lapses")
    unexplained: set[str] = set()
    offenders = []
    for lapse in lapses:
        slot = stack.processor_keys.get(lapse["holder"] or "", "?")
        began = (lapse["claimed_at"] or lapse["lapsed_at"] - LEASE_SECONDS) - 1.0
        ended = lapse["lapsed_at"]
        cause = [
            f
            for f in injector.faults
            if f.target == slot
            and f.began <= ended
            and (f.ended or ended) >= began
            and f.kind in ("processor-kill", "processor-stop")
        ]
        if not cause:
            overlapping = [
                f"{f.kind}#{f.number}"
                for f in injector.faults
                if f.began <= ended and (f.ended or ended) >= began
            ]
            unexplained.add(lapse["id"])
            offenders.append(
                f"{lapse['id']} g{lapse['generation']} held by {slot}, faults then: "
                f"{','.join(overlapping) or 'none'}"
            )
    found.add("lapse of a live, running holder", "unexplained_lapses", offenders)
    found.add(
        "lapses explained by a fault on their holder (info)",
        "info",
        [
            f"{lapse['id']} g{lapse['generation']}"
            for lapse in lapses
            if lapse["id"] not in unexplained
        ],
    )

    wrong = []
    for job in sql(stack.dsn, "failed_jobs"):
        reason, run_job = job["failure_reason"], job["id"]
        recording_ok = True
        if reason == "source_changed":
            recording_ok = any(r in job["message"] for r in workload.replaced)
        legit = (
            (reason == "source_changed" and recording_ok)
            or (reason == "authority_lost" and bool(workload.policy_raises))
            or (reason == "attempts_exhausted" and run_job not in unexplained)
        )
        if not legit:
            wrong.append(f"{run_job} ({reason}: {job['message'][:160]})")
    found.add("job failed by a fault not its own", "wrongly_failed", wrong)

    found.add("run status disagrees with jobs", "status_mismatch", _status_checks(stack))
    found.add(
        "5xx, INTERNAL or UNKNOWN answered to the workload", "internal_answers", workload.internal
    )
    found.add(
        "object left after cleanup", "orphans_after_cleanup", _s3_checks(stack, cleanup_at, found)
    )
    return found


def _status_checks(stack: Stack) -> list[str]:
    offenders = []
    with httpx.Client(
        base_url=stack.gateway_url,
        headers={"Authorization": f"Bearer {stack.agent_key}"},
        timeout=30.0,
    ) as http:
        for row in sql(stack.dsn, "run_states"):
            counts = RunCounts(
                jobs_leased=row["leased"],
                jobs_queued=row["queued"],
                jobs_failed=row["failed"],
                jobs_cancelled=row["cancelled"],
                jobs_expired=row["expired"],
            )
            expected = counts.status()
            if row["receipts"] != row["completed"]:
                offenders.append(
                    f"{row['run_id']} ({row['completed']} completed, {row['receipts']} receipts)"
                )
            path = (
                f"/v1/workshop/photos/{row['run_id']}"
                if row["kind"] == "photo"
                else f"/v1/workshop/runs/{row['run_id']}"
            )
            response = http.get(path)
            if response.status_code != 200:
                offenders.append(f"{row['run_id']} (GET {response.status_code})")
                continue
            body = response.json()
            shown = str(
                (body.get("photo") or body.get("detail", {}).get("run") or {}).get("status", "?")
            )
            status = shown.lower().removeprefix("run_status_")
            if status != expected:
                offenders.append(f"{row['run_id']} (answered {shown}, jobs say {expected})")
    return offenders


def _s3_checks(stack: Stack, cleanup_at: datetime, found: Findings) -> list[str]:
    known = {row["object_key"]: row for row in sql(stack.dsn, "known_objects", cleanup_at)}
    jobs = {(row["run_id"], row["job_index"]): row for row in sql(stack.dsn, "job_sweeps")}
    items = {row["object_key"] for row in sql(stack.dsn, "item_keys")}
    listed = {
        obj.object_name
        for obj in stack.s3.client().list_objects(PREVIEW_BUCKET, recursive=True)
        if obj.object_name is not None
    }
    orphans: list[str] = []
    awaiting: list[str] = []
    held: list[str] = []
    for key in sorted(listed):
        row = known.get(key)
        if row is not None:
            if row["deleted"]:
                orphans.append(f"{key} (marked deleted, bytes still there)")
            elif row["collectable_due"] and row["held_until"] is not None:
                # handed to a cleanup pass that failed or died: its hold must lapse first
                held.append(f"{key} (held until {row['held_until']:%H:%M:%S})")
            elif row["collectable_due"]:
                orphans.append(f"{key} (collectable before the cleanup passes, still there)")
            continue
        parts = key.removeprefix("workshop-tests/").split("/")
        job = None
        with contextlib.suppress(IndexError, ValueError):
            job = jobs.get((parts[1], int(parts[2].lstrip("j"))))
        if job is not None and job["state"] in FINAL_STATES and not job["swept"]:
            awaiting.append(key)
        else:
            orphans.append(f"{key} (no row knows it)")
    missing = sorted(key for key in items if key not in listed)
    found.add(
        "objects listed in S3 after cleanup (info)",
        "info",
        [f"{len(listed)} objects, {len(items)} item images, {len(known)} rows"],
    )
    found.add("item image missing from S3", "lost", missing)
    found.add("unrecorded bytes awaiting their job's sweep (info)", "info", awaiting)
    found.add("collectable, held by an earlier cleanup pass (info)", "info", held)
    return orphans


# --- the soak --------------------------------------------------------------------------


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def drain(stack: Stack, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    live = -1
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            live = int(sql(stack.dsn, "live_jobs")[0][0])
            if live == 0:
                return 0
        time.sleep(2.0)
    return live


def cleanup_passes(stack: Stack) -> list[str]:
    """RunCleanup until a pass deletes nothing; what each pass deleted."""
    done = []
    with grpc.insecure_channel(stack.preview_targets[0]) as channel:
        preview = preview_pb2_grpc.PreviewServiceStub(channel)
        for _ in range(10):
            answer = preview.RunCleanup(pv.RunCleanupRequest(), metadata=stack.admin, timeout=120)
            done.append(
                f"previews {answer.previews_deleted}, uploads {answer.uploads_deleted}, "
                f"unrecorded {answer.unrecorded_previews_found}"
            )
            if not (answer.previews_deleted or answer.uploads_deleted or answer.uploads_remaining):
                break
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos_soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help=f"soak length (default {DEFAULT_SECONDS})"
    )
    parser.add_argument("--short", action="store_true", help=f"a {SHORT_SECONDS} s soak")
    parser.add_argument("--seed", type=int, default=None, help="the injector's and workload's seed")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a check finds anything")
    args = parser.parse_args(argv)
    seconds = args.seconds or (SHORT_SECONDS if args.short else DEFAULT_SECONDS)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    signal.signal(signal.SIGTERM, _interrupted)
    work = Path(tempfile.mkdtemp(prefix="chaos-soak-"))
    keep = args.keep
    log(f"chaos soak: {seconds:.0f} s, seed {seed}, lease {LEASE_SECONDS:.0f} s, work {work}")
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        with contextlib.ExitStack() as exits, running_stack(work, exits) as stack:
            log(
                "stack up: 2 coordinators, 2 preview services, a gateway, 3 processors "
                f"(runtime {stack.runtime_id[:12]}...)"
            )
            workload = Workload(stack, random.Random(f"{seed}-workload"))
            injector = Injector(stack, random.Random(f"{seed}-faults"))
            threads = [
                threading.Thread(target=workload.run, args=(stop, seconds), name="workload"),
                threading.Thread(target=injector.run, args=(stop,), name="injector"),
            ]
            began = time.monotonic()
            for thread in threads:
                thread.start()
            while time.monotonic() - began < seconds:
                time.sleep(1.0)
            stop.set()
            for thread in threads:
                thread.join()
            injector.revive()
            log(f"soak over: {len(injector.faults)} faults; waiting for the jobs to end")
            live = drain(stack, 4 * LEASE_SECONDS + 120)
            log(f"jobs still live: {live}; cleanup passes")
            cleanup_at = datetime.now(UTC)
            passes = cleanup_passes(stack)
            found = check(stack, workload, injector, cleanup_at)
            failing = report(stack, workload, injector, found, passes, live, seed, seconds)
            keep = keep or failing > 0
            return 1 if args.check and failing else 0
    except KeyboardInterrupt:
        log("interrupted; stopping everything")
        keep = True
        return 130
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        if keep:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _job_count(row: asyncpg.Record) -> str:
    photo = " photo" if row["is_photo"] else ""
    reason = f" {row['reason']}" if row["reason"] else ""
    return f"{row['state']}{photo}{reason} {row['jobs']}"


RESULT_FIELDS = (
    "lost",
    "duplicated",
    "stale_accepted",
    "partial_jobs",
    "wrongly_failed",
    "orphans_after_cleanup",
    "unexplained_lapses",
    "status_mismatch",
    "internal_answers",
)


def report(
    stack: Stack,
    workload: Workload,
    injector: Injector,
    found: Findings,
    passes: list[str],
    live: int,
    seed: int,
    seconds: float,
) -> int:
    faults = Counter(f.kind for f in injector.faults)
    print()
    print(
        f"faults ({len(injector.faults)}): "
        + ", ".join(f"{k} {v}" for k, v in sorted(faults.items()))
    )
    for fault in injector.faults:
        took = f"{fault.ended - fault.began:.1f} s" if fault.ended else "unfinished"
        print(
            f"  #{fault.number:<3} {time.strftime('%H:%M:%S', time.localtime(fault.began))} "
            f"{fault.kind:<20} {fault.target:<12} {took:>8} {fault.note}"
        )
    print(
        f"workload: {len(workload.acknowledged)} runs acknowledged "
        f"({sum(1 for m in workload.acknowledged.values() if m == 'full')} full), "
        f"{len(workload.unanswered)} unanswered, {len(workload.cancelled)} cancelled, "
        f"{len(workload.photos)} photos, {sum(workload.replaced.values())} recording replacements, "
        f"{len(workload.policy_raises)} policy raises"
    )
    for what, count in workload.refused.most_common(8):
        print(f"  refused {count}x: {what}")
    for error in [*workload.errors[:5], *injector.errors[:5], *injector.unexpected[:10]]:
        print(f"  note: {error}")
    states = sql(stack.dsn, "job_counts")
    print("jobs: " + ", ".join(_job_count(r) for r in states))
    print(f"still live after the drain: {live}; cleanup passes: {'; '.join(passes)}")
    print()
    print(f"{'check':<52} {'counts as':<22} {'found':>5}  first offenders")
    for name, offenders in found.rows.items():
        shown = "; ".join(offenders[:SHOWN])
        print(f"{name:<52} {found.category[name]:<22} {len(offenders):>5}  {shown}")
    jobs = sum(int(r["jobs"]) for r in states)
    counts = {field: found.count(field) for field in RESULT_FIELDS}
    print(f"seed {seed}, {seconds:.0f} s, lease {LEASE_SECONDS:.0f} s")
    print(
        f"RESULT jobs={jobs} faults={len(injector.faults)} "
        + " ".join(f"{field}={value}" for field, value in counts.items())
    )
    return sum(counts.values())


if __name__ == "__main__":
    sys.exit(main())
