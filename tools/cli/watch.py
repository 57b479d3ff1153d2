"""`workshop runs watch`: the run's live stream (WatchRun) as progress bars or JSON lines,
and an exit code by the run's final status."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import grpc
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from tools.cli.context import Options, channel_tls, fail, refused
from tools.cli.output import as_dict
from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.kit.jsonmap import enum_word
from workshop.v1 import common_pb2, run_pb2, workshop_pb2_grpc
from workshop.v1 import workshop_pb2 as ws

# The exit code of a watch by the run's final status (docs/cli.md).
EXIT_BY_STATUS = {
    common_pb2.RUN_STATUS_COMPLETED: 0,
    common_pb2.RUN_STATUS_FAILED: 3,
    common_pb2.RUN_STATUS_CANCELLED: 4,
    common_pb2.RUN_STATUS_EXPIRED: 5,
}
EXIT_INTERRUPTED = 6  # the stream ended before the run did (connection lost, Ctrl-C)


def state_name(state: common_pb2.JobState.ValueType) -> str:
    return enum_word(common_pb2.JobState.DESCRIPTOR, state)


def status_name(status: common_pb2.RunStatus.ValueType) -> str:
    return enum_word(common_pb2.RunStatus.DESCRIPTOR, status)


def job_row(job: run_pb2.JobSummary) -> dict[str, Any]:
    phase = enum_word(common_pb2.JobPhase.DESCRIPTOR, job.phase)
    return {
        "job": job.job_id,
        "camera": job.camera_id,
        "recording": job.recording_id,
        "state": state_name(job.state),
        "phase": "" if phase == "unspecified" else phase,
        "progress %": job.progress_percent,
        "slots": job.slot_count,
    }


class Bars:
    """One bar per job and one for the run's committed slots, updated per message."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TextColumn("{task.fields[state]}"),
            console=Console(stderr=False),
        )
        self.run_task: TaskID | None = None
        self.jobs: dict[str, TaskID] = {}

    def update(self, detail: run_pb2.RunDetail) -> None:
        counts = detail.run.counts
        committed = counts.slots_frame + counts.slots_empty + counts.slots_dropped
        if self.run_task is None:
            self.run_task = self.progress.add_task(
                f"run {detail.run.run_id}", total=max(counts.slots_expected, 1), state=""
            )
        self.progress.update(
            self.run_task, completed=committed, state=status_name(detail.run.status)
        )
        for job in detail.jobs:
            task = self.jobs.get(job.job_id)
            if task is None:
                task = self.jobs[job.job_id] = self.progress.add_task(
                    f"  {job.job_id} {job.camera_id}", total=100, state=""
                )
            self.progress.update(task, completed=job.progress_percent, state=state_name(job.state))


def follow(opts: Options, run_id: str) -> int:
    """Watches the run to its end; the exit code by its final status."""
    target, metadata = opts.target(), bearer_metadata(opts.secret())
    last: list[run_pb2.RunDetail] = []
    bars = Bars() if not opts.json else None

    async def go() -> int:
        async with open_channel(target, tls=channel_tls()) as channel:
            stream = workshop_pb2_grpc.WorkshopServiceStub(channel).WatchRun(
                ws.WatchRunRequest(run_id=run_id), metadata=metadata
            )
            async for message in stream:
                last[:] = [message.detail]
                _show(opts, bars, message)
                if message.final:
                    return EXIT_BY_STATUS.get(message.detail.run.status, EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED

    try:
        if bars is not None:
            with bars.progress:
                code = asyncio.run(go())
        else:
            code = asyncio.run(go())
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except grpc.aio.AioRpcError as error:
        if not last:  # refused at the start (unknown run, bad key): a refusal
            refused(error)
        print(
            f"workshop: UNAVAILABLE: the watch was interrupted: {error.details()}", file=sys.stderr
        )
        code = EXIT_INTERRUPTED
    if opts.output == "json" and last:
        sys.stdout.write(json.dumps(as_dict(last[0]), sort_keys=True, indent=2) + "\n")
    if code == EXIT_INTERRUPTED and not last:
        fail("UNAVAILABLE", "the watch ended before any update", code=code)
    if last and opts.output == "table":
        run = last[0].run
        print(f"run {run.run_id} {status_name(run.status)}")
    return code


def _show(opts: Options, bars: Bars | None, message: ws.WatchRunResponse) -> None:
    if opts.output == "jsonl":
        sys.stdout.write(json.dumps(as_dict(message), sort_keys=True) + "\n")
        sys.stdout.flush()
    elif bars is not None:
        bars.update(message.detail)
