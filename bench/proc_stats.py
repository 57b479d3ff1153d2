"""CPU and memory of processes, read from /proc (Linux): what the benchmarks measure with.

Reading /proc costs little and needs no agent in the measured processes; every figure is
what the kernel accounts: a live process's own CPU from its CPU-time clock (the
scheduler's nanoseconds, every thread's, ended ones included), what it reaped and the
user/system split in clock ticks (utime, stime, cutime, cstime), VmHWM / VmRSS in kB.

A process's own CPU in ticks is off by up to a tick (10 ms) at each reading; summed over a
family of eight Postgres processes that spread a 1,200-frame pass by about 0.01 ms a frame
(`bench.processor_throughput`), which its clock does not.

A process family's CPU (`family_cpu_s`, `CpuMeter`) counts each live member's own CPU and
what it has reaped (cutime + cstime): a Postgres backend that exits during a pass keeps
its CPU in the postmaster's reaped figure instead of vanishing from the sum.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Mapping
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MEMORY_POLL_S = 0.5


def _stat_fields(path: Path) -> list[str] | None:
    """The fields of a /proc stat file after the command name (fields[0] is field 3,
    the state: utime is field 14, stime 15, cutime 16, cstime 17); None when it is gone."""
    try:
        text = path.read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def process_clock_s(pid: int) -> float | None:
    """The CPU seconds of a process from its CPU-time clock, in the scheduler's nanoseconds:
    all its threads, ended ones included; None when it is gone. Linux lets any process read
    another's (what glibc's clock_getcpuclockid answers: the pid's complement shifted by 3,
    with CPUCLOCK_SCHED, 2, below it)."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        return None


def proc_times(pid: int) -> tuple[float, float, int] | None:
    """(own CPU s, reaped children's CPU s, parent pid) of a process; None when it is gone.
    Its own CPU is its clock's (`process_clock_s`); the reaped children's, which only /proc
    keeps, is in ticks."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    if fields is None:
        return None
    own = process_clock_s(pid)
    if own is None:  # ended between the two reads: its ticks are all there is
        own = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    reaped = (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
    return own, reaped, int(fields[1])


def user_system_s(pid: int) -> tuple[float, float]:
    """(user CPU s, system CPU s) of a process; zeros when it is gone."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    if fields is None:
        return 0.0, 0.0
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


def proc_stat(pid: int) -> tuple[float, int] | None:
    """(own CPU s, parent pid) from /proc; None when the process is gone."""
    times = proc_times(pid)
    return None if times is None else (times[0], times[2])


def parents_of_all() -> dict[int, int]:
    """pid -> parent pid of every live process (one pass over /proc)."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(Path(entry.path) / "stat")
            if fields is not None:
                parents[int(entry.name)] = int(fields[1])
    return parents


def children(root: int, parents: Mapping[int, int] | None = None) -> list[int]:
    """`root`'s descendants that are alive now."""
    parents = parents_of_all() if parents is None else parents
    family = {root}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in family and pid not in family:
                family.add(pid)
                grew = True
    return sorted(family - {root})


def family_cpu_s(root: int | None, parents: Mapping[int, int] | None = None) -> float:
    """CPU seconds of `root` and all its descendants, those that have exited included: each
    live member's own CPU plus its reaped children's (a reaped child's cutime carries its
    own reaped children in turn). A descendant reparented away from the family (its parent
    exited first) is lost from then on; 0.0 when `root` is None, 0 (not started) or gone."""
    if not root:
        return 0.0  # pid 0's "children" would be init and the kernel's threads
    total = 0.0
    for pid in (root, *children(root, parents)):
        times = proc_times(pid)
        if times is not None:
            total += times[0] + times[1]
    return total


def self_cpu_s() -> float:
    """CPU seconds of this process (its threads included, not its children)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """CPU seconds of named process families (`family_cpu_s`) and of this process, named
    `this_process` (None: left out): `mark()` before and after a pass, then `delta`. This
    process is counted alone, never as a family: the services it started are its children."""

    def __init__(
        self, roots: Mapping[str, int | None], *, this_process: str | None = "bench"
    ) -> None:
        self.roots = dict(roots)
        self.this_process = this_process

    def mark(self) -> dict[str, float]:
        parents = parents_of_all()  # one pass over /proc for every family
        marks = {name: family_cpu_s(root, parents) for name, root in self.roots.items()}
        if self.this_process is not None:
            marks[self.this_process] = self_cpu_s()
        return marks


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread of `pid`, by thread name ("main" for the event loop's), from
    each thread's schedstat: the scheduler's nanoseconds on a CPU, not the 10 ms ticks of
    its stat, so a thread that spends a few milliseconds a pass shows. Threads that ended
    are gone."""
    found: dict[str, float] = {}
    try:
        tasks = list(os.scandir(f"/proc/{pid}/task"))
    except OSError:
        return found
    for task in tasks:
        try:
            runtime_ns = int((Path(task.path) / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between the listing and the read
        name = "main" if task.name == str(pid) else comm(Path(task.path) / "comm")
        found[name] = found.get(name, 0.0) + runtime_ns / 1e9
    return found


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {name: seconds - before.get(name, 0.0) for name, seconds in after.items()}


def comm(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "?"


def status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def hwm_mb(pid: int) -> float:
    return status_kb(pid, "VmHWM") / 1024


class MemoryWatch:
    """Samples the processor's children and Triton's memory every MEMORY_POLL_S on a
    thread (one pass over /proc each: the sampling must not load the machine it measures)."""

    def __init__(self, processor: int, triton: int) -> None:
        self.processor = processor
        self.triton = triton
        self.triton_peak_mb = 0.0
        self._children_hwm: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(MEMORY_POLL_S):
            parents = parents_of_all()
            for child in children(self.processor, parents):
                self._children_hwm[child] = max(self._children_hwm.get(child, 0), hwm_mb(child))
            family = [self.triton, *children(self.triton, parents)]
            total = sum(status_kb(pid, "VmRSS") for pid in family) / 1024
            self.triton_peak_mb = max(self.triton_peak_mb, total)

    def processor_peak_mb(self) -> float:
        """The kernel's high-water mark of the processor, plus its children's (if any)."""
        return hwm_mb(self.processor) + sum(self._children_hwm.values())


def busy_cores_s() -> float:
    """CPU seconds the whole machine has been busy (all cores, from /proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS
