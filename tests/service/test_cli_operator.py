"""The `workshop` operator commands as subprocesses against a real coordinator, preview
service and S3 (SeaweedFS): recordings import/list/delete, devices, runtimes, models, keys,
users and buckets."""

from __future__ import annotations

import asyncio
import hashlib
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness
from tests.cli_runner import workshop
from tools.demo.scenes import random_scene, write_recording
from tools.model_repository.detector import build_detector, weights_sha256
from workshop.kit.processor_manifest import manifest_for
from workshop.v1 import operator_pb2 as op

START = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)


def _s3_env(preview: PreviewHarness, bucket: str | None = None) -> dict[str, str]:
    server = preview.bucket.server
    return {
        "WORKSHOP_S3_ENDPOINT": server.endpoint,
        "WORKSHOP_S3_ACCESS_KEY": server.access_key,
        "WORKSHOP_S3_SECRET_KEY": server.secret_key,
        "WORKSHOP_RECORDINGS_BUCKET": bucket or preview.bucket.name,
    }


async def test_recordings_import_a_folder_and_a_file(
    coordinator: CoordinatorHarness, preview: PreviewHarness, tmp_path: Path
) -> None:
    c = coordinator
    folder = tmp_path / "footage"
    folder.mkdir()
    # the start from the name, the camera too; 3 s at 10 fps each
    named = folder / "cam-a_20261129T080000Z.webm"
    write_recording(named, random_scene(1, seconds=3), seconds=3, fps=10, codec="vp9")
    other = folder / "cam-b_20261129T081500Z.mp4"
    write_recording(other, random_scene(2, seconds=4), seconds=4, fps=10, codec="h264")
    env = _s3_env(preview)

    planned = await workshop(c, "-o", "json", "recordings", "import", str(folder), "--dry-run")
    assert planned.code == 0, planned.err
    assert [r["recording_id"] for r in planned.json()] == [
        "cam-a-20261129T080000Z",
        "cam-b-20261129T081500Z",
    ]
    assert await preview.keys("recordings/") == []

    imported = await workshop(c, "-o", "json", "recordings", "import", str(folder), env=env)
    assert imported.code == 0, imported.err
    rows = {r["recording_id"]: r for r in imported.json()}
    assert all(r["imported"] for r in rows.values())
    listed = await c.operator.ListRecordings(op.ListRecordingsRequest(), metadata=c.admin)
    got = {r.recording_id: r for r in listed.recordings}
    a = got["cam-a-20261129T080000Z"]
    data = named.read_bytes()
    assert (a.camera_id, a.fps, a.byte_size) == ("cam-a", 10.0, len(data))
    assert a.sha256 == hashlib.sha256(data).hexdigest()
    assert a.start.ToDatetime(tzinfo=UTC) == START
    assert a.end.ToDatetime(tzinfo=UTC) == START + timedelta(seconds=3)
    b = got["cam-b-20261129T081500Z"]
    assert b.end.ToDatetime(tzinfo=UTC) == START + timedelta(minutes=15, seconds=4)
    assert await preview.keys("recordings/") == sorted(r.object_key for r in got.values())
    cameras = await c.operator.ListCameras(op.ListCamerasRequest(), metadata=c.admin)
    assert [cam.camera_id for cam in cameras.cameras] == ["cam-a", "cam-b"]

    # importing the same bytes again changes nothing (no new generation)
    again = await workshop(c, "-o", "json", "recordings", "import", str(folder), env=env)
    assert [r["imported"] for r in again.json()] == [False, False]
    assert [r["generation"] for r in again.json()] == [1, 1]

    # one file with its start, camera and id given; a file with no start is refused
    loose = tmp_path / "clip.webm"
    write_recording(loose, random_scene(3, seconds=2), seconds=2, fps=10, codec="vp9")
    one, no_start, no_bucket = await asyncio.gather(
        workshop(
            c,
            "-o",
            "json",
            "recordings",
            "import",
            str(loose),
            "--camera",
            "cam-c",
            "--start",
            "2026-11-29T09:00:00+01:00",
            "--id",
            "clip-1",
            env=env,
        ),
        workshop(c, "recordings", "import", str(loose), "--camera", "cam-c", env=env),
        # a bucket S3 does not have: the upload fails and nothing is registered
        workshop(
            c,
            "recordings",
            "import",
            str(loose),
            "--camera",
            "cam-d",
            "--start",
            "2026-11-29T09:00:00Z",
            env=_s3_env(preview, "no-such-bucket"),
        ),
    )
    assert one.code == 0, one.err
    [clip] = one.json()
    assert (clip["recording_id"], clip["start"]) == ("clip-1", "2026-11-29T09:00:00+01:00")
    assert no_start.code == 1
    assert no_start.err.startswith("workshop: INVALID_FIELD: ")
    assert "no start time: pass --start" in no_start.err
    assert no_bucket.code == 1
    assert no_bucket.err.startswith("workshop: UNAVAILABLE: S3 refused no-such-bucket/")
    cameras = await c.operator.ListCameras(op.ListCamerasRequest(), metadata=c.admin)
    assert "cam-d" not in [cam.camera_id for cam in cameras.cameras]

    listed_cli, deleted = await asyncio.gather(
        workshop(c, "-o", "json", "recordings", "list", "--camera", "cam-a"),
        workshop(c, "recordings", "delete", "clip-1"),
    )
    assert [r["recording_id"] for r in listed_cli.json()] == ["cam-a-20261129T080000Z"]
    assert deleted.code == 0, deleted.err
    gone = await workshop(c, "recordings", "delete", "nope")
    assert gone.code == 1
    assert gone.err.startswith("workshop: NOT_FOUND: ")


async def test_devices_runtimes_models_keys_users_buckets(
    coordinator: CoordinatorHarness, preview: PreviewHarness, tmp_path: Path
) -> None:
    c = coordinator
    device = await workshop(c, "-o", "json", "devices", "register", "gpu-box")
    assert device.code == 0, device.err
    runtime, published = await asyncio.gather(
        workshop(c, "-o", "json", "runtimes", "register", "--device", "gpu-box"),
        workshop(
            c,
            "models",
            "publish",
            "--repository",
            str(tmp_path / "models"),
            "--name",
            "det",
            "--version",
            "1",
            "--demo-detector",
        ),
    )
    assert runtime.code == 0, runtime.err
    assert runtime.json()["runtime_id"] == manifest_for("gpu-box")["runtime_id"]
    assert published.code == 0, published.err
    devices, runtimes, models = await asyncio.gather(
        workshop(c, "-o", "json", "devices", "list"),
        workshop(c, "runtimes", "list"),
        workshop(c, "-o", "json", "models", "list"),
    )
    assert [d["device_id"] for d in devices.json()] == ["gpu-box"]
    assert "gpu-box" in runtimes.out
    [model] = models.json()
    assert model["weights_sha256"] == weights_sha256(build_detector(360, 640))

    # keys: create (the secret once), list, revoke; the revoked key is refused
    made = await workshop(
        c, "-o", "json", "keys", "create", "--name", "proc", "--scope", "workshop:run@gpu-box"
    )
    assert made.code == 0, made.err
    key_id, secret = made.json()["key"]["key_id"], made.json()["secret"]
    assert made.json()["key"]["scopes"][0]["device_id"] == "gpu-box"
    keys = await workshop(c, "keys", "list")
    assert key_id in keys.out
    assert "workshop:run@gpu-box" in keys.out
    revoked, bad_scope = await asyncio.gather(
        workshop(c, "keys", "revoke", key_id),
        workshop(c, "keys", "create", "--name", "x", "--scope", "everything"),
    )
    assert revoked.code == 0, revoked.err
    assert bad_scope.code == 2
    refused = await workshop(c, "devices", "list", env={"WORKSHOP_KEY": secret})
    assert refused.code == 1
    assert refused.err.startswith("workshop: CREDENTIAL_REJECTED: ")

    # users: create, set a password from stdin (never echoed), disable
    created = await workshop(c, "-o", "json", "users", "create", "ana", "--display-name", "Ana")
    assert created.code == 0, created.err
    password = await workshop(
        c,
        "-o",
        "json",
        "users",
        "set-password",
        "ana",
        "--password-stdin",
        stdin="correct horse battery\n",
    )
    assert password.code == 0, password.err
    assert password.json()["has_password"] is True
    assert "correct horse" not in password.out + password.err
    disabled = await workshop(c, "-o", "json", "users", "disable", "ana")
    assert disabled.json()["disabled"] is True

    # buckets: create, list, items (none yet), export (an empty archive)
    bucket = await workshop(c, "buckets", "create", "yard")
    assert bucket.code == 0, bucket.err
    archive = tmp_path / "yard.tar"
    listed, items, exported, no_preview = await asyncio.gather(
        workshop(c, "-o", "json", "buckets", "list"),
        workshop(c, "-o", "json", "buckets", "items", "yard", "--review", "pending"),
        workshop(
            c,
            "-o",
            "json",
            "buckets",
            "export",
            "yard",
            "--format",
            "yolo",
            "--out",
            str(archive),
            env={"WORKSHOP_PREVIEW": f"127.0.0.1:{preview.port}"},
        ),
        workshop(c, "buckets", "export", "yard"),
    )
    assert [b["bucket_id"] for b in listed.json()] == ["yard"]
    assert items.json() == []
    assert exported.code == 0, exported.err
    assert exported.json()["items"] == 0
    with tarfile.open(archive) as tar:
        assert "classes.txt" in [m.name for m in tar.getmembers()]
    assert no_preview.code == 2
    assert "--preview" in no_preview.err
