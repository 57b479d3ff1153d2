"""Shared pieces of the operator command lines: where the coordinator is, which key, errors.

Operator commands take the coordinator's address and an admin key from flags or from the
environment (`WORKSHOP_COORDINATOR`, `WORKSHOP_KEY`), so a key need not appear in a shell's
history or a process list. A refused call prints its catalog reason, message and gRPC status
and exits 1. The `workshop` command line (tools/cli) shares `refusal` and the variables.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.kit.tls import client_tls_from_environ

COORDINATOR_ENV = "WORKSHOP_COORDINATOR"
KEY_ENV = "WORKSHOP_KEY"

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]


def add_coordinator_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """`--coordinator HOST:PORT` and `--key KEY`, defaulting to the environment."""
    need = " (required)" if required else ""
    parser.add_argument(
        "--coordinator",
        default=os.environ.get(COORDINATOR_ENV, ""),
        help=f"coordinator gRPC address HOST:PORT; default ${COORDINATOR_ENV}{need}",
    )
    parser.add_argument(
        "--key",
        default=os.environ.get(KEY_ENV, ""),
        help=f"admin key; default ${KEY_ENV}{need}",
    )


def check_coordinator_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit 2 with a usage message when only one of address and key is known."""
    if bool(args.coordinator) != bool(args.key):
        parser.error(f"--coordinator and --key (or ${COORDINATOR_ENV} and ${KEY_ENV}) go together")


def refusal(error: grpc.aio.AioRpcError) -> tuple[str, str, dict[str, str]]:
    """A refused call as its catalog reason (the ErrorInfo reason, else the status code's
    name), its message and the ErrorInfo metadata."""
    info = error_details_pb2.ErrorInfo()
    status = rpc_status.from_call(error)
    if status is not None and status.details:
        status.details[0].Unpack(info)
    return info.reason or error.code().name, error.details() or "", dict(info.metadata)


def call_coordinator(
    target: str, key: str, call: Callable[[grpc.aio.Channel, Metadata], Awaitable[T]]
) -> T:
    """Run `call` on a channel to the coordinator (TLS when WORKSHOP_TLS_CA_FILE is set,
    workshop.kit.tls); a refusal exits 1 with its status."""
    try:
        tls = client_tls_from_environ(os.environ)
    except OSError as error:
        print(f"cannot read {error.filename}: {error.strerror}", file=sys.stderr)
        raise SystemExit(2) from None

    async def run() -> T:
        async with open_channel(target, tls=tls) as channel:
            return await call(channel, bearer_metadata(key))

    try:
        return asyncio.run(run())
    except grpc.aio.AioRpcError as error:
        reason, message, _ = refusal(error)
        print(f"coordinator refused: {reason}: {message} ({error.code().name})", file=sys.stderr)
        raise SystemExit(1) from None
