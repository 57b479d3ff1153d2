"""A run's timeline (docs/runs-and-jobs.md, "A run's timeline") through a real coordinator
on Postgres: a job whose lease lapses under one processor and is reclaimed and completed by
another shows both attempts in order, with who claimed each, the lapse and the heartbeats
it missed, the stale processor's refused calls, and the completion; a hand-back and a
cancelled lease end their attempts; `workshop runs explain` prints the same; bad input is
refused precisely."""

from __future__ import annotations

from datetime import timedelta

import grpc

from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.leases.maintenance import Maintenance
from testbed.coordinator_leases import (
    Setup,
    claimed,
    complete_request,
    create_run,
    empty_result,
    refused,
    setup,
)
from testbed.coordinator_world import CODE
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.gateway import GatewayHarness
from tests.cli_runner import workshop
from workshop.kit.auth import bearer_metadata
from workshop.v1 import common_pb2, jobs_pb2, run_pb2
from workshop.v1 import workshop_pb2 as ws

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


async def second_processor(c: CoordinatorHarness) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Another processor of gpu-box, with a key of its own: (its key id, its metadata)."""
    secret = await c.key(Grant(ScopeName.WORKSHOP_RUN, device_id="gpu-box"), name="processor-b")
    return secret.partition(".")[0], bearer_metadata(secret)


def key_id(s: Setup) -> str:
    return s.processor_secret.partition(".")[0]


async def timeline(c: CoordinatorHarness, run_id: str = "r1") -> list[run_pb2.JobTimeline]:
    reply = await c.workshop.GetRunTimeline(
        ws.GetRunTimelineRequest(run_id=run_id), metadata=c.admin
    )
    assert reply.run_id == run_id
    return list(reply.jobs)


async def test_a_lapsed_and_reclaimed_job_shows_both_attempts(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s = await setup(c)
    other_key, other = await second_processor(c)
    await create_run(c, s)  # r1: j0 and j1, full
    claimed_at = c.clock.now()
    first = await claimed(c, s)  # processor A takes j0
    assert (first.lease.job_id, first.lease.generation) == ("j0", 1)
    c.clock.advance(timedelta(minutes=1))
    renewed_at = c.clock.now()
    await c.jobs.Heartbeat(jobs_pb2.HeartbeatRequest(lease=first.lease), metadata=s.processor)
    # A goes silent: its lease (renewed to renewed_at + 5 min) lapses, maintenance takes it
    # back 6 minutes after the renewal
    c.clock.advance(timedelta(minutes=6))
    rescued_at = c.clock.now()
    assert (await Maintenance(c.db, c.clock, interval_seconds=1).run_once()).requeued == 1

    reclaimed = await c.jobs.Claim(
        jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE),
        metadata=other,
    )
    second = reclaimed.job  # processor B takes j0 again: generation 2
    assert (second.lease.job_id, second.lease.generation) == ("j0", 2)
    reclaimed_at = c.clock.now()
    # A wakes up and reports under its old lease: refused, counted on its attempt
    for _ in range(2):
        assert await refused(
            c.jobs.Heartbeat(jobs_pb2.HeartbeatRequest(lease=first.lease), metadata=s.processor)
        ) == (FAILED_PRECONDITION, "LEASE_MISMATCH")
    assert await refused(
        c.jobs.Complete(complete_request(first, empty_result(first)), metadata=s.processor)
    ) == (FAILED_PRECONDITION, "LEASE_MISMATCH")
    c.clock.advance(timedelta(seconds=30))
    await c.jobs.Complete(complete_request(second, empty_result(second)), metadata=other)
    completed_at = c.clock.now()

    [j0, j1] = await timeline(c)
    assert (j0.job_id, j0.state, j0.lapses) == ("j0", common_pb2.JOB_STATE_COMPLETED, 1)
    lapsed, completed = j0.attempts
    assert (lapsed.generation, lapsed.claimed_by, lapsed.device_id) == (1, key_id(s), "gpu-box")
    assert lapsed.runtime_id == s.world.tracking_runtime
    assert lapsed.outcome == run_pb2.ATTEMPT_OUTCOME_LAPSED
    assert lapsed.claimed_at.ToDatetime(tzinfo=claimed_at.tzinfo) == claimed_at
    # it ran out 5 minutes after its renewal and was taken back a minute later: 6 minutes
    # of heartbeats due every 45 s, none came
    assert lapsed.lease_until.ToDatetime(tzinfo=claimed_at.tzinfo) == renewed_at + timedelta(
        minutes=5
    )
    assert lapsed.ended_at.ToDatetime(tzinfo=claimed_at.tzinfo) == rescued_at
    assert lapsed.heartbeats_missed == 8
    assert {(r.reason, r.count) for r in lapsed.refusals} == {("LEASE_MISMATCH", 3)}
    assert lapsed.failure_reason == common_pb2.FAILURE_REASON_UNSPECIFIED

    assert (completed.generation, completed.claimed_by) == (2, other_key)
    assert completed.outcome == run_pb2.ATTEMPT_OUTCOME_COMPLETED
    assert completed.claimed_at.ToDatetime(tzinfo=claimed_at.tzinfo) == reclaimed_at
    assert completed.ended_at.ToDatetime(tzinfo=claimed_at.tzinfo) == completed_at
    assert (completed.heartbeats_missed, list(completed.refusals)) == (0, [])

    assert (j1.job_id, j1.state, list(j1.attempts)) == ("j1", common_pb2.JOB_STATE_QUEUED, [])

    # the command line tells the same story
    explained = await workshop(c, "-o", "json", "runs", "explain", "r1")
    assert explained.code == 0, explained.err
    [job] = [j for j in explained.json()["timeline"] if j["job_id"] == "j0"]
    assert [(a["generation"], a["outcome"], a["claimed_by"]) for a in job["attempts"]] == [
        (1, "lapsed", key_id(s)),
        (2, "completed", other_key),
    ]
    assert job["attempts"][0]["refusals"] == {"LEASE_MISMATCH": 3}
    told = await workshop(c, "runs", "explain", "r1")
    assert told.code == 0, told.err
    assert "  job j0 (completed, 2 attempt(s))" in told.out
    assert f"#1 claimed by {key_id(s)} on gpu-box" in told.out
    assert "(8 heartbeats missed)" in told.out
    assert "fences refused LEASE_MISMATCH x3" in told.out
    assert f"#2 claimed by {other_key} on gpu-box" in told.out
    assert "job j1" not in told.out  # nothing happened to it; --all-jobs shows it
    everything = await workshop(c, "runs", "explain", "r1", "--all-jobs")
    assert "  job j1 (queued, 0 attempt(s))" in everything.out


async def test_hand_backs_and_cancellations_end_their_attempts(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    s = await setup(c)
    await create_run(c, s)
    job = await claimed(c, s)
    await c.jobs.Release(jobs_pb2.ReleaseRequest(lease=job.lease), metadata=s.processor)
    again = await claimed(c, s)
    assert again.lease.generation == 2
    held = await claimed(c, s)  # j1, still held: its attempt is running
    await c.workshop.CancelRun(ws.CancelRunRequest(run_id="r1"), metadata=c.admin)
    assert await refused(
        c.jobs.Heartbeat(jobs_pb2.HeartbeatRequest(lease=again.lease), metadata=s.processor)
    ) == (FAILED_PRECONDITION, "JOB_CANCELLED")
    [j0, j1] = await timeline(c)
    assert [(a.generation, a.outcome) for a in j0.attempts] == [
        (1, run_pb2.ATTEMPT_OUTCOME_HANDED_BACK),
        (2, run_pb2.ATTEMPT_OUTCOME_CANCELLED),
    ]
    assert {(r.reason, r.count) for r in j0.attempts[1].refusals} == {("JOB_CANCELLED", 1)}
    assert [(a.generation, a.outcome) for a in j1.attempts] == [
        (held.lease.generation, run_pb2.ATTEMPT_OUTCOME_CANCELLED)
    ]


async def test_pages_and_bad_input(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    s = await setup(c)
    await create_run(c, s)
    first = await c.workshop.GetRunTimeline(
        ws.GetRunTimelineRequest(run_id="r1", page_size=1), metadata=c.admin
    )
    assert [j.job_id for j in first.jobs] == ["j0"]
    rest = await c.workshop.GetRunTimeline(
        ws.GetRunTimelineRequest(run_id="r1", page_size=1, page_token=first.next_page_token),
        metadata=c.admin,
    )
    assert [j.job_id for j in rest.jobs] == ["j1"]
    for request, expected in (
        (ws.GetRunTimelineRequest(run_id="nope"), (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")),
        (
            ws.GetRunTimelineRequest(run_id="r1", page_token="x"),
            (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"),
        ),
        (
            ws.GetRunTimelineRequest(run_id="r1", page_size=1001),
            (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"),
        ),
    ):
        assert await refused(c.workshop.GetRunTimeline(request, metadata=c.admin)) == expected


async def test_the_gateway_serves_the_timeline_as_json(gateway: GatewayHarness) -> None:
    """GET /v1/workshop/runs/{id}/timeline (and /api/... for the console): the attempts as
    the run page reads them, enums as words, refusals as a list."""
    c = gateway.c
    s = await setup(c)
    await create_run(c, s)
    first = await claimed(c, s)
    c.clock.advance(timedelta(minutes=6))
    await Maintenance(c.db, c.clock, interval_seconds=1).run_once()
    assert await refused(
        c.jobs.Heartbeat(jobs_pb2.HeartbeatRequest(lease=first.lease), metadata=s.processor)
    ) == (FAILED_PRECONDITION, "LEASE_MISMATCH")
    second = await claimed(c, s)
    assert second.lease.generation == 2
    agent = await gateway.agent(Grant(ScopeName.WORKSHOP))
    answer = await agent.get("/v1/workshop/runs/r1/timeline")
    assert answer.status_code == 200, answer.text
    [j0, j1] = answer.json()["jobs"]
    assert (j0["job_id"], j0["state"], j0["lapses"]) == ("j0", "leased", 1)
    lapsed, running = j0["attempts"]
    assert (lapsed["generation"], lapsed["outcome"], lapsed["claimed_by"]) == (
        1,
        "lapsed",
        key_id(s),
    )
    assert lapsed["heartbeats_missed"] == 8  # 6 minutes from the claim, one due every 45 s
    assert lapsed["refusals"] == [{"reason": "LEASE_MISMATCH", "count": 1}]
    assert (running["generation"], running["outcome"]) == (2, "running")
    assert "ended_at" not in running or not running["ended_at"]
    assert j1["attempts"] == []
    missing = await agent.get("/v1/workshop/runs/nope/timeline")
    assert missing.status_code == 404
    bad = await agent.get("/v1/workshop/runs/r1/timeline", params={"page_size": "5000"})
    assert bad.status_code in (400, 422), bad.text
