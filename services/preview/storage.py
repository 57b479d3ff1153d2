"""The object store behind the preview service, through the `minio` SDK.

The SDK is synchronous, so every call runs on a bounded thread pool owned by
this class and never on the event loop. Its HTTP client has short timeouts and
retries a failed request once: a store that is down or stalled turns into
`StorageUnavailable` (UNAVAILABLE) within a few timeouts instead of holding a
processor's call for the SDK's default five minutes.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import hashlib
import hmac
import io
import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import urllib3
from minio import Minio
from minio.datatypes import PostPolicy
from minio.deleteobjects import DeleteObject
from minio.error import MinioException, S3Error

from services.preview.errors import ImageMissing, StorageMisconfigured, StorageUnavailable
from services.preview.metrics import count_put
from services.preview.settings import PreviewSettings

log = logging.getLogger(__name__)

POLICY_ALGORITHM = "AWS4-HMAC-SHA256"

T = TypeVar("T")

REQUEST_RETRIES = 1
RETRY_BACKOFF_SECONDS = 0.2
RETRY_STATUSES = (500, 502, 503, 504)
MISSING_CODES = frozenset({"NoSuchKey", "NoSuchObject"})
# Refusals that waiting does not cure: the service's keys, region or bucket are wrong.
CONFIGURATION_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "AuthorizationHeaderMalformed",
        "NoSuchBucket",
        "InvalidBucketName",
    }
)


@dataclasses.dataclass(frozen=True)
class RemovalFailure:
    key: str
    problem: str


def http_client(settings: PreviewSettings) -> urllib3.PoolManager:
    """Short timeouts, one retry with backoff, a connection per SDK thread."""
    timeout = settings.s3_timeout_seconds
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=timeout, read=timeout),
        maxsize=settings.s3_threads,
        retries=urllib3.Retry(
            total=REQUEST_RETRIES,
            backoff_factor=RETRY_BACKOFF_SECONDS,
            status_forcelist=RETRY_STATUSES,
        ),
    )


class ObjectStore:
    def __init__(self, settings: PreviewSettings) -> None:
        self.bucket = settings.bucket
        self._http = http_client(settings)
        self._client = Minio(
            settings.s3_endpoint,
            access_key=settings.s3_access_key,
            secret_key=settings.s3_secret_key,
            secure=settings.s3_secure,
            region=settings.s3_region,
            http_client=self._http,
        )
        self._access_key = settings.s3_access_key
        self._secret_key = settings.s3_secret_key
        self._region = settings.s3_region
        self._pool = ThreadPoolExecutor(max_workers=settings.s3_threads, thread_name_prefix="s3")
        scheme = "https" if settings.s3_secure else "http"
        self.bucket_url = f"{scheme}://{settings.s3_endpoint}/{self.bucket}"

    async def _call(self, function: Callable[[], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, function)
        except S3Error as error:
            if error.code in MISSING_CODES:
                raise
            # Wrong keys or a missing bucket are operator problems: say so in the log.
            log.warning("object storage refused a request: %s", error)
            if error.code in CONFIGURATION_CODES:
                raise StorageMisconfigured(
                    f"Object storage refused the preview service ({error.code}): its "
                    "PREVIEW_S3_* settings or PREVIEW_BUCKET are wrong, a configuration error "
                    "an operator must fix."
                ) from error
            raise StorageUnavailable(
                f"Object storage refused the request ({error.code}); retry later."
            ) from error
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as error:
            raise StorageUnavailable(
                f"Object storage is unavailable ({type(error).__name__}); retry later."
            ) from error

    async def ensure_bucket(self) -> bool:
        """Create the bucket if it is missing; True when this call created it."""

        def ensure() -> bool:
            if self._client.bucket_exists(self.bucket):
                return False
            try:
                self._client.make_bucket(self.bucket)
            except S3Error as error:
                # Another replica created it since the check (two starting at once): the
                # bucket is there and ours, which is all this asks.
                if error.code == "BucketAlreadyOwnedByYou":
                    return False
                raise
            return True

        return await self._call(ensure)

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        await self.put_unrecorded(key, data, content_type)
        count_put(key, len(data))

    async def put_unrecorded(self, key: str, data: bytes, content_type: str) -> None:
        """Writes an object the coordinator does not record (an export's layout)."""

        def put() -> None:
            self._client.put_object(
                self.bucket, key, io.BytesIO(data), length=len(data), content_type=content_type
            )

        await self._call(put)

    async def exists(self, key: str) -> bool:
        """Whether the store holds `key` (a HEAD request)."""

        def stat() -> bool:
            try:
                self._client.stat_object(self.bucket, key)
            except S3Error as error:
                if error.code in MISSING_CODES:
                    return False
                raise
            return True

        return await self._call(stat)

    def post_policy(
        self, key: str, content_type: str, max_bytes: int, expires_at: datetime.datetime
    ) -> dict[str, str]:
        """Form fields of an S3 POST policy that writes only `key`, only with this content
        type, 1..max_bytes bytes, until `expires_at`. Signing is local arithmetic (the
        region is configured, so the SDK asks the store nothing): no thread, no request."""
        policy = PostPolicy(self.bucket, expires_at)
        policy.add_equals_condition("key", key)
        policy.add_equals_condition("Content-Type", content_type)
        policy.add_content_length_range_condition(1, max_bytes)
        fields = self._client.presigned_post_policy(policy)
        fields["key"] = key
        fields["Content-Type"] = content_type
        return fields

    def post_policies(
        self,
        keys: Sequence[str],
        content_type: str,
        max_bytes: int,
        expires_at: datetime.datetime,
    ) -> list[dict[str, str]]:
        """`post_policy` for each of `keys`, signed at one instant: the same fields the SDK
        writes (the same policy document and AWS signature V4), with the date's signing
        key derived once for all of them instead of once per key (four HMACs) and no SDK
        objects per key: a quarter of the preview service's CPU per frame went to
        signing grants one by one (docs/benchmarks.md)."""
        signer = self._signer(expires_at)
        answers = []
        for key in keys:
            fields = signer.fields(
                [
                    ["eq", "$key", key],
                    ["eq", "$Content-Type", content_type],
                    ["content-length-range", 1, max_bytes],
                ]
            )
            fields["key"] = key
            fields["Content-Type"] = content_type
            answers.append(fields)
        return answers

    def prefix_post_policy(
        self, prefix: str, content_type: str, max_bytes: int, expires_at: datetime.datetime
    ) -> dict[str, str]:
        """Form fields of ONE S3 POST policy that writes any key starting with `prefix`
        (a `starts-with` condition on `$key`), only with this content type, 1..max_bytes
        bytes, until `expires_at`: one signature for all of a lease's slots instead of one
        per slot. The caller adds the `key` field; the same fields the SDK's
        `presigned_post_policy` writes for a starts-with policy."""
        fields = self._signer(expires_at).fields(
            [
                ["eq", "$Content-Type", content_type],
                ["starts-with", "$key", prefix],
                ["content-length-range", 1, max_bytes],
            ]
        )
        fields["Content-Type"] = content_type
        return fields

    def _signer(self, expires_at: datetime.datetime) -> _PolicySigner:
        return _PolicySigner(
            self.bucket, self._access_key, self._secret_key, self._region, expires_at
        )

    async def get(self, key: str) -> bytes:
        """The object's bytes; ImageMissing when the store has no such object."""

        def get() -> bytes:
            response = self._client.get_object(self.bucket, key)
            try:
                return response.read()
            finally:
                response.close()
                response.release_conn()

        try:
            return await self._call(get)
        except S3Error as error:
            raise ImageMissing("The image's bytes are missing from object storage.") from error

    async def get_head(self, key: str, length: int) -> tuple[bytes, int]:
        """The object's first `length` bytes (fewer when it is shorter) and its whole size;
        ImageMissing when the store has no such object."""

        def get() -> tuple[bytes, int]:
            response = self._client.get_object(self.bucket, key, offset=0, length=length)
            try:
                data = response.read()
                whole = response.headers.get("Content-Range", "").rpartition("/")[2]
                return data, int(whole) if whole.isdigit() else len(data)
            finally:
                response.close()
                response.release_conn()

        try:
            return await self._call(get)
        except S3Error as error:
            raise ImageMissing("The image's bytes are missing from object storage.") from error

    async def list_under(self, prefix: str) -> list[tuple[str, int]]:
        """Every object's key and size under `prefix`."""

        def list_all() -> list[tuple[str, int]]:
            found = self._client.list_objects(self.bucket, prefix=prefix, recursive=True)
            return [(item.object_name or "", item.size or 0) for item in found]

        return await self._call(list_all)

    async def remove(self, keys: Sequence[str]) -> list[RemovalFailure]:
        """Deletes objects (an object already gone counts as deleted); returns the failures."""
        return await self._call(lambda: self._remove_now(keys))

    def _remove_now(self, keys: Sequence[str]) -> list[RemovalFailure]:
        # One DeleteObjects request per 1,000 keys; the SDK's result is lazy, so nothing
        # is sent until it is iterated.
        errors = self._client.remove_objects(self.bucket, [DeleteObject(key) for key in keys])
        return [
            RemovalFailure(error.name or "", f"{error.code}: {error.message}")
            for error in errors
            if error.code not in MISSING_CODES
        ]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._http.clear()


class _PolicySigner:
    """Signs POST policies for a bucket at one instant (AWS signature V4), the date's signing
    key derived once. Conditions are given in the SDK's order (equality, starts-with,
    content-length-range); bucket, algorithm, credential and date are added as it adds them."""

    def __init__(
        self,
        bucket: str,
        access_key: str,
        secret_key: str,
        region: str,
        expires_at: datetime.datetime,
    ) -> None:
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        day = f"{now:%Y%m%d}"
        self.bucket = bucket
        self.credential = f"{access_key}/{day}/{region}/s3/aws4_request"
        self.amz_date = f"{now:%Y%m%dT%H%M%SZ}"
        self.signing_key = _signing_key(secret_key, day, region)
        expiration = expires_at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
        self.expiration = expiration[:-3] + "Z"

    def fields(self, conditions: list[list[str | int]]) -> dict[str, str]:
        policy = {
            "expiration": self.expiration,
            "conditions": [
                ["eq", "$bucket", self.bucket],
                *conditions,
                ["eq", "$x-amz-algorithm", POLICY_ALGORITHM],
                ["eq", "$x-amz-credential", self.credential],
                ["eq", "$x-amz-date", self.amz_date],
            ],
        }
        encoded = base64.b64encode(json.dumps(policy).encode()).decode()
        return {
            "x-amz-algorithm": POLICY_ALGORITHM,
            "x-amz-credential": self.credential,
            "x-amz-date": self.amz_date,
            "policy": encoded,
            "x-amz-signature": hmac.new(
                self.signing_key, encoded.encode(), hashlib.sha256
            ).hexdigest(),
        }


def _signing_key(secret_key: str, day: str, region: str) -> bytes:
    """AWS signature V4's signing key for S3 on `day` (YYYYMMDD) in `region`."""
    key = ("AWS4" + secret_key).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key
