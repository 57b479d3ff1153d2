"""The cleanup loop: every expired preview per pass, at most 500 uploads, oldest first,
and two replicas passing at once delete each object exactly once.

The collectable objects are made cheaply: staged rows written straight into the
coordinator's database (collectable since a known time) and their bytes put with the
SDK from a thread pool.
"""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.preview.settings import PreviewSettings
from services.preview.storage import ObjectStore
from testbed.coordinator_leases import create_run, setup
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.preview import CountingStore, PreviewHarness, running_preview
from testbed.harness.s3 import S3Bucket
from testbed.harness.tcp_proxy import fault_proxy
from workshop.kit.auth import bearer_metadata
from workshop.kit.metrics import REGISTRY
from workshop.kit.periodic import Periodic
from workshop.v1 import common_pb2
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import publication_pb2 as pub

PUT_THREADS = 16


async def collectable_objects(
    c: CoordinatorHarness, bucket: S3Bucket, kind: str, count: int
) -> list[str]:
    """`count` collectable objects of `kind` in run r1's job 0, oldest first, in S3 too."""
    await setup_once(c)
    keys = [f"{kind}s/r1/j0/{generation}/0.jpg" for generation in range(1, count + 1)]
    now = c.clock.now()
    since = [now - timedelta(hours=2) + timedelta(seconds=n) for n in range(count)]
    async with c.db.connection() as connection:
        await connection.execute(
            """
            INSERT INTO staged_objects (object_key, kind, run_id, job_index, generation,
                                        slot_index, sha256, byte_size, content_type, staged_at,
                                        collectable_at)
            SELECT k, $2, 'r1', 0, g, 0, repeat('0', 64), 1, 'image/jpeg', $3, t
            FROM unnest($1::text[], $4::timestamptz[]) WITH ORDINALITY AS u (k, t, g)
            """,
            keys,
            kind,
            now - timedelta(hours=3),
            since,
        )

    client = bucket.server.client()  # one client: its connection pool serves every thread

    def put(key: str) -> None:
        client.put_object(bucket.name, key, io.BytesIO(b"x"), length=1)

    def put_all() -> None:
        with ThreadPoolExecutor(PUT_THREADS) as pool:
            list(pool.map(put, keys))

    await asyncio.to_thread(put_all)
    return keys


def passes(outcome: str) -> float:
    value = REGISTRY.get_sample_value("workshop_preview_cleanup_passes_total", {"outcome": outcome})
    assert value is not None
    return value


async def setup_once(c: CoordinatorHarness) -> None:
    if await c.count("runs") == 0:
        await create_run(c, await setup(c))


async def cleanup(c: CoordinatorHarness, p: PreviewHarness) -> pb.RunCleanupResponse:
    reply: pb.RunCleanupResponse = await p.stub.RunCleanup(pb.RunCleanupRequest(), metadata=c.admin)
    return reply


async def test_uploads_drain_500_per_pass_oldest_first(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> None:
    c = coordinator
    keys = await collectable_objects(c, s3_bucket, "upload", 1_200)
    async with running_preview(c, s3_bucket) as p:
        assert len(await p.keys()) == 1_200
        first, second = await cleanup(c, p), await cleanup(c, p)
        assert [(r.uploads_deleted, r.uploads_remaining) for r in (first, second)] == [
            (500, True),
            (500, True),
        ]
        assert await p.keys() == sorted(keys[1_000:])  # the oldest went first
        third = await cleanup(c, p)
        assert (third.uploads_deleted, third.uploads_remaining, third.bytes_deleted) == (
            200,
            False,
            200,
        )
        assert await p.keys() == []
        async with c.db.connection() as connection:
            left = await connection.fetchval(
                "SELECT count(*) FROM staged_objects WHERE deleted_at IS NULL"
            )
        assert left == 0
        assert (await cleanup(c, p)).uploads_deleted == 0


async def test_two_replicas_passing_at_once_delete_each_object_exactly_once(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> None:
    c = coordinator
    previews = await collectable_objects(c, s3_bucket, "preview", 1_100)
    uploads = await collectable_objects(c, s3_bucket, "upload", 700)
    stores: list[CountingStore] = []

    def counting(settings: PreviewSettings) -> ObjectStore:
        stores.append(CountingStore(settings))
        return stores[-1]

    async with (
        running_preview(c, s3_bucket, store_factory=counting) as a,
        running_preview(c, s3_bucket, store_factory=counting) as b,
    ):
        reports = await asyncio.gather(cleanup(c, a), cleanup(c, b))
        assert sum(r.previews_deleted for r in reports) == 1_100
        assert sum(r.uploads_deleted for r in reports) == 700  # at most 500 each
        assert all(r.uploads_deleted <= 500 for r in reports)
        assert all(store.removed for store in stores)  # both took part
        removals = Counter(key for store in stores for key in store.removed)
        assert sorted(removals) == sorted(previews + uploads)
        assert set(removals.values()) == {1}
        assert [store.failures for store in stores] == [[], []]
        assert await a.keys() == []


async def test_the_loop_runs_a_pass_at_start_and_every_interval(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> None:
    c = coordinator
    await collectable_objects(c, s3_bucket, "preview", 3)
    async with running_preview(c, s3_bucket, cleanup_interval_seconds=0.2) as p:
        loop = p.app.workers[0]
        assert isinstance(loop, Periodic)
        assert loop.interval_seconds == 0.2
        for _ in range(100):
            if not await p.keys():
                break
            await asyncio.sleep(0.05)
        assert await p.keys() == []


async def held(c: CoordinatorHarness) -> list[str]:
    """Keys a cleanup pass holds now (by the coordinator's clock)."""
    async with c.db.connection() as connection:
        rows = await connection.fetch(
            "SELECT object_key FROM staged_objects WHERE gc_claimed_until > $1 ORDER BY 1",
            c.clock.now(),
        )
    return [row["object_key"] for row in rows]


async def test_a_pass_whose_store_is_unreachable_hands_its_batch_back(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> None:
    """The store refuses every connection while a pass runs: the pass fails UNAVAILABLE and
    hands its batch back, so the next pass, with the store back and the coordinator's clock
    not moved, deletes it instead of waiting for the batch's 5-minute hold to lapse."""
    c = coordinator
    keys = await collectable_objects(c, s3_bucket, "preview", 3)
    host, port = s3_bucket.server.endpoint.rsplit(":", 1)
    async with (
        fault_proxy(host, int(port)) as proxy,
        running_preview(c, s3_bucket, s3_endpoint=proxy.address) as p,
    ):
        proxy.refuse()
        before = {o: passes(o) for o in ("ok", "partial", "failed")}
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await cleanup(c, p)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await held(c) == []
        # the failed pass is counted (workshop_preview_cleanup_passes_total, alerted on)
        assert passes("failed") == before["failed"] + 1
        assert passes("ok") == before["ok"]
        proxy.heal()
        report = await cleanup(c, p)
        assert report.previews_deleted == 3
        assert passes("ok") == before["ok"] + 1
        assert passes("partial") == before["partial"]
        assert await p.keys() == []
    async with c.db.connection() as connection:
        deleted = await connection.fetchval(
            "SELECT count(*) FROM staged_objects WHERE object_key = ANY ($1) "
            "AND deleted_at IS NOT NULL",
            keys,
        )
    assert deleted == 3


async def test_only_held_objects_not_yet_deleted_are_handed_back(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> None:
    """MarkObjectsDeleted's not_deleted_keys ends a pass's hold, and nothing else: a key
    marked deleted stays deleted, a key nobody holds and an unknown key change nothing."""
    c = coordinator
    keys = await collectable_objects(c, s3_bucket, "preview", 3)
    service = bearer_metadata(await c.key(Grant(ScopeName.SERVICE), name="cleaner"))
    listed = await c.publication.ListCollectableObjects(
        pub.ListCollectableObjectsRequest(kind=common_pb2.OBJECT_KIND_PREVIEW, limit=2),
        metadata=service,
    )
    taken = sorted(one.object_key for one in listed.objects)
    assert taken == keys[:2]
    assert await held(c) == taken
    await c.publication.MarkObjectsDeleted(
        pub.MarkObjectsDeletedRequest(object_keys=[taken[0]]), metadata=service
    )
    reply = await c.publication.MarkObjectsDeleted(
        pub.MarkObjectsDeletedRequest(not_deleted_keys=[*taken, keys[2], "previews/nowhere.jpg"]),
        metadata=service,
    )
    assert (reply.marked, reply.released) == (0, 1)  # taken[1] only
    assert await held(c) == [taken[0]]  # deleted: its row says so, never listed again
    listed = await c.publication.ListCollectableObjects(
        pub.ListCollectableObjectsRequest(kind=common_pb2.OBJECT_KIND_PREVIEW, limit=10),
        metadata=service,
    )
    assert sorted(one.object_key for one in listed.objects) == [taken[1], keys[2]]


async def test_more_than_1000_keys_in_all_are_refused_and_change_nothing(
    coordinator: CoordinatorHarness, s3_bucket: S3Bucket
) -> None:
    c = coordinator
    keys = await collectable_objects(c, s3_bucket, "preview", 2)
    service = bearer_metadata(await c.key(Grant(ScopeName.SERVICE), name="cleaner"))
    await c.publication.ListCollectableObjects(
        pub.ListCollectableObjectsRequest(kind=common_pb2.OBJECT_KIND_PREVIEW, limit=2),
        metadata=service,
    )
    padding = [f"previews/none/{n}.jpg" for n in range(999)]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.publication.MarkObjectsDeleted(
            pub.MarkObjectsDeletedRequest(
                object_keys=[keys[0]], not_deleted_keys=[*padding, keys[1]]
            ),
            metadata=service,
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "1000" in (caught.value.details() or "")
    assert await held(c) == keys  # not handed back
    async with c.db.connection() as connection:
        assert (
            await connection.fetchval(
                "SELECT count(*) FROM staged_objects WHERE deleted_at IS NOT NULL"
            )
            == 0
        )
