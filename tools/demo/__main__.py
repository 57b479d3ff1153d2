"""`python -m tools.demo [--keep] [--workdir DIR]`: the whole system on this machine.

Starts Postgres, SeaweedFS, the bundled Triton, the coordinator, the preview service, the
gateway and one processor; publishes the demo detector, imports synthetic recordings of two
cameras and saves a workflow (as an operator, over gRPC), then as the demo user through the
gateway (an Agent key) creates a test run of 20 images, follows it on its live WebSocket
with a progress bar and reads its previews back; prints each frame's detections and preview,
and stops everything it started. `--keep` leaves the stack running until
Ctrl-C, SIGTERM, SIGHUP (its terminal closed) or `python -m tools.demo stop`; a watchdog
stops the stack even when the demo is killed. Exit status: 0 when the run completed, 1 on
a failure, 2 on bad usage, 130 when interrupted.

`python -m tools.demo stop [--workdir DIR]` stops the demo running from DIR (without
--workdir: every demo of this user) and everything it started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType

import httpx

from tools.demo import reaper, script
from tools.demo.footage import Footage, make_footage
from tools.demo.report import collect_frames, frame_table, previews_prefix
from tools.demo.stack import PREVIEW_BUCKET, RECORDINGS_BUCKET, Stack, running_stack
from tools.demo.terminal import Console
from tools.demo.workdir import WorkdirError, forget_pids, prepare_workdir, record_pids
from workshop.v1 import common_pb2, run_pb2


class RunFailed(RuntimeError):
    pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "action",
        nargs="?",
        choices=("run", "stop"),
        default="run",
        help="run the demo (default), or stop a running one and its stack",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the stack running after the run (Ctrl-C stops)"
    )
    parser.add_argument(
        "--workdir", type=Path, help="work directory (default: a new temporary directory)"
    )
    args = parser.parse_args(argv)
    if args.action == "stop":
        return stop(args.workdir)
    console = Console()
    # SIGTERM, and SIGHUP when the terminal closes, stop the demo the way Ctrl-C does:
    # everything started is stopped first.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    try:
        workdir = prepare_workdir(args.workdir)
    except WorkdirError as error:
        print(f"workshop demo: {error}", file=sys.stderr)
        return 2
    reaper.start_watchdog(reaper.mark_stack(workdir))
    console.line(f"workshop demo: work directory {workdir}")
    began = time.perf_counter()
    try:
        _demo(workdir, console, keep=args.keep)
    except KeyboardInterrupt:
        console.line("interrupted: everything the demo started is stopped")
        return 130
    except Exception as error:
        console.line(f"demo failed: {error}")
        console.line(f"logs: {workdir / 'logs'}")
        return 1
    finally:
        forget_pids(workdir)
    console.line(
        f"done in {time.perf_counter() - began:.1f} s; everything the demo started is stopped"
    )
    console.line(f"logs, recordings and preview copies stay in {workdir}")
    return 0


def _demo(workdir: Path, console: Console, *, keep: bool) -> None:
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="demo-footage") as pool:
        # Encoding the recordings takes a few seconds of CPU: overlap it with the starts.
        footage = pool.submit(make_footage, workdir / "recordings")
        with running_stack(workdir, console) as stack:
            record_pids(workdir, stack.pids)
            console.line("stack pids: " + " ".join(f"{k}={v}" for k, v in stack.pids.items()))
            _scenario(stack, footage, console)
            if keep:
                _keep_running(stack, console)


def _scenario(stack: Stack, pending: Future[list[Footage]], console: Console) -> None:
    classes = script.publish_detector(stack, console)
    with console.stage("encoding synthetic recordings (VP9 and H.264, 640x360, 10 fps)"):
        footage = pending.result()
    yesterday = datetime.now(UTC) - timedelta(days=1)
    cameras = [clip.camera_id for clip in footage]
    with console.stage(
        f"importing recordings of {', '.join(cameras)} (workshop recordings import)"
    ):
        script.import_footage(stack, footage, yesterday)
    with console.stage(f"saving workflow {script.WORKFLOW_ID} (workshop workflows save)"):
        revision = script.save_workflow(stack, cameras, classes)
    console.line(
        f"test run {script.RUN_ID}: {script.IMAGE_LIMIT} images, runtime {stack.runtime_id}, "
        f"through the gateway {stack.gateway} as user {stack.user.user_id} (Agent key)"
    )
    with script.agent_client(stack) as http:
        script.create_run(http, stack, console, revision)
        began = time.perf_counter()
        detail = script.follow_run(stack, console)
        _report(stack, http, detail, footage, began, console)


def _report(
    stack: Stack,
    http: httpx.Client,
    detail: run_pb2.RunDetail,
    footage: list[Footage],
    began: float,
    console: Console,
) -> None:
    status = common_pb2.RunStatus.Name(detail.run.status).removeprefix("RUN_STATUS_").lower()
    console.line(f"run {status} in {time.perf_counter() - began:.1f} s")
    if detail.run.status != common_pb2.RUN_STATUS_COMPLETED:
        failures = [
            f"{job.camera_id}: {job.failure_message}" for job in detail.jobs if job.failure_message
        ]
        raise RunFailed(f"run {script.RUN_ID} ended {status}: {'; '.join(failures)}")
    frames = collect_frames(stack, http, script.RUN_ID, list(detail.recent_images))
    if frames:
        first = frames[0]
        console.line(
            f"GET {first.path} -> {first.content_type}, {first.byte_size} bytes "
            f"(each of the {len(frames)} previews is read this way)"
        )
    scene = footage[0].scene
    prefix = previews_prefix(script.RUN_ID)
    console.line()
    console.line(
        f"{len(frames)} frames; previews are objects under s3://{PREVIEW_BUCKET}/{prefix} "
        f"on {stack.s3.endpoint} (for the run's hour, while the stack runs), "
        f"copied to {stack.workdir / 'previews'}/<camera>-<HHMMSS>.jpg"
    )
    for row in frame_table(frames, script.RUN_ID, scene.width, scene.height):
        console.line(row)
    console.line()


def _keep_running(stack: Stack, console: Console) -> None:
    grpcurl = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or "grpcurl"
    s3 = stack.s3
    user = stack.user
    gateway = stack.gateway
    lines = [
        "",
        "the stack keeps running; Ctrl-C, SIGTERM, closing this terminal or "
        f"`make demo-stop ARGS='--workdir {stack.workdir}'` stops it",
        f"  coordinator  {stack.coordinator}  (OperatorService, WorkshopService, JobService)",
        f"  preview      {stack.preview}  (PreviewService)",
        f"  gateway      {gateway}  (HTTP API: /api with a session cookie, /v1 with an "
        "Agent key; docs/http-api.md)",
        f"  openapi      {gateway}/v1/openapi.json",
        f"  demo user    {user.user_id}  password {user.password}  (sign in: POST /api/session)",
        f"  agent key    {user.agent_key}  (user {user.user_id}, scope workshop)",
        f"  processor    {stack.processor}  (health; runtime {stack.runtime_id})",
        f"  triton       {stack.triton.grpc_url}  (gRPC), {stack.triton.http_url}",
        f"  postgres     {stack.database_url}",
        f"  s3           http://{s3.endpoint}  access key {s3.access_key}  "
        f"secret key {s3.secret_key}  buckets {PREVIEW_BUCKET}, {RECORDINGS_BUCKET}",
        f"  admin key    {stack.admin_key}",
        f"  work dir     {stack.workdir}",
        "",
        "try:",
        f"  export AGENT_KEY={user.agent_key}",
        f'  curl -H "Authorization: Bearer $AGENT_KEY" {gateway}/v1/workshop/runs',
        f'  curl -H "Authorization: Bearer $AGENT_KEY" {gateway}/v1/workshop/runs/{script.RUN_ID}',
        f'  curl -H "Authorization: Bearer $AGENT_KEY" -H "Content-Type: application/json" '
        f'-d \'{{"id": "demo-2", "workflow_id": "{script.WORKFLOW_ID}", '
        f'"runtime_id": "{stack.runtime_id}", "revision": 1, "mode": "test", '
        f'"image_limit": 10}}\' {gateway}/v1/workshop/runs',
        f"  curl {gateway}/v1/openapi.json",
        f"  export ADMIN_KEY={stack.admin_key}",
        f"  {grpcurl} -plaintext {stack.coordinator} list",
        f'  {grpcurl} -plaintext -H "authorization: Bearer $ADMIN_KEY" '
        f"{stack.coordinator} workshop.v1.WorkshopService/ListRuns",
        f'  {grpcurl} -plaintext -H "authorization: Bearer $ADMIN_KEY" '
        f'-d \'{{"run_id": "{script.RUN_ID}"}}\' {stack.coordinator} '
        "workshop.v1.WorkshopService/GetRun",
        f'  {grpcurl} -plaintext -H "authorization: Bearer $ADMIN_KEY" '
        f'-d \'{{"run_id": "demo-3", "workflow_id": "{script.WORKFLOW_ID}", '
        f'"runtime_id": "{stack.runtime_id}", "revision": 1, "mode": "RUN_MODE_TEST", '
        f'"image_limit": 10}}\' {stack.coordinator} workshop.v1.WorkshopService/CreateRun',
        f'  {grpcurl} -plaintext -H "authorization: Bearer $ADMIN_KEY" '
        f'-d \'{{"run_id": "demo-3"}}\' {stack.coordinator} '
        "workshop.v1.WorkshopService/WatchRun",
    ]
    for line in lines:
        console.line(line)
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        console.line("stopping on request")


def stop(workdir: Path | None) -> int:
    """Stops the demos run from `workdir` (None: all of this user's) and their stacks."""
    stacks = reaper.stacks_of(workdir)
    if not stacks:
        print("no demo stack runs" + (f" from {workdir.resolve()}" if workdir else ""))
        return 0
    for mark, pids in stacks.items():
        demo = reaper.demo_pid_of(mark)
        print(f"stopping the demo from {mark.rsplit('|', 1)[0]} ({len(pids)} processes)")
        if _is_demo(demo):
            # The demo stops its stack in order itself; whatever is left goes below.
            os.kill(demo, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while _is_demo(demo) and time.monotonic() < deadline:
                time.sleep(0.2)
        reaper.stop_stack(mark)
    return 0


def _is_demo(pid: int) -> bool:
    """True while `pid` is a live demo process (a pid may be reused once it is gone)."""
    with contextlib.suppress(OSError):
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z" and b"tools.demo" in command
    return False


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(main())
