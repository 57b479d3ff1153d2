"""What the demo hands a person before its run starts, so they can follow the run and
keep using the stack: the web console's address and the demo user's password first; with
`--keep` also the exports with which `workshop runs list` works when pasted into a shell,
every service's metrics endpoint, `workshop doctor` on the demo's processor, the stack's
endpoints and keys, and `curl` and `grpcurl` commands to try.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

from tools.demo import script
from tools.demo.stack import PREVIEW_BUCKET, RECORDINGS_BUCKET, Stack
from tools.demo.workdir import stop_hint
from workshop.kit.cli import COORDINATOR_ENV, KEY_ENV


def console_line(stack: Stack) -> str:
    user = stack.user
    return f"open {stack.gateway}/ and sign in as {user.user_id} / {user.password}"


def short(stack: Stack) -> list[str]:
    """Without --keep: the console, for as long as the run lasts."""
    return [
        console_line(stack),
        "  (until the run ends: `make demo ARGS=--keep` keeps the stack running after it)",
    ]


def stopping(stack: Stack) -> str:
    return f"Ctrl-C, SIGTERM, closing this terminal or `{stop_hint(stack.workdir)}` stops it"


def full(stack: Stack) -> list[str]:
    """With --keep: everything a person needs to use the stack after the run."""
    bin_dir = Path(sys.executable).parent
    workshop = bin_dir / "workshop"
    cli = str(workshop) if workshop.exists() else f"{sys.executable} -m tools.cli"
    grpcurl = shutil.which("grpcurl", path=str(bin_dir)) or "grpcurl"
    # The command line's settings (docs/cli.md): the coordinator and admin key, the preview
    # service (buckets export), and S3 (recordings import).
    cli_env = {
        COORDINATOR_ENV: stack.coordinator,
        KEY_ENV: stack.admin_key,
        "WORKSHOP_PREVIEW": stack.preview,
        "WORKSHOP_S3_ENDPOINT": stack.s3.endpoint,
        "WORKSHOP_S3_ACCESS_KEY": stack.s3.access_key,
        "WORKSHOP_S3_SECRET_KEY": stack.s3.secret_key,
        "WORKSHOP_RECORDINGS_BUCKET": RECORDINGS_BUCKET,
    }
    processor = " ".join(f"{k}={shlex.quote(v)}" for k, v in stack.processor_env.items())
    s3 = stack.s3
    user = stack.user
    gateway = stack.gateway
    return [
        console_line(stack),
        "",
        "the command line as the operator (admin key): paste into a shell",
        *(f"  export {name}={shlex.quote(value)}" for name, value in cli_env.items()),
        f"  {cli} runs list",
        "",
        "metrics (Prometheus, GET):",
        *(f"  {name:<12} {url}" for name, url in stack.metrics.items()),
        "",
        "the demo's processor host checked as its processor meets it (after the exports above):",
        f"  env {processor} {cli} doctor",
        "",
        "the stack:",
        f"  coordinator  {stack.coordinator}  (OperatorService, WorkshopService, JobService)",
        f"  preview      {stack.preview}  (PreviewService)",
        f"  gateway      {gateway}  (web console at /; HTTP API: /api with a session cookie, "
        "/v1 with an Agent key; docs/http-api.md)",
        f"  openapi      {gateway}/v1/openapi.json",
        f"  demo user    {user.user_id}  password {user.password}  (sign in: the console, or "
        "POST /api/session)",
        f"  agent key    {user.agent_key}  (user {user.user_id}, scope workshop)",
        f"  processor    {stack.processor}  (health; runtime {stack.runtime_id})",
        f"  triton       {stack.triton.grpc_url}  (gRPC), {stack.triton.http_url}",
        f"  postgres     {stack.database_url}",
        f"  s3           http://{s3.endpoint}  access key {s3.access_key}  "
        f"secret key {s3.secret_key}  buckets {PREVIEW_BUCKET}, {RECORDINGS_BUCKET}",
        f"  admin key    {stack.admin_key}",
        f"  work dir     {stack.workdir}",
        f"  stop         Ctrl-C here, SIGTERM, closing this terminal, or "
        f"`{stop_hint(stack.workdir)}` from any terminal",
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
        "",
    ]


def kept(stack: Stack) -> str:
    """The line after a kept demo's run: the stack still runs, and how to stop it."""
    return (
        f"the stack keeps running (console {stack.gateway}/ as {stack.user.user_id}; "
        f"everything printed before the run holds); {stopping(stack)}"
    )
