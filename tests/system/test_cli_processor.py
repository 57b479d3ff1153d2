"""The `workshop` command line with a real processor (DALI/PyAV decode, the bundled Triton):
`runs watch` follows a real run's live stream to its exit code, and `doctor` checks a
processor host, each check failing on purpose with its message and fix."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_world import CODE, save_workflow
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.cli_runner import start, workshop
from tests.processor_world import DEVICE, build_world, run_key, running_processor, yard_spec
from workshop.v1 import operator_pb2 as op

pytestmark = pytest.mark.triton


async def test_watch_follows_a_real_run_to_completion(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path)
    await save_workflow(c, "yard", yard_spec(world.model))
    created = await workshop(
        c,
        *("runs", "create", "r1", "--workflow", "yard", "--runtime", world.runtime_id),
        *("--mode", "test", "--image-limit", "20"),
    )
    assert created.code == 0, created.err
    watcher = await start(c, "-o", "jsonl", "runs", "watch", "r1")
    assert watcher.stdout is not None
    await asyncio.wait_for(watcher.stdout.readline(), 30)  # following before any job starts
    async with running_processor(c, preview, triton_server, world.runtime_id):
        out, err = await asyncio.wait_for(watcher.communicate(), 120)
    assert watcher.returncode == 0, err.decode()
    updates = [json.loads(line) for line in out.decode().splitlines()]
    assert len(updates) >= 2  # progress arrives as it happens, not only the end
    assert [u["final"] for u in updates] == [False] * (len(updates) - 1) + [True]
    last = updates[-1]["detail"]
    assert last["run"]["status"] == "completed"
    assert last["run"]["counts"]["slots_frame"] == 20
    for job in ("j0", "j1"):  # each job's progress only goes up
        seen = [
            j["progress_percent"]
            for u in updates
            for j in u["detail"]["jobs"]
            if j["job_id"] == job
        ]
        assert seen == sorted(seen)
        assert seen[-1] == 100


def _processor_env(
    c: CoordinatorHarness, preview: PreviewHarness, triton: TritonServer, key: str
) -> dict[str, str]:
    s3 = preview.bucket.server
    return {
        "PROCESSOR_DEVICE_ID": DEVICE,
        "PROCESSOR_KEY": key,
        "PROCESSOR_COORDINATOR_TARGET": f"127.0.0.1:{c.port}",
        "PROCESSOR_TRITON_TARGET": triton.grpc_url,
        "PROCESSOR_MODEL_REPOSITORY": str(triton.model_repository),
        "PROCESSOR_S3_ENDPOINT": s3.endpoint,
        "PROCESSOR_S3_ACCESS_KEY": s3.access_key,
        "PROCESSOR_S3_SECRET_KEY": s3.secret_key,
        "PROCESSOR_RECORDINGS_BUCKET": preview.bucket.name,
    }


async def test_doctor_passes_on_a_good_host_and_names_each_failure(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path, cameras=["cam-a"])
    good = _processor_env(c, preview, triton_server, await run_key(c))
    healthy = await workshop(c, "-o", "json", "doctor", env=good)
    assert healthy.code == 0, healthy.out + healthy.err
    checks = {check["name"]: check for check in healthy.json()["checks"]}
    assert all(check["ok"] for check in checks.values()), checks
    assert world.model in checks["triton models"]["detail"]

    # other code: a runtime of this device registered with another code_sha256
    other = await c.operator.RegisterRuntime(
        op.RegisterRuntimeRequest(device_id=DEVICE, engine="workshop-old", code_sha256=CODE),
        metadata=c.admin,
    )
    # another device's key
    await c.operator.RegisterDevice(
        op.RegisterDeviceRequest(device_id="other-box"), metadata=c.admin
    )
    foreign = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="other-box"), name="other")
    broken = good | {
        "PROCESSOR_RUNTIME_ID": other.runtime.runtime_id,
        "PROCESSOR_KEY": foreign,
        "PROCESSOR_TRITON_TARGET": "127.0.0.1:1",  # Triton down
        "PROCESSOR_S3_SECRET_KEY": "wrong",
    }
    failing, ghost, table = await asyncio.gather(
        workshop(c, "-o", "json", "doctor", env=broken),
        workshop(c, "-o", "json", "doctor", env=good | {"PROCESSOR_DEVICE_ID": "ghost"}),
        workshop(c, "doctor", env=broken),
    )
    assert failing.code == 1
    checks = {check["name"]: check for check in failing.json()["checks"]}
    assert checks["device registered"]["ok"]
    code = checks["runtime code"]
    assert not code["ok"]
    assert f"registered with {CODE}" in code["detail"]
    assert "workshop runtimes register --device gpu-box" in code["fix"]
    key = checks["processor key"]
    assert not key["ok"]
    assert "workshop:run key for device other-box, not gpu-box" in key["detail"]
    assert "--scope workshop:run@gpu-box" in key["fix"]
    triton = checks["triton models"]
    assert not triton["ok"]
    assert "Triton at 127.0.0.1:1 (PROCESSOR_TRITON_TARGET) does not answer" in triton["detail"]
    assert not checks["s3 recordings"]["ok"]
    assert "PROCESSOR_S3_SECRET_KEY" in checks["s3 recordings"]["fix"]
    assert checks["/dev/shm"]["ok"]
    assert ghost.code == 1
    ghost_checks = {check["name"]: check for check in ghost.json()["checks"]}
    assert (
        "device 'ghost' (PROCESSOR_DEVICE_ID) is not registered"
        in (ghost_checks["device registered"]["detail"])
    )
    assert ghost_checks["device registered"]["fix"] == "workshop devices register ghost"
    assert table.code == 1
    assert "FAIL runtime code:" in table.out
    assert "fix: create one with `workshop keys create" in table.out
