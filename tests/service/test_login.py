"""Website sign-in (IdentityService.Login, Logout), passwords (OperatorService.SetUserPassword
and `set-password`), the `gateway` scope, a user's own keys, and the website's access to
devices and runtimes; real coordinator, real Postgres, real gRPC (docs/concepts.md).

Every refusal is checked both ways: the call that is refused, and the nearest call that
is not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from argon2 import PasswordHasher
from google.protobuf.duration_pb2 import Duration

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.leases.maintenance import Maintenance
from testbed.coordinator_leases import create_run, setup
from testbed.coordinator_world import error_reason
from testbed.harness.coordinator import EPOCH, CoordinatorHarness, running_coordinator
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, identity_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import workshop_pb2 as ws

Code = grpc.StatusCode
Metadata = tuple[tuple[str, str], ...]
REPO = Path(__file__).resolve().parents[2]

PASSWORD = "correct horse battery staple"
WRONG = "incorrect horse battery"
ADDRESS = "198.51.100.7"
WINDOW = timedelta(minutes=15)
WHO = identity_pb2.WhoAmIRequest()
FAILED = (Code.UNAUTHENTICATED, "LOGIN_FAILED")
THROTTLED = (Code.RESOURCE_EXHAUSTED, "LOGIN_THROTTLED")
SCOPE_MISSING = (Code.PERMISSION_DENIED, "SCOPE_MISSING")
INVALID = (Code.INVALID_ARGUMENT, "INVALID_FIELD")


# --- helpers ---------------------------------------------------------------------------------


async def refusal(call: Awaitable[object]) -> tuple[Code, str, dict[str, str], str]:
    """(code, reason, metadata, message) of a call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    code, reason, metadata = error_reason(caught.value)
    return code, reason, metadata, caught.value.details() or ""


async def refused(call: Awaitable[object], expected: tuple[Code, str]) -> dict[str, str]:
    code, reason, metadata, message = await refusal(call)
    assert (code, reason) == expected, message
    assert message
    return metadata


async def gateway_key(h: CoordinatorHarness) -> Metadata:
    return bearer_metadata(await h.key(Grant(ScopeName.GATEWAY), name="gateway"))


async def user(h: CoordinatorHarness, user_id: str, password: str | None = PASSWORD) -> None:
    await h.operator.CreateUser(
        op.CreateUserRequest(user_id=user_id, display_name=user_id.title()), metadata=h.admin
    )
    if password is not None:
        await h.operator.SetUserPassword(
            op.SetUserPasswordRequest(user_id=user_id, password=password), metadata=h.admin
        )


def login(
    h: CoordinatorHarness,
    gateway: Metadata,
    user_id: str,
    password: str = PASSWORD,
    address: str = ADDRESS,
) -> Any:
    return h.identity.Login(
        identity_pb2.LoginRequest(user_id=user_id, password=password, client_address=address),
        metadata=gateway,
    )


async def failures(h: CoordinatorHarness, subject: str | None = None) -> int:
    async with h.db.connection() as connection:
        count: int = await connection.fetchval(
            "SELECT count(*) FROM login_failures WHERE $1::text IS NULL OR subject = $1", subject
        )
        return count


async def session_of(h: CoordinatorHarness, user_id: str) -> Metadata:
    reply = await h.operator.CreateSession(
        op.CreateSessionRequest(user_id=user_id), metadata=h.admin
    )
    return bearer_metadata(reply.secret)


def days(n: int) -> Duration:
    value = Duration()
    value.FromTimedelta(timedelta(days=n))
    return value


def scope(
    value: common_pb2.Scope.ValueType, camera_ids: tuple[str, ...] = (), device_id: str = ""
) -> common_pb2.KeyScope:
    return common_pb2.KeyScope(scope=value, camera_ids=camera_ids, device_id=device_id)


async def put_camera(h: CoordinatorHarness, camera_id: str) -> None:
    await h.operator.PutCamera(
        op.PutCameraRequest(camera_id=camera_id, name=camera_id), metadata=h.admin
    )


# --- passwords -------------------------------------------------------------------------------


@pytest.fixture
async def default_cost_coordinator(pg_dsn: str) -> AsyncIterator[CoordinatorHarness]:
    """A coordinator that hashes at argon2-cffi's default cost, as a deployment does (the
    harness's own hashes cheaply: testbed/harness/coordinator.py)."""
    async with running_coordinator(pg_dsn, password_hasher=PasswordHasher()) as harness:
        yield harness


async def test_set_user_password_stores_only_an_argon2id_hash(
    default_cost_coordinator: CoordinatorHarness,
) -> None:
    h = default_cost_coordinator
    await user(h, "ana", password=None)
    created = await h.operator.CreateUser(
        op.CreateUserRequest(user_id="ana", display_name="Ana"), metadata=h.admin
    )
    assert not created.user.has_password
    reply = await h.operator.SetUserPassword(
        op.SetUserPasswordRequest(user_id="ana", password=PASSWORD), metadata=h.admin
    )
    assert reply.user.user_id == "ana"
    assert reply.user.has_password
    async with h.db.connection() as connection:
        stored = await connection.fetchval("SELECT password_hash FROM users WHERE user_id = 'ana'")
    assert stored.startswith("$argon2id$v=19$m=65536,t=3,p=4$")  # argon2-cffi's defaults
    assert PASSWORD not in stored
    assert PasswordHasher().verify(stored, PASSWORD)


async def test_set_user_password_is_admin_only_and_refuses_bad_passwords(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await user(h, "ana", password=None)
    for metadata in (
        await session_of(h, "ana"),
        bearer_metadata(await h.key(Grant(ScopeName.WORKSHOP), user_id="ana")),
        await gateway_key(h),
    ):
        await refused(
            h.operator.SetUserPassword(
                op.SetUserPasswordRequest(user_id="ana", password=PASSWORD), metadata=metadata
            ),
            SCOPE_MISSING,
        )
    await refused(
        h.operator.SetUserPassword(
            op.SetUserPasswordRequest(user_id="nobody", password=PASSWORD), metadata=h.admin
        ),
        (Code.NOT_FOUND, "NOT_FOUND"),
    )
    bad = ["", "a" * 11, "é" * 5 + "a", "a" * 1025, "tab\tin the middle", "new\nline password"]
    for password in bad:
        code, reason, info, message = await refusal(
            h.operator.SetUserPassword(
                op.SetUserPasswordRequest(user_id="ana", password=password), metadata=h.admin
            )
        )
        assert ((code, reason), info) == (INVALID, {"field": "password"})
        assert not password or password not in message  # never echoed
    async with h.db.connection() as connection:
        assert await connection.fetchval("SELECT password_hash FROM users") is None
    # the bounds themselves pass: 12 and 1024 bytes (counted in UTF-8), any printable text
    for password in ("a" * 12, "é" * 6, "ü" * 512, "spaces and ünïcödé ok 🙂"):
        reply = await h.operator.SetUserPassword(
            op.SetUserPasswordRequest(user_id="ana", password=password), metadata=h.admin
        )
        assert reply.user.has_password


async def test_a_new_password_replaces_the_old_and_clears_the_users_failures(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    gateway = await gateway_key(h)
    await user(h, "ana")
    for _ in range(5):
        await refused(login(h, gateway, "ana", WRONG), FAILED)
    await refused(login(h, gateway, "ana"), THROTTLED)
    await h.operator.SetUserPassword(
        op.SetUserPasswordRequest(user_id="ana", password="a brand new password"), metadata=h.admin
    )
    assert await failures(h, "user:ana") == 0
    assert await failures(h, f"address:{ADDRESS}") == 5  # the address's stay
    await refused(login(h, gateway, "ana"), FAILED)
    await login(h, gateway, "ana", "a brand new password")


async def test_the_set_password_command_reads_stdin(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    await user(h, "ana", password=None)
    key = dict(h.admin)["authorization"].removeprefix("Bearer ")

    async def command(*args: str, stdin: bytes, env: dict[str, str]) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.coordinator",
            "set-password",
            *args,
            cwd=REPO,
            env={k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")} | env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(stdin), 60)
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    where = {"WORKSHOP_COORDINATOR": f"127.0.0.1:{h.port}", "WORKSHOP_KEY": key}
    code, out, err = await command("--user", "ana", stdin=b"short\n", env=where)
    assert code == 1
    assert "INVALID_ARGUMENT" in err
    assert "short" not in err + out
    code, out, err = await command("--user", "nobody", stdin=f"{PASSWORD}\n".encode(), env=where)
    assert (code, "NOT_FOUND" in err) == (1, True)
    code, out, err = await command("--user", "ana", stdin=b"", env={})
    assert code == 2
    assert "--coordinator" in err

    code, out, err = await command("--user", "ana", stdin=f"{PASSWORD}\n".encode(), env=where)
    assert code == 0, err
    assert out.strip() == '{"user_id": "ana", "has_password": true}'
    assert PASSWORD not in out + err
    reply = await login(h, await gateway_key(h), "ana")
    assert reply.session.user_id == "ana"


# --- login -----------------------------------------------------------------------------------


async def test_login_creates_a_session_of_the_user(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    gateway = await gateway_key(h)
    await user(h, "ana")
    reply = await login(h, gateway, "ana")
    assert reply.session.user_id == "ana"
    assert reply.secret.startswith(reply.session.session_id + ".")
    assert reply.expires_at == reply.session.expires_at
    assert reply.session.expires_at.ToDatetime(tzinfo=UTC) == EPOCH + timedelta(hours=12)
    who = await h.identity.WhoAmI(WHO, metadata=bearer_metadata(reply.secret))
    assert who.kind == common_pb2.PRINCIPAL_KIND_SESSION
    assert (who.user_id, who.session_id, who.display_name) == (
        "ana",
        reply.session.session_id,
        "Ana",
    )
    # the session acts on the workshop like one an operator made
    await h.workshop.ListWorkflows(
        ws.ListWorkflowsRequest(), metadata=bearer_metadata(reply.secret)
    )
    assert await failures(h) == 0
    # an admin key may sign in too
    assert (await login(h, h.admin, "ana")).session.user_id == "ana"


async def test_a_wrong_password_an_unknown_user_and_no_password_answer_alike(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    gateway = await gateway_key(h)
    await user(h, "ana")
    await user(h, "bob", password=None)
    answers = set()
    for user_id, password in (("ana", WRONG), ("nobody", PASSWORD), ("bob", PASSWORD)):
        before = await failures(h, f"user:{user_id}")
        code, reason, metadata, message = await refusal(login(h, gateway, user_id, password))
        answers.add((code, reason, tuple(metadata.items()), message))
        assert await failures(h, f"user:{user_id}") == before + 1  # counted all the same
    assert answers == {(*FAILED, (), "Wrong user id or password.")}
    assert await failures(h, f"address:{ADDRESS}") == 3
    await login(h, gateway, "ana")  # the right password of the same user passes


async def test_a_disabled_user_is_told_so_only_with_the_right_password(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    gateway = await gateway_key(h)
    await user(h, "ana")
    await login(h, gateway, "ana")
    await h.operator.DisableUser(op.DisableUserRequest(user_id="ana"), metadata=h.admin)
    await refused(login(h, gateway, "ana", WRONG), FAILED)
    assert await failures(h, "user:ana") == 1
    _, _, _, message = await refusal(login(h, gateway, "ana"))
    assert message == "The user is disabled; only an admin can help."
    await refused(login(h, gateway, "ana"), (Code.UNAUTHENTICATED, "CREDENTIAL_REJECTED"))
    assert await failures(h, "user:ana") == 1  # the right password is no failure
    async with h.db.connection() as connection:
        assert await connection.fetchval("SELECT count(*) FROM sessions") == 1  # the first one


async def test_failed_logins_of_a_user_are_throttled_until_the_window_passes(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    gateway = await gateway_key(h)
    await user(h, "ana")
    await user(h, "bob")
    for attempt in range(5):  # from five addresses: the user's count alone reaches its limit
        await refused(login(h, gateway, "ana", WRONG, address=f"203.0.113.{attempt}"), FAILED)
        h.clock.advance(timedelta(minutes=1))
    # now EPOCH + 5 min; the first failure leaves the window at EPOCH + 15 min
    for password in (WRONG, PASSWORD):  # throttled: the password is not even checked
        metadata = await refused(login(h, gateway, "ana", password, "192.0.2.1"), THROTTLED)
        assert metadata == {"retry_after_seconds": str(10 * 60)}
    assert await failures(h, "user:ana") == 5  # a throttled attempt is not counted
    assert await failures(h, "address:192.0.2.1") == 0
    await login(h, gateway, "bob", address="192.0.2.1")  # another user from that address

    h.clock.advance(timedelta(minutes=10) - timedelta(milliseconds=1))
    metadata = await refused(login(h, gateway, "ana"), THROTTLED)
    assert metadata == {"retry_after_seconds": "1"}
    h.clock.advance(timedelta(milliseconds=1))  # the first failure leaves the window
    await refused(login(h, gateway, "ana", WRONG), FAILED)  # one more guess is checked
    metadata = await refused(login(h, gateway, "ana"), THROTTLED)
    assert metadata == {"retry_after_seconds": "60"}  # until the second one leaves
    h.clock.advance(timedelta(minutes=1))
    assert (await login(h, gateway, "ana")).session.user_id == "ana"


async def test_failed_logins_from_an_address_are_throttled_for_every_user(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    gateway = await gateway_key(h)
    await user(h, "ana")
    for attempt in range(20):  # twenty users, none at their own limit
        await refused(login(h, gateway, f"guess-{attempt}", PASSWORD), FAILED)
    metadata = await refused(login(h, gateway, "ana"), THROTTLED)
    assert metadata == {"retry_after_seconds": str(15 * 60)}
    assert await failures(h, "user:ana") == 0
    await login(h, gateway, "ana", address="198.51.100.8")  # another address is not throttled
    h.clock.advance(WINDOW)
    await login(h, gateway, "ana")


async def test_a_success_clears_the_users_failures_but_not_the_addresses(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    gateway = await gateway_key(h)
    await user(h, "ana")
    for _ in range(4):
        await refused(login(h, gateway, "ana", WRONG), FAILED)
    await login(h, gateway, "ana")
    assert await failures(h, "user:ana") == 0
    assert await failures(h, f"address:{ADDRESS}") == 4
    for _ in range(5):  # the user's count starts again from zero
        await refused(login(h, gateway, "ana", WRONG), FAILED)
    await refused(login(h, gateway, "ana"), THROTTLED)


async def test_concurrent_wrong_guesses_at_the_limit_are_checked_once(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    gateway = await gateway_key(h)
    await user(h, "ana")
    for attempt in range(4):
        await refused(login(h, gateway, "ana", WRONG, address=f"203.0.113.{attempt}"), FAILED)
    guesses = [
        refusal(login(h, gateway, "ana", f"{WRONG} {n}", address=f"192.0.2.{n}")) for n in range(6)
    ]
    answers = Counter((code, reason) for code, reason, _, _ in await asyncio.gather(*guesses))
    assert answers == Counter({FAILED: 1, THROTTLED: 5})
    assert await failures(h, "user:ana") == 5

    # and per address: nineteen failures, then four users at once
    for attempt in range(19):
        await refused(login(h, gateway, f"guess-{attempt}", address="192.0.2.200"), FAILED)
    guesses = [refusal(login(h, gateway, f"other-{n}", address="192.0.2.200")) for n in range(4)]
    answers = Counter((code, reason) for code, reason, _, _ in await asyncio.gather(*guesses))
    assert answers == Counter({FAILED: 1, THROTTLED: 3})
    assert await failures(h, "address:192.0.2.200") == 20


async def test_malformed_login_fields_are_invalid_and_not_counted(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    gateway = await gateway_key(h)
    await user(h, "ana")
    cases: list[tuple[str, str, str]] = [
        ("", PASSWORD, ADDRESS),
        ("ana smith", PASSWORD, ADDRESS),
        ("a" * 129, PASSWORD, ADDRESS),
        ("ana", "", ADDRESS),
        ("ana", "a" * 1025, ADDRESS),
        ("ana", PASSWORD, ""),
        ("ana", PASSWORD, "198.51.100.7 "),
        ("ana", PASSWORD, "198.51.\n100.7"),
        ("ana", PASSWORD, "a" * 65),
        ("ana", PASSWORD, "адрес"),
    ]
    for user_id, password, address in cases:
        await refused(login(h, gateway, user_id, password, address), INVALID)
    assert await failures(h) == 0
    # the bounds pass: a 1024-byte (wrong) password and a 64-character address are checked
    await refused(login(h, gateway, "ana", "a" * 1024, "a" * 64), FAILED)
    await login(h, gateway, "ana", address="fe80::1%eth0")


async def test_login_needs_the_gateway_key(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    await user(h, "ana")
    await h.operator.RegisterDevice(op.RegisterDeviceRequest(device_id="gpu-box"), metadata=h.admin)
    for metadata in (
        await session_of(h, "ana"),
        bearer_metadata(await h.key(Grant(ScopeName.WORKSHOP), user_id="ana")),
        bearer_metadata(await h.key(Grant(ScopeName.SERVICE))),
        bearer_metadata(await h.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"))),
    ):
        await refused(login(h, metadata, "ana"), SCOPE_MISSING)
    await refused(login(h, (), "ana"), (Code.UNAUTHENTICATED, "CREDENTIAL_MISSING"))
    await refused(
        login(h, bearer_metadata("wk_0123456789abcdef.unknown"), "ana"),
        (Code.UNAUTHENTICATED, "CREDENTIAL_REJECTED"),
    )
    assert await failures(h) == 0
    await login(h, await gateway_key(h), "ana")


async def test_the_gateway_key_reads_runs_and_nothing_else(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    s = await setup(h)
    await create_run(h, s)
    gateway = await gateway_key(h)
    who = await h.identity.WhoAmI(WHO, metadata=gateway)
    assert [held.scope for held in who.scopes] == [common_pb2.SCOPE_GATEWAY]
    detail = await h.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=gateway)
    assert detail.detail.run.run_id == "r1"
    stream = h.workshop.WatchRun(ws.WatchRunRequest(run_id="r1"), metadata=gateway)
    first = await asyncio.wait_for(stream.read(), 10)
    assert isinstance(first, ws.WatchRunResponse)
    assert first.detail.run.run_id == "r1"
    stream.cancel()
    await refused(
        h.workshop.GetRun(ws.GetRunRequest(run_id="r9"), metadata=gateway),
        (Code.NOT_FOUND, "NOT_FOUND"),
    )
    refusals: list[Awaitable[object]] = [
        h.workshop.ListRuns(ws.ListRunsRequest(), metadata=gateway),
        h.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=gateway),
        h.workshop.ListWorkflows(ws.ListWorkflowsRequest(), metadata=gateway),
        h.workshop.GetRunSnapshot(ws.GetRunSnapshotRequest(run_id="r1"), metadata=gateway),
        h.operator.ListDevices(op.ListDevicesRequest(), metadata=gateway),
        h.operator.GetClock(op.GetClockRequest(), metadata=gateway),
        h.identity.ListOwnKeys(identity_pb2.ListOwnKeysRequest(), metadata=gateway),
    ]
    for call in refusals:
        await refused(call, SCOPE_MISSING)


async def test_the_gateway_scope_takes_no_device_and_no_cameras(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await put_camera(h, "cam-1")
    await h.operator.RegisterDevice(op.RegisterDeviceRequest(device_id="gpu-box"), metadata=h.admin)
    for bad in (
        scope(common_pb2.SCOPE_GATEWAY, camera_ids=("cam-1",)),
        scope(common_pb2.SCOPE_GATEWAY, device_id="gpu-box"),
    ):
        await refused(
            h.operator.CreateKey(op.CreateKeyRequest(name="gw", scopes=[bad]), metadata=h.admin),
            INVALID,
        )
    reply = await h.operator.CreateKey(
        op.CreateKeyRequest(name="gw", scopes=[scope(common_pb2.SCOPE_GATEWAY)]), metadata=h.admin
    )
    assert [held.scope for held in reply.key.scopes] == [common_pb2.SCOPE_GATEWAY]
    listed = await h.operator.ListKeys(op.ListKeysRequest(), metadata=h.admin)
    # by id: the harness's admin key has the same (frozen) creation time, so the order of
    # the two is the key ids'
    (stored,) = [key for key in listed.keys if key.key_id == reply.key.key_id]
    assert [held.scope for held in stored.scopes] == [common_pb2.SCOPE_GATEWAY]


async def test_an_older_hash_is_replaced_at_login(
    default_cost_coordinator: CoordinatorHarness,
) -> None:
    h = default_cost_coordinator
    await user(h, "ana", password=None)
    cheap = PasswordHasher(time_cost=1, memory_cost=8192, parallelism=1).hash(PASSWORD)
    async with h.db.connection() as connection:
        await connection.execute("UPDATE users SET password_hash = $1", cheap)
    gateway = await gateway_key(h)
    await refused(login(h, gateway, "ana", WRONG), FAILED)
    await login(h, gateway, "ana")
    async with h.db.connection() as connection:
        stored = await connection.fetchval("SELECT password_hash FROM users")
    assert stored != cheap
    assert stored.startswith("$argon2id$v=19$m=65536,t=3,p=4$")
    await login(h, gateway, "ana")


async def test_maintenance_forgets_failures_that_left_the_window(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    gateway = await gateway_key(h)
    await refused(login(h, gateway, "nobody"), FAILED)
    h.clock.advance(WINDOW - timedelta(seconds=1))
    maintenance = Maintenance(h.db, h.clock, interval_seconds=1)
    assert (await maintenance.run_once()).logins_forgotten == 0
    assert await failures(h) == 2
    h.clock.advance(timedelta(seconds=1))
    assert (await maintenance.run_once()).logins_forgotten == 2
    assert await failures(h) == 0


async def test_no_password_reaches_the_log(
    coordinator: CoordinatorHarness, caplog: pytest.LogCaptureFixture
) -> None:
    h = coordinator
    caplog.set_level(logging.DEBUG)
    gateway = await gateway_key(h)
    await user(h, "ana")
    await refused(login(h, gateway, "ana", WRONG), FAILED)
    await refusal(
        h.operator.SetUserPassword(
            op.SetUserPasswordRequest(user_id="ana", password="tab\tsecret!!"), metadata=h.admin
        )
    )
    await login(h, gateway, "ana")
    text = "\n".join(record.getMessage() for record in caplog.records)
    for secret in (PASSWORD, WRONG, "tab\tsecret!!"):
        assert secret not in text


# --- logout ----------------------------------------------------------------------------------


async def test_logout_revokes_the_calling_session(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    gateway = await gateway_key(h)
    await user(h, "ana")
    signed_in = await login(h, gateway, "ana")
    session = bearer_metadata(signed_in.secret)
    other = await login(h, gateway, "ana")  # another browser
    h.clock.advance(timedelta(minutes=5))
    out = await h.identity.Logout(identity_pb2.LogoutRequest(), metadata=session)
    assert out.session.session_id == signed_in.session.session_id
    assert out.session.revoked_at.ToDatetime(tzinfo=UTC) == EPOCH + timedelta(minutes=5)
    await refused(
        h.identity.WhoAmI(WHO, metadata=session), (Code.UNAUTHENTICATED, "CREDENTIAL_REJECTED")
    )
    await h.identity.WhoAmI(WHO, metadata=bearer_metadata(other.secret))  # still signed in
    h.clock.advance(timedelta(minutes=5))
    again = await h.identity.Logout(identity_pb2.LogoutRequest(), metadata=session)
    assert again.session.revoked_at == out.session.revoked_at  # idempotent


async def test_logout_is_for_sessions(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    await user(h, "ana")
    key = bearer_metadata(await h.key(Grant(ScopeName.WORKSHOP), user_id="ana"))
    logout = identity_pb2.LogoutRequest()
    for metadata in (key, h.admin, await gateway_key(h)):
        _, _, _, message = await refusal(h.identity.Logout(logout, metadata=metadata))
        await refused(
            h.identity.Logout(logout, metadata=metadata),
            (Code.FAILED_PRECONDITION, "NOT_A_SESSION"),
        )
        assert "RevokeOwnKey" in message
    await h.identity.WhoAmI(WHO, metadata=key)  # the key still works
    for metadata, reason in (
        (bearer_metadata("ws_0123456789abcdef.unknown"), "CREDENTIAL_REJECTED"),
        (bearer_metadata("wk_0123456789abcdef.unknown"), "CREDENTIAL_REJECTED"),
        ((), "CREDENTIAL_MISSING"),
    ):
        await refused(h.identity.Logout(logout, metadata=metadata), (Code.UNAUTHENTICATED, reason))
    await h.identity.Logout(logout, metadata=await session_of(h, "ana"))


# --- own keys --------------------------------------------------------------------------------


async def test_a_user_creates_lists_and_revokes_their_own_keys(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await user(h, "ana")
    await user(h, "bob")
    await put_camera(h, "cam-1")
    session = await session_of(h, "ana")
    created = await h.identity.CreateOwnKey(
        identity_pb2.CreateOwnKeyRequest(name="laptop", scopes=[scope(common_pb2.SCOPE_WORKSHOP)]),
        metadata=session,
    )
    key = created.key
    assert (key.name, key.user_id) == ("laptop", "ana")
    assert created.secret.startswith(key.key_id + ".")
    assert key.created_at.ToDatetime(tzinfo=UTC) == EPOCH
    assert key.expires_at.ToDatetime(tzinfo=UTC) == EPOCH + timedelta(days=90)
    who = await h.identity.WhoAmI(WHO, metadata=bearer_metadata(created.secret))
    assert (who.kind, who.user_id, who.key_id) == (common_pb2.PRINCIPAL_KIND_KEY, "ana", key.key_id)
    await h.workshop.ListWorkflows(
        ws.ListWorkflowsRequest(), metadata=bearer_metadata(created.secret)
    )

    h.clock.advance(timedelta(minutes=1))
    reader = await h.identity.CreateOwnKey(
        identity_pb2.CreateOwnKeyRequest(
            name="reader",
            scopes=[
                scope(common_pb2.SCOPE_FOOTAGE_READ, camera_ids=("cam-1",)),
                scope(common_pb2.SCOPE_WORKSHOP, camera_ids=("cam-1",)),
            ],
            ttl=days(365),
        ),
        metadata=session,
    )
    assert reader.key.expires_at.ToDatetime(tzinfo=UTC) == h.clock.now() + (timedelta(days=365))
    assert [(s.scope, list(s.camera_ids)) for s in reader.key.scopes] == [
        (common_pb2.SCOPE_FOOTAGE_READ, ["cam-1"]),
        (common_pb2.SCOPE_WORKSHOP, ["cam-1"]),
    ]
    # bob's keys, and keys of no user, are not ana's
    await h.identity.CreateOwnKey(
        identity_pb2.CreateOwnKeyRequest(name="bob's", scopes=[scope(common_pb2.SCOPE_WORKSHOP)]),
        metadata=await session_of(h, "bob"),
    )
    await h.key(Grant(ScopeName.WORKSHOP), name="no user")

    listed = await h.identity.ListOwnKeys(identity_pb2.ListOwnKeysRequest(), metadata=session)
    assert [k.name for k in listed.keys] == ["reader", "laptop"]
    assert not listed.next_page_token
    first = await h.identity.ListOwnKeys(
        identity_pb2.ListOwnKeysRequest(page_size=1), metadata=session
    )
    assert [k.name for k in first.keys] == ["reader"]
    assert first.next_page_token
    second = await h.identity.ListOwnKeys(
        identity_pb2.ListOwnKeysRequest(page_size=1, page_token=first.next_page_token),
        metadata=session,
    )
    assert [k.name for k in second.keys] == ["laptop"]

    h.clock.advance(timedelta(minutes=1))
    revoke = identity_pb2.RevokeOwnKeyRequest(key_id=key.key_id)
    revoked = await h.identity.RevokeOwnKey(revoke, metadata=session)
    assert revoked.key.HasField("revoked_at")
    await refused(
        h.identity.WhoAmI(WHO, metadata=bearer_metadata(created.secret)),
        (Code.UNAUTHENTICATED, "CREDENTIAL_REJECTED"),
    )
    h.clock.advance(timedelta(minutes=1))
    again = await h.identity.RevokeOwnKey(revoke, metadata=session)
    assert again.key.revoked_at == revoked.key.revoked_at  # idempotent
    live = await h.identity.ListOwnKeys(identity_pb2.ListOwnKeysRequest(), metadata=session)
    assert [k.name for k in live.keys] == ["reader"]
    everything = await h.identity.ListOwnKeys(
        identity_pb2.ListOwnKeysRequest(include_revoked=True), metadata=session
    )
    assert [k.name for k in everything.keys] == ["reader", "laptop"]
    h.clock.advance(timedelta(days=366))  # the reader expired: listed only with the revoked
    session = await session_of(h, "ana")
    live = await h.identity.ListOwnKeys(identity_pb2.ListOwnKeysRequest(), metadata=session)
    assert list(live.keys) == []
    await refused(
        h.identity.ListOwnKeys(identity_pb2.ListOwnKeysRequest(page_token="x"), metadata=session),
        INVALID,
    )


async def test_a_user_grants_only_workshop_and_footage_read(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await user(h, "ana")
    await put_camera(h, "cam-1")
    await h.operator.RegisterDevice(op.RegisterDeviceRequest(device_id="gpu-box"), metadata=h.admin)
    session = await session_of(h, "ana")

    def create(
        *scopes: common_pb2.KeyScope, name: str = "k", ttl: Duration | None = None
    ) -> Awaitable[object]:
        request = identity_pb2.CreateOwnKeyRequest(name=name, scopes=scopes)
        if ttl is not None:
            request.ttl.CopyFrom(ttl)
        return h.identity.CreateOwnKey(request, metadata=session)

    forbidden = {
        "workshop:run": scope(common_pb2.SCOPE_WORKSHOP_RUN, device_id="gpu-box"),
        "admin": scope(common_pb2.SCOPE_ADMIN),
        "service": scope(common_pb2.SCOPE_SERVICE),
        "gateway": scope(common_pb2.SCOPE_GATEWAY),
    }
    for name, grant in forbidden.items():
        _, _, _, message = await refusal(create(scope(common_pb2.SCOPE_WORKSHOP), grant))
        await refused(create(grant), SCOPE_MISSING)
        assert f"'{name}'" in message
    for bad in (
        create(),  # no scope
        create(scope(common_pb2.SCOPE_UNSPECIFIED)),
        create(scope(common_pb2.SCOPE_FOOTAGE_READ)),  # footage:read names its cameras
        create(scope(common_pb2.SCOPE_WORKSHOP, device_id="gpu-box")),
        create(scope(common_pb2.SCOPE_WORKSHOP), name=""),
        create(scope(common_pb2.SCOPE_WORKSHOP), name="n" * 101),
        create(scope(common_pb2.SCOPE_WORKSHOP), name="new\nline"),
        create(scope(common_pb2.SCOPE_WORKSHOP), ttl=days(366)),
        create(scope(common_pb2.SCOPE_WORKSHOP), ttl=Duration(seconds=-1)),
    ):
        await refused(bad, INVALID)
    metadata = await refused(
        create(scope(common_pb2.SCOPE_FOOTAGE_READ, camera_ids=("cam-1", "cam-9"))),
        (Code.NOT_FOUND, "NOT_FOUND"),
    )
    assert metadata == {"kind": "camera", "id": "cam-9"}
    async with h.db.connection() as connection:
        assert await connection.fetchval("SELECT count(*) FROM keys WHERE user_id = 'ana'") == 0
    # what is allowed, at its bounds
    await create(scope(common_pb2.SCOPE_FOOTAGE_READ, camera_ids=("cam-1",)), name="n" * 100)
    await create(scope(common_pb2.SCOPE_WORKSHOP), ttl=days(365))


async def test_another_users_key_is_not_found(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    await user(h, "ana")
    await user(h, "bob")
    bob = await session_of(h, "bob")
    bobs = await h.identity.CreateOwnKey(
        identity_pb2.CreateOwnKeyRequest(name="bob's", scopes=[scope(common_pb2.SCOPE_WORKSHOP)]),
        metadata=bob,
    )
    admins = await h.operator.CreateKey(
        op.CreateKeyRequest(name="ops", scopes=[scope(common_pb2.SCOPE_WORKSHOP)]),
        metadata=h.admin,
    )
    ana = await session_of(h, "ana")
    for key_id in (bobs.key.key_id, admins.key.key_id, "wk_0000000000000000"):
        _, _, metadata, message = await refusal(
            h.identity.RevokeOwnKey(identity_pb2.RevokeOwnKeyRequest(key_id=key_id), metadata=ana)
        )
        assert (metadata, message) == (
            {"kind": "key", "id": key_id},
            f"Key {key_id!r} does not exist.",
        )
    await h.identity.WhoAmI(WHO, metadata=bearer_metadata(bobs.secret))  # untouched
    await h.identity.RevokeOwnKey(
        identity_pb2.RevokeOwnKeyRequest(key_id=bobs.key.key_id), metadata=bob
    )


async def test_a_key_cannot_manage_keys(coordinator: CoordinatorHarness) -> None:
    h = coordinator
    await user(h, "ana")
    agent = bearer_metadata(await h.key(Grant(ScopeName.WORKSHOP), user_id="ana"))
    for metadata in (agent, h.admin, await gateway_key(h)):
        for call in (
            h.identity.CreateOwnKey(
                identity_pb2.CreateOwnKeyRequest(
                    name="more", scopes=[scope(common_pb2.SCOPE_WORKSHOP)]
                ),
                metadata=metadata,
            ),
            h.identity.ListOwnKeys(identity_pb2.ListOwnKeysRequest(), metadata=metadata),
            h.identity.RevokeOwnKey(
                identity_pb2.RevokeOwnKeyRequest(key_id="wk_0000000000000000"), metadata=metadata
            ),
        ):
            code, reason, _, message = await refusal(call)
            assert (code, reason) == SCOPE_MISSING
            assert "a key cannot" in message
    async with h.db.connection() as connection:
        assert await connection.fetchval("SELECT count(*) FROM keys WHERE user_id = 'ana'") == 1
    await h.identity.ListOwnKeys(
        identity_pb2.ListOwnKeysRequest(), metadata=await session_of(h, "ana")
    )
    for call in (
        h.identity.ListOwnKeys(identity_pb2.ListOwnKeysRequest(), metadata=agent),
        h.identity.ListOwnKeys(identity_pb2.ListOwnKeysRequest(), metadata=h.admin),
    ):
        await refused(call, SCOPE_MISSING)


# --- devices and runtimes for the website ----------------------------------------------------


async def test_workshop_scope_lists_devices_and_runtimes_and_registers_runtimes(
    coordinator: CoordinatorHarness,
) -> None:
    h = coordinator
    await user(h, "ana")
    await put_camera(h, "cam-1")
    await h.operator.RegisterDevice(op.RegisterDeviceRequest(device_id="gpu-box"), metadata=h.admin)
    allowed = [
        await session_of(h, "ana"),
        bearer_metadata(await h.key(Grant(ScopeName.WORKSHOP), user_id="ana")),
        bearer_metadata(await h.key(Grant(ScopeName.WORKSHOP, camera_ids=("cam-1",)))),
    ]
    for n, metadata in enumerate(allowed):
        h.clock.advance(timedelta(minutes=1))  # each registration the newest
        devices = await h.operator.ListDevices(op.ListDevicesRequest(), metadata=metadata)
        assert [d.device_id for d in devices.devices] == ["gpu-box"]
        registered = await h.operator.RegisterRuntime(
            op.RegisterRuntimeRequest(
                device_id="gpu-box",
                engine="workshop-processor",
                code_sha256=f"{n:064x}",
                capabilities=["workshop-v3"],
            ),
            metadata=metadata,
        )
        assert registered.created
        runtimes = await h.operator.ListRuntimes(op.ListRuntimesRequest(), metadata=metadata)
        assert runtimes.runtimes[0].runtime_id == registered.runtime.runtime_id
        assert list(runtimes.runtimes[0].capabilities) == ["workshop-v3"]
        await refused(
            h.operator.RegisterRuntime(
                op.RegisterRuntimeRequest(
                    device_id="nowhere", engine="workshop-processor", code_sha256="0" * 64
                ),
                metadata=metadata,
            ),
            (Code.NOT_FOUND, "NOT_FOUND"),
        )
        for call in (
            h.operator.RegisterDevice(
                op.RegisterDeviceRequest(device_id="gpu-two"), metadata=metadata
            ),
            h.operator.PutCamera(op.PutCameraRequest(camera_id="cam-2"), metadata=metadata),
            h.operator.ListCameras(op.ListCamerasRequest(), metadata=metadata),
            h.operator.ListKeys(op.ListKeysRequest(), metadata=metadata),
            h.operator.CreateKey(
                op.CreateKeyRequest(name="x", scopes=[scope(common_pb2.SCOPE_ADMIN)]),
                metadata=metadata,
            ),
        ):
            await refused(call, SCOPE_MISSING)
    others = [
        bearer_metadata(await h.key(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-1",)))),
        bearer_metadata(await h.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"))),
        bearer_metadata(await h.key(Grant(ScopeName.SERVICE))),
        await gateway_key(h),
    ]
    for metadata in others:
        for other_call in (
            h.operator.ListDevices(op.ListDevicesRequest(), metadata=metadata),
            h.operator.ListRuntimes(op.ListRuntimesRequest(), metadata=metadata),
            h.operator.RegisterRuntime(
                op.RegisterRuntimeRequest(
                    device_id="gpu-box", engine="workshop-processor", code_sha256="f" * 64
                ),
                metadata=metadata,
            ),
        ):
            await refused(other_call, SCOPE_MISSING)
    async with h.db.connection() as connection:
        assert await connection.fetchval("SELECT count(*) FROM runtimes") == 3
        assert await connection.fetchval("SELECT count(*) FROM devices") == 1
