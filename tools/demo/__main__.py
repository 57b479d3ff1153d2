"""`python -m tools.demo [--keep] [--workdir DIR]`: the whole system on this machine.

Starts Postgres, SeaweedFS, the bundled Triton, the coordinator, the preview service, the
gateway and one processor; publishes the demo detector, imports synthetic recordings of two
cameras and saves a workflow (as an operator, over gRPC), then as the demo user through the
gateway (an Agent key) creates a test run of 20 images, follows it on its live WebSocket
with a progress bar and reads its previews back; prints each frame's detections and preview,
and stops everything it started. Before the run it says where the web console is and how
to sign in (tools/demo/handoff.py). `--keep` leaves the stack running until Ctrl-C,
SIGTERM, SIGHUP (its terminal closed) or `python -m tools.demo stop`, and first hands it
over: the command line's exports, the metrics endpoints, `workshop doctor` on its
processor, every endpoint and key. Without `--workdir` a kept demo runs from the default
work directory, $TMPDIR/workshop-demo-$USER. A watchdog stops the stack even when the demo
is killed. Exit status: 0 when the run completed, 1 on a failure, 2 on bad usage, 130 when
interrupted.

`python -m tools.demo stop [--workdir DIR]` stops the demo running from DIR (without
--workdir: from the default work directory) and everything it started, and names the
other demos of this user that still run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType

import httpx

from tools.demo import handoff, reaper, script
from tools.demo.footage import Footage, make_footage
from tools.demo.report import collect_frames, frame_table, previews_prefix
from tools.demo.stack import PREVIEW_BUCKET, Stack, running_stack
from tools.demo.terminal import Console
from tools.demo.workdir import (
    WorkdirError,
    default_workdir,
    forget_pids,
    prepare_workdir,
    record_pids,
    stop_hint,
)
from workshop.kit.jsonmap import enum_word
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
        "--workdir",
        type=Path,
        help="work directory (default: a new temporary directory; with --keep, and for stop, "
        f"{default_workdir()})",
    )
    args = parser.parse_args(argv)
    if args.action == "stop":
        return stop(args.workdir)
    console = Console()
    # SIGTERM, and SIGHUP when the terminal closes, stop the demo the way Ctrl-C does:
    # everything started is stopped first.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    chosen = args.workdir or (default_workdir() if args.keep else None)
    try:
        workdir = prepare_workdir(chosen)
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
            console.line()
            for line in handoff.full(stack) if keep else handoff.short(stack):
                console.line(line)
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
    status = enum_word(common_pb2.RunStatus.DESCRIPTOR, detail.run.status)
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
    console.line(handoff.kept(stack))
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        console.line("stopping on request")


def stop(workdir: Path | None) -> int:
    """Stops the demo run from `workdir` (None: the default work directory) and its stack;
    names this user's other demos that still run, each with the command that stops it."""
    chosen = (workdir or default_workdir()).resolve()
    ours = reaper.stacks_of(chosen)
    if not ours:
        print(f"no demo stack runs from {chosen}")
    for mark, pids in ours.items():
        demo = reaper.demo_pid_of(mark)
        print(f"stopping the demo from {reaper.workdir_of(mark)} ({len(pids)} processes)")
        if _is_demo(demo):
            # The demo stops its stack in order itself; whatever is left goes below.
            os.kill(demo, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while _is_demo(demo) and time.monotonic() < deadline:
                time.sleep(0.2)
        reaper.stop_stack(mark)
    for mark in sorted(reaper.stacks_of(None).keys() - ours.keys()):
        other = reaper.workdir_of(mark)
        print(
            f"another demo still runs from {other} (pid {reaper.demo_pid_of(mark)}): "
            f"`{stop_hint(other)}` stops it"
        )
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
