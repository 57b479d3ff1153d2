"""Workflow documents (docs/workflows.md): the `Workflows` service saves, reads, lists,
deletes and validates them, lists the catalog a document may name and chooses a runtime
for one.

A document is the WorkflowSpec contract message, stored as JSON with its revision; every
save is validated against the catalog in the transaction that stores it. Runs read a
workflow through the public functions at the end of this module, inside their own
transaction.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, time
from typing import Any

from google.protobuf import json_format

from services.coordinator.identity import auth
from services.coordinator.identity.auth import Principal, ScopeName
from services.coordinator.platform.clock import Clock
from services.coordinator.platform.db import (
    Connection,
    Database,
    Row,
    bind,
    fetch_all,
    fetch_one,
    sql,
)
from services.coordinator.platform.errors import (
    IdConflict,
    NotFound,
    StaleRevision,
    WorkflowInvalid,
)
from services.coordinator.platform.fields import check_id
from services.coordinator.resources import registry
from services.coordinator.resources.registry import CatalogRows, RuntimeRow
from services.coordinator.workflows import validation
from services.coordinator.workflows.workflows_params import WorkflowInsert, WorkflowUpdate
from workshop.kit.bounds import METADATA_MAX_BYTES
from workshop.kit.errors import PayloadTooLarge
from workshop.v1 import workflow_pb2

MAX_DOCUMENT_BYTES = 64 * 1024

# Deleting a workflow cancels its unfinished runs in the same transaction. Runs sit above
# workflows, so the deletion is given the runs room's cancellation (app.py wires it):
# (connection, workflow_id, now) -> the ids of the runs cancelled.
CancelRuns = Callable[[Connection, str, datetime], Awaitable[list[str]]]


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowRow(Row):
    workflow_id: str
    revision: int
    spec: dict[str, object]  # the WorkflowSpec as JSON (spec_from_json reads it)
    schedule_time: time | None
    time_zone: str
    created_at: datetime
    updated_at: datetime
    updated_by: dict[str, str]  # the saving Principal.to_json
    deleted_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowRevision(Row):
    """A workflow's revision as CreateRun locks it."""

    revision: int
    deleted_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduledWorkflow(Row):
    workflow_id: str
    revision: int
    schedule_time: time  # local time of day
    time_zone: str


def spec_to_json(spec: workflow_pb2.WorkflowSpec) -> dict[str, Any]:
    return json_format.MessageToDict(spec, preserving_proto_field_name=True)


def spec_from_json(value: Mapping[str, Any]) -> workflow_pb2.WorkflowSpec:
    return json_format.ParseDict(dict(value), workflow_pb2.WorkflowSpec())


def _schedule_time(spec: workflow_pb2.WorkflowSpec) -> time | None:
    if not spec.HasField("schedule"):
        return None
    at = spec.schedule.time_of_day
    return time(at.hours, at.minutes, at.seconds)


# Errors travel in gRPC trailers, which peers cap at 8-16 KiB: the error names
# the first problems and their total, and ValidateWorkflow returns every one. The
# problems take the kit's metadata budget but for 1 KiB left to the other entries.
ERROR_PROBLEMS_BUDGET_BYTES = METADATA_MAX_BYTES - 1024
ERROR_MESSAGE_PROBLEMS = 5


def invalid(result: validation.Validation) -> WorkflowInvalid:
    """The error for an invalid document (saving it, or admitting a run of it)."""
    problems: list[dict[str, str]] = []
    used = 0
    for problem in result.problems:
        entry = {
            "kind": workflow_pb2.ValidationProblemKind.Name(
                workflow_pb2.ValidationProblemKind.ValueType(problem.kind)
            ),
            "path": problem.path,
            "step_id": problem.step_id,
            "message": problem.message,
        }
        used += len(json.dumps(entry))
        if used > ERROR_PROBLEMS_BUDGET_BYTES:
            break
        problems.append(entry)
    total = len(result.problems)
    shown = [problem.message for problem in result.problems[:ERROR_MESSAGE_PROBLEMS]]
    message = f"The workflow has {total} problem{'s' if total != 1 else ''}: " + " ".join(shown)
    if total > len(shown):
        message += f" (and {total - len(shown)} more: ValidateWorkflow lists every problem)"
    return WorkflowInvalid(
        message, metadata={"problems": json.dumps(problems), "problems_total": str(total)}
    )


# What the caller of each kind of stale call can do about it.
STALE_SAVE = "reload it and apply your change again"
STALE_DELETE = "reload it and delete it again if you still mean to"
STALE_RUN = "look at what changed, then create the run against the current revision"


def stale(workflow_id: str, expected: int, current: int, advice: str) -> StaleRevision:
    return StaleRevision(
        f"Workflow {workflow_id!r} is at revision {current}, not {expected}; {advice}.",
        metadata={"current_revision": str(current), "workflow_id": workflow_id},
    )


def _missing(workflow_id: str) -> NotFound:
    return NotFound("workflow", workflow_id, f"Workflow {workflow_id!r} does not exist.")


class Workflows:
    def __init__(self, db: Database, clock: Clock, cancel_runs: CancelRuns) -> None:
        self.db = db
        self.clock = clock
        self.cancel_runs = cancel_runs

    async def save_workflow(
        self,
        who: Principal,
        workflow_id: str,
        expected_revision: int,
        spec: workflow_pb2.WorkflowSpec,
    ) -> WorkflowRow:
        auth.require(who, ScopeName.WORKSHOP)
        check_id("workflow_id", workflow_id)
        if spec.ByteSize() > MAX_DOCUMENT_BYTES:
            raise PayloadTooLarge(
                f"The workflow document is {spec.ByteSize()} bytes; the limit is "
                f"{MAX_DOCUMENT_BYTES}."
            )
        now = self.clock.now()
        async with self.db.transaction() as connection:
            result = validation.validate_workflow(spec, await load_catalog(connection))
            if not result.valid:
                raise invalid(result)
            document = spec_to_json(spec)
            schedule = _schedule_time(spec)
            if expected_revision == 0:
                row = await fetch_one(
                    connection,
                    WorkflowRow,
                    *bind(
                        WorkflowInsert(
                            workflow_id=workflow_id,
                            spec=document,
                            schedule_time=schedule,
                            time_zone=spec.time_zone,
                            saved_at=now,
                            saved_by=who.to_json(),
                        )
                    ),
                )
            else:
                row = await fetch_one(
                    connection,
                    WorkflowRow,
                    *bind(
                        WorkflowUpdate(
                            spec=document,
                            schedule_time=schedule,
                            time_zone=spec.time_zone,
                            saved_at=now,
                            saved_by=who.to_json(),
                            workflow_id=workflow_id,
                            expected_revision=expected_revision,
                        )
                    ),
                )
            if row is not None:
                return row
            current = await _workflow(connection, workflow_id)
        if current is None:
            raise NotFound(
                "workflow",
                workflow_id,
                f"Workflow {workflow_id!r} does not exist; save it with revision 0.",
            )
        if current.deleted_at is not None:
            raise IdConflict(
                f"Workflow id {workflow_id!r} belonged to a deleted workflow; choose another id."
            )
        raise stale(workflow_id, expected_revision, current.revision, STALE_SAVE)

    async def get_workflow(self, who: Principal, workflow_id: str) -> WorkflowRow:
        auth.require(who, ScopeName.WORKSHOP)
        async with self.db.connection() as connection:
            return await live_workflow(connection, workflow_id)

    async def list_workflows(
        self, who: Principal, after: tuple[datetime, str] | None, limit: int
    ) -> list[WorkflowRow]:
        auth.require(who, ScopeName.WORKSHOP)
        after_at, after_id = after if after else (None, None)
        async with self.db.connection() as connection:
            return await fetch_all(
                connection,
                WorkflowRow,
                sql("workflows", "workflow_list"),
                after_at,
                after_id,
                limit,
            )

    async def delete_workflow(
        self, who: Principal, workflow_id: str, expected_revision: int | None
    ) -> list[str]:
        """Deletes the workflow and cancels its unfinished runs; returns those runs."""
        auth.require(who, ScopeName.WORKSHOP)
        now = self.clock.now()
        async with self.db.transaction() as connection:
            row = await connection.fetchrow(
                sql("workflows", "workflow_delete"), workflow_id, expected_revision, now
            )
            if row is None:
                current = await _workflow(connection, workflow_id)
                if current is None or current.deleted_at is not None:
                    raise _missing(workflow_id)
                raise stale(workflow_id, expected_revision or 0, current.revision, STALE_DELETE)
            return await self.cancel_runs(connection, workflow_id, now)

    async def validate(
        self, who: Principal, spec: workflow_pb2.WorkflowSpec
    ) -> validation.Validation:
        auth.require(who, ScopeName.WORKSHOP)
        async with self.db.connection() as connection:
            return validation.validate_workflow(spec, await load_catalog(connection))

    async def catalog(self, who: Principal) -> CatalogRows:
        auth.require(who, ScopeName.WORKSHOP)
        async with self.db.connection() as connection:
            return await registry.catalog_rows(connection)

    async def choose_runtime(self, who: Principal, workflow_id: str, recent: bool) -> RuntimeRow:
        """The website's rule (recent=True) or the schedules' and agents' rule for the
        runtime a run of this workflow goes to (docs/runs-and-jobs.md)."""
        auth.require(who, ScopeName.WORKSHOP)
        workflow = await self.get_workflow(who, workflow_id)
        needed = validation.required_capabilities(spec_from_json(workflow.spec))
        async with self.db.connection() as connection:
            return await registry.choose_runtime(connection, self.clock.now(), list(needed), recent)


# What runs read of workflows, inside their own transactions -----------------------------


async def _workflow(connection: Connection, workflow_id: str) -> WorkflowRow | None:
    return await fetch_one(connection, WorkflowRow, sql("workflows", "workflow_get"), workflow_id)


async def live_workflow(connection: Connection, workflow_id: str) -> WorkflowRow:
    """The workflow, or NotFound when it does not exist or was deleted."""
    row = await _workflow(connection, workflow_id)
    if row is None or row.deleted_at is not None:
        raise _missing(workflow_id)
    return row


async def lock_revision(connection: Connection, workflow_id: str) -> int:
    """The workflow's current revision under a row lock (FOR SHARE), or NotFound: CreateRun
    checks it again in the transaction that inserts the run."""
    locked = await fetch_one(
        connection, WorkflowRevision, sql("workflows", "workflow_lock"), workflow_id
    )
    if locked is None or locked.deleted_at is not None:
        raise _missing(workflow_id)
    return locked.revision


async def scheduled_workflows(connection: Connection) -> list[ScheduledWorkflow]:
    """The workflows with a daily schedule, not deleted (the scheduler decides which are due)."""
    return await fetch_all(
        connection, ScheduledWorkflow, sql("workflows", "workflow_scheduled_list")
    )


async def load_catalog(connection: Connection) -> validation.Catalog:
    """What a document is validated against: the cameras, live buckets and model classes."""
    models: dict[str, dict[int, tuple[str, ...]]] = {}
    for row in await registry.model_versions(connection):
        models.setdefault(row.name, {})[row.version] = tuple(row.classes)
    return validation.Catalog(
        camera_ids=frozenset(await registry.camera_ids(connection)),
        bucket_ids=frozenset(await registry.live_bucket_ids(connection)),
        models=models,
    )
