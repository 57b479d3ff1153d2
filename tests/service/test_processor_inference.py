"""The processor's Triton client against the real bundled Triton: pinned versions, batches
spread over the model's instances, frames through system shared memory or gRPC."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as triton

from services.processor.inference import (
    Detection,
    ModelServer,
    ModelUnavailable,
    Pin,
    Served,
    SharedMemoryMode,
    TritonUnreachable,
    batch_spans,
)
from testbed.harness.triton import TritonServer
from tools.demo.scenes import Scene, ground_truth, random_scene, render_frame
from tools.localstack.host import free_ports
from tools.localstack.triton import restartable_triton, supervised_triton
from tools.model_repository.detector import CLASSES, build_detector, weights_sha256
from tools.model_repository.repository import publish_version
from workshop.kit import shared_memory
from workshop.kit.shared_memory import is_loopback

pytestmark = pytest.mark.triton
HEIGHT, WIDTH = 360, 640
SCENES = [random_scene(seed, width=WIDTH, height=HEIGHT) for seed in range(6)]


def _publish(triton_server: TritonServer, *, max_batch_size: int, instances: int) -> Pin:
    name = f"detector_{secrets.token_hex(4)}"
    weights = build_detector(HEIGHT, WIDTH)
    publish_version(
        triton_server.model_repository,
        name,
        1,
        weights,
        classes=CLASSES,
        max_batch_size=max_batch_size,
        instances=instances,
    )
    return Pin(name, 1, weights_sha256(weights))


def _assert_matches_ground_truth(scenes: list[Scene], found: list[list[Detection]]) -> None:
    assert len(found) == len(scenes)
    for scene, detections in zip(scenes, found, strict=True):
        truth = {box.class_name: box for box in ground_truth(scene, 1.0)}
        assert truth, "a scene without objects would prove nothing"
        assert {d.class_name for d in detections} == set(truth)
        for detection in detections:
            box = truth[detection.class_name]
            assert abs(detection.x * WIDTH - box.x) <= 1
            assert abs(detection.w * WIDTH - box.w) <= 1
            assert abs(detection.y * HEIGHT - box.y) <= 1


async def _registered(triton_server: TritonServer) -> set[str]:
    client = triton.InferenceServerClient(triton_server.grpc_url)
    try:
        status = await client.get_system_shared_memory_status(as_json=True)
    finally:
        await client.close()
    return set(status.get("regions", {}))


async def test_pinned_version_is_loaded_checked_and_batched(triton_server: TritonServer) -> None:
    pin = _publish(triton_server, max_batch_size=4, instances=1)
    server = ModelServer(triton_server.grpc_url, triton_server.model_repository)
    try:
        served = await server.ensure(pin)
        assert (served.max_batch_size, served.height, served.width) == (4, HEIGHT, WIDTH)
        frames = np.stack([render_frame(scene, 1.0) for scene in SCENES])
        found = await server.infer(served, frames)  # 6 frames: two batches of 3
        _assert_matches_ground_truth(SCENES, found)
        with pytest.raises(ModelUnavailable, match="pinned"):
            await ModelServer(triton_server.grpc_url, triton_server.model_repository).ensure(
                Pin(pin.name, 1, "0" * 64)
            )
        with pytest.raises(ModelUnavailable, match="not in the model repository"):
            await server.ensure(Pin(pin.name, 7, pin.weights_sha256))
    finally:
        await server.close()


@pytest.mark.parametrize(
    ("mode", "transport"), [("auto", "shared-memory"), ("on", "shared-memory"), ("off", "grpc")]
)
async def test_frames_travel_by_shared_memory_on_the_same_host_or_by_grpc(
    triton_server: TritonServer, mode: SharedMemoryMode, transport: str
) -> None:
    """Two instances: one region each, registered with Triton while the server lives; the
    detections are the same whichever way the frames went."""
    pin = _publish(triton_server, max_batch_size=2, instances=2)
    before = await _registered(triton_server)
    server = ModelServer(triton_server.grpc_url, triton_server.model_repository, shared_memory=mode)
    try:
        served = await server.ensure(pin)
        assert (served.instances, served.transport) == (2, transport)
        ours = await _registered(triton_server) - before
        assert len(ours) == (2 if transport == "shared-memory" else 0)
        # The names are released once Triton has mapped them: nothing is left on a crash.
        assert not [name for name in ours if (shared_memory.SHM_DIR / name).exists()]
        frames = np.stack([render_frame(scene, 1.0) for scene in SCENES])
        for _ in range(2):  # the regions are reused
            _assert_matches_ground_truth(SCENES, await server.infer(served, frames))
    finally:
        await server.close()
    assert await _registered(triton_server) == before


async def test_a_triton_that_cannot_map_the_regions_gets_frames_over_grpc(
    triton_server: TritonServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regions made outside /dev/shm are what a Triton in a container without the
    processor's /dev/shm sees: nothing. "auto" falls back to gRPC; "on" refuses."""
    monkeypatch.setattr(shared_memory, "SHM_DIR", tmp_path)
    pin = _publish(triton_server, max_batch_size=4, instances=2)
    before = await _registered(triton_server)
    fallback = ModelServer(triton_server.grpc_url, triton_server.model_repository)
    strict = ModelServer(triton_server.grpc_url, triton_server.model_repository, shared_memory="on")
    try:
        with caplog.at_level(logging.WARNING, logger="services.processor.inference"):
            served = await fallback.ensure(pin)
        assert served.transport == "grpc"
        assert "sending frames over gRPC" in caplog.text
        frames = np.stack([render_frame(scene, 1.0) for scene in SCENES[:3]])
        _assert_matches_ground_truth(SCENES[:3], await fallback.infer(served, frames))
        with pytest.raises(ModelUnavailable, match="shared memory"):
            await strict.ensure(pin)
    finally:
        await fallback.close()
        await strict.close()
    assert await _registered(triton_server) == before
    assert _files(tmp_path) == []


def _files(folder: Path) -> list[Path]:
    return list(folder.iterdir())


async def test_after_triton_forgets_the_model_and_regions_the_next_ensure_restores_them(
    triton_server: TritonServer,
) -> None:
    """What a Triton restart looks like to the client: the model unloaded and the regions
    unknown. Triton answers the batch UNAVAILABLE (unknown model), so the batch's job is
    handed back rather than failed; the next ensure serves the model again."""
    pin = _publish(triton_server, max_batch_size=4, instances=1)
    server = ModelServer(triton_server.grpc_url, triton_server.model_repository)
    admin = triton.InferenceServerClient(triton_server.grpc_url)
    frames = np.stack([render_frame(scene, 1.0) for scene in SCENES[:2]])
    try:
        served = await server.ensure(pin)
        assert served.transport == "shared-memory"
        await admin.unload_model(pin.name)
        for name in await _registered(triton_server):
            if name.startswith("workshop-processor-"):
                await admin.unregister_system_shared_memory(name)
        with pytest.raises(TritonUnreachable, match="unknown model"):
            await server.infer(served, frames)
        again: Served = await server.ensure(pin)
        assert again is not served
        assert again.transport == "shared-memory"
        _assert_matches_ground_truth(SCENES[:2], await server.infer(again, frames))
    finally:
        await admin.close()
        await server.close()


async def test_a_triton_that_does_not_answer_is_unreachable_not_a_model_problem(
    triton_server: TritonServer,
) -> None:
    """Nothing listens where the processor looks for Triton (a sidecar restarting): that is
    TritonUnreachable, which hands the job back, not ModelUnavailable, which fails it. The
    same pin on the real Triton is served, so only the missing server made the difference."""
    pin = _publish(triton_server, max_batch_size=4, instances=1)
    (port,) = free_ports(1)
    gone = ModelServer(f"127.0.0.1:{port}", triton_server.model_repository)
    there = ModelServer(triton_server.grpc_url, triton_server.model_repository)
    try:
        with pytest.raises(TritonUnreachable, match="Triton did not answer"):
            await gone.ensure(pin)
        assert (await there.ensure(pin)).pin == pin
    finally:
        await gone.close()
        await there.close()


def test_batches_are_balanced_and_cover_every_instance() -> None:
    assert batch_spans(0, 8, 2) == []
    assert batch_spans(1, 8, 2) == [(0, 1)]
    assert batch_spans(10, 8, 2) == [(0, 5), (5, 10)]
    assert batch_spans(16, 8, 2) == [(0, 8), (8, 16)]
    assert batch_spans(17, 8, 2) == [(0, 6), (6, 12), (12, 17)]
    assert batch_spans(6, 4, 1) == [(0, 3), (3, 6)]


@pytest.mark.parametrize(
    ("target", "local"),
    [
        ("127.0.0.1:8001", True),
        ("localhost:8001", True),
        ("[::1]:8001", True),
        ("dns:///localhost:8001", True),
        ("unix:/run/triton.sock", True),
        ("triton.models.svc:8001", False),
        ("10.0.0.7:8001", False),
    ],
)
def test_loopback_targets(target: str, local: bool) -> None:
    assert is_loopback(target) is local


async def test_a_batch_refused_after_a_triton_restart_is_served_again_not_failed(
    tmp_path: Path,
) -> None:
    """Triton killed and started again (the chaos soak's fault): the model is no longer
    loaded ("unknown model ... not found", not UNAVAILABLE) and the regions are unknown.
    The refused batch serves the model again and is tried once more instead of failing its
    job as the model's fault; a model that is still refused then is ModelUnavailable."""
    with restartable_triton(tmp_path) as restartable:
        triton_server = restartable.server
        pin = _publish(triton_server, max_batch_size=4, instances=1)
        server = ModelServer(triton_server.grpc_url, triton_server.model_repository)
        frames = np.stack([render_frame(scene, 1.0) for scene in SCENES[:2]])
        try:
            served = await server.ensure(pin)
            _assert_matches_ground_truth(SCENES[:2], await server.infer(served, frames))
            restartable.kill()
            restartable.start()
            _assert_matches_ground_truth(SCENES[:2], await server.infer(served, frames))
            # the weights replaced behind the pin: serving again refuses, the job fails
            restartable.kill()
            restartable.start()
            weights = triton_server.model_repository / pin.name / "1" / "model.onnx"
            weights.write_bytes(weights.read_bytes() + b"\0")
            with pytest.raises(ModelUnavailable):
                await server.infer(served, frames)
        finally:
            await server.close()


async def test_a_supervised_triton_that_dies_is_started_again_and_serves(
    tmp_path: Path,
) -> None:
    """The demo's Triton (tools.localstack.triton.supervised_triton): a server that exits
    on its own, as the python backend's abort ends it (SIGABRT; SIGKILL here), is started
    again on the same ports, and the processor's next batch loads the model and is served."""
    heard: list[str] = []
    with supervised_triton(tmp_path, heard.append) as supervised:
        triton_server = supervised.server
        pin = _publish(triton_server, max_batch_size=4, instances=1)
        server = ModelServer(triton_server.grpc_url, triton_server.model_repository)
        frames = np.stack([render_frame(scene, 1.0) for scene in SCENES[:2]])
        try:
            served = await server.ensure(pin)
            first_pid = supervised.server.pid
            os.kill(first_pid, signal.SIGKILL)
            for _ in range(600):
                if any(line.startswith("Triton restarted") for line in heard):
                    break
                await asyncio.sleep(0.05)
            assert heard[0].startswith("Triton exited on its own"), heard
            assert heard[-1].startswith("Triton restarted"), heard
            assert supervised.server.pid != first_pid
            assert supervised.server.grpc_url == triton_server.grpc_url
            _assert_matches_ground_truth(SCENES[:2], await server.infer(served, frames))
        finally:
            await server.close()
