"""`workshop runs explain`: why a run waits or why it failed, from its detail (GetRun), and
its timeline: each job's attempts in order (GetRunTimeline)."""

from __future__ import annotations

from typing import Any

from tools.cli.watch import state_name, status_name
from workshop.v1 import common_pb2, run_pb2

# Which fence (docs/leases-and-fences.md) ends a job with each failure reason.
FENCES = {
    common_pb2.FAILURE_REASON_SOURCE_CHANGED: (
        "fence 2, the source: the job's recording was replaced or deleted after the run "
        "was admitted"
    ),
    common_pb2.FAILURE_REASON_AUTHORITY_LOST: (
        "fence 3, the authority: the policy revision was raised, or the run creator's key, "
        "session or user lost its authority"
    ),
}


OUTCOMES = {
    run_pb2.ATTEMPT_OUTCOME_RUNNING: "running",
    run_pb2.ATTEMPT_OUTCOME_COMPLETED: "completed",
    run_pb2.ATTEMPT_OUTCOME_FAILED: "failed",
    run_pb2.ATTEMPT_OUTCOME_LAPSED: "lapsed",
    run_pb2.ATTEMPT_OUTCOME_HANDED_BACK: "handed_back",
    run_pb2.ATTEMPT_OUTCOME_CANCELLED: "cancelled",
    run_pb2.ATTEMPT_OUTCOME_EXPIRED: "expired",
}


def _reason_word(reason: int) -> str:
    if reason == common_pb2.FAILURE_REASON_UNSPECIFIED:
        return ""
    return common_pb2.FailureReason.Name(reason).removeprefix("FAILURE_REASON_").lower()  # type: ignore[arg-type]


def _time(stamp: Any, present: bool) -> str:
    return stamp.ToJsonString() if present else ""


def attempt_facts(attempt: run_pb2.JobAttempt) -> dict[str, Any]:
    return {
        "generation": attempt.generation,
        "claimed_by": attempt.claimed_by,
        "runtime_id": attempt.runtime_id,
        "device_id": attempt.device_id,
        "claimed_at": attempt.claimed_at.ToJsonString(),
        "ended_at": _time(attempt.ended_at, attempt.HasField("ended_at")),
        "outcome": OUTCOMES.get(attempt.outcome, "unknown"),
        "lease_until": _time(attempt.lease_until, attempt.HasField("lease_until")),
        "heartbeats_missed": attempt.heartbeats_missed,
        "refusals": {r.reason: r.count for r in attempt.refusals},
        "failure_reason": _reason_word(attempt.failure_reason),
    }


def job_facts(job: run_pb2.JobTimeline) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "state": state_name(job.state),
        "camera_id": job.camera_id,
        "recording_id": job.recording_id,
        "lapses": job.lapses,
        "failure_reason": _reason_word(job.failure_reason),
        "attempts": [attempt_facts(attempt) for attempt in job.attempts],
    }


def troubled(job: dict[str, Any]) -> bool:
    """A job worth a line without --all-jobs: more than one attempt, or one that did not
    simply complete (or still run), or met a fence."""
    attempts = job["attempts"]
    return len(attempts) > 1 or any(
        a["outcome"] not in ("completed", "running") or a["refusals"] for a in attempts
    )


def explain(
    detail: run_pb2.RunDetail, timeline: list[run_pb2.JobTimeline] | None = None
) -> dict[str, Any]:
    """The facts: status, the runs ahead while queued, the failed jobs with reason, message
    and fence, each job's attempts, and a one-line verdict."""
    run = detail.run
    status = run.status
    failed = [
        {
            "job_id": job.job_id,
            "camera_id": job.camera_id,
            "recording_id": job.recording_id,
            "reason": common_pb2.FailureReason.Name(job.failure_reason)
            .removeprefix("FAILURE_REASON_")
            .lower(),
            "message": job.failure_message,
            "fence": FENCES.get(job.failure_reason, ""),
        }
        for job in detail.jobs
        if job.state == common_pb2.JOB_STATE_FAILED
    ]
    counts = run.counts
    if status == common_pb2.RUN_STATUS_QUEUED and run.waiting_behind:
        verdict = (
            f"waits behind {len(run.waiting_behind)} older run(s) on runtime {run.runtime_id}: "
            "the runtime's processors finish runs one at a time, oldest first"
        )
    elif status == common_pb2.RUN_STATUS_QUEUED:
        verdict = (
            f"queued with nothing ahead: waits for a processor of runtime {run.runtime_id} "
            "to claim its first job (is one running? `workshop runtimes list` shows when it "
            "last checked in)"
        )
    elif status == common_pb2.RUN_STATUS_RUNNING:
        verdict = (
            f"running: {counts.jobs_completed} of {counts.jobs_total} jobs completed, "
            f"{counts.jobs_leased} leased, {counts.jobs_queued} queued"
        )
    elif status == common_pb2.RUN_STATUS_FAILED:
        verdict = f"failed: {len(failed)} of {counts.jobs_total} jobs failed"
    else:
        verdict = status_name(status)
    return {
        "run_id": run.run_id,
        "status": status_name(status),
        "verdict": verdict,
        "waiting_behind": list(run.waiting_behind),
        "failed_jobs": failed,
        "timeline": [job_facts(job) for job in timeline or []],
        "jobs": {
            state_name(s): n
            for s, n in (
                (common_pb2.JOB_STATE_QUEUED, counts.jobs_queued),
                (common_pb2.JOB_STATE_LEASED, counts.jobs_leased),
                (common_pb2.JOB_STATE_COMPLETED, counts.jobs_completed),
                (common_pb2.JOB_STATE_FAILED, counts.jobs_failed),
                (common_pb2.JOB_STATE_CANCELLED, counts.jobs_cancelled),
                (common_pb2.JOB_STATE_EXPIRED, counts.jobs_expired),
            )
        },
    }


def attempt_line(attempt: dict[str, Any]) -> str:
    """One attempt for people: `#2 claimed by wk_b on gpu-box at ...: lapsed at ...`."""
    line = (
        f"#{attempt['generation']} claimed by {attempt['claimed_by'] or '?'} on "
        f"{attempt['device_id'] or attempt['runtime_id']} at {attempt['claimed_at']}: "
    )
    outcome = attempt["outcome"]
    if outcome == "running":
        line += f"running, lease until {attempt['lease_until'] or '?'}"
    elif outcome == "lapsed":
        line += (
            f"lapsed at {attempt['lease_until']} ({attempt['heartbeats_missed']} heartbeats "
            f"missed), taken back at {attempt['ended_at']}"
        )
    else:
        line += f"{outcome.replace('_', ' ')} at {attempt['ended_at']}"
    if attempt["failure_reason"]:
        line += f" ({attempt['failure_reason']})"
    if attempt["refusals"]:
        refusals = ", ".join(f"{r} x{n}" for r, n in sorted(attempt["refusals"].items()))
        line += f"; fences refused {refusals}"
    return line


def lines(explanation: dict[str, Any], *, all_jobs: bool = False) -> list[str]:
    """The explanation for people; the timeline of the jobs that met trouble (every job's
    with `all_jobs`)."""
    out = [f"run {explanation['run_id']}: {explanation['verdict']}"]
    for ahead in explanation["waiting_behind"]:
        out.append(f"  ahead: {ahead}")
    for job in explanation["failed_jobs"]:
        out.append(
            f"  job {job['job_id']} ({job['camera_id']}, {job['recording_id']}) failed: "
            f"{job['reason']}: {job['message']}"
        )
        if job["fence"]:
            out.append(f"    refused by {job['fence']}")
    shown = [j for j in explanation["timeline"] if all_jobs or troubled(j)]
    if shown:
        out.append("timeline:")
    for job in shown:
        out.append(f"  job {job['job_id']} ({job['state']}, {len(job['attempts'])} attempt(s))")
        out.extend(f"    {attempt_line(attempt)}" for attempt in job["attempts"])
    return out
