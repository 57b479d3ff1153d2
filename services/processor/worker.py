"""The processor (a kit Worker): its lease loop, frame pipeline and publisher, composed.

Owns the wiring and nothing else: `Processor` takes the processor's settings, its
JobService calls (on the session stream or unary: calls.py's `job_transport`, chosen
once by whoever starts it, who also closes it) and the preview stub, chooses the
publisher once (publishing.py: grants, or PublishPreview with `direct_writes` off), and
hands the lease loop (leases.py: claim, renew, complete or hand back, drain) the frame
pipeline (pipeline.py: decode, infer, route, track, publish) as the work it runs under
each lease. Every RPC about a job goes through one `Caller` (calls.py), which sorts
answers into successes, refusals and none.
"""

from __future__ import annotations

import asyncio
import dataclasses

from services.processor.calls import Caller, JobCalls, Metadata
from services.processor.inference import ModelServer
from services.processor.leases import PROGRESS_AFTER_SECONDS, LeaseLoop
from services.processor.pipeline import FramePipeline
from services.processor.publishing import publisher_for
from services.processor.recordings import RecordingStore
from workshop.v1 import preview_pb2_grpc


@dataclasses.dataclass
class Processor:
    """One runtime on one device: the long-running claim loop (a kit Worker)."""

    jobs: JobCalls  # calls.job_transport: on the session stream or unary; closed by its maker
    previews: preview_pb2_grpc.PreviewServiceAsyncStub
    credentials: Metadata
    runtime_id: str
    code_sha256: str
    recordings: RecordingStore
    models: ModelServer
    gpu: bool = False
    in_flight: int = 3
    idle_seconds: float = 2.0
    claim_wait_seconds: int = 20  # a Claim waits this long at the coordinator for a job
    heartbeat_seconds: float = 0.0  # 0: the interval Claim hands out (45 s); tests shorten it
    retry_seconds: float = 60.0  # how long an RPC about a job is asked again before a hand-back
    # Progress is reported once a job has run this long, then at most this often (0: always).
    progress_after_seconds: float = PROGRESS_AFTER_SECONDS
    # Write preview bytes straight to object storage with grants (False: through
    # PublishPreview, one call per preview).
    direct_writes: bool = True
    # On a stop, how long jobs in flight may run on before what is left is handed back.
    job_grace_seconds: float = 30.0
    leases: LeaseLoop = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        call = Caller(self.credentials, self.retry_seconds)
        publisher = publisher_for(
            self.direct_writes, self.previews, call, self.code_sha256, self.jobs
        )
        pipeline = FramePipeline(
            self.code_sha256, self.recordings, self.models, publisher, gpu=self.gpu
        )
        self.leases = LeaseLoop(
            self.jobs,
            call,
            self.runtime_id,
            self.code_sha256,
            pipeline.run,
            in_flight=self.in_flight,
            idle_seconds=self.idle_seconds,
            claim_wait_seconds=self.claim_wait_seconds,
            heartbeat_seconds=self.heartbeat_seconds,
            progress_after_seconds=self.progress_after_seconds,
            job_grace_seconds=self.job_grace_seconds,
        )

    async def start(self) -> None:
        await self.leases.start()

    async def drain(self) -> None:
        """Stops claiming; the jobs in flight may finish (leases.py)."""
        await self.leases.drain()

    def hurry(self) -> None:
        """Ends a drain now (a second stop signal)."""
        self.leases.hurry()

    async def stop(self) -> None:
        """Hands back what is still running, no attempt spent (leases.py)."""
        await self.leases.stop()

    @property
    def running_jobs(self) -> set[asyncio.Task[None]]:
        return self.leases.running_jobs

    @property
    def completed(self) -> int:
        return self.leases.completed

    @property
    def failed(self) -> int:
        return self.leases.failed

    @property
    def handed_back(self) -> int:
        return self.leases.handed_back
