"""The operator's view of the coordinator: its CLI and the real grpcurl against a real process.

`python -m services.coordinator migrate` and `create-admin-key` bootstrap a
database; the admin secret they print then drives OperatorService by hand, as
docs/operations.md describes. The manual clock is off unless COORDINATOR_MANUAL_CLOCK=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from services.coordinator.platform.versions import list_migrations
from testbed.harness.processes import REPO, ServiceProcess
from tools.localstack.postgres import admin_execute, run_async

GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or "grpcurl"
OPERATOR = "workshop.v1.OperatorService"


def coordinator_env(dsn: str, **extra: str) -> dict[str, str]:
    values = {
        "DATABASE_URL": dsn,
        "HOST": "127.0.0.1",
        "PORT": "0",
        "DRAIN_SECONDS": "0",
        "GRACE_SECONDS": "1",
        "SCHEDULER_INTERVAL_SECONDS": "0",
        **extra,
    }
    return {f"COORDINATOR_{key}": value for key, value in values.items()}


def cli(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    """Run `python -m services.coordinator ARGS`; its JSON lines on stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "services.coordinator", *args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def grpcurl(
    port: int, method: str, data: dict[str, Any], secret: str | None
) -> subprocess.CompletedProcess[str]:
    command = [GRPCURL, "-plaintext", "-max-time", "10", "-d", json.dumps(data)]
    if secret is not None:
        command += ["-H", f"authorization: Bearer {secret}"]
    command += [f"127.0.0.1:{port}", f"{OPERATOR}/{method}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


def call(port: int, method: str, data: dict[str, Any], secret: str) -> dict[str, Any]:
    done = grpcurl(port, method, data, secret)
    assert done.returncode == 0, done.stderr
    reply: dict[str, Any] = json.loads(done.stdout)
    return reply


def refused(done: subprocess.CompletedProcess[str], code: str, reason: str) -> None:
    """grpcurl failed with the gRPC `code` and printed the ErrorInfo `reason` of the details."""
    assert done.returncode != 0, done.stdout
    assert f"Code: {code}" in done.stderr, done.stderr
    assert re.search(rf'"reason":\s*"{reason}"', done.stderr), done.stderr


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.fixture
def admin_secret(pg_dsn: str) -> str:
    """Bootstrap as an operator would: migrate, then print the first admin key."""
    env = coordinator_env(pg_dsn)
    migrated = [line for line in cli(env, "migrate") if line.get("event") == "migrated"]
    # The per-test database is cloned from a fully migrated template: nothing is left.
    assert migrated == [
        {
            "service": "coordinator",
            "event": "migrated",
            "phase": "pre",
            "applied": [],
            "pending": [],
        }
    ]

    keys = cli(env, "create-admin-key", "--name", "ops")
    admin = [line for line in keys if line.get("event") == "admin-key"]
    assert len(admin) == 1, keys
    secret = admin[0]["secret"]
    assert isinstance(secret, str)
    assert secret
    assert admin[0]["key_id"]
    return secret


def start(env: dict[str, str], log: Path) -> tuple[ServiceProcess, int]:
    service = ServiceProcess("services.coordinator", env, log)
    try:
        port = int(service.wait_event("serving", timeout=60)["port"])
    except BaseException:
        service.stop()
        raise
    return service, port


def test_an_operator_bootstraps_and_drives_the_coordinator_with_grpcurl(
    pg_dsn: str, admin_secret: str, tmp_path: Path
) -> None:
    service, port = start(coordinator_env(pg_dsn), tmp_path / "coordinator.log")
    try:
        registered = call(
            port,
            "RegisterDevice",
            {"device_id": "gpu-box", "description": "rack 1"},
            admin_secret,
        )
        assert registered["device"]["device_id"] == "gpu-box"
        assert registered["device"]["description"] == "rack 1"
        listed = call(port, "ListDevices", {}, admin_secret)
        assert [device["device_id"] for device in listed["devices"]] == ["gpu-box"]

        keys = call(port, "ListKeys", {}, admin_secret)
        assert [(key["name"], key["scopes"]) for key in keys["keys"]] == [
            ("ops", [{"scope": "SCOPE_ADMIN"}])
        ]
        assert admin_secret not in json.dumps(keys)

        before = datetime.now(UTC)
        clock = call(port, "GetClock", {}, admin_secret)
        after = datetime.now(UTC)
        assert clock.get("manual", False) is False
        assert (
            before - timedelta(seconds=1)
            <= parse_time(clock["now"])
            <= after + timedelta(seconds=1)
        )

        advanced = grpcurl(port, "AdvanceClock", {"by": "3600s"}, admin_secret)
        refused(advanced, "FailedPrecondition", "CLOCK_NOT_MANUAL")
        assert "COORDINATOR_MANUAL_CLOCK=1" in advanced.stderr  # the message says what to do
        after_refusal = parse_time(call(port, "GetClock", {}, admin_secret)["now"])
        assert after_refusal - datetime.now(UTC) < timedelta(seconds=5)

        refused(grpcurl(port, "GetClock", {}, None), "Unauthenticated", "CREDENTIAL_MISSING")
        refused(
            grpcurl(port, "GetClock", {}, "wk_not_a_key"), "Unauthenticated", "CREDENTIAL_REJECTED"
        )
    finally:
        assert service.stop() == 0, service.log_tail()


def test_a_coordinator_refuses_to_serve_before_its_pre_migrations(
    pg_dsn: str, tmp_path: Path
) -> None:
    """Started against a database that lacks one of its pre-migrations (step 1 of a rolling
    upgrade forgotten), it exits 1 saying what to run, and serves once it is applied."""
    newest_pre = [m for m in list_migrations() if m.phase == "pre"][-1]
    run_async(
        lambda: admin_execute(
            pg_dsn, f"DELETE FROM schema_migrations WHERE version = {newest_pre.version}"
        )
    )
    env = coordinator_env(pg_dsn)
    done = subprocess.run(
        [sys.executable, "-m", "services.coordinator"],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert f"lacks the pre-migrations {newest_pre.label} of this version" in done.stderr
    assert "python -m services.coordinator migrate" in done.stderr
    assert '"serving"' not in done.stdout

    # its bookkeeping row back (the schema itself never lost it): the coordinator serves
    run_async(
        lambda: admin_execute(
            pg_dsn,
            "INSERT INTO schema_migrations (version, name) "
            f"VALUES ({newest_pre.version}, '{newest_pre.name}')",
        )
    )
    service, _ = start(env, tmp_path / "coordinator.log")
    assert service.stop() == 0, service.log_tail()


def test_the_manual_clock_moves_by_rpc(pg_dsn: str, admin_secret: str, tmp_path: Path) -> None:
    env = coordinator_env(pg_dsn, MANUAL_CLOCK="1")
    service, port = start(env, tmp_path / "coordinator.log")
    try:
        first = call(port, "GetClock", {}, admin_secret)
        assert first["manual"] is True
        started = parse_time(first["now"])

        advanced = call(port, "AdvanceClock", {"by": "3600s"}, admin_secret)
        moved = parse_time(advanced["now"])
        assert timedelta(hours=1) <= moved - started < timedelta(hours=1, seconds=30)

        later = parse_time(call(port, "GetClock", {}, admin_secret)["now"])
        assert moved <= later < moved + timedelta(seconds=30)
        assert later - datetime.now(UTC) > timedelta(minutes=59)

        backwards = grpcurl(port, "AdvanceClock", {"by": "-60s"}, admin_secret)
        refused(backwards, "InvalidArgument", "INVALID_FIELD")
    finally:
        assert service.stop() == 0, service.log_tail()


def test_the_manual_clock_never_moves_back_when_the_coordinator_restarts(
    pg_dsn: str, admin_secret: str, tmp_path: Path
) -> None:
    """Advanced 55 minutes, stopped and started again, the coordinator reads on from where
    it was (the offset is the database's), not from real time."""
    env = coordinator_env(pg_dsn, MANUAL_CLOCK="1")
    service, port = start(env, tmp_path / "first.log")
    try:
        advanced = parse_time(call(port, "AdvanceClock", {"by": "3300s"}, admin_secret)["now"])
    finally:
        assert service.stop() == 0, service.log_tail()

    service, port = start(env, tmp_path / "second.log")
    try:
        after_restart = parse_time(call(port, "GetClock", {}, admin_secret)["now"])
        assert after_restart >= advanced
        assert after_restart - datetime.now(UTC) > timedelta(minutes=54)
        # and what it decides by follows the same clock: a device registered now
        registered = call(port, "RegisterDevice", {"device_id": "gpu-box"}, admin_secret)
        assert parse_time(registered["device"]["registered_at"]) >= advanced
    finally:
        assert service.stop() == 0, service.log_tail()


def test_two_replicas_follow_one_manual_clock(
    pg_dsn: str, admin_secret: str, tmp_path: Path
) -> None:
    """A moves the clock; B reads the same time, and B's own decisions (a device's
    registration time) follow the move too, without a restart or a GetClock first."""
    env = coordinator_env(pg_dsn, MANUAL_CLOCK="1")
    a, a_port = start(env, tmp_path / "a.log")
    try:
        b, b_port = start(env, tmp_path / "b.log")
        try:
            moved = parse_time(call(a_port, "AdvanceClock", {"by": "7200s"}, admin_secret)["now"])

            def registered_on_b(device: str) -> datetime:
                reply = call(b_port, "RegisterDevice", {"device_id": device}, admin_secret)
                return parse_time(reply["device"]["registered_at"])

            # B hears the move on its LISTEN connection within moments
            deadline = datetime.now(UTC) + timedelta(seconds=10)
            attempt = 0
            while (seen := registered_on_b(f"d{attempt}")) < moved:
                assert datetime.now(UTC) < deadline, f"B's clock stayed at {seen}"
                attempt += 1
            on_b = parse_time(call(b_port, "GetClock", {}, admin_secret)["now"])
            on_a = parse_time(call(a_port, "GetClock", {}, admin_secret)["now"])
            assert moved <= on_b <= on_a + timedelta(seconds=5)
            assert on_a <= on_b + timedelta(seconds=5)

            # a move through B is A's too
            again = parse_time(call(b_port, "AdvanceClock", {"by": "60s"}, admin_secret)["now"])
            assert parse_time(call(a_port, "GetClock", {}, admin_secret)["now"]) >= again
        finally:
            assert b.stop() == 0, b.log_tail()
    finally:
        assert a.stop() == 0, a.log_tail()
