"""CreateRun, GetRun and ListRuns (docs/runs-and-jobs.md) on real Postgres through real gRPC."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import asyncpg
import grpc
import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.platform.errors import NEEDS_TRACKING_MESSAGE, NO_MEDIA_MESSAGE
from testbed.coordinator_world import (
    DAY,
    World,
    build_world,
    copy_recordings,
    error_reason,
    put_recording,
    run_request,
    save_workflow,
    workflow_spec,
)
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, workflow_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import workshop_pb2 as ws

FULL = common_pb2.RUN_MODE_FULL
TABLES = ("runs", "run_snapshots", "snapshot_recordings", "jobs")


async def _counts(c: CoordinatorHarness) -> dict[str, int]:
    return {table: await c.count(table) for table in TABLES}


async def _refused(
    c: CoordinatorHarness,
    request: ws.CreateRunRequest,
    metadata: tuple[tuple[str, str], ...] | None = None,
) -> tuple[grpc.StatusCode, str, dict[str, str], str]:
    """Calls CreateRun expecting a refusal that changes nothing."""
    before = await _counts(c)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.workshop.CreateRun(request, metadata=c.admin if metadata is None else metadata)
    assert await _counts(c) == before
    code, reason, details = error_reason(caught.value)
    return code, reason, details, caught.value.details() or ""


@pytest.fixture
async def world(coordinator: CoordinatorHarness) -> World:
    built = await build_world(coordinator)
    await save_workflow(coordinator, "yard", workflow_spec())
    return built


async def test_test_run_takes_the_first_image_limit_slots(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    created = await c.workshop.CreateRun(
        run_request("r1", "yard", world.tracking_runtime, image_limit=70), metadata=c.admin
    )
    assert created.created
    run = created.run
    assert run.status == common_pb2.RUN_STATUS_QUEUED
    assert run.mode == common_pb2.RUN_MODE_TEST
    assert run.image_limit == 70
    # cam-a has two hour-long recordings from 08:00 with 60 s slots: 60 + 10 slots
    assert (run.counts.jobs_total, run.counts.slots_expected) == (2, 70)
    assert run.expires_at.ToDatetime() == (c.clock.now() + timedelta(hours=1)).replace(tzinfo=None)
    detail = (await c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin)).detail
    assert [(j.job_id, j.recording_id, j.slot_count) for j in detail.jobs] == [
        ("j0", "cam-a-0", 60),
        ("j1", "cam-a-1", 10),
    ]
    assert all(j.state == common_pb2.JOB_STATE_QUEUED for j in detail.jobs)


async def test_default_image_limit_is_20(coordinator: CoordinatorHarness, world: World) -> None:
    c = coordinator
    run = (
        await c.workshop.CreateRun(
            run_request("r1", "yard", world.tracking_runtime), metadata=c.admin
        )
    ).run
    assert (run.image_limit, run.counts.jobs_total, run.counts.slots_expected) == (20, 1, 20)


async def test_full_run_freezes_a_snapshot(coordinator: CoordinatorHarness, world: World) -> None:
    c = coordinator
    await save_workflow(c, "both", workflow_spec(cameras=["cam-a", "cam-b"]))
    run = (
        await c.workshop.CreateRun(
            run_request("full-1", "both", world.plain_runtime, mode=FULL), metadata=c.admin
        )
    ).run
    assert (run.counts.jobs_total, run.counts.slots_expected) == (4, 240)
    snap = await c.workshop.GetRunSnapshot(
        ws.GetRunSnapshotRequest(run_id="full-1"), metadata=c.admin
    )
    s = snap.snapshot
    assert (s.run_id, s.workflow_id, s.workflow_revision) == ("full-1", "both", 1)
    assert s.runtime_id == world.plain_runtime
    assert s.code_sha256 == "c0de" * 16
    assert s.policy_revision == 1
    assert s.created_by.kind == common_pb2.PRINCIPAL_KIND_KEY
    assert (s.inputs[0].date.year, s.inputs[0].date.month, s.inputs[0].date.day) == (2026, 11, 29)
    assert s.inputs[0].window_start.ToDatetime() == (DAY + timedelta(hours=8)).replace(tzinfo=None)
    assert [(m.name, m.version, m.resolved_from_latest) for m in s.models] == [
        ("detector", 1, True)
    ]
    assert s.models[0].weights_sha256 == "ab" * 32
    assert list(s.models[0].classes) == ["person", "vehicle"]
    assert s.sampling.interval_seconds == 60
    assert s.sampling.dropped_allowed
    assert [o.bucket_id for o in s.outputs] == ["yard"]
    assert s.recording_count == 4
    assert len(s.recordings_sha256) == 64
    # job order: by recording start, then camera
    assert [(r.job_index, r.recording_id, r.generation, r.slot_count) for r in snap.recordings] == [
        (0, "cam-a-0", 1, 60),
        (1, "cam-b-0", 1, 60),
        (2, "cam-a-1", 1, 60),
        (3, "cam-b-1", 1, 60),
    ]
    # later edits to the workflow, its models or its recordings change nothing in it
    edited = workflow_spec(cameras=["cam-b"], interval=30)
    await save_workflow(c, "both", edited, expected=1)
    await c.operator.PublishModelVersion(
        op.PublishModelVersionRequest(
            name="detector",
            version=2,
            weights_sha256="cd" * 32,
            classes=["person"],
            input_shape=[3, 360, 640],
        ),
        metadata=c.admin,
    )
    await put_recording(c, "cam-a-0", "cam-a", DAY + timedelta(hours=8))
    again = await c.workshop.GetRunSnapshot(
        ws.GetRunSnapshotRequest(run_id="full-1"), metadata=c.admin
    )
    assert again == snap


async def test_retry_returns_the_run_and_other_body_conflicts(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    request = run_request("r1", "yard", world.tracking_runtime, image_limit=5)
    first = await c.workshop.CreateRun(request, metadata=c.admin)
    second = await c.workshop.CreateRun(request, metadata=c.admin)
    assert first.created
    assert not second.created
    assert second.run.run_id == "r1"
    assert await c.count("runs") == 1
    code, reason, details, _ = await _refused(
        c, run_request("r1", "yard", world.tracking_runtime, image_limit=6)
    )
    assert (code, reason, details["run_id"]) == (grpc.StatusCode.ABORTED, "ID_CONFLICT", "r1")
    # an id is never reused, even after the test run expired
    c.clock.advance(timedelta(hours=2))
    expired = await c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin)
    assert expired.detail.run.status == common_pb2.RUN_STATUS_EXPIRED
    code, reason, _, _ = await _refused(
        c, run_request("r1", "yard", world.tracking_runtime, mode=FULL)
    )
    assert (code, reason) == (grpc.StatusCode.ABORTED, "ID_CONFLICT")


async def test_concurrent_creates_with_one_id_make_one_run(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    request = run_request("r1", "yard", world.tracking_runtime)
    results = await asyncio.gather(
        *(c.workshop.CreateRun(request, metadata=c.admin) for _ in range(6))
    )
    assert sum(result.created for result in results) == 1
    assert await c.count("runs") == 1
    assert await c.count("jobs") == 1


async def test_stale_revision(coordinator: CoordinatorHarness, world: World) -> None:
    c = coordinator
    await save_workflow(c, "yard", workflow_spec(interval=30), expected=1)
    code, reason, details, message = await _refused(
        c, run_request("r1", "yard", world.tracking_runtime, revision=1)
    )
    assert (code, reason, details["current_revision"]) == (
        grpc.StatusCode.ABORTED,
        "STALE_REVISION",
        "2",
    )
    assert "revision 2" in message


async def test_revision_is_checked_again_inside_the_inserting_transaction(
    coordinator: CoordinatorHarness, world: World, pg_dsn: str
) -> None:
    """A save that commits while CreateRun is admitting makes CreateRun refuse."""
    c = coordinator
    saver = await asyncpg.connect(pg_dsn)
    try:
        transaction = saver.transaction()
        await transaction.start()
        await saver.execute("UPDATE workflows SET revision = 2 WHERE workflow_id = 'yard'")

        async def create() -> ws.CreateRunResponse:
            request = run_request("r1", "yard", world.tracking_runtime)
            response: ws.CreateRunResponse = await c.workshop.CreateRun(request, metadata=c.admin)
            return response

        creating = asyncio.create_task(create())
        # wait until CreateRun blocks on the workflow's row lock, then commit the save
        for _ in range(500):
            waiting = await saver.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            )
            if waiting:
                break
            await asyncio.sleep(0.01)
        assert waiting, "CreateRun never waited for the workflow's lock"
        await transaction.commit()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await creating
    finally:
        await saver.close()
    assert error_reason(caught.value)[:2] == (grpc.StatusCode.ABORTED, "STALE_REVISION")
    assert await c.count("runs") == 0
    assert await c.count("jobs") == 0


@pytest.mark.parametrize(("limit", "mode"), [(0, common_pb2.RUN_MODE_TEST), (101, None), (5, FULL)])
async def test_bad_image_limit(
    coordinator: CoordinatorHarness,
    world: World,
    limit: int,
    mode: common_pb2.RunMode.ValueType | None,
) -> None:
    request = run_request(
        "r1",
        "yard",
        world.tracking_runtime,
        mode=mode or common_pb2.RUN_MODE_TEST,
        image_limit=limit,
    )
    code, reason, _, message = await _refused(coordinator, request)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    assert "image_limit" in message


@pytest.mark.parametrize(
    ("field", "value"),
    [("run_id", ""), ("run_id", "photo-1"), ("run_id", "bad id"), ("mode", 0)],
)
async def test_bad_fields(
    coordinator: CoordinatorHarness, world: World, field: str, value: object
) -> None:
    request = run_request("r1", "yard", world.tracking_runtime)
    setattr(request, field, value)
    code, reason, _, _ = await _refused(coordinator, request)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")


async def test_unknown_workflow_and_runtime(coordinator: CoordinatorHarness, world: World) -> None:
    for request in (
        run_request("r1", "nope", world.tracking_runtime),
        run_request("r1", "yard", "workshop-" + "0" * 32),
    ):
        code, reason, _, _ = await _refused(coordinator, request)
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")


async def test_no_media(coordinator: CoordinatorHarness, world: World) -> None:
    await save_workflow(coordinator, "night", workflow_spec(window=(0, 6)))
    code, reason, _, message = await _refused(
        coordinator, run_request("r1", "night", world.tracking_runtime)
    )
    assert (code, reason, message) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "NO_MEDIA",
        NO_MEDIA_MESSAGE,
    )


async def test_deleted_and_expired_recordings_are_no_media(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    await c.operator.DeleteRecording(
        op.DeleteRecordingRequest(recording_id="cam-b-0"), metadata=c.admin
    )
    await save_workflow(c, "b", workflow_spec(cameras=["cam-b"], window=(8, 9)))
    assert (await _refused(c, run_request("r1", "b", world.tracking_runtime)))[1] == "NO_MEDIA"
    c.clock.advance(timedelta(days=41))
    assert (await _refused(c, run_request("r2", "yard", world.tracking_runtime)))[1] == "NO_MEDIA"


async def test_tracking_workflow_on_plain_runtime(
    coordinator: CoordinatorHarness, world: World
) -> None:
    await save_workflow(coordinator, "change", workflow_spec(keep_by_change=True))
    code, reason, _, message = await _refused(
        coordinator, run_request("r1", "change", world.plain_runtime)
    )
    assert (code, reason, message) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "NEEDS_TRACKING",
        NEEDS_TRACKING_MESSAGE,
    )
    ok = await coordinator.workshop.CreateRun(
        run_request("r2", "change", world.tracking_runtime), metadata=coordinator.admin
    )
    assert ok.created


async def test_too_many_slots(coordinator: CoordinatorHarness, world: World) -> None:
    c = coordinator
    await put_recording(c, "long", "cam-b", DAY + timedelta(hours=10), timedelta(hours=3))
    await save_workflow(c, "dense", workflow_spec(cameras=["cam-b"], interval=1))
    code, reason, _, message = await _refused(
        c, run_request("r1", "dense", world.tracking_runtime, mode=FULL)
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "TOO_MANY_SLOTS")
    assert "long" in message
    assert "10,000" in message.replace("10000", "10,000")


async def test_too_many_jobs(coordinator: CoordinatorHarness, world: World) -> None:
    c = coordinator
    start = DAY + timedelta(hours=12)
    await copy_recordings(
        c,
        [
            (f"many-{i}", "cam-b", start + timedelta(seconds=i), start + timedelta(seconds=i + 1))
            for i in range(10_001)
        ],
    )
    await save_workflow(c, "many", workflow_spec(cameras=["cam-b"], interval=1, window=(12, 18)))
    code, reason, _, message = await _refused(
        c, run_request("r1", "many", world.tracking_runtime, mode=FULL)
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "TOO_MANY_JOBS")
    assert "10001" in message.replace(",", "")


async def test_at_capacity_refuses_without_evicting(pg_dsn: str) -> None:
    async with running_coordinator(pg_dsn, job_capacity=3) as c:
        world = await build_world(c)
        await save_workflow(c, "yard", workflow_spec())
        await c.workshop.CreateRun(
            run_request("r1", "yard", world.tracking_runtime, mode=FULL), metadata=c.admin
        )
        code, reason, _, _ = await _refused(
            c, run_request("r2", "yard", world.tracking_runtime, mode=FULL)
        )
        assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "CAPACITY")
        detail = await c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin)
        assert detail.detail.run.counts.jobs_queued == 2


async def test_credentials(coordinator: CoordinatorHarness, world: World) -> None:
    c = coordinator
    request = run_request("r1", "yard", world.tracking_runtime)
    processor_key = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"))
    code, reason, _, _ = await _refused(c, request, bearer_metadata(processor_key))
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "SCOPE_MISSING")
    agent = await c.key(Grant(ScopeName.WORKSHOP), name="agent")
    async with c.db.connection() as connection:
        key_id = await connection.fetchval("SELECT key_id FROM keys WHERE name = 'agent'")
    await c.operator.RevokeKey(op.RevokeKeyRequest(key_id=key_id), metadata=c.admin)
    code, reason, _, _ = await _refused(c, request, bearer_metadata(agent))
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_REJECTED")
    code, reason, _, _ = await _refused(c, request, ())
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_MISSING")


async def test_run_day_and_previous_day_follow_the_time_zone(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator  # now is 2026-11-30 12:00 UTC = 04:00 in Los Angeles
    cases = [
        (workflow_pb2.INPUT_DAY_RUN_DAY, "UTC", (2026, 11, 30)),
        (workflow_pb2.INPUT_DAY_PREVIOUS_DAY, "UTC", (2026, 11, 29)),
        (workflow_pb2.INPUT_DAY_RUN_DAY, "Asia/Tokyo", (2026, 11, 30)),
        (workflow_pb2.INPUT_DAY_PREVIOUS_DAY, "America/Los_Angeles", (2026, 11, 29)),
    ]
    await put_recording(c, "today", "cam-a", DAY + timedelta(days=1), timedelta(hours=24))
    await put_recording(c, "yday", "cam-b", DAY - timedelta(hours=12), timedelta(hours=48))
    for index, (day, zone, expected) in enumerate(cases):
        workflow_id = f"w{index}"
        await save_workflow(
            c,
            workflow_id,
            workflow_spec(cameras=["cam-a", "cam-b"], day=day, time_zone=zone, window=(0, 23)),
        )
        await c.workshop.CreateRun(
            run_request(f"r{index}", workflow_id, world.tracking_runtime), metadata=c.admin
        )
        snap = await c.workshop.GetRunSnapshot(
            ws.GetRunSnapshotRequest(run_id=f"r{index}"), metadata=c.admin
        )
        date = snap.snapshot.inputs[0].date
        assert (date.year, date.month, date.day) == expected, (day, zone)


async def test_list_runs_newest_first_without_photos(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    await save_workflow(c, "other", workflow_spec(cameras=["cam-b"]))
    for run_id, workflow_id in (("a", "yard"), ("b", "other"), ("c", "yard")):
        await c.workshop.CreateRun(
            run_request(run_id, workflow_id, world.tracking_runtime), metadata=c.admin
        )
    async with c.db.connection() as connection:
        await connection.execute(
            """INSERT INTO runs (run_id, kind, mode, workflow_id, workflow_revision, runtime_id,
                                 image_limit, fingerprint, created_by, policy_revision, created_at,
                                 code_sha256)
               VALUES ('photo-x', 'photo', 'test', 'yard', 1, $1, 1, 'f', '{}', 1, $2, 'c')""",
            world.tracking_runtime,
            c.clock.now(),
        )
    listed = await c.workshop.ListRuns(ws.ListRunsRequest(), metadata=c.admin)
    assert [entry.run.run_id for entry in listed.runs] == ["c", "b", "a"]
    by_workflow = await c.workshop.ListRuns(
        ws.ListRunsRequest(workflow_id="yard", page_size=1), metadata=c.admin
    )
    assert [entry.run.run_id for entry in by_workflow.runs] == ["c"]
    rest = await c.workshop.ListRuns(
        ws.ListRunsRequest(workflow_id="yard", page_size=1, page_token=by_workflow.next_page_token),
        metadata=c.admin,
    )
    assert [entry.run.run_id for entry in rest.runs] == ["a"]


async def test_later_runs_on_a_runtime_wait_behind_older_ones(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    for run_id in ("first", "second", "third"):
        await c.workshop.CreateRun(
            run_request(run_id, "yard", world.tracking_runtime), metadata=c.admin
        )
    await c.workshop.CreateRun(
        run_request("elsewhere", "yard", world.plain_runtime), metadata=c.admin
    )
    third = await c.workshop.GetRun(ws.GetRunRequest(run_id="third"), metadata=c.admin)
    assert list(third.detail.run.waiting_behind) == ["first", "second"]
    other = await c.workshop.GetRun(ws.GetRunRequest(run_id="elsewhere"), metadata=c.admin)
    assert list(other.detail.run.waiting_behind) == []


async def test_deleting_a_workflow_cancels_its_unfinished_runs(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    await c.workshop.CreateRun(run_request("r1", "yard", world.tracking_runtime), metadata=c.admin)
    deleted = await c.workshop.DeleteWorkflow(
        ws.DeleteWorkflowRequest(workflow_id="yard"), metadata=c.admin
    )
    assert list(deleted.cancelled_run_ids) == ["r1"]
    run = (await c.workshop.GetRun(ws.GetRunRequest(run_id="r1"), metadata=c.admin)).detail.run
    assert run.status == common_pb2.RUN_STATUS_CANCELLED
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await save_workflow(c, "yard", workflow_spec())
    assert error_reason(caught.value)[:2] == (grpc.StatusCode.ABORTED, "ID_CONFLICT")


async def test_deleting_a_bucket_cancels_runs_writing_into_it(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    await c.operator.CreateBucket(op.CreateBucketRequest(bucket_id="other"), metadata=c.admin)
    await save_workflow(c, "elsewhere", workflow_spec(bucket="other"))
    await c.workshop.CreateRun(run_request("r1", "yard", world.tracking_runtime), metadata=c.admin)
    await c.workshop.CreateRun(
        run_request("r2", "elsewhere", world.tracking_runtime), metadata=c.admin
    )
    deleted = await c.operator.DeleteBucket(
        op.DeleteBucketRequest(bucket_id="yard"), metadata=c.admin
    )
    assert list(deleted.cancelled_run_ids) == ["r1"]


async def test_save_workflow_validation_and_revisions(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    bad = workflow_spec(cameras=["cam-x"], classes=["unicorn"], bucket="nope", window=(9, 8))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await save_workflow(c, "bad", bad)
    code, reason, details = error_reason(caught.value)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "VALIDATION_FAILED")
    kinds = {problem["kind"] for problem in json.loads(details["problems"])}
    assert {
        "VALIDATION_PROBLEM_KIND_UNKNOWN_CAMERA",
        "VALIDATION_PROBLEM_KIND_UNKNOWN_CLASS",
        "VALIDATION_PROBLEM_KIND_UNKNOWN_BUCKET",
        "VALIDATION_PROBLEM_KIND_BAD_WINDOW",
    } <= kinds
    huge = workflow_spec()
    for index in range(70):
        huge.graph.steps.add(step_id=f"extra{index}", do_nothing=workflow_pb2.DoNothingStep())
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await save_workflow(c, "huge", huge)
    details = error_reason(caught.value)[2]
    kinds = {p["kind"] for p in json.loads(details["problems"])}
    assert "VALIDATION_PROBLEM_KIND_TOO_LARGE" in kinds
    # the error carries what fits in gRPC trailers; ValidateWorkflow returns every problem
    every = await c.workshop.ValidateWorkflow(
        ws.ValidateWorkflowRequest(spec=huge), metadata=c.admin
    )
    assert (
        int(details["problems_total"]) == len(every.problems) > len(json.loads(details["problems"]))
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await save_workflow(c, "yard", workflow_spec(), expected=7)
    assert error_reason(caught.value)[:3] == (
        grpc.StatusCode.ABORTED,
        "STALE_REVISION",
        {"current_revision": "1", "workflow_id": "yard"},
    )
    saved = await save_workflow(c, "yard", workflow_spec(interval=30), expected=1)
    assert saved.revision == 2
    validated = await c.workshop.ValidateWorkflow(
        ws.ValidateWorkflowRequest(spec=workflow_spec(keep_by_change=True)), metadata=c.admin
    )
    assert validated.valid
    assert list(validated.required_capabilities) == ["workshop-v3"]


async def test_choose_runtime_rules(coordinator: CoordinatorHarness, world: World) -> None:
    c = coordinator
    await save_workflow(c, "change", workflow_spec(keep_by_change=True))

    async def choose(workflow_id: str, choice: ws.RuntimeChoice.ValueType) -> str:
        reply = await c.workshop.ChooseRuntime(
            ws.ChooseRuntimeRequest(workflow_id=workflow_id, choice=choice), metadata=c.admin
        )
        return reply.runtime.runtime_id

    async def seen(runtime_id: str, minutes_ago: int) -> None:
        async with c.db.connection() as connection:
            await connection.execute(
                "UPDATE runtimes SET last_seen_at = $2 WHERE runtime_id = $1",
                runtime_id,
                c.clock.now() - timedelta(minutes=minutes_ago),
            )

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await choose("yard", ws.RUNTIME_CHOICE_NEWEST)
    assert error_reason(caught.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "NO_RUNTIME")
    await seen(world.tracking_runtime, minutes_ago=1)
    await seen(world.plain_runtime, minutes_ago=0)
    # the website: newest seen within 2 minutes that has the needed capabilities
    assert await choose("yard", ws.RUNTIME_CHOICE_RECENT_CAPABLE) == world.plain_runtime
    assert await choose("change", ws.RUNTIME_CHOICE_RECENT_CAPABLE) == world.tracking_runtime
    # agents and schedules: newest ever seen, however long ago
    c.clock.advance(timedelta(hours=5))
    assert await choose("change", ws.RUNTIME_CHOICE_NEWEST) == world.plain_runtime
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await choose("yard", ws.RUNTIME_CHOICE_RECENT_CAPABLE)
    assert error_reason(caught.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "NO_RUNTIME")


async def test_catalog_lists_what_the_editor_offers(
    coordinator: CoordinatorHarness, world: World
) -> None:
    agent = bearer_metadata(await coordinator.key(Grant(ScopeName.WORKSHOP)))
    catalog = await coordinator.workshop.GetCatalog(ws.GetCatalogRequest(), metadata=agent)
    assert [camera.camera_id for camera in catalog.cameras] == ["cam-a", "cam-b"]
    assert [bucket.bucket_id for bucket in catalog.buckets] == ["yard"]
    assert [(m.name, m.version) for m in catalog.model_versions] == [("detector", 1)]
    assert {r.runtime_id for r in catalog.runtimes} == {world.tracking_runtime, world.plain_runtime}


async def test_validate_only_plans_the_run_without_creating_it(
    coordinator: CoordinatorHarness, world: World
) -> None:
    c = coordinator
    await save_workflow(c, "both", workflow_spec(cameras=["cam-a", "cam-b"]))
    request = run_request("plan-1", "both", world.plain_runtime, mode=FULL)
    request.validate_only = True
    before = await _counts(c)
    plan = await c.workshop.CreateRun(request, metadata=c.admin)
    assert await _counts(c) == before
    assert not plan.created
    assert not plan.HasField("run")
    s = plan.planned_snapshot
    assert (s.run_id, s.workflow_id, s.runtime_id) == ("plan-1", "both", world.plain_runtime)
    assert [(m.name, m.version, m.resolved_from_latest) for m in s.models] == [
        ("detector", 1, True)
    ]
    assert [(j.job_id, j.recording_id, j.camera_id, j.slot_count) for j in plan.planned_jobs] == [
        ("j0", "cam-a-0", "cam-a", 60),
        ("j1", "cam-b-0", "cam-b", 60),
        ("j2", "cam-a-1", "cam-a", 60),
        ("j3", "cam-b-1", "cam-b", 60),
    ]
    # The same id then creates the run that was planned, with the same jobs.
    request.validate_only = False
    created = await c.workshop.CreateRun(request, metadata=c.admin)
    assert created.created
    assert (created.run.counts.jobs_total, created.run.counts.slots_expected) == (4, 240)
    # Planning refuses what creating refuses, with the same reason.
    await save_workflow(c, "night", workflow_spec(window=(0, 6)))
    night = run_request("plan-2", "night", world.tracking_runtime)
    night.validate_only = True
    code, reason, _, _ = await _refused(c, night)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "NO_MEDIA")


async def test_list_runs_filters_by_status_and_mode_as_the_runs_answer_them(
    coordinator: CoordinatorHarness, world: World
) -> None:
    """ListRuns' status filter (SQL) keeps exactly the runs whose status (RunCounts.status,
    Python) is the one asked, and its mode filter those of the mode: the two rules agree."""
    c = coordinator
    full = common_pb2.RUN_MODE_FULL
    for run_id, mode in (("t1", common_pb2.RUN_MODE_TEST), ("f1", full), ("f2", full)):
        await c.workshop.CreateRun(
            run_request(run_id, "yard", world.tracking_runtime, mode=mode), metadata=c.admin
        )
    await c.workshop.CancelRun(ws.CancelRunRequest(run_id="f2"), metadata=c.admin)
    c.clock.advance(timedelta(hours=2))  # the test run is past its hour: expired

    async def listed(**fields: object) -> dict[str, int]:
        answer = await c.workshop.ListRuns(ws.ListRunsRequest(**fields), metadata=c.admin)  # type: ignore[arg-type]
        return {entry.run.run_id: entry.run.status for entry in answer.runs}

    every = await listed()
    assert every == {
        "t1": common_pb2.RUN_STATUS_EXPIRED,
        "f1": common_pb2.RUN_STATUS_QUEUED,
        "f2": common_pb2.RUN_STATUS_CANCELLED,
    }
    for status in common_pb2.RunStatus.values():
        if status == common_pb2.RUN_STATUS_UNSPECIFIED:
            continue
        assert await listed(status=status) == {
            run_id: s for run_id, s in every.items() if s == status
        }, common_pb2.RunStatus.Name(status)
    assert set(await listed(mode=full)) == {"f1", "f2"}
    assert set(await listed(mode=common_pb2.RUN_MODE_TEST)) == {"t1"}
    assert await listed(mode=full, status=common_pb2.RUN_STATUS_CANCELLED) == {
        "f2": common_pb2.RUN_STATUS_CANCELLED
    }
    assert await listed(status=common_pb2.RUN_STATUS_CANCELLED, workflow_id="other") == {}
