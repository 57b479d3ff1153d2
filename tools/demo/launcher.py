"""Starts the parts of a local stack, slow ones on worker threads so their starts overlap, and
stops everything it started, newest first, when its block ends: after success, a failure or
Ctrl-C alike."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from tools.demo.terminal import Console
from tools.localstack.processes import ServiceProcess, run_module

T = TypeVar("T")
READY_TIMEOUT_S = 120.0
# Each runs `python -m <service>` and gets these on top of what the caller gives it.
SERVICE_DEFAULTS = {"HOST": "127.0.0.1", "PORT": "0", "DRAIN_SECONDS": "0", "GRACE_SECONDS": "5"}


class Launcher:
    def __init__(self, console: Console, logs: Path, base_env: Mapping[str, str]) -> None:
        self._console = console
        self._logs = logs
        self._base_env = base_env
        self._stack = ExitStack()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="demo-start")
        self._pending: list[Future[Any]] = []

    def __enter__(self) -> Launcher:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        stopping = self._console.stage("stopping everything the demo started", "stopped")
        with stopping, _uninterruptible():
            # A start in progress cannot be cancelled: let it finish (or fail) so that what
            # it started is on the stack before the stack unwinds.
            wait(self._pending)
            self._pool.shutdown()
            return bool(self._stack.__exit__(kind, error, traceback))

    def background(
        self,
        label: str,
        start: Callable[[], AbstractContextManager[T]],
        describe: Callable[[T], str],
    ) -> Future[T]:
        """Enter `start()` on a worker thread; prints `label ready in N s (describe)`."""

        def enter() -> T:
            began = time.perf_counter()
            manager = start()
            value = manager.__enter__()
            with self._lock:
                self._stack.push(manager.__exit__)
            elapsed = time.perf_counter() - began
            self._console.line(f"  {label} ready in {elapsed:.1f} s ({describe(value)})")
            return value

        future = self._pool.submit(enter)
        self._pending.append(future)
        return future

    def service(
        self, label: str, module: str, env: Mapping[str, str], args: Sequence[str] = ()
    ) -> Service:
        """Start `python -m <module>` without waiting for it; it is stopped on exit."""
        prefix = module.rsplit(".", 1)[-1].upper()
        defaults = {f"{prefix}_{key}": value for key, value in SERVICE_DEFAULTS.items()}
        began = time.perf_counter()
        process = ServiceProcess(
            module,
            {**defaults, **env},
            self._logs / f"{label}.log",
            args=args,
            base_env=self._base_env,
        )
        with self._lock:
            self._stack.callback(process.stop)
        return Service(label, process, began, self._console)

    def command(self, label: str, module: str, args: Sequence[str], env: Mapping[str, str]) -> str:
        """Run `python -m <module> <args>` to completion (stderr to the logs); its stdout."""
        return run_module(module, args, env, self._logs / f"{label}.log", base_env=self._base_env)


class Service:
    """A service process that was started; `wait()` returns once it serves, `wait_http()`
    once it announces its HTTP port (the gateway does, before it serves)."""

    def __init__(self, label: str, process: ServiceProcess, began: float, console: Console) -> None:
        self.label = label
        self.process = process
        self._began = began
        self._console = console
        self.target = ""
        self.http = ""
        self.metrics = ""  # its Prometheus endpoint, once it serves (when it has its own)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self) -> str:
        """host:port once the service announces it serves; prints its ready line."""
        if not self.target:
            serving = self.process.wait_event("serving", timeout=READY_TIMEOUT_S)
            self.target = f"127.0.0.1:{serving['port']}"
            if serving.get("metrics_port"):
                self.metrics = f"http://127.0.0.1:{serving['metrics_port']}/metrics"
            elapsed = time.perf_counter() - self._began
            http = f", HTTP {self.http}" if self.http else ""
            self._console.line(
                f"  {self.label} serving in {elapsed:.1f} s (pid {self.pid}, {self.target}{http})"
            )
        return self.target

    def wait_http(self) -> str:
        """http://host:port once the service announces its HTTP server (`{"event": "http"}`).
        Events announced meanwhile stay readable: `wait()` after this still finds `serving`."""
        if not self.http:
            announced = self.process.wait_event("http", timeout=READY_TIMEOUT_S)
            self.http = f"http://{announced['host']}:{announced['port']}"
        return self.http


@contextmanager
def _uninterruptible() -> Iterator[None]:
    """Ctrl-C and SIGTERM are ignored while the stack stops, so that a second one cannot cut
    the stop short and leave processes behind (every stop is bounded by a SIGKILL)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        sig: signal.signal(sig, signal.SIG_IGN)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
