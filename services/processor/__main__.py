"""`python -m services.processor [serve | workshop-manifest --device ID]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from services.processor.manifest import manifest_for
from services.processor.settings import PREFIX, ProcessorSettings
from workshop.kit.server import serve
from workshop.kit.settings import settings_or_exit
from workshop.kit.telemetry import configure_logging, configure_tracing

LABEL = "processor"


async def run_server(settings: ProcessorSettings) -> None:
    # The claim loop arrives with the processor issue; until then the process
    # serves only health and reflection and claims nothing.
    await serve(label=LABEL, settings=settings, services=[])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.processor")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("serve", help="run the processor (default)")
    manifest = commands.add_parser(
        "workshop-manifest", help="print the runtime manifest, code_sha256 and runtime id"
    )
    manifest.add_argument("--device", required=True, help="device id, e.g. gpu-box")
    args = parser.parse_args(argv)
    if args.command == "workshop-manifest":
        print(json.dumps(manifest_for(args.device), indent=2, sort_keys=True))
        return
    settings = settings_or_exit(ProcessorSettings, PREFIX, os.environ)
    configure_logging(LABEL, settings.log_level)
    configure_tracing(LABEL)
    try:
        asyncio.run(run_server(settings))
    except OSError as error:
        print(f"{LABEL}: cannot start: {error}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
