"""The root of the `workshop` command line: global options and the command groups.

Every command talks gRPC to the coordinator (and, for exports, the preview service) with
`authorization: Bearer <key>` metadata, an admin key for operator commands. The address and
key come from options or the environment, so a key need not appear in a shell's history.
The global options may come before or after the command (tools/cli/command.py).
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import typer

from tools.cli import datasets, doctor, operator, recordings, runs, workflows
from tools.cli.command import GlobalOptionsGroup, build
from tools.cli.context import Options
from workshop.kit.cli import COORDINATOR_ENV, KEY_ENV

OUTPUTS = ("table", "json", "jsonl")

app = typer.Typer(
    name="workshop",
    help="Operate Workshop: runs, workflows, recordings, devices, models, keys, users, buckets."
    "\n\nThe options below may come before or after the command: `workshop runs list -o json`"
    " is `workshop -o json runs list`.",
    cls=GlobalOptionsGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # a bug shows a plain traceback; refusals never do
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(runs.app, name="runs")
app.add_typer(workflows.app, name="workflows")
app.add_typer(recordings.app, name="recordings")
app.add_typer(operator.devices, name="devices")
app.add_typer(operator.runtimes, name="runtimes")
app.add_typer(operator.models, name="models")
app.add_typer(operator.keys, name="keys")
app.add_typer(operator.users, name="users")
app.add_typer(operator.buckets, name="buckets")
app.add_typer(datasets.app, name="datasets")
app.command("doctor")(doctor.doctor)


def _version(shown: bool) -> None:
    """`workshop X.Y.Z`: the installed package's version (pyproject.toml's)."""
    if not shown:
        return
    try:
        print(f"workshop {metadata.version('workshop')}")
    except metadata.PackageNotFoundError:
        print("workshop (not installed: `pip install -e .` records its version)")
    raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    coordinator: str = typer.Option(
        "", envvar=COORDINATOR_ENV, help="coordinator gRPC address HOST:PORT"
    ),
    key: str = typer.Option(
        "", envvar=KEY_ENV, help="the key (admin for operator commands)", show_default=False
    ),
    key_file: Path | None = typer.Option(
        None, envvar="WORKSHOP_KEY_FILE", help="a file holding the key (when --key is not given)"
    ),
    preview: str = typer.Option(
        "", envvar="WORKSHOP_PREVIEW", help="preview service gRPC address (buckets export)"
    ),
    output: str = typer.Option(
        "table",
        "--output",
        "-o",
        envvar="WORKSHOP_OUTPUT",
        help="table (for people), json, or jsonl (one object a line: watch updates, list rows)",
    ),
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_version,
        help="print the version and exit",
    ),
) -> None:
    if output not in OUTPUTS:
        raise typer.BadParameter(f"must be one of {', '.join(OUTPUTS)}", param_hint="--output")
    ctx.obj = Options(
        coordinator=coordinator, key=key, key_file=key_file, preview=preview, output=output
    )


EXIT_CTRL_C = 130  # the shells' code for a command ended by SIGINT


def main() -> None:
    try:
        build(app)(prog_name="workshop")
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback (`runs watch` exits 6 itself)
        print("workshop: interrupted", file=sys.stderr)
        raise SystemExit(EXIT_CTRL_C) from None
