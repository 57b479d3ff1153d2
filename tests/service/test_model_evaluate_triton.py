"""`workshop models evaluate`'s pass (`workshop.kit.evaluation.run_over`) through the bundled
Triton serving the demo detector: with Triton on this host each worker's images travel in a
region of system shared memory, registered while the pass runs and gone after it; a Triton
that cannot map the region gets the images in its requests. The scores are the same either
way, and the same as with the images sent in the requests from the start."""

from __future__ import annotations

import contextlib
import logging
import secrets
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as triton

from testbed.harness.triton import TritonServer
from testbed.yolo_exports import export_chunks, scene_items
from tools.model_repository.detector import CLASSES, build_detector
from tools.model_repository.repository import publish_version
from workshop.kit import evaluation, shared_memory
from workshop.kit.evaluation import Progress, ServedModel, run_over, served_model

pytestmark = pytest.mark.triton
ITEMS = 12
WORKERS = 2


@pytest.fixture(scope="module")
def detector(triton_server: TritonServer) -> ServedModel:
    name = f"detector_{secrets.token_hex(4)}"
    publish_version(
        triton_server.model_repository,
        name,
        1,
        build_detector(360, 640),
        classes=CLASSES,
        max_batch_size=8,
        instances=2,
    )
    with _client(triton_server) as client:
        return served_model(client, name, 1, CLASSES)


def _client(server: TritonServer) -> contextlib.closing[triton.InferenceServerClient]:
    return contextlib.closing(triton.InferenceServerClient(server.grpc_url))


def _ours(client: triton.InferenceServerClient) -> set[str]:
    """The evaluation's regions Triton holds now."""
    status = client.get_system_shared_memory_status(as_json=True)
    return {n for n in status.get("regions", {}) if n.startswith(evaluation.REGION_PREFIX)}


def _pass(
    server: TritonServer, model: ServedModel, *, shared: bool, seen: set[str] | None = None
) -> dict[str, Any]:
    """The pass's report over ITEMS items; `seen` gathers the evaluation's regions Triton
    held whenever the pass reported progress."""
    with _client(server) as watcher:

        def progress(_: Progress) -> None:
            if seen is not None:
                seen.update(_ours(watcher))

        done = run_over(
            export_chunks(ITEMS, scene_items(ITEMS)),
            lambda: triton.InferenceServerClient(server.grpc_url),
            [model],
            workers=WORKERS,
            progress=progress,
            shared_memory=shared,
        )
        assert _ours(watcher) == set(), "a region was left registered"
    assert done.items == ITEMS
    return done.report(0)


def test_the_images_travel_in_shared_memory_and_score_as_in_the_requests(
    triton_server: TritonServer, detector: ServedModel
) -> None:
    in_requests = _pass(triton_server, detector, shared=False)
    assert in_requests["detections"] > ITEMS  # the scenes hold boxes the detector finds
    seen: set[str] = set()
    assert _pass(triton_server, detector, shared=True, seen=seen) == in_requests
    assert 1 <= len(seen) <= WORKERS  # a region a worker, while the pass ran
    # Triton mapped them, so their names were released: a crash leaves no file behind
    assert not [n for n in seen if (shared_memory.SHM_DIR / n).exists()]


def test_a_triton_that_cannot_map_the_region_gets_the_images_in_the_requests(
    triton_server: TritonServer,
    detector: ServedModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A region made outside /dev/shm is what a Triton that does not share this host's
    /dev/shm sees (one reached through `kubectl port-forward`): nothing."""
    in_requests = _pass(triton_server, detector, shared=False)
    monkeypatch.setattr(shared_memory, "SHM_DIR", tmp_path)
    with caplog.at_level(logging.WARNING, logger=evaluation.__name__):
        assert _pass(triton_server, detector, shared=True) == in_requests
    assert "sending the images over gRPC" in caplog.text
    assert list(tmp_path.iterdir()) == []  # each region made was removed
