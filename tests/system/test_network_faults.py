"""Network faults between a processor process and the services it talks to
(docs/reliability.md#network-faults): partitions, resets and refusals on the links from
`python -m services.processor` to the coordinator, the preview service and S3.

Each link crosses a FaultProxy (testbed/harness/tcp_proxy.py), a real TCP hop in this
process that the test stalls (a partition: silence, bytes held, no RST), resets or
refuses, and heals. A fault starts at a known point of the conversation, not at a
guessed moment: `when_sent` runs it just before the first chunk that names a given
object key crosses the link (the Complete, which names the job's uploads; an S3 POST
or GET of one key). The coordinator runs in this process on the harness's frozen clock,
so a lease lapses when the test moves the clock, not after five minutes.

What must hold (a dropped connection loses no committed work, never publishes stale
bytes, never leaves part of a job in a bucket): a partition shorter than the lease is
ridden out under the same lease (no attempt spent, no hand-back); one longer than the
lease lets it lapse, another holder takes the job under a new generation, and every
write the stale processor sends once the link heals is refused: nothing of its
generation is published after the lapse or committed, and its bytes in S3 are garbage
that cleanup deletes. A connection that goes silent for good is replaced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from services.coordinator.leases.maintenance import Maintenance
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import PreviewHarness, running_preview
from testbed.harness.processes import ServiceProcess
from testbed.harness.s3 import S3Bucket
from testbed.harness.tcp_proxy import FaultProxy, fault_proxy
from testbed.harness.triton import TritonServer
from tests.processor_gates import rows, until, within
from tests.processor_world import (
    DEVICE,
    SECONDS,
    finished,
    one_camera_run,
    run_detail,
    run_key,
    running_processor,
)
from workshop.kit.auth import bearer_metadata
from workshop.kit.processor_manifest import code_sha256
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import preview_pb2 as pv

pytestmark = pytest.mark.triton
SLOTS = SECONDS // 2  # slots per job: every 2 s of a SECONDS-long recording
LAPSE = timedelta(minutes=5, seconds=1)  # past the coordinator's 5-minute lease
SHORT = 1.5  # seconds a short partition lasts: well inside every deadline and the lease
# The Complete is the only call to the coordinator that names a slot's upload (in a full
# run each slot's preview): its SlotResult.upload_key as encoded, field tag included. The
# session's record_previews name the same keys as RecordPreviewRequest.object_key, another
# tag; progress and heartbeats name none.
COMPLETE = jobs_pb2.SlotResult(upload_key="previews/r1/j0/1/0.jpg").SerializeToString()
# What a processor logs when a job does not simply go on: a hand-back, a stop, a Fail.
NOT_RIDDEN_OUT = r"handed back|job r1/j0 stopped|lease of r1/j0 lost|failed unexpectedly|\bFail\b"


def preview_key(slot: int, generation: int = 1) -> bytes:
    return f"previews/r1/j0/{generation}/{slot}.jpg".encode()


@dataclasses.dataclass
class Links:
    """The processor's links, each through its own proxy: to the coordinator, to its
    preview service, and to S3 (its recordings, and the direct writes its grants name)."""

    coordinator: FaultProxy
    preview: FaultProxy
    s3: FaultProxy
    stale_preview: PreviewHarness  # the processor's preview service, reached via `preview`


@asynccontextmanager
async def proxied_links(c: CoordinatorHarness, bucket: S3Bucket) -> AsyncIterator[Links]:
    """Proxies on each link; the processor's preview service is a replica whose S3 endpoint
    is the S3 proxy, so the grants it hands out send the processor's writes across it (the
    `preview` fixture, on a direct link, serves the second processor and the checks)."""
    server = bucket.server
    host, port = server.endpoint.rsplit(":", 1)
    async with (
        fault_proxy("127.0.0.1", c.port) as coordinator,
        fault_proxy(host, int(port)) as s3,
        running_preview(c, bucket, s3_endpoint=s3.address) as stale_preview,
        fault_proxy("127.0.0.1", stale_preview.port) as preview,
    ):
        yield Links(coordinator, preview, s3, stale_preview)


@asynccontextmanager
async def processor_process(
    c: CoordinatorHarness, links: Links, triton: TritonServer, log_path: Path
) -> AsyncIterator[ServiceProcess]:
    """`python -m services.processor` on the proxied links: one job at a time (no Claim
    waits at the coordinator while it works), calls asked again for up to 30 s."""
    bucket = links.stale_preview.bucket
    values = {
        "PORT": "0",
        "DRAIN_SECONDS": "0",
        "GRACE_SECONDS": "1",
        "DEVICE_ID": DEVICE,
        "KEY": await run_key(c),
        "COORDINATOR_TARGET": links.coordinator.address,
        "PREVIEW_TARGET": links.preview.address,
        "TRITON_TARGET": triton.grpc_url,
        "MODEL_REPOSITORY": str(triton.model_repository),
        "S3_ENDPOINT": links.s3.address,
        "S3_ACCESS_KEY": bucket.server.access_key,
        "S3_SECRET_KEY": bucket.server.secret_key,
        "RECORDINGS_BUCKET": bucket.name,
        "IN_FLIGHT": "1",
        "RPC_RETRY_SECONDS": "30",
    }
    process = ServiceProcess(
        "services.processor", {f"PROCESSOR_{k}": v for k, v in values.items()}, log_path
    )
    try:
        await asyncio.to_thread(process.wait_event, "serving")
        yield process
    finally:
        await asyncio.to_thread(process.stop)


def logged(process: ServiceProcess, pattern: str) -> list[str]:
    """The processor's log lines that match `pattern`."""
    text = process.log_path.read_text(errors="replace")
    return [line for line in text.splitlines() if re.search(pattern, line)]


async def lapse(c: CoordinatorHarness) -> None:
    """Moves the coordinator's clock past the lease and runs a maintenance pass: the job's
    lease lapses (one attempt spent) and the job is queued again."""
    c.clock.advance(LAPSE)
    done = await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
    assert (done.requeued, done.exhausted) == (1, 0)


async def job_row(c: CoordinatorHarness) -> dict[str, Any]:
    (job,) = await rows(
        c, "SELECT state, generation, lapses FROM jobs WHERE run_id = 'r1' AND job_index = 0"
    )
    return job


async def assert_committed_by(c: CoordinatorHarness, generation: int, lapses: int) -> None:
    """The job's result is `generation`'s, once: every item is its preview of the slot and
    one receipt; nothing of any other generation is published or committed."""
    detail = await run_detail(c, "r1")
    assert detail.run.status == common_pb2.RUN_STATUS_COMPLETED, detail
    assert await job_row(c) == {"state": "completed", "generation": generation, "lapses": lapses}
    items = await rows(c, "SELECT slot_index, object_key FROM bucket_items WHERE run_id = 'r1'")
    assert sorted((i["slot_index"], i["object_key"]) for i in items) == [
        (slot, preview_key(slot, generation).decode()) for slot in range(SLOTS)
    ]
    receipts = await rows(c, "SELECT generation, items_saved FROM receipts WHERE run_id = 'r1'")
    assert receipts == [{"generation": generation, "items_saved": SLOTS}]


async def stale_rows(c: CoordinatorHarness) -> list[dict[str, Any]]:
    """Generation 1's objects as the coordinator knows them, with when each was staged."""
    return await rows(
        c,
        "SELECT slot_index, staged_at, published_at IS NOT NULL AS published, "
        "collectable_at IS NOT NULL AS collectable FROM staged_objects "
        "WHERE run_id = 'r1' AND generation = 1 ORDER BY slot_index",
    )


# processor <-> coordinator ---------------------------------------------------------------------


async def test_a_partition_longer_than_the_lease_refuses_the_stale_completion(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """The processor↔coordinator link is partitioned just as the Complete crosses it. The
    lease lapses meanwhile and a second processor commits the job under generation 2; when
    the link heals, the held Complete reaches the coordinator and is refused: no receipt,
    item or publication of generation 1, its previews collectable and deleted by cleanup,
    and the stale processor stops the job (it does not hand it back or fail it)."""
    c = coordinator
    world = await one_camera_run(c, preview, triton_server, tmp_path)
    async with proxied_links(c, s3_bucket) as links:
        partitioned = links.coordinator.when_sent(COMPLETE, links.coordinator.stall)
        async with processor_process(c, links, triton_server, tmp_path / "processor.log") as stale:
            await within(partitioned.wait(), f"the Complete\n{stale.log_tail()}")
            assert await job_row(c) == {"state": "leased", "generation": 1, "lapses": 0}
            await lapse(c)
            lapsed_at = c.clock.now()
            async with running_processor(c, preview, triton_server, world.runtime_id) as second:
                await finished(c, "r1")
                await until(lambda: second.completed == 1, "the second processor's commit")
            assert links.coordinator.held >= 1  # the Complete, still in the partition
            links.coordinator.heal()
            await until(lambda: logged(stale, r"job r1/j0 stopped"), "the stale job to stop")
            # refused: the job has ended (generation 2 committed it)
            assert logged(stale, r"job r1/j0 stopped: The job has already ended")
            assert not logged(stale, r"handed back|failed unexpectedly|\bFail\b")

    await assert_committed_by(c, generation=2, lapses=1)
    stale_objects = await stale_rows(c)
    assert [row["slot_index"] for row in stale_objects] == list(range(SLOTS))
    # recorded (as previews) while the lease held, before the lapse; none since
    assert all(row["staged_at"] < lapsed_at for row in stale_objects)
    assert all(row["collectable"] for row in stale_objects)
    cleaned = await preview.stub.RunCleanup(pv.RunCleanupRequest(), metadata=c.admin)
    assert cleaned.previews_deleted == SLOTS
    assert await preview.keys("previews/r1/j0/1/") == []


async def test_a_stale_completion_is_refused_while_the_new_holder_works(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """As above, but the job is claimed anew (generation 2) by a direct Claim that still
    holds it when the link heals: the held Complete of generation 1 is refused by the lease
    fence, not by the job's end, and changes nothing. Generation 2 is handed back; the
    processor, its link healed, claims the job again and commits it under generation 3."""
    c = coordinator
    world = await one_camera_run(c, preview, triton_server, tmp_path)
    async with proxied_links(c, s3_bucket) as links:
        partitioned = links.coordinator.when_sent(COMPLETE, links.coordinator.stall)
        async with processor_process(c, links, triton_server, tmp_path / "processor.log") as stale:
            await within(partitioned.wait(), f"the Complete\n{stale.log_tail()}")
            await lapse(c)
            claim = jobs_pb2.ClaimRequest(runtime_id=world.runtime_id, code_sha256=code_sha256())
            claimed = await c.jobs.Claim(claim, metadata=bearer_metadata(await run_key(c)))
            assert claimed.job.lease.generation == 2
            links.coordinator.heal()
            await until(lambda: logged(stale, r"job r1/j0 stopped"), "the stale job to stop")
            assert logged(stale, r"job r1/j0 stopped: This lease is no longer the job.s lease")
            assert await job_row(c) == {"state": "leased", "generation": 2, "lapses": 1}
            assert await rows(c, "SELECT 1 FROM receipts") == []
            await c.jobs.Release(jobs_pb2.ReleaseRequest(lease=claimed.job.lease), metadata=c.admin)
            await finished(c, "r1")
            assert not logged(stale, r"handed back|failed unexpectedly|\bFail\b")
    await assert_committed_by(c, generation=3, lapses=1)


@pytest.mark.parametrize("fault", ["stall", "refuse"])
async def test_a_partition_shorter_than_the_lease_is_ridden_out(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
    fault: str,
) -> None:
    """The processor↔coordinator link fails for SHORT seconds just as the Complete crosses
    it: stalled (the Complete held, then delivered: TCP rides it out), or reset and refused
    (the Complete fails UNAVAILABLE and is asked again until the link is back). Either way
    the job commits under its first lease: generation 1, no lapse, no hand-back."""
    c = coordinator
    await one_camera_run(c, preview, triton_server, tmp_path)
    async with proxied_links(c, s3_bucket) as links:
        proxy = links.coordinator
        broken = proxy.when_sent(COMPLETE, getattr(proxy, fault))
        async with processor_process(
            c, links, triton_server, tmp_path / "processor.log"
        ) as process:
            await within(broken.wait(), f"the Complete\n{process.log_tail()}")
            await asyncio.sleep(SHORT)
            if fault == "refuse":
                assert proxy.refused >= 1  # the Complete was asked again, and refused
            else:
                assert proxy.held >= 1
            proxy.heal()
            await finished(c, "r1")
            assert not logged(process, NOT_RIDDEN_OUT)
            if fault == "refuse":
                assert logged(process, r"Complete: UNAVAILABLE; asking again")
    await assert_committed_by(c, generation=1, lapses=0)


# processor <-> S3 ------------------------------------------------------------------------------


def recording_get(bucket: S3Bucket) -> bytes:
    """The start of the processor's GET of the job's recording."""
    return f"GET /{bucket.name}/recordings/".encode()


def for_a_while(proxy: FaultProxy, fault: Callable[[], None]) -> Callable[[], None]:
    """`fault` now, healed SHORT seconds later (no test step waits for it)."""

    def act() -> None:
        fault()
        asyncio.get_running_loop().call_later(SHORT, proxy.heal)

    return act


async def test_short_s3_faults_are_ridden_out(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """The processor↔S3 link fails four times in one job, each as a given request crosses
    it: the recording's GET is reset (the S3 client sends it again on a new connection);
    slot 2's direct write (its POST with a grant) is stalled for SHORT seconds (held, then
    delivered); slot 5's is reset (sent again); slot 8's is reset and every connection
    refused for SHORT seconds (the write asked again until the store is back). The job
    commits under its first lease: no lapse, no hand-back."""
    c = coordinator
    await one_camera_run(c, preview, triton_server, tmp_path)
    async with proxied_links(c, s3_bucket) as links:
        proxy = links.s3
        faults = [
            proxy.when_sent(recording_get(s3_bucket), proxy.reset),
            proxy.when_sent(preview_key(2), for_a_while(proxy, proxy.stall)),
            proxy.when_sent(preview_key(5), proxy.reset),
            proxy.when_sent(preview_key(8), for_a_while(proxy, proxy.refuse)),
        ]
        async with processor_process(
            c, links, triton_server, tmp_path / "processor.log"
        ) as process:
            await finished(c, "r1")
            assert [fault.is_set() for fault in faults] == [True] * 4, process.log_tail()
            assert not logged(process, NOT_RIDDEN_OUT)
            # slot 8's write was asked again while the store was away
            assert logged(process, r"did not take preview .*/8\.jpg.*; asking again")
    assert proxy.resets >= 3
    assert proxy.refused >= 1
    await assert_committed_by(c, generation=1, lapses=0)


async def test_an_s3_partition_longer_than_the_lease_leaves_only_garbage(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """The processor↔S3 link is partitioned as slot 5's direct write crosses it. The lease
    lapses meanwhile and a second processor commits the job under generation 2. When the
    link heals the stale write lands (the store cannot know the lease), but nothing of
    generation 1 is published after the lapse, committed, or kept: its records are
    refused or never sent, the stale processor stops the job, and cleanup deletes every
    generation-1 object, the recorded ones at once and the unrecorded ones with the job's
    sweep ten minutes after it ended."""
    c = coordinator
    world = await one_camera_run(c, preview, triton_server, tmp_path)
    async with proxied_links(c, s3_bucket) as links:
        partitioned = links.s3.when_sent(preview_key(5), links.s3.stall)
        async with processor_process(c, links, triton_server, tmp_path / "processor.log") as stale:
            await within(partitioned.wait(), f"slot 5's write\n{stale.log_tail()}")
            await lapse(c)
            lapsed_at = c.clock.now()
            async with running_processor(c, preview, triton_server, world.runtime_id) as second:
                await finished(c, "r1")
                await until(lambda: second.completed == 1, "the second processor's commit")
            assert links.s3.held >= 1  # slot 5's write, still in the partition
            links.s3.heal()
            await until(lambda: logged(stale, r"job r1/j0 stopped"), "the stale job to stop")
            assert not logged(stale, r"handed back|failed unexpectedly|\bFail\b")
        assert preview_key(5).decode() in await preview.keys("previews/r1/j0/1/")  # it landed

    await assert_committed_by(c, generation=2, lapses=1)
    stale_objects = await stale_rows(c)
    assert all(row["collectable"] for row in stale_objects)
    assert all(row["staged_at"] < lapsed_at for row in stale_objects if row["published"])
    c.clock.advance(timedelta(minutes=11))  # past the sweep's grace after the job ended
    await preview.stub.RunCleanup(pv.RunCleanupRequest(), metadata=c.admin)
    assert await preview.keys("previews/r1/j0/1/") == []
    assert await preview.keys("previews/r1/j0/2/") == [
        preview_key(slot, 2).decode() for slot in sorted(range(SLOTS), key=str)
    ]


async def test_a_connection_black_holed_mid_call_is_given_up_and_replaced(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    s3_bucket: S3Bucket,
    triton_server: TritonServer,
    tmp_path: Path,
) -> None:
    """The processor's connection to the coordinator goes silent for good just as the
    Complete crosses it (a firewall that forgot the flow, a coordinator host gone without
    a word), while new connections go through. The processor must notice the dead
    connection and ask again on a new one, so the job commits under its first lease;
    TCP alone would keep the dead connection for many minutes, every call on it ending at
    its deadline, until the job was handed back or its lease lapsed."""
    c = coordinator
    await one_camera_run(c, preview, triton_server, tmp_path)
    async with proxied_links(c, s3_bucket) as links:
        proxy = links.coordinator
        lost = proxy.when_sent(COMPLETE, proxy.blackhole)
        async with processor_process(
            c, links, triton_server, tmp_path / "processor.log"
        ) as process:
            await within(lost.wait(), f"the Complete\n{process.log_tail()}")
            opened = proxy.opened
            await finished(c, "r1")
            assert proxy.opened > opened  # asked again on a new connection
            assert not logged(process, NOT_RIDDEN_OUT)
    await assert_committed_by(c, generation=1, lapses=0)
