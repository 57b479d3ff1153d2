"""`workshop doctor`: checks a processor host the way its processor will meet it.

It reads the processor's own settings (`PROCESSOR_*`, as `python -m services.processor`
does) and, for what only an operator may read (devices, runtimes, model versions), the
coordinator and admin key of the global options. Each check says what is wrong and how to
fix it; the exit code is 1 when any fails. The checks (tools/cli/checks.py) import Triton's
client, minio and the processor's settings, so they load only when the command runs.
"""

from __future__ import annotations

import asyncio
import os

import typer

from tools.cli.context import EXIT_REFUSED, Options, options
from workshop.kit.auth import bearer_metadata


def doctor(
    ctx: typer.Context,
    model: list[str] = typer.Option(
        [], help="check only these models (default: every published version)"
    ),
) -> None:
    """Check this processor host: device registered, local code_sha256 equals the registered
    runtime's, PROCESSOR_KEY is workshop:run for this device, Triton serves the published
    versions with their weights, S3 reachable, /dev/shm usable. Exit 1 if any check fails."""
    from tools.cli.checks import Check, Doctor, processor_settings, report
    from workshop.kit.settings import SettingsError

    opts: Options = options(ctx)
    try:
        settings = processor_settings(os.environ)
    except SettingsError as error:
        problems = "; ".join(f"{variable}: {problem}" for variable, problem in error.problems)
        checks = [Check("processor settings", False, problems, "set the PROCESSOR_* variables")]
        report(opts, checks)
        raise typer.Exit(EXIT_REFUSED) from None
    coordinator = opts.coordinator or settings.coordinator_target
    found = Doctor(settings, coordinator, bearer_metadata(opts.secret()), model)
    asyncio.run(found.run())
    report(opts, found.checks)
    if not all(c.ok for c in found.checks):
        raise typer.Exit(EXIT_REFUSED)
