"""Fetching a job's recording from object storage, checked against its snapshot digest.

The SDK is synchronous: calls run on a small thread pool, never on the event loop.
A recording whose bytes do not match the digest the run was admitted with is
never decoded: the job fails instead of labelling other footage. So does one the
store says is gone. A store that does not answer, or answers with its own
trouble (5xx, throttling, refused credentials), is not the recording's fault:
`StorageUnreachable`, and the job is handed back to be tried again.
"""

from __future__ import annotations

import asyncio
import hashlib
from concurrent.futures import ThreadPoolExecutor

import urllib3
from minio import Minio
from minio.error import MinioException, S3Error

# What the store says about the object itself; any other answer is about the store.
GONE_CODES = frozenset({"NoSuchKey", "NoSuchObject", "NoSuchBucket"})


class RecordingUnavailable(RuntimeError):
    """The recording is gone, or its bytes are not the admitted ones: the job fails."""


class StorageUnreachable(RuntimeError):
    """Object storage did not serve the recording (down, slow, refusing us)."""


class RecordingStore:
    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str,
        *,
        secure: bool = False,
        region: str = "us-east-1",
        threads: int = 4,
        timeout_seconds: float = 30.0,
    ) -> None:
        self.bucket = bucket
        self._client = Minio(
            endpoint,
            access_key=access_key,
            secret_key=secret_key,
            secure=secure,
            region=region,
            http_client=urllib3.PoolManager(
                timeout=urllib3.Timeout(connect=5.0, read=timeout_seconds),
                retries=urllib3.Retry(total=2, backoff_factor=0.2),
                maxsize=threads,
            ),
        )
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="recordings")

    async def fetch(self, object_key: str, sha256: str) -> bytes:
        data = await asyncio.get_running_loop().run_in_executor(self._pool, self._read, object_key)
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise RecordingUnavailable(
                f"{object_key}: SHA-256 {actual} differs from the admitted {sha256}."
            )
        return data

    def _read(self, object_key: str) -> bytes:
        try:
            response = self._client.get_object(self.bucket, object_key)
            try:
                return response.read()
            finally:
                response.close()
                response.release_conn()
        except S3Error as error:
            if error.code in GONE_CODES:
                raise RecordingUnavailable(f"{object_key}: {error.code}: {error.message}") from None
            raise StorageUnreachable(
                f"Object storage refused to serve {object_key}: {error.code}"
            ) from None
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as error:
            raise StorageUnreachable(
                f"Object storage did not serve {object_key}: {type(error).__name__}"
            ) from None

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
