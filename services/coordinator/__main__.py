"""`python -m services.coordinator [serve | migrate [--phase pre|post] |
create-admin-key --name NAME | set-password --user USER]`."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from datetime import timedelta

import grpc

from services.coordinator.app import build
from services.coordinator.identity.accounts import insert_key
from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.platform.clock import Clock, StoredClock, SystemClock
from services.coordinator.platform.db import Database, PostgresError
from services.coordinator.platform.migrate import (
    ForeignHistory,
    MigrationRefused,
    SchemaBehind,
    check_pre_migrations,
    migrate,
)
from services.coordinator.platform.versions import PHASES, Phase
from services.coordinator.settings import PREFIX, CoordinatorSettings
from workshop.kit.cli import (
    Metadata,
    add_coordinator_arguments,
    call_coordinator,
    check_coordinator_arguments,
)
from workshop.kit.server import announce, run_event_loop, serve
from workshop.kit.settings import settings_or_exit
from workshop.kit.telemetry import configure_logging, configure_tracing
from workshop.v1 import operator_pb2, operator_pb2_grpc

LABEL = "coordinator"


async def make_clock(settings: CoordinatorSettings, db: Database) -> Clock:
    """The manual clock where enabled, as the database holds it (so a restart never moves
    it back), else real time."""
    return await StoredClock.load(db) if settings.manual_clock else SystemClock()


async def run_server(settings: CoordinatorSettings) -> None:
    # The pool proves the database is reachable before we report SERVING, and
    # is closed only after the server has stopped taking calls.
    async with Database.open(settings.database_url, size=settings.database_pool_size) as db:
        async with db.connection() as connection:
            await check_pre_migrations(connection)
        coordinator = build(
            db,
            await make_clock(settings, db),
            job_capacity=settings.job_capacity,
            scheduler_interval_seconds=settings.scheduler_interval_seconds,
            maintenance_interval_seconds=settings.maintenance_interval_seconds,
            principal_cache_seconds=settings.principal_cache_seconds,
            login_limits=settings.login_limits,
            lease=timedelta(seconds=settings.lease_seconds),
            max_image_bytes=settings.max_image_bytes,
            metrics_max_age_seconds=settings.metrics_max_age_seconds,
            lease_attestation_key=settings.lease_attestation_key,
        )
        await serve(
            label=LABEL,
            settings=settings,
            services=coordinator.services,
            workers=coordinator.workers,
            collectors=coordinator.collectors,
        )


async def run_migrate(settings: CoordinatorSettings, phase: Phase) -> None:
    outcome = await migrate(settings.database_url, phase)
    announce(LABEL, event="migrated", phase=phase, applied=outcome.applied, pending=outcome.pending)


async def run_create_admin_key(settings: CoordinatorSettings, name: str) -> None:
    """Bootstrap: the first admin key, written straight to the database."""
    async with Database.open(settings.database_url, size=1) as db:
        now = (await make_clock(settings, db)).now()
        async with db.transaction() as connection:
            row, secret = await insert_key(
                connection, name, [Grant(ScopeName.ADMIN)], "", None, now
            )
    announce(LABEL, event="admin-key", key_id=row.key_id, secret=secret)


def read_password(user_id: str) -> str:
    """The new password: from stdin when it is not a terminal (one line, its newline
    dropped), else typed twice at a prompt that does not echo. Never from the arguments."""
    if not sys.stdin.isatty():
        return sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    first = getpass.getpass(f"New password for {user_id}: ")
    if getpass.getpass("Again: ") != first:
        print("set-password: the two passwords differ; nothing was changed", file=sys.stderr)
        raise SystemExit(1)
    return first


def set_password(target: str, key: str, user_id: str, password: str) -> dict[str, object]:
    """OperatorService.SetUserPassword; the user as it is now (never the password)."""

    async def call(channel: grpc.aio.Channel, metadata: Metadata) -> dict[str, object]:
        reply = await operator_pb2_grpc.OperatorServiceStub(channel).SetUserPassword(
            operator_pb2.SetUserPasswordRequest(user_id=user_id, password=password),
            metadata=metadata,
        )
        return {"user_id": reply.user.user_id, "has_password": reply.user.has_password}

    return call_coordinator(target, key, call)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.coordinator")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("serve", help="run the coordinator (default)")
    migrate_command = commands.add_parser(
        "migrate", help="apply schema migrations (advisory-locked; docs/upgrading.md)"
    )
    migrate_command.add_argument(
        "--phase",
        choices=PHASES,
        default="pre",
        help="pre (default): only the pre-migrations, safe while the previous version "
        "serves; post: everything pending, once every coordinator runs this version",
    )
    admin = commands.add_parser("create-admin-key", help="print a new admin key's secret once")
    admin.add_argument("--name", default="admin", help="a label for the key")
    password = commands.add_parser(
        "set-password",
        help="set a user's password (read from stdin, or typed twice at a prompt)",
    )
    password.add_argument("--user", required=True, help="the user's id")
    add_coordinator_arguments(password, required=True)
    args = parser.parse_args(argv)
    if args.command == "set-password":
        # Over gRPC with an admin key, like the other operator commands: no database URL.
        if not args.coordinator:
            password.error("needs --coordinator and --key (or their environment variables)")
        check_coordinator_arguments(password, args)
        secret = read_password(args.user)
        print(json.dumps(set_password(args.coordinator, args.key, args.user, secret)))
        return
    settings = settings_or_exit(CoordinatorSettings, PREFIX, os.environ)
    configure_logging(LABEL, settings.log_level)
    configure_tracing(LABEL)
    if args.command == "migrate":
        runner = run_migrate(settings, args.phase)
    elif args.command == "create-admin-key":
        runner = run_create_admin_key(settings, args.name)
    else:
        runner = run_server(settings)
    try:
        run_event_loop(runner)
    except (MigrationRefused, ForeignHistory) as refused:
        print(f"{LABEL}: {args.command or 'serve'}: {refused}", file=sys.stderr)
        raise SystemExit(1) from None
    except SchemaBehind as behind:
        print(f"{LABEL}: cannot start: {behind}", file=sys.stderr)
        raise SystemExit(1) from None
    except (OSError, PostgresError) as error:
        print(f"{LABEL}: cannot start: {error}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
