"""`python -m services.coordinator [serve|migrate]`."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import asyncpg

from services.coordinator.app import grpc_services
from services.coordinator.migrate import apply_migrations
from services.coordinator.settings import PREFIX, CoordinatorSettings
from workshop.kit.server import announce, serve
from workshop.kit.settings import settings_or_exit
from workshop.kit.telemetry import configure_logging, configure_tracing

LABEL = "coordinator"


async def run_server(settings: CoordinatorSettings) -> None:
    # The pool proves the database is reachable before we report SERVING, and
    # is closed only after the server has stopped taking calls.
    async with asyncpg.create_pool(
        settings.database_url, min_size=1, max_size=settings.database_pool_size
    ):
        await serve(label=LABEL, settings=settings, services=grpc_services())


async def run_migrate(settings: CoordinatorSettings) -> None:
    applied = await apply_migrations(settings.database_url)
    announce(LABEL, event="migrated", applied=applied)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.coordinator")
    parser.add_argument("command", nargs="?", default="serve", choices=["serve", "migrate"])
    args = parser.parse_args(argv)
    settings = settings_or_exit(CoordinatorSettings, PREFIX, os.environ)
    configure_logging(LABEL, settings.log_level)
    configure_tracing(LABEL)
    runner = run_server if args.command == "serve" else run_migrate
    try:
        asyncio.run(runner(settings))
    except (OSError, asyncpg.PostgresError) as error:
        print(f"{LABEL}: cannot start: {error}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
