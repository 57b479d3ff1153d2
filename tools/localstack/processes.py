"""Start Workshop services as real processes and stop exactly the ones started.

A service announces itself with JSON lines on stdout (see `workshop.kit.server.announce`);
`ServiceProcess` reads them on a thread so the pipe never fills, and exposes the announced
ports. `run_module` runs a one-shot command (`python -m services.coordinator migrate`) and
returns what it printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tools.localstack import orphan_guard
from tools.localstack.host import tail


class ServiceProcess:
    """One running service: `python -m <module> [args]` with the given environment.

    It runs in its own session, so a Ctrl-C at the terminal reaches only whoever started
    it, which then stops it in order.
    """

    def __init__(
        self,
        module: str,
        env: Mapping[str, str],
        log_path: Path,
        *,
        args: Sequence[str] = (),
        cwd: Path | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        """`env` is added to `base_env` (default: this process's environment)."""
        self.module = module
        self.log_path = log_path
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=cwd,
            env={**(os.environ if base_env is None else base_env), **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
        )
        orphan_guard.watch(self.process.pid)
        assert self.process.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            with contextlib.suppress(ValueError):
                self.events.put(json.loads(line))
        self.events.put({"event": "eof"})

    def wait_event(self, event: str, timeout: float = 30.0) -> dict[str, Any]:
        """The first announced event named `event`; fails with the log tail otherwise."""
        for item in self.seen:
            if item.get("event") == event:
                return item
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.module}: no {event!r} in {timeout}s\n{self.log_tail()}")
            try:
                item = self.events.get(timeout=remaining)
            except queue.Empty:
                continue
            self.seen.append(item)
            if item.get("event") == event:
                return item
            if item.get("event") == "eof":
                code = self.process.wait(timeout=5)
                raise RuntimeError(
                    f"{self.module} exited ({code}) before {event!r}\n{self.log_tail()}"
                )

    def log_tail(self, lines: int = 40) -> str:
        if not self._log.closed:
            self._log.flush()
        return tail(self.log_path, lines)

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then SIGKILL to the process group if it does not exit in time."""
        self.terminate()
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            code = self.process.wait(timeout=10)
        self._reader.join(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()
        return code


@contextlib.contextmanager
def running_service(
    module: str,
    env: Mapping[str, str],
    log_path: Path,
    *,
    ready_timeout: float = 60.0,
    cwd: Path | None = None,
    args: Sequence[str] = (),
) -> Iterator[tuple[ServiceProcess, dict[str, Any]]]:
    """Start `module` (with `args`), wait for its `serving` announcement, and always stop
    it."""
    service = ServiceProcess(module, env, log_path, cwd=cwd, args=args)
    try:
        serving = service.wait_event("serving", timeout=ready_timeout)
        yield service, serving
    finally:
        service.stop()


class CommandFailed(RuntimeError):
    """A one-shot command exited with a non-zero status."""


def run_module(
    module: str,
    args: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    *,
    timeout: float = 120.0,
    base_env: Mapping[str, str] | None = None,
) -> str:
    """Run `python -m <module> <args>` to completion; returns its stdout.

    stderr goes to `log_path`; a non-zero exit raises CommandFailed with its tail.
    """
    with log_path.open("ab") as log:
        finished = subprocess.run(
            [sys.executable, "-m", module, *args],
            env={**(os.environ if base_env is None else base_env), **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            timeout=timeout,
            check=False,
        )
    if finished.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise CommandFailed(
            f"python -m {module} {' '.join(args)} exited {finished.returncode}\n{tail}"
        )
    return finished.stdout.decode()


def announcements(output: str) -> list[dict[str, Any]]:
    """The JSON objects a command printed one per line (`workshop.kit.server.announce`)."""
    found = []
    for line in output.splitlines():
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                found.append(value)
    return found
