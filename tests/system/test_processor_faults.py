"""Processor faults on the real components (docs/limits-and-errors.md): a processor killed mid-job,
a recording replaced mid-job, a run cancelled mid-job.

Timing is the test's: a write is held at a gate (in the preview service's store, or in a
wrapper around the processor's real stubs) until the test has broken what it breaks, so
"mid-job" is a fact, not a race. Every call that passes the gate is answered by the real
coordinator, preview service, SeaweedFS and Triton.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import grpc
import pytest

from services.coordinator.leases.maintenance import Maintenance
from services.preview.settings import PreviewSettings
from services.preview.storage import ObjectStore
from services.processor.calls import TRANSPORTS, Transport
from testbed.coordinator_world import error_reason, run_request, save_workflow
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness, running_preview
from testbed.harness.processes import ServiceProcess
from testbed.harness.s3 import S3Bucket
from testbed.harness.triton import TritonServer
from tests.processor_gates import WAIT, Call, HeldRecords, Spy, rows, until, within
from tests.processor_world import (
    DEVICE,
    SECONDS,
    build_world,
    finished,
    job_calls,
    one_camera_run,
    put_recording,
    run_detail,
    run_key,
    running_processor,
    yard_spec,
)
from workshop.kit.auth import bearer_metadata
from workshop.kit.hashing import sha256_hex
from workshop.kit.processor_manifest import code_sha256
from workshop.v1 import common_pb2, jobs_pb2, preview_pb2_grpc
from workshop.v1 import preview_pb2 as pv
from workshop.v1 import workshop_pb2 as ws

pytestmark = pytest.mark.triton
SLOTS = SECONDS // 2  # slots per job: every 2 s of a SECONDS-long recording
FULL = common_pb2.RUN_MODE_FULL
ITEM = 2  # RunImage.source of a bucket item (1: a preview)
# A staged object's kind as its readers see it (run_published_previews_v1: a full run's
# preview that its job's commit kept is an upload), for a query of staged_objects `so`.
KIND_AS_READ = (
    "coalesce((SELECT p.kind FROM run_published_previews_v1(so.run_id) p "
    "WHERE p.object_key = so.object_key), so.kind)"
)


# gates -----------------------------------------------------------------------------------------


class HeldStore(ObjectStore):
    """The preview service's store, holding each write whose key `hold` matches until
    `gate` opens; every other write, and a held one once let through, goes to S3."""

    def __init__(self, settings: PreviewSettings, hold: Callable[[str], bool]) -> None:
        super().__init__(settings)
        self.hold = hold
        self.held = asyncio.Event()
        self.gate = asyncio.Event()
        self.waiting = 0
        self.let_through: list[str] = []  # held writes that reached S3 once let through

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        if not self.hold(key):
            await super().put(key, data, content_type)
            return
        self.waiting += 1
        self.held.set()
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1
        await super().put(key, data, content_type)
        self.let_through.append(key)


# 1. killed mid-job -----------------------------------------------------------------------------


def processor_env(
    c: CoordinatorHarness, preview: PreviewHarness, triton: TritonServer, key: str, **more: str
) -> dict[str, str]:
    """No RUNTIME_ID: the process claims for the runtime of its own code on DEVICE_ID;
    `more`: further settings (PROCESSOR_ is added)."""
    server = preview.bucket.server
    values = {
        "PORT": "0",
        "DRAIN_SECONDS": "0",
        "GRACE_SECONDS": "1",
        "DEVICE_ID": DEVICE,
        "KEY": key,
        "COORDINATOR_TARGET": f"127.0.0.1:{c.port}",
        "PREVIEW_TARGET": f"127.0.0.1:{preview.port}",
        "TRITON_TARGET": triton.grpc_url,
        "MODEL_REPOSITORY": str(triton.model_repository),
        "S3_ENDPOINT": server.endpoint,
        "S3_ACCESS_KEY": server.access_key,
        "S3_SECRET_KEY": server.secret_key,
        "RECORDINGS_BUCKET": preview.bucket.name,
        **more,
    }
    return {f"PROCESSOR_{name}": value for name, value in values.items()}


def first_attempt_preview_after_slot_0(key: str) -> bool:
    match = re.fullmatch(r"previews/r1/j0/1/(\d+)\.jpg", key)
    return match is not None and int(match[1]) >= 1


async def test_a_processor_killed_mid_job_is_replaced_after_its_lease_lapses(
    coordinator: CoordinatorHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """`python -m services.processor`, publishing through PublishPreview (the path of
    processors before grants), is SIGKILLed while its first attempt waits on the
    write of slot 1's preview (slot 0's preview, which in a full run is also its upload,
    accepted). Until the lease lapses nobody else gets the job; then a second processor
    takes it under generation 2 and commits it once: each slot one item whose object is
    generation 2's preview of that slot, one receipt, and the dead attempt's objects are
    garbage that cleanup deletes."""
    c = coordinator

    def held_store(settings: PreviewSettings) -> ObjectStore:
        return HeldStore(settings, first_attempt_preview_after_slot_0)

    async with running_preview(c, s3_bucket, store_factory=held_store) as preview:
        store = preview.store
        assert isinstance(store, HeldStore)
        world = await one_camera_run(c, preview, triton_server, tmp_path)
        key = await run_key(c)
        env = processor_env(c, preview, triton_server, key)
        env["PROCESSOR_DIRECT_WRITES"] = "0"  # its bytes pass the preview service's store
        first = ServiceProcess("services.processor", env, tmp_path / "processor.log")
        try:
            await asyncio.to_thread(first.wait_event, "serving")
            await within(store.held.wait(), f"slot 1's preview\n{first.log_tail()}")
            mid = await run_detail(c, "r1")
            (job,) = mid.jobs
            assert (job.state, job.generation) == (common_pb2.JOB_STATE_LEASED, 1)
            assert mid.run.counts.previews_published == 1  # slot 0
            os.killpg(first.process.pid, signal.SIGKILL)
            assert await asyncio.to_thread(first.process.wait, WAIT) == -signal.SIGKILL
        finally:
            await asyncio.to_thread(first.stop)

        # The dead processor's lease holds until it lapses: nobody else gets the job.
        claim = jobs_pb2.ClaimRequest(runtime_id=world.runtime_id, code_sha256=code_sha256())
        other = bearer_metadata(key)
        assert not (await c.jobs.Claim(claim, metadata=other)).HasField("job")
        c.clock.advance(timedelta(minutes=5, seconds=1))
        done = await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
        assert (done.requeued, done.exhausted) == (1, 0)
        store.gate.set()  # a write the dead attempt left behind may go on now: it is fenced
        await until(lambda: store.waiting == 0, "the held write to end")

        # Killing the client may have cancelled the held call (nothing written); if not,
        # its bytes reached S3 and the coordinator refused their record (LEASE_MISMATCH),
        # which leaves a collectable row for them.
        async def refusals_recorded() -> bool:
            found = await rows(
                c,
                "SELECT 1 FROM staged_objects WHERE object_key = ANY($1::text[])",
                store.let_through,
            )
            return len(found) == len(store.let_through)

        await until(refusals_recorded, "the refused records of the held writes")
        dead = ["previews/r1/j0/1/0.jpg", *store.let_through]

        async with running_processor(c, preview, triton_server, world.runtime_id) as second:
            detail = await finished(c, "r1")
            # The run reads completed once the commit lands, a moment before the processor
            # has handled the answer.
            await until(lambda: second.completed == 1, "the processor to count the completion")
        assert second.failed == 0
        run = detail.run
        assert run.status == common_pb2.RUN_STATUS_COMPLETED, detail
        (job,) = detail.jobs
        assert (job.state, job.generation) == (common_pb2.JOB_STATE_COMPLETED, 2)
        assert (run.counts.slots_frame, run.counts.items_saved) == (SLOTS, SLOTS)
        assert len(detail.recent_images) == SLOTS
        assert all(image.source == ITEM for image in detail.recent_images)

        items = await rows(
            c,
            "SELECT item_id, slot_index, object_key, sha256 FROM bucket_items WHERE run_id = 'r1'",
        )
        assert sorted(item["slot_index"] for item in items) == list(range(SLOTS))
        # each item's object is generation 2's preview of its slot: nothing was staged twice
        assert {item["object_key"] for item in items} == {
            f"previews/r1/j0/2/{slot}.jpg" for slot in range(SLOTS)
        }
        receipts = await rows(c, "SELECT generation, items_saved FROM receipts")
        assert receipts == [{"generation": 2, "items_saved": SLOTS}]
        lapsed = await rows(c, "SELECT lapses FROM jobs WHERE run_id = 'r1'")
        assert lapsed == [{"lapses": 1}]
        kept = await rows(
            c,
            f"SELECT object_key, {KIND_AS_READ} AS kind FROM staged_objects so "
            "WHERE run_id = 'r1' AND collectable_at IS NULL ORDER BY object_key",
        )
        assert {row["object_key"] for row in kept} == {item["object_key"] for item in items}
        assert {row["kind"] for row in kept} == {"upload"}
        assert await preview.keys("previews/r1/j0/1/") == sorted(dead)

        cleaned = await preview.stub.RunCleanup(pv.RunCleanupRequest(), metadata=c.admin)
        assert (cleaned.previews_deleted, cleaned.uploads_deleted) == (len(dead), 0)
        assert await preview.keys("previews/") == sorted(item["object_key"] for item in items)
        assert await preview.keys("uploads/") == []
        for item in items:
            read = await preview.stub.ReadImage(
                pv.ReadImageRequest(run_id="r1", item_id=item["item_id"]), metadata=c.admin
            )
            assert sha256_hex(read.image) == item["sha256"]
            assert not read.HasField("expires_at")  # a full run's items stay
        # the winner's previews became its items' uploads: their own ids have expired
        replaced = await rows(
            c, "SELECT item_id FROM staged_objects WHERE run_id = 'r1' AND generation = 2"
        )
        assert len(replaced) == SLOTS
        for one in replaced:
            gone = pv.ReadImageRequest(run_id="r1", item_id=one["item_id"])
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await preview.stub.ReadImage(gone, metadata=c.admin)
            assert error_reason(caught.value)[:2] == (grpc.StatusCode.NOT_FOUND, "EXPIRED")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_processor_killed_between_its_direct_writes_and_their_records_leaves_nothing(
    coordinator: CoordinatorHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    transport: Transport,
) -> None:
    """`python -m services.processor` writes its previews straight to S3 with grants and is
    SIGKILLed while the first batch of records that names a slot after 0 is held: on its
    session at the coordinator (the default), or at the preview service (unary calls). The
    lease lapses, a second processor commits the job under generation 2, and every byte the
    dead attempt wrote goes: records held at the preview service arrive late and are
    refused (LEASE_MISMATCH) and left collectable; records held on the session are
    cancelled with the stream (nothing recorded); and the bytes never recorded are found by
    the job's sweep, ten minutes after it ended."""
    c = coordinator
    async with running_preview(c, s3_bucket) as preview:
        held = HeldRecords(
            monkeypatch,
            lambda previews: any(p.slot_index >= 1 and p.lease.generation == 1 for p in previews),
            preview,
        )
        gate = held.gate
        world = await one_camera_run(c, preview, triton_server, tmp_path)
        key = await run_key(c)
        first = ServiceProcess(
            "services.processor",
            processor_env(c, preview, triton_server, key, JOB_TRANSPORT=transport),
            tmp_path / "processor.log",
        )
        try:
            await asyncio.to_thread(first.wait_event, "serving")
            await within(held.held.wait(), f"slot 1's record\n{first.log_tail()}")
            (job,) = (await run_detail(c, "r1")).jobs
            assert (job.state, job.generation) == (common_pb2.JOB_STATE_LEASED, 1)
            os.killpg(first.process.pid, signal.SIGKILL)
            assert await asyncio.to_thread(first.process.wait, WAIT) == -signal.SIGKILL
        finally:
            await asyncio.to_thread(first.stop)
        dead = await preview.keys("previews/r1/j0/1/")
        assert dead, "the dead attempt wrote nothing"

        c.clock.advance(timedelta(minutes=5, seconds=1))
        done = await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
        assert (done.requeued, done.exhausted) == (1, 0)
        gate.set()  # records held at the preview service reach the coordinator: refused
        async with running_processor(c, preview, triton_server, world.runtime_id) as second:
            detail = await finished(c, "r1")
            await until(lambda: second.completed == 1, "the processor to count the completion")
        (job,) = detail.jobs
        assert (job.state, job.generation) == (common_pb2.JOB_STATE_COMPLETED, 2)
        items = await rows(c, "SELECT object_key FROM bucket_items WHERE run_id = 'r1'")
        assert {item["object_key"] for item in items} == {
            f"previews/r1/j0/2/{slot}.jpg" for slot in range(SLOTS)
        }
        assert await preview.keys("previews/r1/j0/2/") == sorted(i["object_key"] for i in items)

        c.clock.advance(timedelta(minutes=11))  # past the sweep's grace after the job ended
        cleaned = await preview.stub.RunCleanup(pv.RunCleanupRequest(), metadata=c.admin)
        assert cleaned.previews_deleted == len(dead)
        assert await preview.keys("previews/r1/j0/1/") == []
        assert await preview.keys("previews/") == sorted(i["object_key"] for i in items)


# 2. recording replaced mid-job -----------------------------------------------------------------


async def test_a_recording_replaced_mid_job_refuses_the_completion(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """cam-a's recording is replaced after its job published every slot (each preview also
    its slot's upload), before Complete is sent: the source fence refuses the completion
    (SOURCE_CHANGED) and fails the job with that reason (it can never commit), nothing of
    the job reaches the bucket, and the processor goes on to cam-b's job."""
    c = coordinator
    world = await build_world(c, preview, triton_server, tmp_path)
    await save_workflow(c, "yard", yard_spec(world.model))
    await c.workshop.CreateRun(
        run_request("r1", "yard", world.runtime_id, mode=FULL), metadata=c.admin
    )
    log: list[Call] = []
    jobs = Spy(
        job_calls(c.channel),
        log,
        hold=lambda method, request: method == "Complete" and request.lease.job_id == "j0",
    )
    async with running_processor(
        c, preview, triton_server, world.runtime_id, jobs=jobs, in_flight=1
    ) as processor:
        await within(jobs.held.wait(), "j0's completion")
        mid = await run_detail(c, "r1")
        assert mid.run.counts.previews_published == SLOTS  # every slot of j0 went through
        # The same bytes again: a put is a replacement all the same (a new generation).
        put = await put_recording(c, preview, "cam-a-0", "cam-a", world.files["cam-a"])
        assert put.recording.generation == 2
        jobs.gate.set()

        await until(lambda: processor.completed == 1, "j1's completion")
        detail = await run_detail(c, "r1")
        assert processor.failed == 0

    completes = [(call.job, call.outcome) for call in log if call.method == "Complete"]
    assert completes == [("r1/j0", "SOURCE_CHANGED"), ("r1/j1", "ok")]
    after = log.index(next(call for call in log if call.outcome == "SOURCE_CHANGED"))
    assert [call for call in log[after + 1 :] if call.job == "r1/j0"] == []  # j0 stopped
    states = {job.job_id: job.state for job in detail.jobs}
    # j0 can never commit: the refused Complete ended it at once, not a lapsed lease later.
    assert states == {"j0": common_pb2.JOB_STATE_FAILED, "j1": common_pb2.JOB_STATE_COMPLETED}
    reasons = {job.job_id: job.failure_reason for job in detail.jobs}
    assert reasons["j0"] == common_pb2.FAILURE_REASON_SOURCE_CHANGED
    assert detail.run.status == common_pb2.RUN_STATUS_FAILED
    assert detail.run.counts.items_saved == SLOTS
    by_job = await rows(
        c, "SELECT job_index, count(*) AS items FROM bucket_items GROUP BY job_index"
    )
    assert by_job == [{"job_index": 1, "items": SLOTS}]
    assert [row["job_index"] for row in await rows(c, "SELECT job_index FROM receipts")] == [1]
    objects = await rows(
        c,
        f"SELECT job_index, {KIND_AS_READ} AS kind, collectable_at IS NULL AS kept, "
        "count(*) AS n FROM staged_objects so GROUP BY 1, 2, 3 ORDER BY 1",
    )
    # j0's previews were never committed as uploads: with the job ended they are garbage;
    # j1's each became its item's upload. No upload was staged on its own.
    assert objects == [
        {"job_index": 0, "kind": "preview", "kept": False, "n": SLOTS},
        {"job_index": 1, "kind": "upload", "kept": True, "n": SLOTS},
    ]
    assert await preview.keys("uploads/") == []


async def test_a_recording_replaced_mid_job_ends_the_job_at_the_next_heartbeat(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """cam-a's recording is replaced while its job holds slot 1's preview. The next
    heartbeat is refused (SOURCE_CHANGED) and that refusal ends the job at once: failed
    source_changed under its first lease, no lapse, the run failed; the processor stops
    the job (the held preview is dropped). Before, the heartbeat ended nothing: the run
    showed running until the lease lapsed five minutes later, and the lapse spent an
    attempt."""
    c = coordinator
    world = await one_camera_run(c, preview, triton_server, tmp_path)
    log: list[Call] = []
    jobs = Spy(job_calls(c.channel), log)
    previews = Spy(
        preview_pb2_grpc.PreviewServiceStub(preview.channel),
        log,
        hold=lambda method, request: method == "PublishPreview" and request.slot_index == 1,
    )
    beat = 0.2
    loop = asyncio.get_running_loop()
    async with running_processor(
        c,
        preview,
        triton_server,
        world.runtime_id,
        jobs=jobs,
        previews=previews,
        heartbeat_seconds=beat,
        direct_writes=False,  # the job itself waits in PublishPreview, the call held
    ) as processor:
        await within(previews.held.wait(), "slot 1's preview")
        put = await put_recording(c, preview, "cam-a-0", "cam-a", world.files["cam-a"])
        assert put.recording.generation == 2
        replaced = loop.time()
        refused = Call("Heartbeat", "r1/j0", None, "SOURCE_CHANGED")
        await until(lambda: refused in log, "the refused heartbeat")
        detail = await run_detail(c, "r1")  # no clock moved, no maintenance pass
        ended = loop.time()
        await until(lambda: Call("PublishPreview", "r1/j0", 1, "cancelled") in log, "a stop")
        assert (processor.completed, processor.failed) == (0, 0)

    assert detail.run.status == common_pb2.RUN_STATUS_FAILED
    (job,) = detail.jobs
    assert (job.state, job.failure_reason, job.generation) == (
        common_pb2.JOB_STATE_FAILED,
        common_pb2.FAILURE_REASON_SOURCE_CHANGED,
        1,
    )
    assert "was replaced after the run was admitted" in job.failure_message
    assert await rows(c, "SELECT lapses FROM jobs WHERE run_id = 'r1'") == [{"lapses": 0}]
    # a correctness bound (a lapse would take five minutes), not a speed claim
    assert ended - replaced < 30.0, f"ended {ended - replaced:.1f} s after the replacement"
    after = log[log.index(refused) + 1 :]
    assert all(call.outcome == "cancelled" for call in after), after  # nothing more sent


# 3. cancelled mid-job --------------------------------------------------------------------------


@pytest.mark.parametrize("stop", ["heartbeat", "preview"])
async def test_a_cancelled_run_stops_its_processor_at_the_next_heartbeat_or_write(
    coordinator: CoordinatorHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
    stop: str,
) -> None:
    """r1 is cancelled while its processor holds slot 1's preview (slot 0 published). With
    a 0.1 s heartbeat the refused heartbeat (JOB_CANCELLED) stops the job before the preview
    is sent; with the 45 s heartbeat the preview is sent: the preview service still keeps
    slot 0's lease check (for an hour here, so that this is certain), writes the bytes, and
    their record is refused (JOB_CANCELLED), which leaves them collectable. Either way
    nothing more of r1 is accepted, r1 ends cancelled, and the processor takes r2."""
    c = coordinator
    async with running_preview(c, s3_bucket, lease_check_seconds=3600) as preview:
        world = await one_camera_run(c, preview, triton_server, tmp_path)
        log: list[Call] = []
        jobs = Spy(job_calls(c.channel), log)
        previews = Spy(
            preview_pb2_grpc.PreviewServiceStub(preview.channel),
            log,
            hold=lambda method, request: (
                method == "PublishPreview"
                and request.lease.run_id == "r1"
                and request.slot_index == 1
            ),
        )
        beat = 0.1 if stop == "heartbeat" else 0.0  # 0: the coordinator's 45 s
        async with running_processor(
            c,
            preview,
            triton_server,
            world.runtime_id,
            jobs=jobs,
            previews=previews,
            heartbeat_seconds=beat,
            direct_writes=False,  # the job itself waits in PublishPreview, the call held
        ) as processor:
            await within(previews.held.wait(), "slot 1's preview")
            assert (await run_detail(c, "r1")).run.counts.previews_published == 1
            cancelled = await c.workshop.CancelRun(
                ws.CancelRunRequest(run_id="r1"), metadata=c.admin
            )
            assert cancelled.jobs_cancelled == 1
            if stop == "heartbeat":
                refused = Call("Heartbeat", "r1/j0", None, "JOB_CANCELLED")
                await until(lambda: refused in log, "the refused heartbeat")
                held = Call("PublishPreview", "r1/j0", 1, "cancelled")
                await until(lambda: held in log, "the held preview to be dropped")
            else:
                previews.gate.set()
                refused = Call("PublishPreview", "r1/j0", 1, "JOB_CANCELLED")
                await until(lambda: refused in log, "the refused preview")
            previews.gate.set()
            await c.workshop.CreateRun(
                run_request("r2", "yard", world.runtime_id, mode=FULL), metadata=c.admin
            )
            second = await finished(c, "r2")
            await until(lambda: processor.completed == 1, "the processor to count r2's completion")
            assert processor.failed == 0

        assert second.run.status == common_pb2.RUN_STATUS_COMPLETED
        assert second.run.counts.items_saved == SLOTS
        detail = await run_detail(c, "r1")
        assert detail.run.status == common_pb2.RUN_STATUS_CANCELLED
        assert [job.state for job in detail.jobs] == [common_pb2.JOB_STATE_CANCELLED]
        assert (detail.run.counts.previews_published, detail.run.counts.items_saved) == (1, 0)
        # After the refusal nothing of r1 was sent, let alone accepted.
        after = log[log.index(refused) + 1 :]
        assert [call for call in after if call.job == "r1/j0" and call.outcome != "cancelled"] == []
        accepted_writes = [
            (call.method, call.slot)
            for call in log
            if call.job == "r1/j0" and call.outcome == "ok" and call.slot is not None
        ]
        assert accepted_writes == [("PublishPreview", 0)]  # the preview is also slot 0's upload
        assert [call for call in log if call.method == "StageUpload"] == []  # r2's neither
        assert await preview.keys("uploads/") == []
        written = ["previews/r1/j0/1/0.jpg"]
        if stop == "preview":
            written.append("previews/r1/j0/1/1.jpg")  # written, then its record refused
        assert await preview.keys("previews/r1/") == written
        known = await rows(
            c,
            "SELECT object_key, published_at IS NOT NULL AS published, "
            "collectable_at IS NOT NULL AS garbage FROM staged_objects WHERE run_id = 'r1' "
            "ORDER BY object_key",
        )
        # every object r1 wrote has its row, and is left to cleanup
        assert known == [
            {"object_key": key, "published": key == written[0], "garbage": True} for key in written
        ]
