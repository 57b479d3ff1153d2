"""Group commit of preview records.

Each publish ends with a fenced record in the coordinator. Concurrent publishes of one
processor (the same credential: the coordinator checks fence 4 against it) share one
RecordPreviews call, which the coordinator runs as one statement: while a call is in
flight, records queue; when it returns, everything queued goes in the next call. One
publish alone is sent at once, so this adds no wait; under load a call carries as many
records as arrived during the previous one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence

from services.preview.coordinator import CoordinatorClient, CoordinatorUnavailable
from workshop.kit.errors import WorkshopError
from workshop.v1 import publication_pb2 as pub

log = logging.getLogger(__name__)

MAX_BATCH = 256  # what one RecordPreviews call takes

Waiting = tuple[pub.RecordPreviewRequest, "asyncio.Future[pub.RecordPreviewResponse]"]


@dataclasses.dataclass
class _Queue:
    waiting: list[Waiting] = dataclasses.field(default_factory=list)
    sender: asyncio.Task[None] | None = None


class PreviewRecorder:
    def __init__(self, coordinator: CoordinatorClient, *, max_batch: int = MAX_BATCH) -> None:
        self._coordinator = coordinator
        self._max_batch = max_batch
        self._queues: dict[str, _Queue] = {}

    async def record(
        self, processor: str, request: pub.RecordPreviewRequest
    ) -> pub.RecordPreviewResponse:
        """Records one preview for `processor`; raises the coordinator's refusal."""
        answer: asyncio.Future[pub.RecordPreviewResponse] = (
            asyncio.get_running_loop().create_future()
        )
        queue = self._queues.setdefault(processor, _Queue())
        queue.waiting.append((request, answer))
        if queue.sender is None:
            queue.sender = asyncio.create_task(self._send(processor, queue))
        return await answer

    async def record_many(
        self, processor: str, requests: Sequence[pub.RecordPreviewRequest]
    ) -> list[pub.RecordPreviewResponse | WorkshopError]:
        """Records several previews of `processor` (in order, in as few calls as the batch
        size allows); a refusal is answered in its place, any other failure raised."""
        loop = asyncio.get_running_loop()
        answers: list[asyncio.Future[pub.RecordPreviewResponse]] = []
        queue = self._queues.setdefault(processor, _Queue())
        for request in requests:
            answer: asyncio.Future[pub.RecordPreviewResponse] = loop.create_future()
            queue.waiting.append((request, answer))
            answers.append(answer)
        if queue.sender is None:
            queue.sender = asyncio.create_task(self._send(processor, queue))
        outcomes = await asyncio.gather(*answers, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, WorkshopError):
                raise outcome
        return [
            outcome
            for outcome in outcomes
            if isinstance(outcome, pub.RecordPreviewResponse | WorkshopError)
        ]

    async def _send(self, processor: str, queue: _Queue) -> None:
        try:
            while queue.waiting:
                batch = queue.waiting[: self._max_batch]
                del queue.waiting[: self._max_batch]
                await self._send_batch(processor, batch)
        finally:
            queue.sender = None
            if not queue.waiting:
                self._queues.pop(processor, None)

    async def _send_batch(self, processor: str, batch: list[Waiting]) -> None:
        outcomes: Sequence[pub.RecordPreviewResponse | BaseException]
        try:
            outcomes = await self._coordinator.record_previews(
                [request for request, _ in batch], processor
            )
            if len(outcomes) != len(batch):
                raise CoordinatorUnavailable(
                    f"The coordinator answered {len(outcomes)} outcomes for {len(batch)} previews."
                )
        except WorkshopError as error:
            outcomes = [error] * len(batch)
        except Exception as error:  # a bug: fail these publishes, keep the queue going
            log.exception("recording %d previews failed", len(batch))
            outcomes = [error] * len(batch)
        for (_, answer), outcome in zip(batch, outcomes, strict=True):
            if answer.done():  # its publish was cancelled
                continue
            if isinstance(outcome, BaseException):
                answer.set_exception(outcome)
            else:
                answer.set_result(outcome)
