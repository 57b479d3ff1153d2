"""EvaluationService: `workshop models evaluate --processor`, run beside this processor's
Triton (proto/workshop/v1/evaluation.proto; docs/bring-your-own-model.md).

The processor holds no credential for it: it asks the coordinator who the caller is (an
admin key, or nothing), then makes every read with the caller's own credential, so the
coordinator and the preview service decide what the caller may read. One evaluation at a
time per processor, so that its jobs keep their share of Triton.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from workshop.kit.cli import refusal
from workshop.kit.errors import (
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    WorkshopError,
)
from workshop.kit.evaluation import Progress
from workshop.kit.evaluation_plan import Services, evaluate, plan_of
from workshop.kit.server import GrpcService
from workshop.kit.status import REASONS
from workshop.v1 import common_pb2, evaluation_pb2, evaluation_pb2_grpc, identity_pb2
from workshop.v1 import identity_pb2_grpc as identity

PROGRESS_EVERY_SECONDS = 1.0
WHO_AM_I_TIMEOUT_SECONDS = 5.0


def evaluation_service(
    coordinator: grpc.aio.Channel, preview: grpc.aio.Channel, triton: str, repository: Path
) -> GrpcService:
    """The service as the processor's server hosts it (`python -m services.processor`)."""
    servicer = EvaluationServicer(coordinator, preview, triton, repository)
    return GrpcService(
        "workshop.v1.EvaluationService",
        lambda server: evaluation_pb2_grpc.add_EvaluationServiceServicer_to_server(
            servicer, server
        ),
    )


class EvaluationServicer(evaluation_pb2_grpc.EvaluationServiceServicer):
    def __init__(
        self,
        coordinator: grpc.aio.Channel,
        preview: grpc.aio.Channel,
        triton: str,
        repository: Path | None,
    ) -> None:
        self._coordinator = coordinator
        self._preview = preview
        self._triton = triton
        self._repository = repository
        self._busy = False

    async def EvaluateModelVersion(
        self,
        request: evaluation_pb2.EvaluateModelVersionRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[evaluation_pb2.EvaluateModelVersionResponse]:
        metadata = await self._admin(context)
        ask = plan_of(request)
        if self._busy:
            raise ResourceExhausted(
                "this processor is already evaluating a version; ask again when it is done, "
                "or ask another processor",
                reason="CAPACITY",
            )
        self._busy = True
        try:
            progress: asyncio.Queue[Progress] = asyncio.Queue()
            task = asyncio.create_task(
                evaluate(
                    Services(self._coordinator, self._preview, metadata),
                    self._triton,
                    ask,
                    repository=self._repository,
                    on_progress=progress.put_nowait,
                )
            )
            try:
                last_sent = time.monotonic()
                while not task.done():
                    waiting = asyncio.ensure_future(progress.get())
                    await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
                    if not waiting.done():
                        waiting.cancel()
                        continue
                    now = time.monotonic()
                    if now - last_sent >= PROGRESS_EVERY_SECONDS:
                        last_sent = now
                        done = waiting.result()
                        yield evaluation_pb2.EvaluateModelVersionResponse(
                            progress=evaluation_pb2.EvaluationProgress(
                                items=done.items, seconds=round(done.seconds, 3)
                            )
                        )
                report = await task
            except grpc.aio.AioRpcError as error:
                raise relayed(error) from None
            finally:
                task.cancel()
            yield evaluation_pb2.EvaluateModelVersionResponse(report=report)
        finally:
            self._busy = False

    async def _admin(self, context: grpc.aio.ServicerContext[Any, Any]) -> tuple[tuple[str, str]]:
        """The caller's credential, once the coordinator says it is an admin's."""
        credential = [
            (key, str(value))
            for key, value in context.invocation_metadata() or ()
            if key == "authorization"
        ]
        if not credential:
            raise Unauthenticated(
                "send an admin key as `authorization: Bearer <secret>`",
                reason="CREDENTIAL_MISSING",
            )
        try:
            who = await identity.IdentityServiceStub(self._coordinator).WhoAmI(
                identity_pb2.WhoAmIRequest(),
                metadata=credential,
                timeout=WHO_AM_I_TIMEOUT_SECONDS,
            )
        except grpc.aio.AioRpcError as error:
            raise relayed(error) from None
        if not any(held.scope == common_pb2.SCOPE_ADMIN for held in who.scopes):
            raise PermissionDenied(
                "evaluating a model version needs an admin key", reason="SCOPE_MISSING"
            )
        return (credential[0],)


def relayed(error: grpc.aio.AioRpcError) -> WorkshopError:
    """A refusal of the coordinator or the preview service, passed on to the caller as it
    came (reason, message, metadata); what has no reason of the catalog (a deadline, a
    broken connection) is UNAVAILABLE."""
    reason, message, metadata = refusal(error)
    if reason not in REASONS or reason in ("INTERNAL", "WORKSHOP_ERROR"):
        return Unavailable(f"a service this evaluation reads from failed: {message}")
    return WorkshopError(message, reason=reason, metadata=metadata)
