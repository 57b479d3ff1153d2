"""The web console in Chromium: how fast the run page and the review page paint, and how
smoothly the run page takes a stream of live messages.

    .venv/bin/python -m bench.page_load [--quick] [--loads N]

Starts the demo's whole stack as processes (tools/demo/stack.py: Postgres, SeaweedFS,
Triton, coordinator, preview service, gateway, one processor with the demo detector),
imports two synthetic recordings (VP9 and H.264, 640x360, 10 fps, 50 s each) with the
`workshop` CLI and runs, as the demo user through the gateway (set-up, timed, not
measured):

- a test run of 100 images (a frame every 1 s of each recording), and
- a full run of 1,000 items (a frame every 0.1 s; every frame shows the scene's objects,
  so every one is saved), in 6 sightings.

Then Chromium (Debian's /usr/bin/chromium, driven by Playwright) signs in with the login
form and, `--loads` times each, opens the run page (`#/run/<id>`) and the review page
(`#/review/<id>`) as fresh document loads. A page's figure is the time from navigation
start to the mark it sets once its data is on the page (`workshop:run-painted`,
`review-shown`; docs/console.md); the median over the loads is reported, with the
slowest load and the time until the run page's 100 images had all loaded.

Live load: a third test run, caught while running (the processor is paused with SIGSTOP
once half its images are in, and continued afterwards), so that its run page keeps its
live socket; that socket is the real one, relayed by Playwright (`route_web_socket`);
once its first message is in, this process sends the page 50
messages a second for 5 s on that socket, each the run's real detail with the jobs'
progress and the order of its images changed, so that every message repaints strips and
images. Frames are counted in the page with requestAnimationFrame: dropped frames are
those a 60 Hz display would have shown in the 5 s that the page did not paint, and the
longest gap between two frames is printed. (The gateway itself coalesces a run's
updates within 120 ms, so a real socket never carries more than about 8 messages a
second; 50 is a stress figure for the page.)

`--quick`: 200 items in the full run, 3 loads. Targets (2-core machine): run page <= 1,000
ms, review page <= 1,500 ms. The last line is `RESULT run_page_ms=<x> review_page_ms=<y>
dropped_frames=<n>`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from google.protobuf import json_format
from playwright.async_api import Page, WebSocketRoute, async_playwright

from bench.stats import median
from testbed.harness.browser import CHROMIUM, CHROMIUM_ARGS
from tools.demo import script
from tools.demo.footage import CAMERAS, Footage
from tools.demo.scenes import random_scene, write_recording
from tools.demo.stack import Stack, running_stack
from tools.demo.terminal import Console

SECONDS = 50  # each recording's length
TEST_RUN, FULL_RUN, LIVE_RUN = "page-load-test", "page-load-full", "page-load-live"
IMAGES = 100  # the test run: a frame every 2 * seconds / IMAGES of each recording
FULL_INTERVAL_S = 0.1
LIVE_RATE, LIVE_SECONDS = 50, 5.0
FINAL = {"completed", "failed", "cancelled", "expired"}
TARGETS_MS = {"run": 1_000.0, "review": 1_500.0}

# In the page (functions, not strings: the console's CSP forbids evaluating strings).
MARKED = "(mark) => performance.getEntriesByName(mark).length > 0"
MARK_TIME = "(mark) => performance.getEntriesByName(mark)[0].startTime"
IMAGES_LOADED = """(count) => {
  const images = [...document.querySelectorAll("#images img")];
  return images.length >= count && images.every((image) => image.complete);
}"""
# Counts animation frames from now for `ms` milliseconds.
COUNT_FRAMES = """(ms) => new Promise((resolve) => {
  const stamps = [];
  const start = performance.now();
  function tick(now) {
    stamps.push(now);
    if (now - start < ms) requestAnimationFrame(tick);
    else resolve(stamps);
  }
  requestAnimationFrame(tick);
})"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.page_load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="200 items in the full run")
    parser.add_argument("--loads", type=int, default=0, help="loads of each page (default 7)")
    args = parser.parse_args(argv)
    if shutil.which(CHROMIUM) is None:
        print(f"no Chromium at {CHROMIUM} (scripts/system-deps.sh installs it)")
        return 2
    seconds = 10 if args.quick else SECONDS
    loads = args.loads or (3 if args.quick else 7)
    console = Console(sys.stdout)
    with tempfile.TemporaryDirectory(prefix="bench-page-load-") as scratch:
        workdir = Path(scratch)
        footage = _footage(workdir / "recordings", seconds)
        with running_stack(workdir, console) as stack:
            _prepare(stack, footage, console, test_interval=2 * seconds / IMAGES)
            processor = stack.pids["processor"]
            live_run = _running_run(stack, processor, console)
            try:
                figures = asyncio.run(_measure(stack, loads, live_run))
            finally:
                os.kill(processor, signal.SIGCONT)
    print(
        f"RESULT run_page_ms={figures['run']:.0f} review_page_ms={figures['review']:.0f} "
        f"dropped_frames={figures['dropped']:.0f}"
    )
    return 0


def _footage(directory: Path, seconds: int) -> list[Footage]:
    """The demo's two cameras, `seconds` long each."""
    directory.mkdir(parents=True)
    made = []
    for camera_id, (codec, seed) in CAMERAS.items():
        scene = random_scene(seed, seconds=seconds)
        path = directory / f"{camera_id}.{'webm' if codec == 'vp9' else 'mp4'}"
        info = write_recording(path, scene, seconds=seconds, fps=10, codec=codec)
        made.append(Footage(camera_id, codec, path, scene, info))
    return made


def _prepare(
    stack: Stack, footage: list[Footage], console: Console, *, test_interval: float
) -> None:
    classes = script.publish_detector(stack, console)
    with console.stage("importing recordings (workshop recordings import)"):
        script.import_footage(stack, footage, datetime.now(UTC) - timedelta(days=1))
    cameras = [clip.camera_id for clip in footage]
    script.workshop_cli(stack, ["buckets", "create", script.BUCKET_ID], "buckets.log")
    with script.agent_client(stack) as http:
        for run_id, interval, mode, limit in (
            (TEST_RUN, test_interval, "test", IMAGES),
            (FULL_RUN, FULL_INTERVAL_S, "full", None),
        ):
            revision = _save_workflow(stack, run_id, cameras, classes, interval)
            began = time.perf_counter()
            with console.stage(f"{mode} run {run_id} (a frame every {interval} s)"):
                body = {
                    "id": run_id,
                    "workflow_id": run_id,
                    "runtime_id": stack.runtime_id,
                    "revision": revision,
                    "mode": mode,
                    "image_limit": limit,
                }
                script.answer_json(http.post(script.RUNS_PATH, json=body))
                run = _finished(http, run_id)
            counts = run["counts"]
            console.line(
                f"  {run['status']} in {time.perf_counter() - began:.1f} s: "
                f"{counts.get('slots_frame', 0)} frames, {counts.get('items_saved', 0)} items"
            )


def _save_workflow(
    stack: Stack, workflow_id: str, cameras: list[str], classes: list[str], interval: float
) -> int:
    spec = script.workflow_spec(cameras, classes)
    spec.graph.steps[1].sample.interval_seconds = interval
    document = stack.logs.parent / f"{workflow_id}.workflow.json"
    document.write_text(json.dumps(json_format.MessageToDict(spec)))
    saved = script.workshop_cli(
        stack, ["workflows", "save", workflow_id, str(document)], "save-workflow.log"
    )
    return int(saved["revision"])


def _finished(http: httpx.Client, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        answer = script.answer_json(http.get(f"{script.RUNS_PATH}/{run_id}"))
        run: dict[str, Any] = answer["detail"]["run"]
        if run["status"] in FINAL:
            return run
        time.sleep(0.5)
    raise RuntimeError(f"run {run_id} did not finish within 15 minutes")


def _running_run(stack: Stack, processor: int, console: Console) -> str:
    """A test run caught running: the processor is stopped (SIGSTOP) once the run has
    shown half its images, so the run page keeps its live socket open for the live load
    (the page opens none for a finished run). The caller continues the processor."""
    with script.agent_client(stack) as http:
        revision = script.answer_json(http.get(f"/v1/workshop/workflows/{TEST_RUN}"))
        for attempt in range(3):
            run_id = f"{LIVE_RUN}-{attempt}"
            body = {
                "id": run_id,
                "workflow_id": TEST_RUN,
                "runtime_id": stack.runtime_id,
                "revision": int(revision["workflow"]["revision"]),
                "mode": "test",
                "image_limit": IMAGES,
            }
            script.answer_json(http.post(script.RUNS_PATH, json=body))
            while True:
                answer = script.answer_json(http.get(f"{script.RUNS_PATH}/{run_id}"))
                shown = len(answer["detail"].get("recent_images", []))
                if answer["detail"]["run"]["status"] in FINAL:
                    break
                if shown >= IMAGES // 2:
                    os.kill(processor, signal.SIGSTOP)
                    console.line(f"live run {run_id}: processor paused at {shown} images")
                    return run_id
                time.sleep(0.05)
    raise RuntimeError("every live run finished before it could be caught running")


async def _measure(stack: Stack, loads: int, live_run: str) -> dict[str, float]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(
                base_url=stack.gateway, viewport={"width": 1280, "height": 800}
            )
            page = await context.new_page()
            await _sign_in(page, stack)
            run = await _loads(page, f"/#/run/{TEST_RUN}", "workshop:run-painted", loads, True)
            review = await _loads(page, f"/#/review/{FULL_RUN}", "review-shown", loads, False)
            dropped = await _live_load(page, live_run)
        finally:
            await browser.close()
    print()
    print(f"{'page':<10}{'median ms':>12}{'max ms':>10}{'all images ms':>16}")
    for name, (middle, slowest, images) in (("run", run), ("review", review)):
        extra = f"{images:>16.0f}" if images else f"{'-':>16}"
        target = "met" if middle <= TARGETS_MS[name] else "missed"
        goal = f"target {TARGETS_MS[name]:.0f}: {target}"
        print(f"{name:<10}{middle:>12.0f}{slowest:>10.0f}{extra}   {goal}")
    return {"run": run[0], "review": review[0], "dropped": dropped}


async def _sign_in(page: Page, stack: Stack) -> None:
    await page.goto("/#/login")
    await page.get_by_label("User id").fill(stack.user.user_id)
    await page.get_by_label("Password").fill(stack.user.password)
    await page.get_by_role("button", name="Sign in").click()
    await page.get_by_role("heading", name="Runs").wait_for()


async def _loads(
    page: Page, fragment: str, mark: str, loads: int, images: bool
) -> tuple[float, float, float]:
    """(median, slowest) milliseconds from navigation start to the page's `mark` over
    `loads` fresh document loads, and the median time until every image had loaded."""
    painted: list[float] = []
    loaded: list[float] = []
    for _ in range(loads + 1):  # the first load warms the browser's and services' caches
        await page.goto("about:blank")
        await page.goto(fragment)
        await page.wait_for_function(MARKED, arg=mark)
        painted.append(await page.evaluate(MARK_TIME, mark))
        if images:
            await page.wait_for_function(IMAGES_LOADED, arg=IMAGES)
            loaded.append(await page.evaluate("performance.now()"))
    painted, loaded = painted[1:], loaded[1:]
    return (
        median(painted),
        max(painted),
        median(loaded) if loaded else 0.0,
    )


async def _live_load(page: Page, run_id: str) -> float:
    """Dropped frames while LIVE_RATE messages a second arrive for LIVE_SECONDS."""
    routes: list[WebSocketRoute] = []
    first: list[dict[str, Any]] = []
    arrived = asyncio.Event()

    def relay(route: WebSocketRoute) -> None:
        server = route.connect_to_server()

        def forward(message: str | bytes) -> None:
            if isinstance(message, str) and not first:
                first.append(json.loads(message))
                arrived.set()
            route.send(message)

        server.on_message(forward)
        routes.append(route)

    await page.route_web_socket(f"**/api/workshop/runs/{run_id}/live", relay)
    await page.goto("about:blank")
    await page.goto(f"/#/run/{run_id}")
    await page.wait_for_function(MARKED, arg="workshop:run-painted")
    await asyncio.wait_for(arrived.wait(), timeout=30)
    [route] = routes
    # The same page with no messages arriving: what this machine drops anyway.
    quiet: list[float] = await page.evaluate(COUNT_FRAMES, 2000)
    counting = asyncio.ensure_future(page.evaluate(COUNT_FRAMES, LIVE_SECONDS * 1000))
    began = time.perf_counter()
    for number in range(int(LIVE_RATE * LIVE_SECONDS)):
        route.send(json.dumps(_variant(first[0], number)))
        await asyncio.sleep(max(0.0, began + (number + 1) / LIVE_RATE - time.perf_counter()))
    stamps: list[float] = await counting
    dropped = _dropped(stamps)
    taken = await page.get_attribute("#live-note", "data-messages")
    print(
        f"live: {int(LIVE_RATE * LIVE_SECONDS)} messages sent in {time.perf_counter() - began:.1f}"
        f" s, {taken} taken by the page; {len(stamps) - 1} frames in {stamps[-1] - stamps[0]:.0f}"
        f" ms: {dropped:.0f} of {_expected(stamps):.0f} dropped at 60 Hz, longest gap "
        f"{_longest(stamps):.0f}"
        f" ms (no messages: {_dropped(quiet):.0f} of {_expected(quiet):.0f} dropped)"
    )
    return dropped


def _expected(stamps: list[float]) -> float:
    return (stamps[-1] - stamps[0]) / (1000 / 60)


def _dropped(stamps: list[float]) -> float:
    """Frames a 60 Hz display would have shown between the first and last stamp that the
    page did not paint."""
    return max(0.0, _expected(stamps) - (len(stamps) - 1))


def _longest(stamps: list[float]) -> float:
    return max(later - earlier for earlier, later in itertools.pairwise(stamps))


def _variant(message: dict[str, Any], number: int) -> dict[str, Any]:
    """The run's real message with its jobs' progress moved and its images rotated."""
    varied = copy.deepcopy(message)
    varied["seq"] = int(message.get("seq", 0)) + number + 1
    varied["final"] = False
    detail = varied["detail"]
    detail["run"]["status"] = "running"
    for job in detail.get("jobs", []):
        job["state"] = "leased"
        job["progress_percent"] = number % 100
    images = detail.get("recent_images", [])
    if images:
        shift = number % len(images)
        detail["recent_images"] = images[shift:] + images[:shift]
    return varied


if __name__ == "__main__":
    sys.exit(main())
