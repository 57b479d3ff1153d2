"""The object store behind the preview service, through the `minio` SDK.

The SDK is synchronous, so every call runs on a bounded thread pool owned by
this class and never on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from minio import Minio

from services.preview.settings import PreviewSettings

T = TypeVar("T")


class ObjectStore:
    def __init__(self, settings: PreviewSettings) -> None:
        self.bucket = settings.bucket
        self._client = Minio(
            settings.s3_endpoint,
            access_key=settings.s3_access_key,
            secret_key=settings.s3_secret_key,
            secure=settings.s3_secure,
            region=settings.s3_region,
        )
        self._pool = ThreadPoolExecutor(max_workers=settings.s3_threads, thread_name_prefix="s3")

    async def _call(self, function: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, function)

    async def ensure_bucket(self) -> bool:
        """Create the bucket if it is missing; True when this call created it."""

        def ensure() -> bool:
            if self._client.bucket_exists(self.bucket):
                return False
            self._client.make_bucket(self.bucket)
            return True

        return await self._call(ensure)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
