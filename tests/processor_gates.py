"""Gates and logs for processor tests: a wrapper around a processor's real stubs that logs
every call with its outcome and can hold one until the test opens a gate, a hold of the
records of written previews wherever they arrive, and polling helpers with a bound."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from services.coordinator.servicers import jobs as coordinator_jobs
from testbed.coordinator_world import error_reason
from testbed.harness.coordinator import CoordinatorHarness

WAIT = 60.0  # seconds any single awaited step may take before the test fails


@dataclasses.dataclass(frozen=True)
class Call:
    method: str
    job: str  # run/job
    slot: int | None  # previews and uploads
    outcome: str  # "ok", the refusal's ErrorInfo reason, or "cancelled" (never sent)


class Spy:
    """A processor's real stub, each call logged with its outcome; a call that `hold`
    matches waits for `gate` before it is sent."""

    def __init__(
        self, stub: Any, log: list[Call], hold: Callable[[str, Any], bool] | None = None
    ) -> None:
        self._stub = stub
        self.log = log
        self.hold = hold or (lambda _method, _request: False)
        self.held = asyncio.Event()
        self.gate = asyncio.Event()
        self.waiting = 0  # calls held at the gate now

    def __getattr__(self, method: str) -> Callable[..., Any]:
        send = getattr(self._stub, method)

        if method == "Claim":  # no lease yet: nothing to log or hold
            return send  # type: ignore[no-any-return]

        async def call(request: Any, **kwargs: Any) -> Any:
            # A batch of records (RecordWrittenPreviews) is logged as one call per preview.
            batch = list(request.previews) if hasattr(request, "previews") else [request]

            def logged(outcome: str, outcomes: list[str] | None = None) -> None:
                for position, each in enumerate(batch):
                    lease = each.lease
                    slot = each.slot_index if hasattr(each, "slot_index") else None
                    said = outcomes[position] if outcomes else outcome
                    self.log.append(Call(method, f"{lease.run_id}/{lease.job_id}", slot, said))

            if self.hold(method, request):
                self.held.set()
                self.waiting += 1
                try:
                    await self.gate.wait()
                except asyncio.CancelledError:
                    logged("cancelled")
                    raise
                finally:
                    self.waiting -= 1
            try:
                reply = await send(request, **kwargs)
            except grpc.aio.AioRpcError as error:
                logged(error_reason(error)[1] or error.code().name)
                raise
            if method == "Heartbeat" and request.leases:
                # a batched heartbeat: each lease's own outcome, as a single one would log it
                for renewal in reply.renewals:
                    ref = renewal.lease
                    outcome = "ok" if renewal.renewed else renewal.reason
                    self.log.append(Call(method, f"{ref.run_id}/{ref.job_id}", None, outcome))
                return reply
            if hasattr(reply, "outcomes") and len(reply.outcomes) == len(batch):
                logged(
                    "ok",
                    [o.refused.reason if o.HasField("refused") else "ok" for o in reply.outcomes],
                )
            else:
                logged("ok")
            return reply

        return call


class HeldRecords:
    """Holds every batch of records of written previews that `holds(previews)` matches
    until `gate` opens, wherever the batch arrives: as a record_previews on a Session of
    this process's coordinators (a processor's default) or at `preview`'s
    RecordWrittenPreviews (a processor whose calls go unary). `jobs` collects the (run,
    job id) of the held records."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        holds: Callable[[list[Any]], bool],
        preview: Any = None,  # a PreviewHarness
    ) -> None:
        self.holds = holds
        self.held = asyncio.Event()
        self.gate = asyncio.Event()
        self.jobs: set[tuple[str, str]] = set()
        kind, answer = coordinator_jobs.SESSION_CALLS["record_previews"]

        async def on_session(servicer: Any, caller: Any, request: Any) -> Any:
            await self.hold(list(request.previews))
            return await answer(servicer, caller, request)

        monkeypatch.setitem(coordinator_jobs.SESSION_CALLS, "record_previews", (kind, on_session))
        if preview is not None:
            grants = preview.app.api.grants
            record = grants.record

            async def at_preview(processor: str, request: Any) -> Any:
                await self.hold(list(request.previews))
                return await record(processor, request)

            monkeypatch.setattr(grants, "record", at_preview)

    async def hold(self, previews: list[Any]) -> None:
        if self.holds(previews):
            self.jobs.update((p.lease.run_id, p.lease.job_id) for p in previews)
            self.held.set()
            await self.gate.wait()


async def within(awaitable: Any, what: str) -> Any:
    try:
        return await asyncio.wait_for(awaitable, WAIT)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def until(check: Callable[[], Any], what: str) -> None:
    """Polls `check` (sync or async) until it is true."""

    async def poll() -> None:
        while True:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return
            await asyncio.sleep(0.05)

    await within(poll(), what)


async def rows(c: CoordinatorHarness, query: str, *args: Any) -> list[dict[str, Any]]:
    async with c.db.connection() as connection:
        return [dict(row) for row in await connection.fetch(query, *args)]
