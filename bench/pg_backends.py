"""Postgres' CPU in a measured window, by process: whose backend spent it.

A benchmark's Postgres figure is the whole cluster (the postmaster and every process under
it), so a statement's time in pg_stat_statements does not say all of it: the background
writers, autovacuum, the backends' own work between statements (parsing a message,
waking up) and the clients that are not the system's (a benchmark's own polling) all land
in the same figure. `BackendCpu` reads every cluster process's CPU from /proc before and
after the window, and names each one:

- a client backend by its `application_name` (the coordinator names its connections
  `workshop-coordinator schema=NNNN`; the benchmark's own connections have none or their
  own), read from pg_stat_activity outside the window;
- any other process by its `backend_type` (walwriter, checkpointer, autovacuum worker...),
  or, for one that started and exited inside the window, by the title it showed in /proc
  (`postgres: autovacuum worker`), which a thread of this process samples every
  `SAMPLE_S` (reading /proc costs Postgres nothing).

A process that exited inside the window is counted from its last sample (its CPU after
that sample is in the postmaster's reaped total, printed apart as what no sample saw).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from bench.proc_stats import proc_times

EXIT_WAIT_S = 0.3
SAMPLE_S = 0.02  # an autovacuum worker on a small table lives a few tens of ms
OWN_NAME = "bench pg_backends"  # this module's connection, opened outside the window


@dataclass
class _Seen:
    title: str
    first_s: float  # CPU when first seen (0 for a process born inside the window)
    last_s: float


@dataclass
class BackendCpu:
    """`await start()` before the window, `stop()` at its end, `await name_newcomers()`,
    then `report()`."""

    dsn: str
    postmaster: int
    clients: Mapping[str, int]  # name -> pid of each process that connects to Postgres
    seen: dict[int, _Seen] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)
    reaped_s: float = 0.0
    maintenance: dict[str, tuple[int, int]] = field(default_factory=dict)
    postmaster_s: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    async def start(self) -> None:
        self.labels = await _labels(self.dsn, self.clients)
        self.maintenance = await _maintenance(self.dsn)
        # Their backends (and the caller's, e.g. a pg_stat_statements reset) exit after the
        # connections close: let them go before the marks, or their whole lives would land
        # in the window's reaped CPU.
        await asyncio.sleep(EXIT_WAIT_S)
        self._sample(born_inside=False)
        times = proc_times(self.postmaster)
        self.reaped_s = times[1] if times else 0.0
        self.postmaster_s = times[0] if times else 0.0
        self._thread = threading.Thread(target=self._loop, name="pg-backends", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """At the window's end (no query: the names of processes born inside come from
        `name_newcomers()` afterwards)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample(born_inside=True)
        times = proc_times(self.postmaster)
        if times:
            self.reaped_s, self.postmaster_s = (
                times[1] - self.reaped_s,
                times[0] - self.postmaster_s,
            )

    async def name_newcomers(self) -> None:
        """After the window: names the processes born inside it that still live, and the
        tables autovacuum visited meanwhile."""
        for pid, label in (await _labels(self.dsn, self.clients)).items():
            self.labels.setdefault(pid, label)
        after = await _maintenance(self.dsn)
        before = self.maintenance
        self.maintenance = {
            table: (vacuums - before.get(table, (0, 0))[0], analyzes - before.get(table, (0, 0))[1])
            for table, (vacuums, analyzes) in after.items()
        }

    def by_label(self) -> dict[str, tuple[int, float]]:
        """label -> (processes, CPU s in the window)."""
        totals: dict[str, tuple[int, float]] = {}
        for pid, seen in self.seen.items():
            spent = seen.last_s - seen.first_s
            if spent > 0:
                label = self.labels.get(pid) or seen.title
                count, seconds = totals.get(label, (0, 0.0))
                totals[label] = (count + 1, seconds + spent)
        # what exited between its last sample and the end: the postmaster reaped each
        # exited process's whole life, of which its samples saw up to last_s
        sampled_exited = sum(seen.last_s for pid, seen in self.seen.items() if not _alive(pid))
        if self.reaped_s - sampled_exited > 0:
            totals["exited, after its last sample"] = (0, self.reaped_s - sampled_exited)
        if self.postmaster_s > 0:
            totals["postmaster"] = (1, self.postmaster_s)
        return totals

    def report(self, per: int, unit: str, say: Callable[[str], None]) -> None:
        rows = sorted(self.by_label().items(), key=lambda item: -item[1][1])
        total = sum(seconds for _, (_, seconds) in rows)
        say(
            f"postgres CPU by process (/proc, the window only): {total * 1000 / per:.3f} ms per "
            f"{unit} in all"
        )
        say(f"  {'ms/' + unit:>9} {'ms':>8} {'procs':>5}  process")
        for label, (count, seconds) in rows:
            say(f"  {seconds * 1000 / per:>9.4f} {seconds * 1000:>8.0f} {count:>5}  {label}")
        visited = {table: counts for table, counts in self.maintenance.items() if any(counts)}
        say(
            "autovacuum in the window (pg_stat_user_tables: vacuums, analyzes): "
            + (", ".join(f"{t} {v}/{a}" for t, (v, a) in sorted(visited.items())) or "none")
        )

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample(born_inside=True)

    def _sample(self, *, born_inside: bool) -> None:
        for pid in _children(self.postmaster):
            times = proc_times(pid)
            if times is None:
                continue
            seen = self.seen.get(pid)
            if seen is None:
                first = 0.0 if born_inside else times[0]
                self.seen[pid] = _Seen(_title(pid), first, times[0])
            else:
                seen.last_s = times[0]


async def _labels(dsn: str, clients: Mapping[str, int]) -> dict[int, str]:
    rows = await _fetch(
        dsn, "SELECT pid, backend_type, application_name, client_port FROM pg_stat_activity"
    )
    owners = _port_owners(clients)
    labels = {}
    for row in rows:
        if row["backend_type"] != "client backend":
            labels[int(row["pid"])] = str(row["backend_type"])
            continue
        owner = owners.get(row["client_port"] or -1, "another process")
        name = row["application_name"] or "no application_name"
        labels[int(row["pid"])] = f"client backend of the {owner} ({name})"
    return labels


async def _fetch(dsn: str, query: str) -> list[asyncpg.Record]:
    """`query`'s rows on a connection of its own, outside the window."""
    connection = await asyncpg.connect(dsn, server_settings={"application_name": OWN_NAME})
    try:
        return list(await connection.fetch(query))
    finally:
        await connection.close()


async def _maintenance(dsn: str) -> dict[str, tuple[int, int]]:
    """table -> (autovacuum runs, autoanalyze runs) so far."""
    rows = await _fetch(
        dsn, "SELECT relname, autovacuum_count, autoanalyze_count FROM pg_stat_user_tables"
    )
    return {
        str(row["relname"]): (int(row["autovacuum_count"]), int(row["autoanalyze_count"]))
        for row in rows
    }


def _port_owners(clients: Mapping[str, int]) -> dict[int, str]:
    """Local TCP port -> the name of the process (of `clients`) whose socket it is: the
    coordinator and a benchmark connect with the same application_name, so a backend's
    client is told by its socket (/proc/net/tcp's inode, found in the process's fds)."""
    inode_port: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            inode_port[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    owners = {}
    for name, pid in clients.items():
        try:
            fds = list(os.scandir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("socket:["):
                port = inode_port.get(target[8:-1])
                if port is not None:
                    owners[port] = name
    return owners


def _title(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    title = raw.replace(b"\0", b" ").decode(errors="replace").strip().removeprefix("postgres: ")
    # a client backend's title is "user database host(port) state": it is named by
    # pg_stat_activity when it lives past the window; one that did not is just a client
    return "client backend, gone by the end" if "(" in title else title


def _children(pid: int) -> list[int]:
    """The postmaster's children, from the kernel's list (one file: cheap enough to read
    every SAMPLE_S, where a scan of /proc is not)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()
