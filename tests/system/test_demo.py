"""`python -m tools.demo` end to end, twice in a row: each run creates its run through the
gateway, prints 20 frame rows with the scenes' detections and their previews, and leaves
no process it started. The first exits 0. The second is kept (`--keep`): its hand-off,
printed before its run starts, works as printed (the web console's address and the demo
user's password, the exports with which `workshop runs list` works when pasted into a
shell, every service's metrics endpoint, and `workshop doctor` against the demo's
processor), and closing its terminal stops its stack.

Both use the kept demo's default work directory (under the test's TMPDIR; the first is
given it with `--workdir`), so a finished demo's directory and state do not break the next
run. One test, not two: a demo run costs about 40 s of CPU, and the suite is bound by CPU.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tools.localstack.postgres import PostgresUnavailable
from tools.localstack.postgres import check_available as check_postgres
from tools.localstack.s3 import WeedNotFound, find_weed
from tools.localstack.triton import TritonUnavailable
from tools.localstack.triton import check_available as check_triton

pytestmark = [pytest.mark.triton, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CLASSES = {"person", "vehicle", "animal"}
STACK = {"postgres", "seaweedfs", "triton", "coordinator", "preview", "gateway", "processor"}
ROW = re.compile(r"^(\d+)\s+(\d\d:\d\d:\d\d)\s+(cam-[ab])\s+(.+?)\s+(\S+/\d+\.jpg)$")
DETECTION = re.compile(r"(\w+) (\d\.\d\d) \((\d+),(\d+) (\d+)x(\d+)\)")
WORKDIR = re.compile(r"^workshop demo: work directory (\S+)$", re.MULTILINE)
PIDS = re.compile(r"^stack pids: (.+)$", re.MULTILINE)
PID = re.compile(r"\bpid (\d+)\b")
CREATE = re.compile(r"^POST /v1/workshop/runs (\{.+\})$", re.MULTILINE)
# A processor may lease the first job before CreateRun reads the run back, so the
# answer can already say running.
CREATED = re.compile(
    r"^  -> 200: run demo-run (queued|running), created by user demo \(key \S+\)$",
    re.MULTILINE,
)
LIVE = re.compile(r"^GET ws://127\.0\.0\.1:\d+/v1/workshop/runs/demo-run/live ", re.MULTILINE)
IMAGE = re.compile(
    r"^GET /v1/workshop/runs/demo-run/previews/\S+/image -> image/jpeg, (\d+) bytes", re.MULTILINE
)
GATEWAY = re.compile(r"^  gateway      (http://127\.0\.0\.1:\d+) ", re.MULTILINE)
USER = re.compile(r"^  demo user    demo  password (\S+) ", re.MULTILINE)
AGENT_KEY = re.compile(r"^  agent key    (\S+) ", re.MULTILINE)
CONSOLE = re.compile(r"^open (http://127\.0\.0\.1:\d+)/ and sign in as demo / (\S+)$", re.MULTILINE)
CLI_BLOCK = re.compile(
    r"^the command line.*\n((?:  export WORKSHOP_\w+=\S+\n)+)  (\S+ runs list)$", re.M
)
METRICS = re.compile(r"^  (\w+) +(http://127\.0\.0\.1:\d+/metrics)$", re.MULTILINE)
DOCTOR = re.compile(r"^  (env PROCESSOR_.* doctor)$", re.MULTILINE)
SERVICES = {"coordinator", "preview", "gateway", "processor", "triton"}


@pytest.fixture(autouse=True)
def _components_installed() -> None:
    try:
        check_postgres()
        find_weed()
        check_triton()
    except (PostgresUnavailable, WeedNotFound, TritonUnavailable) as missing:
        pytest.skip(str(missing))


def run_demo(tmp_path: Path, *args: str) -> tuple[str, float]:
    began = time.perf_counter()
    finished = subprocess.run(
        [sys.executable, "-m", "tools.demo", *args],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # the default work directory goes here
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    elapsed = time.perf_counter() - began
    assert finished.returncode == 0, finished.stdout + finished.stderr
    return finished.stdout, elapsed


def check_frames(output: str) -> None:
    rows = [match for line in output.splitlines() if (match := ROW.match(line))]
    assert [int(row[1]) for row in rows] == list(range(1, 21)), output
    assert sorted(row[3] for row in rows) == ["cam-a"] * 10 + ["cam-b"] * 10
    for row in rows:
        detections = DETECTION.findall(row[4])
        # Every scene object stays in frame the whole recording: each frame shows all three.
        assert {d[0] for d in detections} == CLASSES, row[0]
        assert all(float(d[1]) >= 0.5 for d in detections), row[0]


def check_gateway(output: str) -> None:
    """The run was created with the documented body and followed through the gateway."""
    (body,) = CREATE.findall(output)
    assert list(json.loads(body)) == [
        "id",
        "workflow_id",
        "runtime_id",
        "revision",
        "mode",
        "image_limit",
    ]
    assert json.loads(body)["mode"] == "test"
    assert CREATED.search(output), output
    assert LIVE.search(output), output
    (size,) = IMAGE.findall(output)
    assert int(size) > 0


def check_previews(workdir: Path) -> None:
    copies = sorted((workdir / "previews").glob("*.jpg"))
    assert len(copies) == 20
    assert all(path.read_bytes()[:2] == b"\xff\xd8" for path in copies)


def started_pids(output: str) -> set[int]:
    (line,) = PIDS.findall(output)
    named = dict(entry.split("=") for entry in line.split())
    assert set(named) == STACK
    pids = {int(pid) for pid in named.values()} | {int(pid) for pid in PID.findall(output)}
    assert 0 not in pids
    return pids


def running(pid: int) -> bool:
    """True while the process exists and is not a zombie (a reaped-late child of init)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def processes_mentioning(path: Path) -> list[str]:
    """Command lines of live processes that name `path` (Triton and SeaweedFS do)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or not running(int(proc.name)):
            continue
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(path) in command:
            found.append(f"{proc.name}: {command}")
    return found


def check_handoff(printed: str) -> None:
    """The hand-off comes before the run: the console's address and the demo user's
    password first; the exports make `workshop runs list` work when pasted into a shell;
    every service's metrics endpoint answers; `workshop doctor` passes on the demo's
    processor with what it prints."""
    ((console, _),) = CONSOLE.findall(printed)
    assert printed.index(f"open {console}/") < printed.index("POST /v1/workshop/runs"), printed
    (gateway,) = GATEWAY.findall(printed)
    assert console == gateway
    (exports, runs_list) = CLI_BLOCK.findall(printed)[0]
    names = re.findall(r"export (WORKSHOP_\w+)=", exports)
    assert {"WORKSHOP_COORDINATOR", "WORKSHOP_KEY", "WORKSHOP_PREVIEW"} <= set(names)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("WORKSHOP_", "PROCESSOR_"))}
    pasted = subprocess.run(
        ["bash", "-c", exports.replace("  export", "export") + runs_list],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert pasted.returncode == 0, pasted.stdout + pasted.stderr
    assert "demo-run" in pasted.stdout, pasted.stdout
    assert "completed" in pasted.stdout, pasted.stdout
    endpoints = dict(METRICS.findall(printed))
    assert set(endpoints) == SERVICES, printed
    with httpx.Client(timeout=30) as http:
        assert http.get(f"{console}/").status_code == 200
        for service, url in endpoints.items():
            scraped = http.get(url)
            assert scraped.status_code == 200, (service, scraped.text)
            assert "# TYPE " in scraped.text, service
    (doctor,) = DOCTOR.findall(printed)
    checked = subprocess.run(
        ["bash", "-c", exports.replace("  export", "export") + doctor],
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok   device registered" in checked.stdout, checked.stdout


def check_kept_gateway(printed: str) -> None:
    """What a kept demo prints lets a person in: the Agent key lists the demo's run, the
    password signs the demo user in, and the OpenAPI document is served."""
    (gateway,) = GATEWAY.findall(printed)
    (password,) = USER.findall(printed)
    (key,) = AGENT_KEY.findall(printed)
    assert CONSOLE.findall(printed)[0] == (gateway, password)
    assert f'curl -H "Authorization: Bearer $AGENT_KEY" {gateway}/v1/workshop/runs' in printed
    with httpx.Client(base_url=gateway, timeout=30) as http:
        runs = http.get("/v1/workshop/runs", headers={"Authorization": f"Bearer {key}"})
        assert runs.status_code == 200, runs.text
        (run,) = [entry["run"] for entry in runs.json()["runs"]]
        assert (run["run_id"], run["status"]) == ("demo-run", "completed")
        assert run["created_by"]["user_id"] == "demo"
        signed_in = http.post("/api/session", json={"user_id": "demo", "password": password})
        assert signed_in.status_code == 200, signed_in.text
        assert signed_in.json()["user_id"] == "demo"
        assert http.get("/v1/openapi.json").json()["openapi"].startswith("3.1")


@pytest.mark.timeout(900)
def test_the_demo_runs_then_runs_kept_and_stops_when_its_terminal_closes(
    tmp_path: Path,
) -> None:
    # the work directory a kept demo takes by default (a demo that is not kept takes a new
    # one unless told): the kept run below finds this run's directory and state
    workdir = str(tmp_path / f"workshop-demo-{getpass.getuser()}")
    first, first_s = run_demo(tmp_path, "--workdir", workdir)
    assert WORKDIR.findall(first) == [workdir]
    check_frames(first)
    check_gateway(first)
    assert not [pid for pid in started_pids(first) if running(pid)], first
    assert processes_mentioning(Path(workdir)) == []

    demo = subprocess.Popen(
        [sys.executable, "-m", "tools.demo", "--keep"],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert demo.stdout is not None
    output = []
    try:
        for line in demo.stdout:
            output.append(line)
            if line.startswith("the stack keeps running"):
                break
        printed = "".join(output)
        assert "the stack keeps running" in printed, printed
        pids = started_pids(printed)
        assert all(running(pid) for pid in pids)
        check_handoff(printed)
        check_kept_gateway(printed)
        check_frames(printed)
        check_gateway(printed)
        # no --workdir: the default one, the first run's, which `make demo-stop` without
        # ARGS stops
        assert WORKDIR.findall(printed) == [workdir]
        assert "`make demo-stop` stops it" in printed, printed
        demo.send_signal(signal.SIGHUP)  # what closing its terminal sends
        rest, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
        demo.wait()
    # 0 once it waits as a kept stack does, 130 if the signal comes a moment before
    assert demo.returncode in (0, 130), printed + rest
    assert "everything the demo started is stopped" in rest, rest
    deadline = time.monotonic() + 30  # the watchdog's grace, were anything left
    while [pid for pid in pids if running(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if running(pid)], printed + rest
    print(f"the first demo run took {first_s:.1f} s")
    check_previews(Path(workdir))
    assert processes_mentioning(Path(workdir)) == []
