"""`python -m services.preview`: the preview and staged-upload service."""

from __future__ import annotations

import os
import sys

from minio.error import S3Error
from urllib3.exceptions import HTTPError

from services.preview.app import build
from services.preview.errors import StorageUnavailable
from services.preview.settings import PREFIX, PreviewSettings
from services.preview.storage import ObjectStore
from workshop.kit.channels import open_channel
from workshop.kit.identity import KeyRefused, check_own_key, has_scope
from workshop.kit.server import run_event_loop, serve
from workshop.kit.settings import EXIT_BAD_SETTINGS, settings_or_exit
from workshop.kit.telemetry import configure_logging, configure_tracing
from workshop.kit.tls import client_tls
from workshop.v1 import common_pb2

LABEL = "preview"


async def run_server(settings: PreviewSettings) -> None:
    store = ObjectStore(settings)
    channel = open_channel(settings.coordinator_target, tls=client_tls(settings))
    try:
        await check_own_key(
            channel,
            settings.service_key,
            variable=f"{PREFIX}_SERVICE_KEY",
            target=settings.coordinator_target,
            requirement=has_scope(common_pb2.SCOPE_SERVICE),
        )
        # Proves the object store is reachable (and the keys work) before SERVING.
        await store.ensure_bucket()
        app = build(settings, store, channel)
        await serve(label=LABEL, settings=settings, services=app.services, workers=app.workers)
    finally:
        await channel.close()
        store.close()


def main() -> None:
    settings = settings_or_exit(PreviewSettings, PREFIX, os.environ)
    configure_logging(LABEL, settings.log_level)
    configure_tracing(LABEL)
    try:
        run_event_loop(run_server(settings))
    except KeyRefused as error:
        print(f"{LABEL}: cannot start: {error}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_SETTINGS) from None
    except (OSError, S3Error, HTTPError, StorageUnavailable) as error:
        print(
            f"{LABEL}: cannot start: object store {settings.s3_endpoint}: {error}", file=sys.stderr
        )
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
