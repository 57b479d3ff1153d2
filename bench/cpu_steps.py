"""The coordinator's CPU by call kind, measured step by step inside its own process.

    python -m bench.cpu_steps services.coordinator   (environment as for the module)

Runs the module (`runpy`) with its call handlers and asyncpg's statement execution wrapped:
each step of such a coroutine (from one resumption to its next await) adds the event-loop
thread's CPU it took (`time.thread_time`) to its kind: a Session message by its call
(`session complete`, `session record_previews`, ...), the Session's request reading (its
requests' decoding and checks), the unary handlers a benchmark reaches, and each SQL
statement by the function or table it names (`sql previews_record_v1`). A kind's CPU holds
what its steps ran, the statements' encoding included; a statement's kind counts again
inside its handler's. What no such step runs (gRPC's and the loop's own C code between
them, other threads, the kernel) is the rest of the process's CPU.

py-spy's sampled attribution of the same CPU put about four times as much in asyncpg's
`_do_execute` as these steps measure (its samples of the loop's C code land on the last
Python frame), so `--profile-control` prints these totals beside it.

SIGUSR1 zeroes the totals; SIGUSR2 writes them to `$WORKSHOP_CPU_STEPS` (one line per kind:
CPU ms, steps' coroutines, kind), so a benchmark brackets the work it measures.
"""

from __future__ import annotations

import os
import re
import runpy
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Generator
from types import FrameType
from typing import Any

CPU_S: defaultdict[str, float] = defaultdict(float)
CALLS: Counter[str] = Counter()
_STATEMENT = re.compile(r"FROM\s+(\w+)|SELECT\s+(\w+)\(")


class _Measured:
    """Awaits `inner`, adding the thread CPU of each of its steps to `kind`."""

    def __init__(self, inner: Awaitable[Any], kind: str) -> None:
        self.inner = inner
        self.kind = kind

    def __await__(self) -> Generator[Any, Any, Any]:
        steps = self.inner.__await__()
        value: Any = None
        error: BaseException | None = None
        while True:
            began = time.thread_time()
            try:
                yielded = steps.throw(error) if error is not None else steps.send(value)
            except StopIteration as stop:
                CPU_S[self.kind] += time.thread_time() - began
                return stop.value
            except BaseException:
                CPU_S[self.kind] += time.thread_time() - began
                raise
            CPU_S[self.kind] += time.thread_time() - began
            error, value = None, None
            try:
                value = yield yielded
            except BaseException as raised:  # cancellation and throw() pass on to the step
                error = raised


def _wrap(owner: Any, name: str, kind: Callable[[tuple[Any, ...]], str]) -> Any:
    original = getattr(owner, name)

    async def measured(self: Any, *args: Any, **kwargs: Any) -> Any:
        label = kind(args)
        CALLS[label] += 1
        return await _Measured(original(self, *args, **kwargs), label)

    setattr(owner, name, measured)
    return measured


def _statement(args: tuple[Any, ...]) -> str:
    found = _STATEMENT.search(str(args[0]))
    return "sql " + (found.group(1) or found.group(2) if found else str(args[0]).split()[0])


def _named(label: str) -> Callable[[tuple[Any, ...]], str]:
    return lambda args: label


def install() -> None:
    """Wraps the coordinator's handlers and asyncpg's statements (import order: before
    the coordinator builds its servicers)."""
    import asyncpg.connection

    from services.coordinator.servicers import jobs, publication, workshop

    _wrap(asyncpg.connection.Connection, "_do_execute", _statement)
    _wrap(jobs._Session, "_call", lambda args: f"session {args[1]}")
    _wrap(jobs._Session, "_read", _named("session request reading (decoding, checks)"))
    for name in ("CheckLease", "StageObject", "RecordPreviews"):
        _wrap(publication.PublicationServicer, name, _named(f"unary {name}"))
    for name in ("CreateRun", "GetRun"):
        _wrap(workshop.WorkshopServicer, name, _named(f"unary {name}"))
    for name in ("Claim", "Heartbeat", "ReportProgress", "Complete"):
        _wrap(jobs.JobServicer, name, _named(f"unary {name}"))


def _reset(signum: int, frame: FrameType | None) -> None:
    CPU_S.clear()
    CALLS.clear()


def _write(signum: int, frame: FrameType | None) -> None:
    path = os.environ["WORKSHOP_CPU_STEPS"]
    lines = [
        f"{seconds * 1000:.3f} {CALLS[kind]} {kind}\n"
        for kind, seconds in sorted(CPU_S.items(), key=lambda item: -item[1])
    ]
    with open(f"{path}.part", "w", encoding="utf-8") as out:
        out.writelines(lines)
    os.replace(f"{path}.part", path)


def main() -> None:
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    install()
    signal.signal(signal.SIGUSR1, _reset)
    signal.signal(signal.SIGUSR2, _write)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
