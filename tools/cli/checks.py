"""The checks of `workshop doctor` on a processor host, as its processor will meet them.

It reads the processor's own settings (`PROCESSOR_*`, as `python -m services.processor`
does) and, for what only an operator may read (devices, runtimes, model versions), the
coordinator and admin key of the global options. Each check says what is wrong and how to
fix it; the exit code is 1 when any fails.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import tritonclient.grpc.aio as triton
from minio import Minio
from minio.error import MinioException, S3Error
from tritonclient.utils import InferenceServerException

# The one import of a service by a tool (docs/architecture.md, "Import rules"): the doctor
# reads PROCESSOR_* through the processor's own settings class, so it meets exactly the
# names, defaults and checks the processor will; a copy in the kit would drift from them.
from services.processor.settings import PREFIX, ProcessorSettings
from tools.cli.context import Options, channel_tls
from tools.cli.output import emit
from tools.cli.paging import WHOLE_PAGE
from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.kit.model_repository import RepositoryError, served_weights_sha256
from workshop.kit.processor_manifest import code_sha256, manifest_for
from workshop.kit.settings import load_settings
from workshop.v1 import common_pb2, identity_pb2, identity_pb2_grpc, operator_pb2_grpc
from workshop.v1 import operator_pb2 as op

SHM = Path("/dev/shm")
SHM_MIN_FREE = 64 * 1024 * 1024  # a few batches of 640x360 frames for Triton's shared memory
CHECK_SECONDS = 5.0


def processor_settings(environ: Mapping[str, str]) -> ProcessorSettings:
    """The processor's settings from `environ`, read as `python -m services.processor` reads
    them; SettingsError lists every variable that is missing or wrong."""
    return load_settings(ProcessorSettings, PREFIX, environ)


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


class Failed(Exception):
    """A check's failure: what is wrong and how to fix it."""

    def __init__(self, detail: str, fix: str) -> None:
        super().__init__(detail)
        self.detail, self.fix = detail, fix


@dataclasses.dataclass
class Doctor:
    settings: ProcessorSettings
    coordinator: str
    admin: tuple[tuple[str, str], ...]
    models: list[str]
    checks: list[Check] = dataclasses.field(default_factory=list)

    async def check(self, name: str, probe: Callable[[], Awaitable[str]]) -> None:
        try:
            detail = await asyncio.wait_for(probe(), CHECK_SECONDS * 3)
        except Failed as failure:
            self.checks.append(Check(name, False, failure.detail, failure.fix))
        except TimeoutError:
            self.checks.append(Check(name, False, "no answer in time", "is it running?"))
        else:
            self.checks.append(Check(name, True, detail))

    async def run(self) -> None:
        async with open_channel(self.coordinator, max_attempts=1, tls=channel_tls()) as channel:
            self.operator = operator_pb2_grpc.OperatorServiceStub(channel)
            self.identity = identity_pb2_grpc.IdentityServiceStub(channel)
            await self.check("device registered", self.device)
            await self.check("runtime code", self.runtime)
            await self.check("processor key", self.key)
            await self.check("triton models", self.triton)
        await self.check("s3 recordings", self.s3)
        await self.check("/dev/shm", self.shm)

    async def _call(self, rpc: str, request: Any) -> Any:
        try:
            return await getattr(self.operator, rpc)(
                request, metadata=self.admin, timeout=CHECK_SECONDS
            )
        except grpc.aio.AioRpcError as error:
            raise Failed(
                f"the coordinator at {self.coordinator} answered {rpc} with "
                f"{error.code().name}: {error.details()}",
                "check --coordinator/WORKSHOP_COORDINATOR and that --key/WORKSHOP_KEY is an "
                "admin key",
            ) from None

    async def device(self) -> str:
        device = self.settings.device_id
        reply = await self._call("ListDevices", op.ListDevicesRequest(page_size=WHOLE_PAGE))
        if not any(d.device_id == device for d in reply.devices):
            raise Failed(
                f"device {device!r} (PROCESSOR_DEVICE_ID) is not registered",
                f"workshop devices register {device}",
            )
        return f"{device} is registered"

    def runtime_id(self) -> str:
        return self.settings.runtime_id or str(manifest_for(self.settings.device_id)["runtime_id"])

    async def runtime(self) -> str:
        device, runtime_id, local = self.settings.device_id, self.runtime_id(), code_sha256()
        reply = await self._call(
            "ListRuntimes", op.ListRuntimesRequest(device_id=device, page_size=WHOLE_PAGE)
        )
        found = next((r for r in reply.runtimes if r.runtime_id == runtime_id), None)
        if found is None:
            raise Failed(
                f"runtime {runtime_id} (this code on {device}) is not registered",
                f"workshop runtimes register --device {device}",
            )
        if found.code_sha256 != local:
            raise Failed(
                f"this host's code_sha256 is {local}, but runtime {runtime_id} was registered "
                f"with {found.code_sha256}: its jobs would be refused (CODE_MISMATCH)",
                "deploy the code that runtime was registered with, or register this code "
                f"(`workshop runtimes register --device {device}`) and unset PROCESSOR_RUNTIME_ID",
            )
        return f"{runtime_id}: code_sha256 {local[:12]}… matches"

    async def key(self) -> str:
        device = self.settings.device_id
        fix = (
            f"create one with `workshop keys create --name processor --scope "
            f"workshop:run@{device}` and put its secret in PROCESSOR_KEY"
        )
        try:
            who = await self.identity.WhoAmI(
                identity_pb2.WhoAmIRequest(),
                metadata=bearer_metadata(self.settings.key),
                timeout=CHECK_SECONDS,
            )
        except (grpc.aio.AioRpcError, ValueError) as error:
            detail = error.details() if isinstance(error, grpc.aio.AioRpcError) else str(error)
            raise Failed(f"the coordinator refuses PROCESSOR_KEY: {detail}", fix) from None
        run_scopes = [s for s in who.scopes if s.scope == common_pb2.SCOPE_WORKSHOP_RUN]
        if not run_scopes:
            raise Failed(f"PROCESSOR_KEY ({who.key_id}) has no workshop:run scope", fix)
        if not any(s.device_id == device for s in run_scopes):
            bound = ", ".join(s.device_id for s in run_scopes)
            raise Failed(
                f"PROCESSOR_KEY ({who.key_id}) is a workshop:run key for device {bound}, "
                f"not {device}",
                fix,
            )
        return f"{who.key_id}: workshop:run for {device}"

    async def triton(self) -> str:
        target, repository = self.settings.triton_target, self.settings.model_repository
        reply = await self._call(
            "ListModelVersions", op.ListModelVersionsRequest(page_size=WHOLE_PAGE)
        )
        versions = [v for v in reply.model_versions if not self.models or v.name in self.models]
        client = triton.InferenceServerClient(target)
        try:
            try:
                live = await client.is_server_live(client_timeout=CHECK_SECONDS)
            except InferenceServerException as error:
                raise Failed(
                    f"Triton at {target} (PROCESSOR_TRITON_TARGET) does not answer: "
                    f"{error.message()}",
                    "start Triton (explicit model control, this model repository) or fix "
                    "PROCESSOR_TRITON_TARGET",
                ) from None
            if not live:
                raise Failed(f"Triton at {target} is not live", "look at Triton's log")
            for v in versions:
                await self._model(client, repository, v)
        finally:
            await client.close()
        names = ", ".join(f"{v.name} v{v.version}" for v in versions) or "no model versions"
        return f"Triton at {target} serves {names} with the published weights"

    async def _model(self, client: Any, repository: Path, v: Any) -> None:
        publish = (
            f"publish it: `workshop models publish --repository {repository} --name {v.name} "
            f"--version {v.version} ...`"
        )
        try:
            served = await asyncio.to_thread(served_weights_sha256, repository, v.name, v.version)
        except (OSError, RepositoryError) as error:
            raise Failed(
                f"{v.name} v{v.version} is not in {repository}: {error}", publish
            ) from None
        if served != v.weights_sha256:
            raise Failed(
                f"{v.name} v{v.version} in {repository} has weights {served}, but the "
                f"coordinator pins {v.weights_sha256}",
                "publish the pinned weights under that version (versions are immutable)",
            )
        version = str(v.version)
        try:
            if not await client.is_model_ready(v.name, version):
                await client.load_model(v.name)  # what the processor does on its first job
            ready = await client.is_model_ready(v.name, version)
        except InferenceServerException as error:
            raise Failed(
                f"Triton cannot serve {v.name} v{version}: {error.message()}",
                f"is {repository} Triton's model repository?",
            ) from None
        if not ready:
            raise Failed(f"Triton did not make {v.name} v{version} ready", "look at Triton's log")

    async def s3(self) -> str:
        s = self.settings
        where = f"{s.s3_endpoint} bucket {s.recordings_bucket}"

        def probe() -> bool:
            client = Minio(
                s.s3_endpoint,
                access_key=s.s3_access_key,
                secret_key=s.s3_secret_key,
                secure=s.s3_secure,
                region="us-east-1",  # as the processor's RecordingStore: no location lookup
            )
            return client.bucket_exists(s.recordings_bucket)

        try:
            exists = await asyncio.to_thread(probe)
        except (S3Error, MinioException, OSError, ValueError) as error:
            raise Failed(
                f"S3 at {where} refuses or does not answer: {error}",
                "check PROCESSOR_S3_ENDPOINT, PROCESSOR_S3_ACCESS_KEY, PROCESSOR_S3_SECRET_KEY",
            ) from None
        if not exists:
            raise Failed(
                f"S3 at {s.s3_endpoint} has no bucket {s.recordings_bucket}",
                "create it, or set PROCESSOR_RECORDINGS_BUCKET",
            )
        return f"{where} reachable"

    async def shm(self) -> str:
        return await asyncio.to_thread(shm_check)


def shm_check() -> str:
    """/dev/shm exists, takes a write and has room for Triton's frame regions."""
    fix = "mount a tmpfs at /dev/shm (docker: --shm-size=1g, or --ipc=host)"
    if not SHM.is_dir():
        raise Failed("/dev/shm does not exist", fix)
    free = shutil.disk_usage(SHM).free
    try:
        with tempfile.NamedTemporaryFile(dir=SHM, prefix="workshop-doctor-") as handle:
            handle.write(b"\0" * 1024 * 1024)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        raise Failed(f"cannot write to /dev/shm: {error.strerror}", fix) from None
    if free < SHM_MIN_FREE:
        raise Failed(f"/dev/shm has {free // 2**20} MiB free; frames need at least 64", fix)
    return f"writable, {free // 2**20} MiB free"


def report(opts: Options, checks: list[Check]) -> None:
    rows = [dataclasses.asdict(c) for c in checks]
    if opts.json:
        emit(opts, {"ok": all(c.ok for c in checks), "checks": rows})
        return
    for c in checks:
        print(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}")
        if c.fix:
            print(f"     fix: {c.fix}")
