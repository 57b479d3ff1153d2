"""IdentityService.WhoAmI, and the services that check their own key when they start."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import grpc
import pytest
from minio import Minio

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.s3 import S3Server
from workshop.kit.auth import bearer_metadata
from workshop.kit.settings import EXIT_BAD_SETTINGS
from workshop.v1 import common_pb2, identity_pb2
from workshop.v1 import operator_pb2 as op

REPO = Path(__file__).resolve().parents[2]
WHO = identity_pb2.WhoAmIRequest()


async def test_a_key_learns_its_scopes(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    await c.operator.RegisterDevice(op.RegisterDeviceRequest(device_id="gpu-box"), metadata=c.admin)
    secret = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="proc")
    reply = await c.identity.WhoAmI(WHO, metadata=bearer_metadata(secret))
    assert reply.kind == common_pb2.PRINCIPAL_KIND_KEY
    assert secret.startswith(reply.key_id + ".")
    assert reply.display_name == "proc"
    assert [(s.scope, s.device_id) for s in reply.scopes] == [
        (common_pb2.SCOPE_WORKSHOP_RUN, "gpu-box")
    ]
    assert not reply.HasField("expires_at")


async def test_a_session_learns_its_user_and_expiry(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    await c.operator.CreateUser(op.CreateUserRequest(user_id="ada"), metadata=c.admin)
    session = await c.operator.CreateSession(
        op.CreateSessionRequest(user_id="ada"), metadata=c.admin
    )
    reply = await c.identity.WhoAmI(WHO, metadata=bearer_metadata(session.secret))
    assert reply.kind == common_pb2.PRINCIPAL_KIND_SESSION
    assert (reply.user_id, reply.session_id) == ("ada", session.session.session_id)
    assert reply.expires_at == session.session.expires_at
    assert {s.scope for s in reply.scopes} == {
        common_pb2.SCOPE_WORKSHOP,
        common_pb2.SCOPE_FOOTAGE_READ,
    }


async def test_no_credential_or_a_revoked_one_is_unauthenticated(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    created = await c.operator.CreateKey(
        op.CreateKeyRequest(
            name="gone", scopes=[common_pb2.KeyScope(scope=common_pb2.SCOPE_WORKSHOP)]
        ),
        metadata=c.admin,
    )
    await c.operator.RevokeKey(op.RevokeKeyRequest(key_id=created.key.key_id), metadata=c.admin)
    for metadata in ((), bearer_metadata(created.secret)):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await c.identity.WhoAmI(WHO, metadata=metadata)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def start(module: str, env: dict[str, str]) -> tuple[int, str]:
    """Runs `python -m module` until it exits (within 60 s); returns its code and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        cwd=REPO,
        env={"PATH": os.environ["PATH"], **env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, stderr.decode()


async def test_the_preview_service_exits_2_on_a_refused_key_before_touching_s3(
    coordinator: CoordinatorHarness, s3_server: S3Server
) -> None:
    c = coordinator
    bucket = "identity-check-never-created"
    wrong_scope = await c.key(Grant(ScopeName.WORKSHOP), name="not-a-service-key")
    base = {
        "PREVIEW_PORT": "0",
        "PREVIEW_S3_ENDPOINT": s3_server.endpoint,
        "PREVIEW_S3_ACCESS_KEY": s3_server.access_key,
        "PREVIEW_S3_SECRET_KEY": s3_server.secret_key,
        "PREVIEW_BUCKET": bucket,
        "PREVIEW_COORDINATOR_TARGET": f"127.0.0.1:{c.port}",
    }
    for key, problem in (
        ("wk_0123456789abcdef.unknown", "refuses this key"),
        (wrong_scope, "has no scope SCOPE_SERVICE"),
    ):
        code, stderr = await start("services.preview", {**base, "PREVIEW_SERVICE_KEY": key})
        assert code == EXIT_BAD_SETTINGS, stderr
        assert "PREVIEW_SERVICE_KEY" in stderr, stderr
        assert problem in stderr, stderr
        assert "Traceback" not in stderr
    client = Minio(
        s3_server.endpoint,
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        secure=False,
    )
    assert not client.bucket_exists(bucket)


async def test_the_processor_exits_2_on_a_key_for_another_device(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    for device in ("gpu-box", "other-box"):
        await c.operator.RegisterDevice(
            op.RegisterDeviceRequest(device_id=device), metadata=c.admin
        )
    other = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="other-box"), name="other")
    code, stderr = await start(
        "services.processor",
        {
            "PROCESSOR_PORT": "0",
            "PROCESSOR_DEVICE_ID": "gpu-box",
            "PROCESSOR_KEY": other,
            "PROCESSOR_RUNTIME_ID": "workshop-" + "0" * 32,
            "PROCESSOR_COORDINATOR_TARGET": f"127.0.0.1:{c.port}",
            "PROCESSOR_PREVIEW_TARGET": "127.0.0.1:1",
            "PROCESSOR_S3_ENDPOINT": "127.0.0.1:1",
            "PROCESSOR_S3_ACCESS_KEY": "unused",
            "PROCESSOR_S3_SECRET_KEY": "unused",
        },
    )
    assert code == EXIT_BAD_SETTINGS, stderr
    assert "PROCESSOR_KEY" in stderr
    assert "has no scope SCOPE_WORKSHOP_RUN bound to device 'gpu-box'" in stderr
