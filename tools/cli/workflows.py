"""`workshop workflows save|validate|get|list`: workflow documents from and to JSON files
(the WorkflowSpec in proto JSON, as the HTTP API's `spec`; docs/workflows.md)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import typer
from google.protobuf import json_format

from tools.cli.context import fail, options, run
from tools.cli.output import as_dict, emit
from tools.cli.paging import limit_option
from workshop.kit.cli import Metadata
from workshop.v1 import workflow_pb2, workshop_pb2_grpc
from workshop.v1 import workshop_pb2 as ws

app = typer.Typer(help="Save, validate and fetch workflow documents.", no_args_is_help=True)


def read_spec(path: Path) -> workflow_pb2.WorkflowSpec:
    """The WorkflowSpec in `path`; a file that is not one ends the command (INVALID_FIELD)."""
    try:
        text = path.read_text()
    except OSError as error:
        fail("INVALID_FIELD", f"cannot read {path}: {error.strerror}")
    try:
        return json_format.Parse(text, workflow_pb2.WorkflowSpec())
    except json_format.ParseError as error:
        fail("INVALID_FIELD", f"{path} is not a workflow document: {error}")


def _stub(channel: grpc.aio.Channel) -> workshop_pb2_grpc.WorkshopServiceAsyncStub:
    return workshop_pb2_grpc.WorkshopServiceStub(channel)


def _summary(workflow: workflow_pb2.Workflow) -> dict[str, object]:
    return {
        "workflow": workflow.workflow_id,
        "revision": workflow.revision,
        "name": workflow.spec.name,
        "steps": len(workflow.spec.graph.steps),
        "updated": workflow.updated_at.ToJsonString(),
    }


@app.command()
def save(
    ctx: typer.Context,
    workflow_id: str = typer.Argument(..., help="workflow id"),
    file: Path = typer.Argument(..., help="JSON file holding the WorkflowSpec"),
    expected_revision: int | None = typer.Option(
        None,
        help="the revision you edited (0 creates the workflow); default: 0 when the workflow "
        "does not exist, else its current revision",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate only; save nothing"),
) -> None:
    """Save a workflow from a file (SaveWorkflow); it must validate."""
    opts = options(ctx)
    spec = read_spec(file)
    if dry_run:
        _validate(ctx, spec, file)
        return

    async def call(channel: grpc.aio.Channel, md: Metadata) -> workflow_pb2.Workflow:
        stub = _stub(channel)
        expected = expected_revision
        if expected is None:
            try:
                got = await stub.GetWorkflow(
                    ws.GetWorkflowRequest(workflow_id=workflow_id), metadata=md
                )
                expected = got.workflow.revision
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                expected = 0
        reply = await stub.SaveWorkflow(
            ws.SaveWorkflowRequest(workflow_id=workflow_id, expected_revision=expected, spec=spec),
            metadata=md,
        )
        return reply.workflow

    workflow = run(opts, call)
    emit(opts, as_dict(workflow), table=[_summary(workflow)], title="saved")


def _validate(ctx: typer.Context, spec: workflow_pb2.WorkflowSpec, file: Path) -> None:
    opts = options(ctx)

    async def call(channel: grpc.aio.Channel, md: Metadata) -> ws.ValidateWorkflowResponse:
        reply: ws.ValidateWorkflowResponse = await _stub(channel).ValidateWorkflow(
            ws.ValidateWorkflowRequest(spec=spec), metadata=md
        )
        return reply

    reply = run(opts, call)
    problems = [
        {
            "kind": workflow_pb2.ValidationProblemKind.Name(p.kind),
            "path": p.path,
            "step": p.step_id,
            "message": p.message,
        }
        for p in reply.problems
    ]
    if opts.json:
        emit(opts, as_dict(reply))
    elif reply.valid:
        needs = ", ".join(reply.required_capabilities) or "none"
        print(f"{file}: valid (runtime capabilities needed: {needs})")
    else:
        emit(opts, problems, table=problems, title=f"{file}: {len(problems)} problem(s)")
    if not reply.valid:
        fail("VALIDATION_FAILED", f"{file} has {len(problems)} problem(s)")


@app.command()
def validate(
    ctx: typer.Context, file: Path = typer.Argument(..., help="JSON file holding the WorkflowSpec")
) -> None:
    """Validate a workflow file against the current catalog without saving it (exit 1 with
    every problem when it does not validate)."""
    _validate(ctx, read_spec(file), file)


@app.command()
def get(
    ctx: typer.Context,
    workflow_id: str = typer.Argument(..., help="workflow id"),
    file: Path | None = typer.Option(
        None, "--file", "-f", help="write the WorkflowSpec here (a file `save` takes back)"
    ),
) -> None:
    """Fetch a workflow at its current revision (GetWorkflow)."""
    opts = options(ctx)

    async def call(channel: grpc.aio.Channel, md: Metadata) -> workflow_pb2.Workflow:
        reply = await _stub(channel).GetWorkflow(
            ws.GetWorkflowRequest(workflow_id=workflow_id), metadata=md
        )
        return reply.workflow

    workflow = run(opts, call)
    if file is not None:
        spec = json_format.MessageToDict(workflow.spec, preserving_proto_field_name=True)
        try:
            file.write_text(json.dumps(spec, indent=2) + "\n")
        except OSError as error:
            fail("INVALID_FIELD", f"cannot write {file}: {error.strerror}")
    emit(opts, as_dict(workflow), table=[_summary(workflow)], title=f"workflow {workflow_id}")


@app.command("list")
def list_workflows(
    ctx: typer.Context, limit: int = limit_option("most recently saved first")
) -> None:
    """List workflows, most recently saved first."""
    opts = options(ctx)

    async def call(channel: grpc.aio.Channel, md: Metadata) -> ws.ListWorkflowsResponse:
        reply: ws.ListWorkflowsResponse = await _stub(channel).ListWorkflows(
            ws.ListWorkflowsRequest(page_size=limit), metadata=md
        )
        return reply

    reply = run(opts, call)
    emit(
        opts,
        [as_dict(w) for w in reply.workflows],
        table=[_summary(w) for w in reply.workflows],
        title="workflows",
    )
