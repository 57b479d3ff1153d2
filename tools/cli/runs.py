"""`workshop runs create|list|get|watch|cancel|explain` (WorkshopService, docs/runs-and-jobs.md)."""

from __future__ import annotations

import enum
from typing import Any

import grpc
import typer

from tools.cli import explain as explaining
from tools.cli import watch as watching
from tools.cli.context import Options, options, run
from tools.cli.output import as_dict, emit
from tools.cli.paging import IMAGE_LIMIT_HELP, limit_option
from workshop.kit.cli import Metadata
from workshop.kit.jsonmap import enum_word
from workshop.v1 import common_pb2, run_pb2, workshop_pb2_grpc
from workshop.v1 import workshop_pb2 as ws

app = typer.Typer(help="Create, follow, explain and cancel runs.", no_args_is_help=True)

MODES = {"test": common_pb2.RUN_MODE_TEST, "full": common_pb2.RUN_MODE_FULL}


def _stub(channel: grpc.aio.Channel) -> workshop_pb2_grpc.WorkshopServiceAsyncStub:
    return workshop_pb2_grpc.WorkshopServiceStub(channel)


def run_row(run: run_pb2.Run) -> dict[str, Any]:
    """A run in one table row."""
    c = run.counts
    done = c.jobs_completed + c.jobs_failed + c.jobs_cancelled + c.jobs_expired
    return {
        "run": run.run_id,
        "status": enum_word(common_pb2.RunStatus.DESCRIPTOR, run.status),
        "mode": enum_word(common_pb2.RunMode.DESCRIPTOR, run.mode),
        "workflow": f"{run.workflow_id}@{run.workflow_revision}",
        "jobs done": f"{done}/{c.jobs_total}",
        "slots": c.slots_expected,
        "created": run.created_at.ToJsonString(),
    }


@app.command()
def create(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="your id for the run; a retry with it is safe"),
    workflow: str = typer.Option(..., "--workflow", "-w", help="workflow id"),
    runtime: str = typer.Option(
        "", help="runtime id; default: the newest that checked in (ChooseRuntime NEWEST)"
    ),
    revision: int = typer.Option(0, help="workflow revision; default: its current one"),
    mode: str = typer.Option("test", help="test (expiring previews) or full (saves to buckets)"),
    image_limit: int | None = typer.Option(None, help=IMAGE_LIMIT_HELP),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="print the jobs, slots and model pins; create nothing"
    ),
) -> None:
    """Create a run of a workflow (CreateRun), or plan one with --dry-run."""
    opts = options(ctx)
    if mode not in MODES:
        raise typer.BadParameter("must be test or full", param_hint="--mode")

    async def call(channel: grpc.aio.Channel, md: Metadata) -> ws.CreateRunResponse:
        stub = _stub(channel)
        current = revision
        if not current:
            got = await stub.GetWorkflow(ws.GetWorkflowRequest(workflow_id=workflow), metadata=md)
            current = got.workflow.revision
        chosen = runtime
        if not chosen:
            picked = await stub.ChooseRuntime(
                ws.ChooseRuntimeRequest(workflow_id=workflow, choice=ws.RUNTIME_CHOICE_NEWEST),
                metadata=md,
            )
            chosen = picked.runtime.runtime_id
        request = ws.CreateRunRequest(
            run_id=run_id,
            workflow_id=workflow,
            runtime_id=chosen,
            revision=current,
            mode=MODES[mode],
            validate_only=dry_run,
        )
        if image_limit is not None:
            request.image_limit = image_limit
        reply: ws.CreateRunResponse = await stub.CreateRun(request, metadata=md)
        return reply

    reply = run(opts, call)
    if dry_run:
        _print_plan(opts, reply)
        return
    emit(
        opts,
        {"created": reply.created, "run": as_dict(reply.run)},
        table=[run_row(reply.run) | {"created now": reply.created}],
    )


def _print_plan(opts: Options, reply: ws.CreateRunResponse) -> None:
    snapshot = reply.planned_snapshot
    jobs = [
        {
            "job": job.job_id,
            "camera": job.camera_id,
            "recording": job.recording_id,
            "slots": job.slot_count,
        }
        for job in reply.planned_jobs
    ]
    models = [
        {
            "step": m.step_id,
            "model": m.name,
            "version": m.version,
            "from latest": m.resolved_from_latest,
            "weights_sha256": m.weights_sha256,
        }
        for m in snapshot.models
    ]
    plan = {
        "run_id": snapshot.run_id,
        "workflow_id": snapshot.workflow_id,
        "revision": snapshot.workflow_revision,
        "runtime_id": snapshot.runtime_id,
        "jobs": jobs,
        "slots": sum(job.slot_count for job in reply.planned_jobs),
        "models": models,
        "snapshot": as_dict(snapshot),
    }
    if opts.json:
        emit(opts, plan)
        return
    title = (
        f"dry run: {snapshot.run_id} would run {snapshot.workflow_id}@"
        f"{snapshot.workflow_revision} on {snapshot.runtime_id}: {len(jobs)} jobs, "
        f"{plan['slots']} slots (nothing was created)"
    )
    emit(opts, plan, table=jobs, title=title)
    emit(opts, models, table=models, title="model pins")


class RunStatusName(enum.StrEnum):
    """A run's status as `runs list --status` takes it."""

    queued = "queued"
    running = "running"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"
    expired = "expired"


class RunModeName(enum.StrEnum):
    test = "test"
    full = "full"


@app.command("list")
def list_runs(
    ctx: typer.Context,
    workflow: str = typer.Option("", "--workflow", "-w", help="only this workflow's runs"),
    status: RunStatusName | None = typer.Option(None, help="only runs in this status now"),
    mode: RunModeName | None = typer.Option(None, help="only test or only full runs"),
    limit: int = limit_option("newest first"),
) -> None:
    """List recent runs, newest first (ListRuns)."""
    opts = options(ctx)
    request = ws.ListRunsRequest(
        workflow_id=workflow,
        page_size=limit,
        status=common_pb2.RunStatus.Value(f"RUN_STATUS_{status.upper()}")
        if status
        else common_pb2.RUN_STATUS_UNSPECIFIED,
        mode=common_pb2.RunMode.Value(f"RUN_MODE_{mode.upper()}")
        if mode
        else common_pb2.RUN_MODE_UNSPECIFIED,
    )

    async def call(channel: grpc.aio.Channel, md: Metadata) -> ws.ListRunsResponse:
        reply: ws.ListRunsResponse = await _stub(channel).ListRuns(request, metadata=md)
        return reply

    reply = run(opts, call)
    entries = [as_dict(entry) for entry in reply.runs]
    if opts.output == "jsonl":
        for entry in entries:
            emit(opts, entry)
        return
    emit(opts, entries, table=[run_row(entry.run) for entry in reply.runs], title="runs")


def get_detail(opts: Options, run_id: str) -> run_pb2.RunDetail:
    async def call(channel: grpc.aio.Channel, md: Metadata) -> run_pb2.RunDetail:
        reply = await _stub(channel).GetRun(ws.GetRunRequest(run_id=run_id), metadata=md)
        return reply.detail

    return run(opts, call)


@app.command()
def get(ctx: typer.Context, run_id: str = typer.Argument(..., help="run id")) -> None:
    """Show a run: status, counts and each job (GetRun)."""
    opts = options(ctx)
    detail = get_detail(opts, run_id)
    if opts.json:
        emit(opts, as_dict(detail))
        return
    emit(opts, {}, table=[run_row(detail.run)], title=f"run {run_id}")
    emit(opts, {}, table=[watching.job_row(job) for job in detail.jobs], title="jobs")


@app.command()
def watch(ctx: typer.Context, run_id: str = typer.Argument(..., help="run id")) -> None:
    """Follow a run until it ends (WatchRun): a progress bar per job, or with `--output
    jsonl` one JSON object per update. Exit code: 0 completed, 3 failed, 4 cancelled,
    5 expired, 6 the watch was interrupted."""
    raise typer.Exit(watching.follow(options(ctx), run_id))


@app.command()
def cancel(ctx: typer.Context, run_id: str = typer.Argument(..., help="run id")) -> None:
    """Cancel a run's queued and leased jobs (CancelRun; a finished run stays as it is)."""
    opts = options(ctx)

    async def call(channel: grpc.aio.Channel, md: Metadata) -> ws.CancelRunResponse:
        reply: ws.CancelRunResponse = await _stub(channel).CancelRun(
            ws.CancelRunRequest(run_id=run_id), metadata=md
        )
        return reply

    reply = run(opts, call)
    emit(
        opts,
        {"run": as_dict(reply.run), "jobs_cancelled": reply.jobs_cancelled},
        table=[run_row(reply.run) | {"jobs cancelled now": reply.jobs_cancelled}],
    )


@app.command()
def explain(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="run id"),
    all_jobs: bool = typer.Option(
        False, "--all-jobs", help="every job's attempts, not only those of jobs that met trouble"
    ),
) -> None:
    """Why a run waits (the runs ahead of it) or failed (each failed job's reason, message
    and the fence that refused it), and its timeline: each job's attempts in order (who
    claimed it, lapses with the heartbeats missed, hand-backs, fence refusals, the end)."""
    opts = options(ctx)
    detail = get_detail(opts, run_id)
    explanation = explaining.explain(detail, get_timeline(opts, run_id))
    if opts.json:
        emit(opts, explanation)
        return
    for line in explaining.lines(explanation, all_jobs=all_jobs):
        print(line)


def get_timeline(opts: Options, run_id: str) -> list[run_pb2.JobTimeline]:
    """Every job of the run's timeline (GetRunTimeline, page after page)."""

    async def call(channel: grpc.aio.Channel, md: Metadata) -> list[run_pb2.JobTimeline]:
        jobs: list[run_pb2.JobTimeline] = []
        token = ""
        while True:
            reply = await _stub(channel).GetRunTimeline(
                ws.GetRunTimelineRequest(run_id=run_id, page_size=1000, page_token=token),
                metadata=md,
            )
            jobs.extend(reply.jobs)
            token = reply.next_page_token
            if not token:
                return jobs

    return run(opts, call)
