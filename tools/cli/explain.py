"""`workshop runs explain`: why a run waits or why it failed, from its detail (GetRun)."""

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


def explain(detail: run_pb2.RunDetail) -> dict[str, Any]:
    """The facts: status, the runs ahead while queued, the failed jobs with reason, message
    and fence, and a one-line verdict."""
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


def lines(explanation: dict[str, Any]) -> list[str]:
    """The explanation for people."""
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
    return out
