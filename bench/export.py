"""Exporting a bucket as a dataset (ExportBucket) through the preview service over real S3.

    .venv/bin/python -m bench.export [--items 100000 | --quick] [--format coco|yolo]
                                     [--check] [--version]

Starts a throwaway Postgres cluster (the test harness's) with a migrated database,
SeaweedFS (`weed mini`, data in a temporary directory), and the coordinator and the
preview service each as its own process (`bench/services.py`: `python -m
services.coordinator`, `python -m services.preview`, system clock), so that what the
preview service's memory does is its own: the figure is its kernel-accounted peak,
VmHWM from /proc/<pid>/status after the export, less its VmRSS just before it.

Setup, not measured. Putting `--items` items through Claim, StageUpload and Complete
would take longer than the export itself, so the bucket's rows are written straight
into the coordinator's tables, as a committed job would leave them: gpu-box, cam-a and
cam-b with one recording each, a full run of the workflow `bench` (its two jobs), then
`bucket_items` (accepted, two boxes each: person and vehicle, the cameras taking turns,
one frame a second) with their `staged_objects` rows (uploads, committed); the
table's trigger adds their boxes and counts them as a commit does (the first page's
class list is read from those counters). The bytes are real and really in S3: a 64x48
JPEG (PyAV), made unique per item with a comment segment (about 3 KB), put with the
minio SDK from 16 threads.

Measured: one ExportBucket call by an admin key, from the request to the last chunk,
the client only counting the bytes (`--check` also reads the whole archive back with
tarfile, after the clock stops). Reported: items/s, MB/s of archive, CPU seconds of the
preview service, the coordinator and SeaweedFS, and the preview service's peak RSS
growth. The last line is `RESULT export_items_per_s=<x> export_peak_rss_mb=<y>`.

`--version` (docs/datasets.md) first freezes the bucket into a dataset version
(DatasetService.CreateDatasetVersion: the freeze's wall time is the figure, its target
10 s for 100,000 items), exports the version instead of the live bucket, then resumes
that export half-way (`offset`: the layout the whole export stored in S3, then the
second half; the time to the first byte is reported too) and checks the two halves give
the whole archive's bytes; the RESULT line adds `freeze_s=<x> resume_s=<y>`.
Everything it starts is stopped on exit, also on error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import signal
import struct
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType

import urllib3
from minio import Minio

from bench.proc_stats import CpuMeter, status_kb
from bench.services import SeparateServices, separate_services
from testbed.coordinator_world import DAY, build_world, run_request, save_workflow, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.postgres import (
    TIMINGS,
    PostgresUnavailable,
    create_migrated_database,
    postgres_cluster,
)
from testbed.harness.preview import jpeg_bytes
from testbed.harness.s3 import REGION, S3HarnessError, S3Server, running_s3_server
from workshop.kit.channels import open_channel
from workshop.kit.object_keys import object_key
from workshop.kit.server import run_event_loop
from workshop.v1 import common_pb2, dataset_pb2, dataset_pb2_grpc, preview_pb2_grpc, run_pb2
from workshop.v1 import preview_pb2 as pb

DATABASE = "bench_export"
BUCKET = "bench-export"  # the S3 bucket
DATASET = "yard"  # the Workshop bucket (build_world's)
WORKFLOW_ID = "bench"
RUN_ID = "bench-export"
QUICK_ITEMS = 2_000
UPLOAD_THREADS = 16
COPY_BATCH = 10_000
FORMATS = {"coco": run_pb2.DATASET_FORMAT_COCO, "yolo": run_pb2.DATASET_FORMAT_YOLO}
BOXES = [
    {"class_name": "person", "score": 0.9, "x": 0.1, "y": 0.2, "w": 0.3, "h": 0.4},
    {"class_name": "vehicle", "score": 0.8, "x": 0.55, "y": 0.5, "w": 0.25, "h": 0.2},
]
# Rows as a committed job leaves them; the per-item columns travel as arrays.
ITEMS_SQL = """
INSERT INTO bucket_items (item_id, bucket_id, run_id, job_index, slot_index, step_id, camera_id,
                          recording_id, recording_generation, frame_time, boxes, object_key,
                          sha256, review_state, saved_at, reviewed_at)
SELECT t.item_id, $1, $2, t.job_index, t.slot_index, 'save', t.camera_id, t.recording_id, 1,
       t.frame_time, $3::jsonb, t.object_key, t.sha256, 'accepted', $4, $4
FROM unnest($5::text[], $6::int[], $7::int[], $8::text[], $9::text[], $10::timestamptz[],
            $11::text[], $12::text[])
     AS t(item_id, job_index, slot_index, camera_id, recording_id, frame_time, object_key, sha256)
"""
OBJECTS_SQL = """
INSERT INTO staged_objects (object_key, kind, run_id, job_index, generation, slot_index, sha256,
                            byte_size, content_type, staged_at, published_at, item_id,
                            frame_time, boxes)
SELECT t.object_key, 'upload', $1, t.job_index, 1, t.slot_index, t.sha256, t.byte_size,
       'image/jpeg', $3, $3, t.item_id, t.frame_time, $2::jsonb
FROM unnest($4::text[], $5::int[], $6::int[], $7::text[], $8::bigint[], $9::text[],
            $10::timestamptz[])
     AS t(object_key, job_index, slot_index, sha256, byte_size, item_id, frame_time)
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--items", type=int, default=100_000, help="items in the bucket")
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_ITEMS:,} items (overrides --items)"
    )
    parser.add_argument("--format", choices=sorted(FORMATS), default="coco")
    parser.add_argument("--check", action="store_true", help="read the archive back")
    parser.add_argument(
        "--version", action="store_true", help="freeze a dataset version and export it"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.items = QUICK_ITEMS
    if args.items < 1:
        parser.error("--items must be at least 1")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with (
            postgres_cluster() as cluster,
            tempfile.TemporaryDirectory(prefix="bench-export-") as scratch,
            running_s3_server(Path(scratch)) as s3,
        ):
            say(
                f"postgres: {cluster.bin_dir} on {cluster.host}:{cluster.port} "
                f"(initdb {TIMINGS.initdb_s:.2f} s, start {TIMINGS.start_s:.2f} s); "
                f"seaweedfs: {s3.weed} on {s3.endpoint}"
            )
            dsn = create_migrated_database(cluster, DATABASE)
            s3.client().make_bucket(BUCKET)
            try:
                rate, peak_mb, extra = run_event_loop(_bench(dsn, s3, Path(scratch), args))
            except asyncio.CancelledError:  # SIGTERM while the loop ran
                raise SystemExit(128 + signal.SIGTERM) from None
    except PostgresUnavailable as unavailable:
        say(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    except S3HarnessError as problem:
        say(f"cannot start SeaweedFS: {problem}")
        return 2
    more = "".join(f" {name}={value:.2f}" for name, value in extra.items())
    say(f"RESULT export_items_per_s={rate:.1f} export_peak_rss_mb={peak_mb:.1f}{more}")
    return 0


def say(line: str = "") -> None:
    print(line, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


async def _bench(
    dsn: str, s3: S3Server, scratch: Path, args: argparse.Namespace
) -> tuple[float, float, dict[str, float]]:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    async with separate_services(dsn, s3, scratch, bucket=BUCKET) as services:
        c = services.coordinator
        began = time.perf_counter()
        images = await _fill_bucket(c, s3, args.items)
        say(
            f"setup: {args.items:,} items ({sum(len(image) for image in images):,} bytes of "
            f"JPEG in S3) in {time.perf_counter() - began:.1f} s; services as their own processes"
        )
        extra: dict[str, float] = {}
        version_id = ""
        if args.version:
            version_id, extra["freeze_s"] = await _freeze(c, args.items)
        rate, growth = await _export(services, s3, args, images, version_id)
        if version_id:
            extra["resume_s"] = await _resume(services, args, version_id)
        return rate, growth, extra


async def _freeze(c: CoordinatorHarness, items: int) -> tuple[str, float]:
    """Freezes the bucket (every item accepted) into a version; its id and the wall time."""
    stub = dataset_pb2_grpc.DatasetServiceStub(c.channel)
    began = time.perf_counter()
    answer = await stub.CreateDatasetVersion(
        dataset_pb2.CreateDatasetVersionRequest(bucket_id=DATASET, name="bench", seed=1),
        metadata=c.admin,
        timeout=120,
    )
    wall = time.perf_counter() - began
    version = answer.version
    if version.item_count != items:
        raise AssertionError(f"froze {version.item_count} items of {items}")
    say()
    say(
        f"CreateDatasetVersion of {items:,} items: {wall:.2f} s wall (target 10 s at "
        f"100,000); {version.train_count:,} train, {version.val_count:,} val, "
        f"{version.box_count:,} boxes"
    )
    return version.version_id, wall


async def _resume(services: SeparateServices, args: argparse.Namespace, version_id: str) -> float:
    """The version's export whole, then from half-way: the same bytes; the resume's wall."""
    channel = open_channel(f"127.0.0.1:{services.preview_port}", max_attempts=1)
    md = services.coordinator.admin
    try:
        stub = preview_pb2_grpc.PreviewServiceStub(channel)
        request = pb.ExportBucketRequest(dataset_version_id=version_id, format=FORMATS[args.format])
        digest, size = hashlib.sha256(), 0
        async for response in stub.ExportBucket(request, metadata=md):
            size += len(response.data)
            digest.update(response.data)
        whole = digest.hexdigest()
        half = size // 2 + 777  # in the middle of a member, whatever the layout
        first = hashlib.sha256()
        taken = 0
        async for response in stub.ExportBucket(request, metadata=md):
            piece = response.data[: max(0, half - taken)]
            first.update(piece)
            taken += len(response.data)
            if taken >= half:
                break
        request.offset = half
        began = time.perf_counter()
        rest = 0
        total = 0
        first_byte = 0.0
        async for response in stub.ExportBucket(request, metadata=md):
            if response.HasField("total_bytes"):
                total = response.total_bytes
                first_byte = time.perf_counter() - began
            first.update(response.data)
            rest += len(response.data)
        wall = time.perf_counter() - began
    finally:
        await channel.close()
    if first.hexdigest() != whole or total != size:
        raise AssertionError("the resumed archive differs from the whole one")
    say(
        f"  resumed at byte {half:,} of {size:,}: {rest:,} bytes in {wall:.2f} s wall, the "
        f"first after {first_byte:.2f} s (the layout the whole export stored, then the "
        "second half); the same bytes as the whole archive"
    )
    return wall


async def _fill_bucket(c: CoordinatorHarness, s3: S3Server, items: int) -> list[bytes]:
    """The rows a committed run would leave (see the module docstring), and the bytes."""
    await build_world(c, recordings_per_camera=1)
    await save_workflow(c, WORKFLOW_ID, workflow_spec(cameras=("cam-a", "cam-b"), interval=60))
    world_runtime = await _tracking_runtime(c)
    await c.workshop.CreateRun(
        run_request(RUN_ID, WORKFLOW_ID, world_runtime, mode=common_pb2.RUN_MODE_FULL),
        metadata=c.admin,
    )
    async with c.db.connection() as connection:
        jobs = await connection.fetch(
            "SELECT job_index, camera_id, recording_id, recording_generation, generation "
            "FROM jobs WHERE run_id = $1 ORDER BY camera_id",
            RUN_ID,
        )
    assert [job["camera_id"] for job in jobs] == ["cam-a", "cam-b"], jobs
    base = jpeg_bytes(64, 48, seed=1)
    now = datetime.now(UTC)
    images: list[bytes] = []
    rows: list[tuple[str, int, int, str, str, datetime, str, str, int]] = []
    keys = []
    for n in range(items):
        job = jobs[n % 2]
        # a comment segment right after SOI makes each image's bytes (and digest) its own
        tag = f"item {n}".encode()
        image = base[:2] + b"\xff\xfe" + struct.pack(">H", len(tag) + 2) + tag + base[2:]
        key = object_key(
            "upload", RUN_ID, f"job-{job['job_index']}", 1, n, test=False, content_type="image/jpeg"
        )
        images.append(image)
        keys.append(key)
        rows.append(
            (
                f"it_{n:024x}",
                job["job_index"],
                n,
                job["camera_id"],
                job["recording_id"],
                DAY + timedelta(hours=8, seconds=n),
                key,
                hashlib.sha256(image).hexdigest(),
                len(image),
            )
        )
    async with c.db.transaction() as connection:
        for start in range(0, items, COPY_BATCH):
            batch = rows[start : start + COPY_BATCH]
            ids, job_indexes, slots, cameras, recordings, times, batch_keys, digests, sizes = (
                list(column) for column in zip(*batch, strict=True)
            )
            await connection.execute(
                ITEMS_SQL,
                DATASET,
                RUN_ID,
                BOXES,
                now,
                ids,
                job_indexes,
                slots,
                cameras,
                recordings,
                times,
                batch_keys,
                digests,
            )
            await connection.execute(
                OBJECTS_SQL,
                RUN_ID,
                BOXES,
                now,
                batch_keys,
                job_indexes,
                slots,
                digests,
                sizes,
                ids,
                times,
            )
    await asyncio.to_thread(_upload, s3, keys, images)
    return images


async def _tracking_runtime(c: CoordinatorHarness) -> str:
    async with c.db.connection() as connection:
        runtime: str = await connection.fetchval(
            "SELECT runtime_id FROM runtimes WHERE engine = 'workshop-processor'"
        )
    return runtime


def _upload(s3: S3Server, keys: list[str], images: list[bytes]) -> None:
    http = urllib3.PoolManager(maxsize=UPLOAD_THREADS, retries=urllib3.Retry(total=2))
    client = Minio(
        s3.endpoint,
        access_key=s3.access_key,
        secret_key=s3.secret_key,
        secure=False,
        region=REGION,
        http_client=http,
    )

    def put(index: int) -> None:
        image = images[index]
        client.put_object(
            BUCKET, keys[index], io.BytesIO(image), length=len(image), content_type="image/jpeg"
        )

    try:
        with ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="upload") as pool:
            for _ in pool.map(put, range(len(keys))):
                pass
    finally:
        http.clear()


async def _export(
    services: SeparateServices,
    s3: S3Server,
    args: argparse.Namespace,
    images: list[bytes],
    version_id: str = "",
) -> tuple[float, float]:
    preview_pid = services.preview_process.process.pid
    coordinator_pid = services.coordinator_process.process.pid
    weed_pid = s3.pid
    request = pb.ExportBucketRequest(bucket_id=DATASET, format=FORMATS[args.format])
    if version_id:
        request = pb.ExportBucketRequest(dataset_version_id=version_id, format=FORMATS[args.format])
    channel = open_channel(f"127.0.0.1:{services.preview_port}", max_attempts=1)
    try:
        stub = preview_pb2_grpc.PreviewServiceStub(channel)
        rss_before_kb = status_kb(preview_pid, "VmRSS")
        cpu_before = _cpu(preview_pid, coordinator_pid, weed_pid)
        kept: list[bytes] = []
        size = chunks = exported = 0
        began = time.perf_counter()
        async for response in stub.ExportBucket(request, metadata=services.coordinator.admin):
            size += len(response.data)
            chunks += 1
            if args.check:
                kept.append(response.data)
            if response.last:
                exported = response.items
        wall = time.perf_counter() - began
        cpu_after = _cpu(preview_pid, coordinator_pid, weed_pid)
        peak_kb = status_kb(preview_pid, "VmHWM")
    finally:
        await channel.close()
    if exported != len(images):
        raise AssertionError(f"exported {exported} items of {len(images)}")
    growth_mb = (peak_kb - rss_before_kb) / 1024
    rate = exported / wall
    cpu = {name: cpu_after[name] - cpu_before[name] for name in cpu_before}
    say()
    what = f"version {version_id[:15]}" if version_id else "the live bucket"
    say(
        f"ExportBucket ({args.format}, {what}) of {exported:,} items: {size:,} bytes in "
        f"{chunks} chunks"
    )
    say(
        f"  {wall:.2f} s wall: {rate:,.0f} items/s, {size / wall / 1e6:.1f} MB/s; "
        f"{cpu['preview'] / exported * 1e6:.0f} us preview CPU per item"
    )
    say("  CPU s: " + ", ".join(f"{name} {seconds:.2f}" for name, seconds in cpu.items()))
    say(
        f"  preview service RSS: {rss_before_kb / 1024:.1f} MB before, "
        f"peak {peak_kb / 1024:.1f} MB (VmHWM): growth {growth_mb:.1f} MB"
    )
    if args.check:
        _check(b"".join(kept), args.format, images)
        say("  check: the archive reads back with every image and its index")
    return rate, growth_mb


def _cpu(preview: int, coordinator: int, weed: int | None) -> dict[str, float]:
    roots = {"preview": preview, "coordinator": coordinator, "seaweedfs": weed}
    return CpuMeter(roots, this_process=None).mark()


def _check(data: bytes, dataset_format: str, images: list[bytes]) -> None:
    index = "annotations.json" if dataset_format == "coco" else "classes.txt"
    digests = {hashlib.sha256(image).hexdigest() for image in images}
    found = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            extracted = tar.extractfile(member)
            assert extracted is not None
            body = extracted.read()
            if member.name.startswith("images/"):
                assert hashlib.sha256(body).hexdigest() in digests, member.name
                found += 1
            elif member.name == index and dataset_format == "coco":
                coco = json.loads(body)
                assert len(coco["images"]) == len(images)
                assert len(coco["annotations"]) == len(images) * len(BOXES)
    assert found == len(images), (found, len(images))


if __name__ == "__main__":
    sys.exit(main())
