"""Where a benchmark's control-plane CPU goes: pg_stat_statements and py-spy samples.

Both cost the measured processes little but not nothing (pg_stat_statements adds a few
microseconds a statement; py-spy reads the target's memory from its own process), so a
benchmark runs them only when asked (`--profile-control`) and its figures from such a run
are for the breakdown, not for the record.

- `enable_pg_stat_statements(cluster)` preloads the extension (a restart) with
  `track = all`, so statements inside the SQL functions are counted too ("nested");
  `statements_reset` / `statements_report` bracket the measured phase.
- `PySpy(pids, folder)` samples each process (raw collapsed stacks, `--nonblocking`)
  while its block runs; `report()` prints the functions with the most samples. py-spy is
  found next to the interpreter or on PATH, or under `$PY_SPY`; without it the block runs
  unprofiled and a line says so. `$PY_SPY_RATE` sets the samples a second (250);
  `$PY_SPY_NATIVE=1` adds the C frames (gRPC, uvloop, asyncpg), pausing the target for
  each sample, which costs it several times its own CPU; `$PY_SPY_GIL=1` keeps only
  samples that hold the GIL (a thread waiting in C is otherwise sometimes counted busy).
  The C code between Python frames is counted on the last Python frame, so per-function
  shares are approximate (`bench.cpu_steps` measures a service's calls exactly).
- `rpc_counts(port)` / `rpc_report(...)`: the calls a service answered, by method and
  code, from its `/metrics` (`workshop_rpc_requests_total`), before and after.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import TracebackType

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families

from tools.localstack.postgres import PostgresCluster

RATE_HZ = int(os.environ.get("PY_SPY_RATE", "250"))  # samples a second
TOP = 25


def say(line: str = "") -> None:
    print(line, flush=True)


def enable_pg_stat_statements(cluster: PostgresCluster) -> None:
    with (cluster.data_dir / "workshop.conf").open("a", encoding="utf-8") as conf:
        conf.write(
            "shared_preload_libraries = 'pg_stat_statements'\n"
            "pg_stat_statements.track = all\n"
            "pg_stat_statements.max = 2000\n"
        )
    cluster.restart()


async def statements_reset(dsn: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await connection.execute("SELECT pg_stat_statements_reset()")
    finally:
        await connection.close()


async def statements_report(dsn: str, per: int, unit: str, top: int = TOP) -> None:
    """The statements with the most execution time, per `unit` (`per` of them)."""
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(
            "SELECT toplevel, calls, total_exec_time, total_plan_time, query "
            "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database "
            "WHERE datname = current_database()) ORDER BY total_exec_time DESC LIMIT $1",
            top,
        )
        top_total = await connection.fetchval(
            "SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements "
            "WHERE toplevel AND dbid = (SELECT oid FROM pg_database "
            "WHERE datname = current_database())"
        )
    finally:
        await connection.close()
    say(
        f"pg_stat_statements: top-level statements {float(top_total):.0f} ms in all, "
        f"{float(top_total) / per:.3f} ms per {unit}"
    )
    say(
        f"  {'level':<6} {'calls':>7} {'per ' + unit:>9} {'total ms':>9} {'ms/call':>8} "
        f"{'ms/' + unit:>9}  statement"
    )
    for row in rows:
        text = " ".join(str(row["query"]).split())
        total = float(row["total_exec_time"])
        calls = int(row["calls"])
        say(
            f"  {'top' if row['toplevel'] else 'nested':<6} {calls:>7} {calls / per:>9.2f} "
            f"{total:>9.1f} {total / max(calls, 1):>8.3f} {total / per:>9.3f}  {text[:100]}"
        )


async def rpc_counts(port: int | None) -> Counter[str]:
    """Calls answered by a service so far, by method and code, from its /metrics
    (`workshop_rpc_requests_total`; a Session's messages count under Session/<call>)."""
    counts: Counter[str] = Counter()
    if port is None:
        return counts
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    for family in text_string_to_metric_families(text):
        if family.name != "workshop_rpc_requests":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            method = sample.labels.get("method", "").removeprefix("workshop.v1.")
            code = sample.labels.get("code", "")
            counts[f"{method} {code}" if code != "OK" else method] += int(sample.value)
    return counts


def rpc_report(name: str, before: Counter[str], after: Counter[str], per: int, unit: str) -> None:
    calls = after - before
    say(
        f"calls answered by the {name} (its /metrics), per {unit}: {sum(calls.values()) / per:.3f}"
        " in all (the scrape itself not counted)"
    )
    for method, count in calls.most_common():
        say(f"  {count / per:8.3f}  {count:>6}  {method}")


def py_spy_binary() -> str | None:
    return (
        os.environ.get("PY_SPY")
        or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        or shutil.which("py-spy")
    )


class PySpy:
    """Samples each named process with py-spy while the block runs."""

    def __init__(self, pids: dict[str, int], folder: Path) -> None:
        self.pids = pids
        self.folder = folder
        self.binary = py_spy_binary()
        self._spies: list[subprocess.Popen[bytes]] = []
        self._began = 0.0
        self.wall_s = 0.0

    def output(self, name: str) -> Path:
        return self.folder / f"py-spy-{name}.txt"

    def __enter__(self) -> PySpy:
        if self.binary is None:
            say("(py-spy not found: set PY_SPY or `pip install py-spy` for the Python profiles)")
            return self
        for name, pid in self.pids.items():
            self._spies.append(
                subprocess.Popen(
                    [
                        self.binary,
                        "record",
                        "--pid",
                        str(pid),
                        "--rate",
                        str(RATE_HZ),
                        "--format",
                        "raw",
                        "--nolineno",
                        *self._mode(),
                        "--output",
                        str(self.output(name)),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        time.sleep(0.5)  # attached before the measured work starts
        self._began = time.perf_counter()
        return self

    @staticmethod
    def _mode() -> list[str]:
        """`--nonblocking` (Python frames only), or with `$PY_SPY_NATIVE` set the C frames
        too (gRPC, uvloop, asyncpg's protocol): py-spy must pause the target to unwind
        those, so a native profile costs the target more."""
        mode = ["--native"] if os.environ.get("PY_SPY_NATIVE") else ["--nonblocking"]
        # `$PY_SPY_GIL`: only samples that hold the GIL (no idle thread miscounted as busy)
        return [*mode, "--gil"] if os.environ.get("PY_SPY_GIL") else mode

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.wall_s = time.perf_counter() - self._began
        for spy in self._spies:
            spy.send_signal(signal.SIGINT)
        for spy in self._spies:
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()

    def report(self, per: int, unit: str, top: int = TOP) -> None:
        for name in self.pids:
            _report(name, self.output(name), per, unit, top)


def stack_counts(path: Path) -> tuple[Counter[str], Counter[str], int]:
    """From py-spy's raw (collapsed) output: samples by the frame they ended in (own),
    samples by every frame on their stack (inclusive), and the samples in all."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    if not path.exists():
        return own, inclusive, total
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [
            _frame_name(frame)
            for frame in stack.split(";")
            if not frame.startswith(("process ", "thread "))
        ]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return own, inclusive, total


def _report(name: str, path: Path, per: int, unit: str, top: int) -> None:
    own, inclusive, total = stack_counts(path)
    if not total:
        return
    ms = 1000 / RATE_HZ
    say(
        f"py-spy of the {name}: {total} busy samples at {RATE_HZ} Hz, "
        f"{total * ms / per:.3f} ms of Python per {unit}"
    )
    say(f"  inclusive, ms per {unit} (top {top}, without frames on > 95 % of samples):")
    shown = 0
    for frame, count in inclusive.most_common():
        if count / total > 0.95:
            continue
        say(f"    {count * ms / per:7.3f}  {count / total:6.1%}  {frame}")
        shown += 1
        if shown == top:
            break
    say(f"  own, ms per {unit} (top {top}):")
    for frame, count in own.most_common(top):
        say(f"    {count * ms / per:7.3f}  {count / total:6.1%}  {frame}")


def _frame_name(frame: str) -> str:
    """'function (path/to/module.py)' with the path shortened to its last two parts."""
    function, _, where = frame.partition(" (")
    where = where.rstrip(")")
    parts = where.split("/")
    return f"{function} ({'/'.join(parts[-2:])})" if where else function
