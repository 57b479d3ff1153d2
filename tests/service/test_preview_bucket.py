"""The preview service's bucket at start: replicas that start at once all find it."""

from __future__ import annotations

import asyncio
import uuid

from minio import Minio
from minio.error import S3Error

from testbed.harness.preview import object_store
from testbed.harness.s3 import S3Server

REPLICAS = 6


async def test_replicas_starting_at_once_all_find_their_bucket(s3_server: S3Server) -> None:
    """Each replica checks for the bucket and creates it when missing; between one's check
    and its create another may have created it (SeaweedFS answers BucketAlreadyOwnedByYou).
    That is the bucket being there, not a failure to start (found by bench.chaos_soak)."""
    client = s3_server.client()
    for _ in range(5):
        bucket = f"workshop-test-{uuid.uuid4().hex[:16]}"
        stores = [object_store(s3_server, bucket) for _ in range(REPLICAS)]
        try:
            created = await asyncio.gather(*(store.ensure_bucket() for store in stores))
            assert any(created), "one of them created it"
            assert client.bucket_exists(bucket)
            # and a replica that starts later finds it without creating it
            assert await stores[0].ensure_bucket() is False
        finally:
            for store in stores:
                store.close()
            _remove(client, bucket)


def _remove(client: Minio, bucket: str) -> None:
    """Removes the test's bucket. Right after six concurrent creates, SeaweedFS can answer
    a DELETE with NoSuchBucket although a HEAD just found the bucket (a clean clone's CI
    run, 2026-12-06): the test's checks were made by then, and a uniquely named bucket
    left behind on its throwaway server harms nothing."""
    try:
        if client.bucket_exists(bucket):
            client.remove_bucket(bucket)
    except S3Error as error:
        if error.code != "NoSuchBucket":
            raise
