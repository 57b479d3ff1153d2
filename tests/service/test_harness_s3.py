"""The S3 harness against real SeaweedFS: round trip, signature checks, restarts."""

from __future__ import annotations

import io
import secrets

import pytest
from minio.error import S3Error

from testbed.harness.s3 import TIMINGS, S3Bucket


def test_put_then_get_returns_the_same_bytes(s3_bucket: S3Bucket) -> None:
    server, bucket = s3_bucket
    client = server.client()
    payload = secrets.token_bytes(64 * 1024)
    key = "workshop-tests/round-trip/blob.bin"

    client.put_object(
        bucket, key, io.BytesIO(payload), length=len(payload), content_type="image/jpeg"
    )
    response = client.get_object(bucket, key)
    try:
        assert response.read() == payload
    finally:
        response.close()
        response.release_conn()
    assert client.stat_object(bucket, key).size == len(payload)
    print(f"weed ready in {TIMINGS.ready_s[0]:.2f} s")


def test_a_wrong_secret_key_is_refused(s3_bucket: S3Bucket) -> None:
    server, bucket = s3_bucket
    impostor = server.client(secret_key=server.secret_key + "x")

    with pytest.raises(S3Error) as refused:
        impostor.put_object(bucket, "workshop-tests/forged", io.BytesIO(b"no"), length=2)
    assert refused.value.code == "SignatureDoesNotMatch"

    with pytest.raises(S3Error) as refused:
        impostor.list_objects(bucket).__next__()
    assert refused.value.code == "SignatureDoesNotMatch"
    assert list(server.client().list_objects(bucket, recursive=True)) == []


def test_restart_keeps_a_committed_object(s3_bucket: S3Bucket) -> None:
    server, bucket = s3_bucket
    key = "workshop-tests/restart/kept.bin"
    payload = secrets.token_bytes(4096)
    server.client().put_object(bucket, key, io.BytesIO(payload), length=len(payload))
    pid_before = server.pid

    elapsed = server.restart()
    print(f"weed restart (SIGKILL + start) ready in {elapsed:.2f} s")

    assert server.pid is not None
    assert server.pid != pid_before
    response = server.client().get_object(bucket, key)
    try:
        assert response.read() == payload
    finally:
        response.close()
        response.release_conn()
