"""The real `tritonserver` that nvidia-pytriton bundles, on loopback ports, explicit model control.

Launch recipe: the server binary runs from the installed
package, while `backends/` and `caches/` are copied into a work directory so that the python
backend stub for this interpreter's minor version can sit next to `libtriton_python.so`.
The copies lose their `$ORIGIN` RPATH to `nvidia_pytriton.libs`, hence `LD_LIBRARY_PATH`.
The stub embeds Python: it needs a shared libpython of this minor version (the running
interpreter's own one comes first) and finds the venv through `python3` on `PATH`.

`running_triton(work_dir)` starts one and stops it (SIGTERM, then SIGKILL to its process
group, which holds its python stubs) on exit. Models are published into its repository with
`tools.model_repository.repository.publish_version` and loaded by name.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.util
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tools.localstack import orphan_guard
from tools.localstack.host import free_ports

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0
LAUNCH_ATTEMPTS = 3
LOG_HEAD_LINES = 10
LOG_TAIL_LINES = 50
# The python backend starts each stub with this much shared memory and grows it on demand.
STUB_SHM_BYTES = 16 * 1024 * 1024

_SERVER_OPTIONS = (
    "--model-control-mode=explicit",
    "--http-address=127.0.0.1",
    "--grpc-address=127.0.0.1",
    "--metrics-address=127.0.0.1",
    "--allow-gpu-metrics=false",
    # Local models run on CPU; pinned host memory only helps GPU transfers.
    "--pinned-memory-pool-byte-size=0",
    f"--exit-timeout-secs={int(STOP_GRACE_S)}",
    f"--backend-config=python,shm-default-byte-size={STUB_SHM_BYTES}",
    f"--backend-config=python,shm-growth-byte-size={STUB_SHM_BYTES}",
)


class TritonStartError(RuntimeError):
    """The bundled server could not be prepared or did not become ready."""


class TritonUnavailable(TritonStartError):
    """nvidia-pytriton is not installed, so there is no server to start."""


@dataclass(frozen=True)
class TritonServer:
    """A running server; models are loaded explicitly by name from `model_repository`."""

    grpc_url: str
    http_url: str
    model_repository: Path
    log_path: Path
    pid: int
    metrics_url: str = ""  # Prometheus GET /metrics


@dataclass(frozen=True)
class _Distribution:
    """Where nvidia-pytriton keeps the server, its libraries and the python stubs."""

    server_dir: Path
    libs_dir: Path

    @property
    def binary(self) -> Path:
        return self.server_dir / "bin" / "tritonserver"

    @property
    def stub(self) -> Path:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        return self.server_dir / "python_backend_stubs" / version / "triton_python_backend_stub"


def _find_distribution() -> _Distribution | None:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        return None
    package_dir = Path(spec.origin).parent
    dist = _Distribution(
        server_dir=package_dir / "tritonserver",
        libs_dir=package_dir.parent / "nvidia_pytriton.libs",
    )
    for required in (dist.binary, dist.stub, dist.libs_dir, dist.server_dir / "backends"):
        if not required.exists():
            raise TritonStartError(f"nvidia-pytriton is installed but {required} is missing")
    return dist


def _require_distribution() -> _Distribution:
    dist = _find_distribution()
    if dist is None:
        raise TritonUnavailable("nvidia-pytriton is not installed (pip install -e '.[triton]')")
    return dist


def _prepare_backends(dist: _Distribution, work_dir: Path) -> None:
    """Copies, so the stub can join the python backend without touching site-packages."""
    backends = work_dir / "backends"
    shutil.copytree(dist.server_dir / "backends", backends, ignore=_ignore_pycache)
    shutil.copytree(dist.server_dir / "caches", work_dir / "caches")
    shutil.copy2(dist.stub, backends / "python" / "triton_python_backend_stub")


def _ignore_pycache(_directory: str, names: list[str]) -> set[str]:
    return {name for name in names if name == "__pycache__"}


def _libpython_dir() -> Path | None:
    """The running interpreter's shared libpython, so the stub matches its stdlib exactly."""
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME")
    if libdir and soname and (Path(libdir) / soname).is_file():
        return Path(libdir)
    # Fall back to the loader's search path (Debian: the libpython3.X package).
    if ctypes.util.find_library(f"python{sys.version_info.major}.{sys.version_info.minor}"):
        return None
    raise TritonStartError(
        f"the python backend stub needs a shared libpython{sys.version_info.major}."
        f"{sys.version_info.minor}.so.1.0 and none was found: install Debian's "
        f"libpython{sys.version_info.major}.{sys.version_info.minor} or use a Python built "
        "with --enable-shared"
    )


def _server_env(dist: _Distribution) -> dict[str, str]:
    env = dict(os.environ)
    libpython = _libpython_dir()
    lib_dirs = [str(libpython)] if libpython else []
    lib_dirs.append(str(dist.libs_dir))
    if env.get("LD_LIBRARY_PATH"):
        lib_dirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(lib_dirs)
    # The stub's embedded interpreter locates its prefix (and the venv) via `python3` on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.prefix) / "bin"), env.get("PATH", "")])
    return env


def _log_excerpt(log_path: Path) -> str:
    """Head and tail: a bad option is reported first, followed by the whole usage text."""
    lines = log_path.read_text(errors="replace").splitlines()
    if len(lines) <= LOG_HEAD_LINES + LOG_TAIL_LINES:
        return "\n".join(lines)
    return "\n".join([*lines[:LOG_HEAD_LINES], "[...]", *lines[-LOG_TAIL_LINES:]])


def _is_ready(grpc_url: str) -> bool:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        return bool(client.is_server_ready(client_timeout=1.0))
    except InferenceServerException:
        return False
    finally:
        client.close()


def _wait_until_ready(popen: subprocess.Popen[bytes], grpc_url: str, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if _has_exited(popen):
            raise TritonStartError(
                f"tritonserver exited before it was ready; "
                f"log {log_path}:\n{_log_excerpt(log_path)}"
            )
        if _is_ready(grpc_url):
            return
        time.sleep(0.1)
    raise TritonStartError(
        f"tritonserver was not ready after {READY_TIMEOUT_S:.0f} s; "
        f"log {log_path}:\n{_log_excerpt(log_path)}"
    )


def _stop(process: _Process) -> None:
    """SIGTERM, then SIGKILL the server's own process group (it and its python stubs)."""
    _terminate(process.popen)
    # A killed stub leaves its shared-memory regions behind; the prefix is unique to us.
    for region in Path("/dev/shm").glob(f"{process.shm_prefix}*"):
        region.unlink(missing_ok=True)


def _terminate(popen: subprocess.Popen[bytes]) -> None:
    if popen.returncode is not None:
        return
    if not _has_exited(popen):
        # os.kill, not send_signal: send_signal may reap the server, and the group id with it.
        os.kill(popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S + 2.0
        while time.monotonic() < deadline and not _has_exited(popen):
            time.sleep(0.05)
    # The server is not reaped yet, so its group id cannot belong to anyone else.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)
    popen.wait()


def _has_exited(popen: subprocess.Popen[bytes]) -> bool:
    """Like poll(), but leaves the zombie unreaped (WNOWAIT) so its pid stays ours."""
    result = os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return result is not None


@dataclass(frozen=True)
class _Process:
    """A server started here, and the prefix of the shared memory its stubs use."""

    popen: subprocess.Popen[bytes]
    shm_prefix: str


def _start(
    dist: _Distribution,
    work_dir: Path,
    repo: Path,
    env: dict[str, str],
    attempt: int,
    ports: tuple[int, int, int] | None = None,
) -> tuple[TritonServer, _Process]:
    http_port, grpc_port, metrics_port = ports or free_ports(3)
    shm_prefix = f"workshop-triton-{secrets.token_hex(6)}-"
    log_path = work_dir / f"tritonserver-{attempt}.log"
    command = [
        str(dist.binary),
        f"--model-repository={repo}",
        f"--backend-directory={work_dir / 'backends'}",
        f"--cache-directory={work_dir / 'caches'}",
        *_SERVER_OPTIONS,
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        # A unique prefix keeps concurrent servers' stub shared-memory regions apart.
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
    ]
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work_dir,
            start_new_session=True,
        )
    orphan_guard.watch(popen.pid)
    server = TritonServer(
        grpc_url=f"127.0.0.1:{grpc_port}",
        http_url=f"http://127.0.0.1:{http_port}",
        model_repository=repo,
        log_path=log_path,
        pid=popen.pid,
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
    )
    return server, _Process(popen, shm_prefix)


def _launch(dist: _Distribution, work_dir: Path, repo: Path) -> tuple[TritonServer, _Process]:
    _prepare_backends(dist, work_dir)
    env = _server_env(dist)
    attempt = 1
    while True:
        server, process = _start(dist, work_dir, repo, env, attempt)
        try:
            _wait_until_ready(process.popen, server.grpc_url, server.log_path)
        except BaseException as error:
            _stop(process)
            if not isinstance(error, TritonStartError) or attempt >= LAUNCH_ATTEMPTS:
                raise
            if not _lost_port_race(server.log_path):
                raise
            attempt += 1
        else:
            return server, process


def _lost_port_race(log_path: Path) -> bool:
    """Another process may take a probed port before the server binds it."""
    return "address already in use" in log_path.read_text(errors="replace").lower()


def check_available() -> None:
    """Raises TritonUnavailable without nvidia-pytriton (TritonStartError when it is broken)."""
    _require_distribution()


@contextlib.contextmanager
def running_triton(work_dir: Path, repo: Path | None = None) -> Iterator[TritonServer]:
    """A ready server whose repository is `repo` (default: a new `work_dir/models`).

    Raises TritonUnavailable without nvidia-pytriton, TritonStartError when it cannot start.
    """
    dist = _require_distribution()
    if repo is None:
        repo = work_dir / "models"
        repo.mkdir()
    server, process = _launch(dist, work_dir, repo)
    try:
        yield server
    finally:
        _stop(process)


class RestartableTriton:
    """A running server that fault injection may kill (SIGKILL to its process group, python
    stubs included) and start again on the same ports and repository, so that its clients
    keep their address. Models load again on demand (explicit model control)."""

    def __init__(self, work_dir: Path, repo: Path) -> None:
        self._dist = _require_distribution()
        self._work_dir = work_dir
        self._repo = repo
        self._env = _server_env(self._dist)
        self._starts = 0
        self.server, self._process = _launch(self._dist, work_dir, repo)

    def kill(self) -> None:
        """SIGKILL the server and its stubs at once (no grace), and reap it."""
        popen = self._process.popen
        if popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
        _stop(self._process)

    def start(self) -> float:
        """Start again on the same ports (after `kill`); returns the seconds to ready."""
        began = time.perf_counter()
        self._starts += 1
        url = urllib.parse.urlsplit(self.server.http_url)
        grpc_port = int(self.server.grpc_url.rsplit(":", 1)[1])
        metrics_port = free_ports(1)[0]
        server, process = _start(
            self._dist,
            self._work_dir,
            self._repo,
            self._env,
            100 + self._starts,
            ports=(int(url.port or 0), grpc_port, metrics_port),
        )
        self.server, self._process = server, process
        _wait_until_ready(process.popen, server.grpc_url, server.log_path)
        return time.perf_counter() - began

    def has_exited(self) -> bool:
        """Whether the server has exited on its own (its zombie left unreaped for `kill`)."""
        return _has_exited(self._process.popen)

    def stop(self) -> None:
        _stop(self._process)


@contextlib.contextmanager
def restartable_triton(work_dir: Path) -> Iterator[RestartableTriton]:
    """`RestartableTriton` on a new `work_dir/models` repository; stopped on exit."""
    repo = work_dir / "models"
    repo.mkdir()
    triton = RestartableTriton(work_dir, repo)
    try:
        yield triton
    finally:
        triton.stop()


# How often the supervisor looks at the server, and how long it waits after a failed start.
SUPERVISE_POLL_S = 0.5
RESTART_PAUSE_S = 2.0


@contextlib.contextmanager
def supervised_triton(
    work_dir: Path, on_restart: Callable[[str], None]
) -> Iterator[RestartableTriton]:
    """`restartable_triton`, started again on the same ports whenever it exits on its own,
    as Kubernetes restarts a container: Triton's python backend can abort the whole server
    under load (`boost::interprocess::lock_exception`, triton-inference-server/server#8882),
    and its clients (the processor) hand their jobs back and reload the models they need
    once it answers again. `on_restart` hears a line for each exit and each restart; a
    start that fails is tried again after RESTART_PAUSE_S until the context ends."""
    with restartable_triton(work_dir) as triton:
        stopping = threading.Event()

        def watch() -> None:
            while not stopping.wait(SUPERVISE_POLL_S):
                if not triton.has_exited():
                    continue
                triton.kill()  # reaps it, and its python stubs with it
                on_restart(f"Triton exited on its own (log {triton.server.log_path}); restarting")
                while not stopping.is_set():
                    try:
                        seconds = triton.start()
                    except TritonStartError as error:
                        on_restart(f"Triton did not start again: {error}")
                        triton.kill()
                        stopping.wait(RESTART_PAUSE_S)
                    else:
                        target = triton.server.grpc_url
                        on_restart(f"Triton restarted in {seconds:.1f} s ({target})")
                        break

        supervisor = threading.Thread(target=watch, name="triton-supervisor", daemon=True)
        supervisor.start()
        try:
            yield triton
        finally:
            stopping.set()
            supervisor.join()
