"""The demo's scenario on a running stack: publish the demo detector, import two cameras'
recordings, save a workflow, run a test run of 20 images and follow it live.

Every step goes through the public surfaces people use. An operator's: the `workshop`
command line (`python -m tools.cli`, admin key) publishes the model, imports the footage
(upload, digest, camera and recording) and saves the bucket and the workflow. A user's,
through the gateway with the demo user's Agent key: the run is created with
`POST /v1/workshop/runs` and followed on its live WebSocket,
`/v1/workshop/runs/{run_id}/live` (docs/http-api.md).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, time
from time import monotonic
from typing import Any

import httpx
from google.protobuf import json_format
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tools.demo.footage import Footage
from tools.demo.stack import CALL_TIMEOUT_S, RECORDINGS_BUCKET, Stack
from tools.demo.terminal import Console
from tools.localstack.host import tail
from tools.localstack.processes import run_module
from workshop.kit.jsonmap import enum_word, from_json
from workshop.v1 import common_pb2, run_pb2, workflow_pb2

MODEL = "demo_detector"
MODEL_VERSION = 1
WORKFLOW_ID = "yard-watch"
BUCKET_ID = "yard"
RUN_ID = "demo-run"
IMAGE_LIMIT = 20
# The gateway's routes the demo uses (docs/http-api.md), under /v1 for Agent keys.
RUNS_PATH = "/v1/workshop/runs"
LIVE_PATH = "/v1/workshop/runs/{run_id}/live"
IMAGE_PATH = "/v1/workshop/runs/{run_id}/previews/{item_id}/image"
# 30 s recordings sampled every 3 s: 10 slots per camera, 20 in all.
INTERVAL_SECONDS = 3
RECORDING_START = time(8, 0)
WINDOW = (8, 9)  # hours, UTC
# 20 frames take seconds; a run still unfinished after this is stuck (see the logs).
WATCH_TIMEOUT_S = 180.0
FINAL = (
    common_pb2.RUN_STATUS_COMPLETED,
    common_pb2.RUN_STATUS_FAILED,
    common_pb2.RUN_STATUS_CANCELLED,
    common_pb2.RUN_STATUS_EXPIRED,
)


def workshop_cli(stack: Stack, args: list[str], log: str, env: dict[str, str] | None = None) -> Any:
    """`workshop -o json ARGS` as the operator runs it; its JSON answer."""
    printed = run_module(
        "tools.cli",
        ["-o", "json", *args],
        {**stack.operator_env(), **(env or {})},
        stack.logs / log,
        base_env=stack.base_env,
    )
    return json.loads(printed)


def publish_detector(stack: Stack, console: Console) -> list[str]:
    """`workshop models publish --demo-detector`; returns the model's classes."""
    with console.stage(
        f"publishing the demo detector {MODEL} v{MODEL_VERSION} (workshop models publish)"
    ):
        published = workshop_cli(
            stack,
            [
                "models",
                "publish",
                "--repository",
                str(stack.triton.model_repository),
                "--name",
                MODEL,
                "--version",
                str(MODEL_VERSION),
                "--demo-detector",
            ],
            "publish-model.log",
        )
    return [str(name) for name in published["classes"]]


def import_footage(stack: Stack, footage: list[Footage], day: datetime) -> None:
    """`workshop recordings import`: each recording uploaded to the recordings bucket, its
    duration, fps and digest read from the file, camera and recording registered."""
    start = datetime.combine(day.date(), RECORDING_START, tzinfo=UTC)
    s3 = {
        "WORKSHOP_S3_ENDPOINT": stack.s3.endpoint,
        "WORKSHOP_S3_ACCESS_KEY": stack.s3.access_key,
        "WORKSHOP_S3_SECRET_KEY": stack.s3.secret_key,
        "WORKSHOP_RECORDINGS_BUCKET": RECORDINGS_BUCKET,
    }
    for clip in footage:
        workshop_cli(
            stack,
            [
                "recordings",
                "import",
                str(clip.path),
                "--camera",
                clip.camera_id,
                "--camera-name",
                f"demo {clip.codec} camera",
                "--start",
                start.isoformat(),
            ],
            "import-recordings.log",
            s3,
        )


def save_workflow(stack: Stack, cameras: list[str], classes: list[str]) -> int:
    """`workshop buckets create` and `workshop workflows save` from a file in the work
    directory; returns the saved revision."""
    workshop_cli(stack, ["buckets", "create", BUCKET_ID, "--name", "Yard"], "save-workflow.log")
    document = stack.logs.parent / f"{WORKFLOW_ID}.workflow.json"
    spec = workflow_spec(cameras, classes)
    document.write_text(
        json.dumps(json_format.MessageToDict(spec, preserving_proto_field_name=True), indent=2)
    )
    saved = workshop_cli(
        stack,
        ["workflows", "save", WORKFLOW_ID, str(document), "--expected-revision", "0"],
        "save-workflow.log",
    )
    return int(saved["revision"])


def workflow_spec(cameras: list[str], classes: list[str]) -> workflow_pb2.WorkflowSpec:
    """Yesterday 08:00-09:00 UTC of every camera, a frame every 3 s, labelled by the
    detector; frames with any class scoring 0.5 are saved to the bucket, others dropped."""
    next_ = workflow_pb2.EDGE_BRANCH_NEXT
    steps = [
        workflow_pb2.Step(
            step_id="in",
            input=workflow_pb2.InputStep(
                camera_ids=cameras,
                day=workflow_pb2.INPUT_DAY_PREVIOUS_DAY,
                window_start=common_pb2.TimeOfDay(hours=WINDOW[0]),
                window_end=common_pb2.TimeOfDay(hours=WINDOW[1]),
            ),
        ),
        workflow_pb2.Step(
            step_id="sample", sample=workflow_pb2.SampleStep(interval_seconds=INTERVAL_SECONDS)
        ),
        workflow_pb2.Step(step_id="detect", model=workflow_pb2.ModelStep(model_name=MODEL)),
        workflow_pb2.Step(
            step_id="rule", rule=workflow_pb2.RuleStep(class_names=classes, min_score=0.5)
        ),
        workflow_pb2.Step(step_id="save", output=workflow_pb2.OutputStep(bucket_id=BUCKET_ID)),
        workflow_pb2.Step(step_id="drop", do_nothing=workflow_pb2.DoNothingStep()),
    ]
    edges = [
        workflow_pb2.Edge(from_step_id="in", to_step_id="sample", branch=next_),
        workflow_pb2.Edge(from_step_id="sample", to_step_id="detect", branch=next_),
        workflow_pb2.Edge(from_step_id="detect", to_step_id="rule", branch=next_),
        workflow_pb2.Edge(
            from_step_id="rule", to_step_id="save", branch=workflow_pb2.EDGE_BRANCH_MATCH
        ),
        workflow_pb2.Edge(
            from_step_id="rule", to_step_id="drop", branch=workflow_pb2.EDGE_BRANCH_NO_MATCH
        ),
    ]
    return workflow_pb2.WorkflowSpec(
        name="Yard watch (demo)",
        time_zone="UTC",
        graph=workflow_pb2.WorkflowGraph(steps=steps, edges=edges),
    )


def agent_client(stack: Stack) -> httpx.Client:
    """An HTTP client of the gateway's `/v1` API with the demo user's Agent key."""
    return httpx.Client(
        base_url=stack.gateway,
        headers={"Authorization": f"Bearer {stack.user.agent_key}"},
        timeout=CALL_TIMEOUT_S,
    )


def create_run(http: httpx.Client, stack: Stack, console: Console, revision: int) -> None:
    """`POST /v1/workshop/runs` with the demo user's Agent key, printed as docs/http-api.md
    shows a request."""
    body = {
        "id": RUN_ID,
        "workflow_id": WORKFLOW_ID,
        "runtime_id": stack.runtime_id,
        "revision": revision,
        "mode": "test",
        "image_limit": IMAGE_LIMIT,
    }
    console.line(f"POST {RUNS_PATH} {json.dumps(body)}")
    response = http.post(RUNS_PATH, json=body)
    run = answer_json(response)["run"]
    creator = run["created_by"]
    console.line(
        f"  -> {response.status_code}: run {run['run_id']} {run['status']}, created by user "
        f"{creator['user_id']} (key {creator['key_id']})"
    )


def follow_run(stack: Stack, console: Console) -> run_pb2.RunDetail:
    """Draw a progress bar from the run's live WebSocket until a message is `final`; the
    run's detail as of that message. Each message is `{"seq", "sent_at", "final",
    "detail"}`, the detail a RunDetail as JSON (docs/http-api.md)."""
    url = live_url(stack, RUN_ID)
    console.line(f"GET {url} (WebSocket, Agent key)")
    deadline = monotonic() + WATCH_TIMEOUT_S
    headers = {"Authorization": f"Bearer {stack.user.agent_key}"}
    try:
        with connect(url, additional_headers=headers, open_timeout=CALL_TIMEOUT_S) as live:
            while True:
                remaining = deadline - monotonic()
                if remaining <= 0:
                    raise TimeoutError
                message = json.loads(live.recv(timeout=remaining))
                detail = from_json(message["detail"], run_pb2.RunDetail)
                _draw(console, detail)
                if message["final"] or detail.run.status in FINAL:
                    return detail
    except TimeoutError:
        log = stack.logs / "processor.log"
        raise RuntimeError(
            f"run {RUN_ID} did not finish within {WATCH_TIMEOUT_S:.0f} s; the processor's "
            f"last lines ({log}):\n{tail(log, 10)}"
        ) from None
    except InvalidStatus as refused:
        answer = refused.response
        raise RuntimeError(
            f"the gateway refused the live socket {url}: {answer.status_code} "
            f"{bytes(answer.body).decode(errors='replace')[:200]}"
        ) from None
    except ConnectionClosed as closed:
        code, reason = (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else (None, "")
        log = stack.logs / "gateway.log"
        raise RuntimeError(
            f"the live socket of run {RUN_ID} closed before the run finished ({code} "
            f"{reason!r}); the gateway's last lines ({log}):\n{tail(log, 10)}"
        ) from None
    finally:
        console.end_progress()


def live_url(stack: Stack, run_id: str) -> str:
    return "ws" + stack.gateway.removeprefix("http") + LIVE_PATH.format(run_id=run_id)


def image_path(run_id: str, item_id: str) -> str:
    return IMAGE_PATH.format(run_id=run_id, item_id=item_id)


class GatewayRefused(RuntimeError):
    """The gateway answered an error (its JSON shape: docs/http-api.md, Errors)."""


def answer_json(response: httpx.Response) -> dict[str, Any]:
    """The JSON body of a 2xx answer; GatewayRefused with the error's reason otherwise."""
    if response.is_success:
        body: dict[str, Any] = response.json()
        return body
    raise GatewayRefused(refusal(response))


def refusal(response: httpx.Response) -> str:
    request = response.request
    what = f"{request.method} {request.url.path} answered {response.status_code}"
    try:
        error = response.json()
        return f"{what} {error['reason']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return f"{what}: {response.text[:200]}"


def _draw(console: Console, detail: run_pb2.RunDetail) -> None:
    run = detail.run
    counts = run.counts
    committed = counts.slots_frame + counts.slots_empty + counts.slots_dropped
    # Previews appear frame by frame; slots are committed per job, when the job completes.
    done = max(committed, counts.previews_published)
    finished = counts.jobs_completed + counts.jobs_failed + counts.jobs_cancelled
    status = enum_word(common_pb2.RunStatus.DESCRIPTOR, run.status)
    console.progress(
        f"run {RUN_ID}",
        int(done),
        int(counts.slots_expected),
        f"frames, {finished}/{counts.jobs_total} jobs done, {status}",
    )
