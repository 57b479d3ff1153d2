"""`workshop models evaluate`: on a processor (its EvaluationService, beside its Triton) or
here, through a Triton the operator can reach; both run `workshop.kit.evaluation_plan` and
print the same report (docs/bring-your-own-model.md#evaluating-a-version)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from rich.console import Console

from tools.cli.context import Options, channel_tls, fail, refused, run
from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.kit.cli import Metadata
from workshop.kit.errors import WorkshopError
from workshop.v1 import evaluation_pb2, evaluation_pb2_grpc


class _Status:
    """Items scored so far, on stderr while the pass runs (people only; never with -o json)."""

    def __init__(self, opts: Options) -> None:
        console = Console(stderr=True)
        self._status = console.status("evaluating: reading the bucket") if not opts.json else None

    def __enter__(self) -> _Status:
        if self._status is not None:
            self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)

    def update(self, items: int, seconds: float) -> None:
        if self._status is not None:
            rate = items / seconds if seconds > 0 else 0.0
            self._status.update(f"evaluating: {items} items scored ({rate:.0f} items/s)")


def evaluate_on(
    opts: Options, processor: str, ask: evaluation_pb2.EvaluateModelVersionRequest
) -> evaluation_pb2.EvaluationReport:
    """The processor at `processor` runs it (EvaluationService.EvaluateModelVersion)."""
    secret = opts.secret()

    async def call() -> evaluation_pb2.EvaluationReport | None:
        async with open_channel(processor, tls=channel_tls()) as channel:
            stub = evaluation_pb2_grpc.EvaluationServiceStub(channel)
            with _Status(opts) as status:
                async for event in stub.EvaluateModelVersion(ask, metadata=bearer_metadata(secret)):
                    if event.HasField("report"):
                        return event.report
                    status.update(event.progress.items, event.progress.seconds)
        return None

    try:
        report = asyncio.run(call())
    except grpc.aio.AioRpcError as error:
        refused(error)
    except ValueError as error:  # a malformed key
        fail("CREDENTIAL_MALFORMED", str(error))
    if report is None:
        fail("UNAVAILABLE", f"the processor at {processor} ended the evaluation without a report")
    return report


def evaluate_here(
    opts: Options,
    triton: str,
    ask: evaluation_pb2.EvaluateModelVersionRequest,
    repository: Path | None,
) -> evaluation_pb2.EvaluationReport:
    """This command runs the pass, through the Triton at `triton`, reading the coordinator
    and the preview service with its own key."""
    from workshop.kit.evaluation_plan import Services, evaluate, plan_of

    preview = opts.target("preview")

    async def call(coordinator: grpc.aio.Channel, md: Metadata) -> evaluation_pb2.EvaluationReport:
        async with open_channel(preview, tls=channel_tls()) as to_preview:
            with _Status(opts) as status:
                return await evaluate(
                    Services(coordinator, to_preview, md),
                    triton,
                    plan_of(ask),
                    repository=repository,
                    on_progress=lambda done: status.update(done.items, done.seconds),
                )

    try:
        return run(opts, call)
    except WorkshopError as error:
        fail(error.reason, error.message)
