"""A private, throwaway Postgres cluster on a free loopback port.

`postgres_cluster()` runs initdb and starts the server (trust auth, durability switched off
for speed: this is for tests and the demo, never for data that matters), and on exit stops
it and deletes its files. Debian's ``postgresql-15`` binaries when present, else the ones the
``pgserver`` wheel bundles. Postgres refuses to run as root, so as root the server runs as
the ``postgres`` OS user (``runuser``).

`create_database(cluster, name)` returns the DSN of a new, empty database (the coordinator's
migrations are applied by testbed.harness.postgres or by `python -m services.coordinator
migrate`: tools import no service, docs/architecture.md "Import rules").
`PostgresUnavailable` says this machine cannot run a cluster (the tests skip on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar, cast

import asyncpg  # type: ignore[import-untyped,unused-ignore]

from tools.localstack import orphan_guard
from tools.localstack.host import free_ports, tail

DEBIAN_BIN_DIR = Path("/usr/lib/postgresql/15/bin")
SUPERUSER = "postgres"
HOST = "127.0.0.1"
START_TIMEOUT_S = 60
PORT_ATTEMPTS = 3
# OS users that may own the server process when we run as root.
SERVER_OS_USERS = ("postgres", "nobody")
# Cloning a database writes a few hundred files: about 10 ms on tmpfs against 100 ms
# on the ext4 disk here, fsync=off or not. So the cluster lives in /dev/shm when it is
# roomy (a container's default 64 MB /dev/shm is not); WORKSHOP_TEST_PG_DIR overrides.
RAM_DIR = Path("/dev/shm")
RAM_DIR_MIN_FREE_BYTES = 1 << 30
PARENT_DIR_ENV = "WORKSHOP_TEST_PG_DIR"
INSTALL_HINT = (
    "install Debian's server (`apt-get install postgresql-15`) "
    "or the bundled binaries (`pip install pgserver`)"
)

# Durability off: a test cluster trades crash safety for speed. A clean stop
# ("fast") keeps every committed row; an "immediate" stop is a crash, and with
# synchronous_commit=off the last few hundred milliseconds of commits may be lost.
SERVER_SETTINGS: dict[str, str] = {
    "listen_addresses": f"'{HOST}'",
    "max_connections": "200",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "'128MB'",
    "log_min_messages": "warning",
    "log_min_error_statement": "error",
}

StopMode = Literal["smart", "fast", "immediate"]
T = TypeVar("T")


@dataclass
class PostgresTimings:
    """Seconds spent starting clusters; the test harness also fills the template and clones."""

    initdb_s: float = 0.0
    start_s: float = 0.0
    template_s: float = 0.0
    migrations: tuple[str, ...] = ()
    clones_s: list[float] = field(default_factory=list)
    restarts_s: list[float] = field(default_factory=list)


TIMINGS = PostgresTimings()


@dataclass(frozen=True)
class PostgresCluster:
    """One running cluster; ``restart()`` brings it back on the same port and data."""

    host: str
    port: int
    superuser: str
    bin_dir: Path
    data_dir: Path
    socket_dir: Path
    log_path: Path
    os_user: str | None  # None: the server runs as the current user

    @property
    def admin_dsn(self) -> str:
        return self.dsn("postgres")

    def dsn(self, database: str) -> str:
        return f"postgresql://{self.superuser}@{self.host}:{self.port}/{database}"

    def start(self) -> float:
        """Start the server and wait until it accepts connections; returns the seconds taken."""
        began = time.perf_counter()
        self._pg_ctl("start", "-l", str(self.log_path), "-t", str(START_TIMEOUT_S))
        orphan_guard.watch(self.pid)
        return time.perf_counter() - began

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop: "fast" shuts down cleanly, "immediate" is a crash (recovery on next start)."""
        self._pg_ctl("stop", "-m", mode, "-t", str(START_TIMEOUT_S))

    def restart(self, mode: StopMode = "fast") -> float:
        """Stop and start again on the same port and data; returns the seconds taken.

        Clients lose their connections and must reconnect. See SERVER_SETTINGS for
        what an "immediate" (crash) restart may lose.
        """
        began = time.perf_counter()
        self.stop(mode)
        self.start()
        elapsed = time.perf_counter() - began
        TIMINGS.restarts_s.append(elapsed)
        return elapsed

    @property
    def pid(self) -> int | None:
        """The postmaster's PID from this cluster's own pid file; None when it is stopped."""
        return _postmaster_pid(self.data_dir)

    def is_running(self) -> bool:
        status = _run(
            self._as_server_user(
                [str(self.bin_dir / "pg_ctl"), "status", "-D", str(self.data_dir)]
            ),
            cwd=self.socket_dir,
            check=False,
        )
        return status.returncode == 0

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    def kill(self) -> None:
        """Last resort: SIGKILL the postmaster recorded in this cluster's own pid file."""
        pid = _postmaster_pid(self.data_dir)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _pg_ctl(self, action: str, *args: str) -> None:
        command = [str(self.bin_dir / "pg_ctl"), action, "-D", str(self.data_dir), "-w", "-s"]
        result = _run(self._as_server_user([*command, *args]), cwd=self.socket_dir, check=False)
        if result.returncode != 0:
            raise PostgresLaunchError(
                f"pg_ctl {action} failed (exit {result.returncode}): {result.stdout.strip()}\n"
                f"--- {self.log_path} ---\n{self.log_tail()}"
            )

    def _as_server_user(self, command: list[str]) -> list[str]:
        return _as_user(self.os_user, command)


class PostgresLaunchError(RuntimeError):
    pass


class PostgresUnavailable(PostgresLaunchError):
    """This machine cannot run a private cluster (no binaries, no user to run it as)."""


@contextlib.contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A private, throwaway cluster: initdb, start, and on exit stop and delete it.

    Raises PostgresUnavailable before touching anything when this machine cannot run one.
    """
    bin_dir = _find_bin_dir()
    os_user = _server_os_user()
    root = Path(tempfile.mkdtemp(prefix="workshop-pg-", dir=_parent_dir()))
    data_dir = root / "data"
    cluster: PostgresCluster | None = None
    try:
        if os_user is not None:
            entry = pwd.getpwnam(os_user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        began = time.perf_counter()
        _initdb(bin_dir, data_dir, os_user, cwd=root)
        TIMINGS.initdb_s = time.perf_counter() - began
        cluster = _start_on_free_port(bin_dir, data_dir, root, os_user)
        yield cluster
    finally:
        _shut_down(data_dir, cluster)
        shutil.rmtree(root, ignore_errors=True)


def check_available() -> None:
    """Raises PostgresUnavailable when this machine cannot run a private cluster."""
    _find_bin_dir()
    _server_os_user()


def create_database(cluster: PostgresCluster, name: str) -> str:
    """Creates the empty database `name` on the cluster; returns its DSN."""
    run_async(lambda: admin_execute(cluster.admin_dsn, f"CREATE DATABASE {quote_ident(name)}"))
    return cluster.dsn(name)


def run_async(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a private event loop in a worker thread and return its result.

    Safe from sync fixtures whether or not the calling thread owns a (stopped) loop.
    """

    async def main() -> T:
        return await make()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-admin") as pool:
        return pool.submit(lambda: asyncio.run(main())).result()


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _find_bin_dir() -> Path:
    if all((DEBIAN_BIN_DIR / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
        return DEBIAN_BIN_DIR
    if importlib.util.find_spec("pgserver") is not None:
        commands = importlib.import_module("pgserver._commands")
        return Path(cast(str, commands.POSTGRES_BIN_PATH))
    raise PostgresUnavailable(f"no PostgreSQL server binaries: {INSTALL_HINT}")


def _parent_dir() -> Path | None:
    """Where the cluster's directory goes; None means the system's temporary directory."""
    chosen = os.environ.get(PARENT_DIR_ENV)
    if chosen:
        return Path(chosen)
    try:
        roomy = shutil.disk_usage(RAM_DIR).free >= RAM_DIR_MIN_FREE_BYTES
    except OSError:
        return None
    return RAM_DIR if roomy and os.access(RAM_DIR, os.W_OK | os.X_OK) else None


def _server_os_user() -> str | None:
    if os.geteuid() != 0:
        return None
    if shutil.which("runuser") is None:
        raise PostgresUnavailable(
            "running as root, and `runuser` (util-linux) is missing to drop privileges"
        )
    for name in SERVER_OS_USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise PostgresUnavailable(f"running as root and none of the OS users {SERVER_OS_USERS} exists")


def _initdb(bin_dir: Path, data_dir: Path, os_user: str | None, *, cwd: Path) -> None:
    command = [
        str(bin_dir / "initdb"),
        "-D",
        str(data_dir),
        "-U",
        SUPERUSER,
        "--auth=trust",
        "--encoding=UTF8",
        "--no-locale",
        "--no-sync",
    ]
    result = _run(_as_user(os_user, command), cwd=cwd, check=False)
    if result.returncode != 0:
        raise PostgresLaunchError(f"initdb failed (exit {result.returncode}):\n{result.stdout}")
    with (data_dir / "postgresql.conf").open("a", encoding="utf-8") as conf:
        conf.write("\ninclude 'workshop.conf'\n")


def _start_on_free_port(
    bin_dir: Path, data_dir: Path, socket_dir: Path, os_user: str | None
) -> PostgresCluster:
    # Another process can take the free port before the server binds it: try a few.
    for attempt in range(1, PORT_ATTEMPTS + 1):
        [port] = free_ports(1)
        settings = {
            **SERVER_SETTINGS,
            "port": str(port),
            "unix_socket_directories": f"'{socket_dir}'",
        }
        conf = "".join(f"{key} = {value}\n" for key, value in settings.items())
        (data_dir / "workshop.conf").write_text(conf, encoding="utf-8")
        cluster = PostgresCluster(
            host=HOST,
            port=port,
            superuser=SUPERUSER,
            bin_dir=bin_dir,
            data_dir=data_dir,
            socket_dir=socket_dir,
            log_path=socket_dir / "postgres.log",
            os_user=os_user,
        )
        try:
            TIMINGS.start_s = cluster.start()
        except PostgresLaunchError:
            _shut_down(data_dir, cluster)  # a start that timed out may have left a server
            if attempt < PORT_ATTEMPTS and "could not bind" in cluster.log_tail():
                continue
            raise
        return cluster
    raise AssertionError("unreachable")


def _shut_down(data_dir: Path, cluster: PostgresCluster | None) -> None:
    """Stop the server this session started, if any; never touches other processes."""
    if cluster is None or _postmaster_pid(data_dir) is None:
        return
    try:
        cluster.stop("immediate")
    except PostgresLaunchError:
        cluster.kill()


async def admin_execute(dsn: str, *statements: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


def _postmaster_pid(data_dir: Path) -> int | None:
    try:
        first_line = (data_dir / "postmaster.pid").read_text(encoding="utf-8").split("\n", 1)[0]
    except FileNotFoundError:
        return None
    return int(first_line) if first_line.strip().isdigit() else None


def _as_user(os_user: str | None, command: list[str]) -> list[str]:
    return command if os_user is None else ["runuser", "-u", os_user, "--", *command]


def _run(command: list[str], *, cwd: Path, check: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=cwd,
        check=check,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=START_TIMEOUT_S + 30,
    )
