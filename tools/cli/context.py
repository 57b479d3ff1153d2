"""What every command shares: where the coordinator is, which key, how to print, and how a
refusal ends the command (its catalog reason and message on stderr, a non-zero exit code,
never a traceback)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn, TypeVar

import grpc
import typer

from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.kit.cli import Metadata, refusal
from workshop.kit.status import REASONS
from workshop.kit.tls import ClientTls, client_tls_from_environ

T = TypeVar("T")

# Exit codes shared by every command (docs/cli.md); `runs watch` adds its own.
EXIT_REFUSED = 1  # the server refused the call, or the input is bad
EXIT_USAGE = 2  # missing or malformed options (typer's own code for usage errors)
# Where each service's address comes from: option, environment variable, what it is.
ADDRESS_SETTINGS = {
    "coordinator": ("--coordinator", "WORKSHOP_COORDINATOR", "the coordinator's gRPC address"),
    "preview": ("--preview", "WORKSHOP_PREVIEW", "the preview service's gRPC address"),
}


@dataclasses.dataclass
class Options:
    """The global options, as the root callback resolved them."""

    coordinator: str = ""
    key: str = ""
    key_file: Path | None = None
    preview: str = ""
    output: str = "table"

    @property
    def json(self) -> bool:
        return self.output in ("json", "jsonl")

    def secret(self) -> str:
        """The key: --key / WORKSHOP_KEY, else the first line of --key-file."""
        if self.key:
            return self.key
        if self.key_file is None:
            fail(
                "CREDENTIAL_MISSING",
                "no key: pass --key or --key-file, or set WORKSHOP_KEY or WORKSHOP_KEY_FILE",
                code=EXIT_USAGE,
            )
        try:
            return self.key_file.read_text().strip()
        except OSError as error:
            fail("INVALID_FIELD", f"cannot read {self.key_file}: {error.strerror}")

    def target(self, service: str = "coordinator") -> str:
        address = self.preview if service == "preview" else self.coordinator
        if not address:
            option, variable, what = ADDRESS_SETTINGS[service]
            fail(
                "INVALID_FIELD",
                f"no {service} address: set {variable} or pass {option} HOST:PORT ({what}; "
                "`make demo ARGS=--keep` prints the demo's)",
                code=EXIT_USAGE,
            )
        return address


def options(ctx: typer.Context) -> Options:
    found = ctx.find_object(Options)
    return found if found is not None else Options()


def fail(reason: str, message: str, *, code: int = EXIT_REFUSED) -> NoReturn:
    """Ends the command: `workshop: REASON: message` on stderr; REASON is the catalog's."""
    assert reason in REASONS, f"{reason} is not in the error catalog"
    print(f"workshop: {reason}: {message}", file=sys.stderr)
    raise typer.Exit(code)


def refused(error: grpc.aio.AioRpcError) -> NoReturn:
    """A refused call: its catalog reason, gRPC code, message and ErrorInfo metadata."""
    reason, message, metadata = refusal(error)
    extra = "".join(f"\n  {key}: {value}" for key, value in sorted(metadata.items()))
    # The server's reason is printed as it came: the catalog is the server's too.
    print(f"workshop: {reason}: {message} ({error.code().name}){extra}", file=sys.stderr)
    raise typer.Exit(EXIT_REFUSED)


def channel_tls() -> ClientTls | None:
    """TLS for the command's channels when WORKSHOP_TLS_CA_FILE is set (workshop.kit.tls)."""
    try:
        return client_tls_from_environ(os.environ)
    except OSError as error:
        fail("INVALID_FIELD", f"cannot read {error.filename}: {error.strerror}", code=EXIT_USAGE)


def run(
    opts: Options,
    call: Callable[[grpc.aio.Channel, Metadata], Awaitable[T]],
    *,
    service: str = "coordinator",
) -> T:
    """Runs `call` on a channel to the coordinator (or the preview service) with the key."""
    target, secret = opts.target(service), opts.secret()
    try:
        metadata = bearer_metadata(secret)
    except ValueError as error:
        fail("CREDENTIAL_MALFORMED", str(error), code=EXIT_USAGE)

    tls = channel_tls()

    async def go() -> T:
        async with open_channel(target, tls=tls) as channel:
            return await call(channel, metadata)

    try:
        return asyncio.run(go())
    except grpc.aio.AioRpcError as error:
        refused(error)
