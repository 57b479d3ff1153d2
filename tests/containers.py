"""Running Workshop's images with podman, for the image system tests.

`built_images()` runs `make images` (scripts/images.sh: cached, so quick when nothing
changed; concurrent callers take turns) and returns each image's name. `Containers` starts
containers the way the manifests run them (user 10001, read-only root filesystem, a tmpfs
/tmp, every capability dropped, no privilege escalation) under unique names with a label of
their own, and removes every one of them on exit, keeping their logs.

podman runs through scripts/podman (deploy/podman/containers.conf). Where podman is missing
and cannot be installed (not root), `require_podman` skips; on CI (root, Debian) `make
images` installs it, so the tests never skip there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tools.demo import script
from tools.demo.footage import make_footage
from tools.demo.stack import Stack
from tools.demo.terminal import Console
from workshop.kit.jsonmap import from_json
from workshop.v1 import common_pb2, run_pb2

ROOT = Path(__file__).resolve().parent.parent
PODMAN = ROOT / "scripts" / "podman"
IMAGES = ("coordinator", "preview", "gateway", "processor", "triton")
TAG = "dev"
USER = "10001:10001"
BUILD_TIMEOUT_S = 1800  # a cold build: the Debian base, five locks (DALI's 1.3 GB)
FULL_RUN_ID = "images-full-run"
RUN_TIMEOUT_S = 180.0


def image(name: str) -> str:
    return f"localhost/workshop/{name}:{TAG}"


def require_podman() -> None:
    if shutil.which("podman") is None and os.geteuid() != 0:
        pytest.skip("podman is not installed and this user cannot install it (not root)")


def built_images() -> dict[str, str]:
    """`make images` (cached); each service's image name. Its output goes to the test's."""
    require_podman()
    began = time.monotonic()
    done = subprocess.run(
        ["make", "--no-print-directory", "images", f"IMAGE_TAG={TAG}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    print(f"make images: {time.monotonic() - began:.1f} s")
    return {name: image(name) for name in IMAGES}


def podman(
    *args: str, timeout: float = 120, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(PODMAN), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        input=input,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])}: {done.stderr[-3000:]}")
    return done


class Containers:
    """Containers started by one test; `close` removes them all (logs first kept)."""

    def __init__(self, logs: Path) -> None:
        self.label = f"workshop.test={uuid.uuid4().hex[:12]}"
        self.prefix = f"wst-{self.label[-12:]}"
        self.logs = logs
        self.names: list[str] = []

    def name(self, service: str) -> str:
        return f"{self.prefix}-{service}"

    def args(self, service: str, env: Mapping[str, str], volumes: Sequence[str]) -> list[str]:
        """`podman run` options: as the manifests' securityContext and volumes say."""
        options = [
            f"--name={self.name(service)}",
            f"--label={self.label}",
            "--network=host",
            "--read-only",
            "--read-only-tmpfs=false",
            "--tmpfs=/tmp:rw,mode=1777",
            f"--user={USER}",
            "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
        ]
        options += [f"--volume={volume}" for volume in volumes]
        options += [f"--env={key}={value}" for key, value in env.items()]
        return options

    def start(
        self,
        service: str,
        image_name: str,
        command: Sequence[str] = (),
        env: Mapping[str, str] = {},
        volumes: Sequence[str] = (),
    ) -> str:
        """Starts a container in the background; its name."""
        self.names.append(self.name(service))
        podman("run", "--detach", *self.args(service, env, volumes), image_name, *command)
        return self.name(service)

    def command(
        self,
        service: str,
        image_name: str,
        command: Sequence[str],
        env: Mapping[str, str] = {},
        timeout: float = 120,
    ) -> str:
        """Runs a command in a new container to its end; its stdout (status 0 required)."""
        self.names.append(self.name(service))
        done = podman(
            "run", *self.args(service, env, ()), image_name, *command, timeout=timeout, check=False
        )
        self.save_log(self.name(service))
        assert done.returncode == 0, f"{service}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        return done.stdout

    def running(self, name: str) -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", name, check=False)
        return state.stdout.strip() == "true"

    def log(self, name: str) -> str:
        done = podman("logs", name, check=False)
        return done.stdout + done.stderr

    def save_log(self, name: str) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.logs / f"{name.removeprefix(self.prefix + '-')}.log").write_text(self.log(name))

    def wait_until(self, name: str, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        """Polls `ready` until it holds; fails with the container's log once it exits."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                if ready():
                    return
            if not self.running(name):
                pytest.fail(f"{name} exited:\n{self.log(name)[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"{name} not ready in {timeout:.0f} s:\n{self.log(name)[-4000:]}")
            time.sleep(0.25)

    def close(self) -> None:
        for name in self.names:
            with contextlib.suppress(Exception):
                self.save_log(name)
        listed = podman("ps", "--all", "--quiet", f"--filter=label={self.label}", check=False)
        ids = listed.stdout.split()
        if ids:
            # SIGKILL at once: the test is over (a graceful stop only costs the suite time)
            podman("rm", "--force", "--time=0", *ids, check=False, timeout=180)


@contextlib.contextmanager
def containers(logs: Path) -> Iterator[Containers]:
    started = Containers(logs)
    try:
        yield started
    finally:
        started.close()


def grpc_serving(target: str) -> bool:
    """grpc.health.v1.Health/Check answers SERVING (the manifests' gRPC probes)."""
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=2
        )
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


class Forward:
    """Forwards TCP connections from `listen` to `upstream` (threads; for the few
    connections a test makes), until `close`, which closes every connection too."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(listen)
        self.lock = threading.Lock()
        self.open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True, name=f"forward-{listen}").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self.lock:
                self.open |= {client, server}
            ends = [2]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(
                    target=self._copy, args=(source, sink, (client, server), ends), daemon=True
                ).start()

    def _copy(
        self,
        source: socket.socket,
        sink: socket.socket,
        pair: tuple[socket.socket, socket.socket],
        ends: list[int],
    ) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        with self.lock:
            ends[0] -= 1
            if ends[0] == 0:
                for end in pair:
                    self.open.discard(end)
                    end.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for end in self.open:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()
            self.open.clear()


def run_the_demo_scenario(stack: Stack, *, full_run: bool) -> None:
    """`make demo`'s scenario (tools/demo/__main__.py): publish the demo detector, import
    two cameras, save the workflow, a 20-image test run followed on its live socket; then
    with `full_run`, a full run of the same workflow; all through the gateway with the demo
    user's Agent key (as users reach the product)."""
    console = Console()
    classes = script.publish_detector(stack, console)
    footage = make_footage(stack.workdir / "recordings")
    yesterday = datetime.now(UTC) - timedelta(days=1)
    script.import_footage(stack, footage, yesterday)
    cameras = [clip.camera_id for clip in footage]
    revision = script.save_workflow(stack, cameras, classes)
    with script.agent_client(stack) as http:
        script.create_run(http, stack, console, revision)
        detail = script.follow_run(stack, console)
        assert detail.run.status == common_pb2.RUN_STATUS_COMPLETED, detail
        assert detail.run.counts.previews_published > 0, detail.run.counts
        if not full_run:
            return
        created = http.post(
            script.RUNS_PATH,
            json={
                "id": FULL_RUN_ID,
                "workflow_id": script.WORKFLOW_ID,
                "runtime_id": stack.runtime_id,
                "revision": revision,
                "mode": "full",
            },
        )
        script.answer_json(created)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            answer = script.answer_json(http.get(f"{script.RUNS_PATH}/{FULL_RUN_ID}"))
            full = from_json(answer["detail"], run_pb2.RunDetail)
            if full.run.status in script.FINAL:
                break
            assert time.monotonic() < deadline, full.run
            time.sleep(0.5)
        assert full.run.status == common_pb2.RUN_STATUS_COMPLETED, full
        assert full.run.counts.slots_frame > 0, full.run.counts


def host_ca_lines() -> list[str]:
    """A distinctive line (the first of its body) of each CA this host adds to its bundle
    (/usr/local/share/ca-certificates): the build secret an image must not keep."""
    lines = []
    for path in Path("/usr/local/share/ca-certificates").rglob("*.crt"):
        body = [line for line in path.read_text().splitlines() if line and "-----" not in line]
        if body:
            lines.append(body[0])
    return lines


def assert_no_build_secrets(image_name: str) -> None:
    """No layer of the image holds a pip.conf, anything in /run/secrets, or a CA bundle
    with this host's own CAs in it (the build secrets of scripts/images.sh)."""
    dirs = podman(
        "image",
        "inspect",
        "--format={{.GraphDriver.Data.UpperDir}}:{{.GraphDriver.Data.LowerDir}}",
        image_name,
    ).stdout.strip()
    extra = host_ca_lines()
    for layer in (Path(d) for d in dirs.split(":") if d):
        assert not list(layer.rglob("pip.conf")), (image_name, layer)
        secrets = layer / "run" / "secrets"
        assert not secrets.is_dir() or not any(secrets.iterdir()), (image_name, layer)
        for bundle in layer.rglob("*.crt"):
            if bundle.is_file() and not bundle.is_symlink():
                text = bundle.read_text(errors="replace")
                assert not any(line in text for line in extra), (image_name, bundle)
    history = podman("history", "--no-trunc", "--format={{.CreatedBy}}", image_name).stdout
    assert "cert =" not in history, image_name
    assert "index-url" not in history, image_name
