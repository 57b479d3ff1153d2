"""Previews written straight to object storage, recorded in batches (docs/previews-and-uploads.md).

The preview service grants writes for a lease (GrantPreviewWrites with `lease_grant`:
one S3 POST policy for every slot, bound to the lease's preview key prefix, the content
type and the largest size, expiring within a minute and never after the lease; a preview
service from before it answers a policy per slot for the next slots asked for, which are
used instead). The processor POSTs each image with the grant under the slot's key and
queues the preview's record. Records of all its jobs go together,
as one `record_previews` message on the processor's Session stream to the coordinator
(`records`: SessionJobs.RecordPreviews), which runs them as one fenced statement; a
processor whose calls go unary (PROCESSOR_JOB_TRANSPORT=unary, a coordinator of release
0.1) or whose coordinator does not take the message (RecordsNotServed: asked once, then
never again) sends them to the preview service's RecordWrittenPreviews instead, which
forwards them to the coordinator's same statement. A batch is sent when it holds
`max_batch` records, `linger_seconds` after its first one, or when a job waits for its
records; one batch is in flight at a time, so each lease's records arrive in slot
order. A job waits for its records (`settle`) before it completes; a refusal met
earlier stops it at its next frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import urllib3
from google.protobuf.message import Message

from services.processor.calls import RecordsNotServed
from workshop.v1 import common_pb2
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import publication_pb2 as pub

# Slots asked for per GrantPreviewWrites, for a preview service that answers per-slot
# grants (one from before lease grants): a job's next 128 (a 60 s recording at 2 fps has
# 120), so most jobs ask once; the grants of slots not reached before they expire (60 s)
# are asked for again. A lease grant covers every slot: asked for again only as it expires.
GRANT_BATCH = 128
MAX_BATCH = 256  # records per message (what the coordinator and the preview service take)
# How long the first queued record waits for others. A batch costs the control plane CPU
# whatever it carries (a message on the session and its statement, whose fences run once
# per lease of the batch: docs/benchmarks.md), so it is worth a wait; a preview then
# reaches the run's live images up to this much later (half of it on average). At 2
# frames/s per job and 3 jobs in flight (6 records/s), 1.4 s makes batches of 9 records
# whatever the jobs' phases, each record waiting 0.7-0.9 s on average (1.25 s: 7-9; 1.0 s:
# 6); a processor faster than real time fills them sooner (the throughput benchmark's: 90
# records per batch). A job that finishes does not wait (settle sends at once), nor does
# a full batch.
LINGER_SECONDS = 1.4
GRANT_MARGIN = timedelta(seconds=5)  # a grant closer than this to its expiry is renewed
WRITE_TIMEOUT_SECONDS = 10.0
WRITE_RETRIES = 2
# A write the store does not take (unreachable, 5xx) after the HTTP client's own retries is
# asked again with this backoff for up to `retry_seconds`, as the worker asks an RPC again:
# a store out for a second must not hand back (and redo) a job that has written half its
# previews.
WRITE_FIRST_PAUSE_SECONDS = 0.5
WRITE_MAX_PAUSE_SECONDS = 5.0

log = logging.getLogger(__name__)

LeaseId = tuple[str, str, int]
Call = Callable[[Any, Any], Awaitable[Any]]


class WriteFailed(Exception):
    """Object storage did not take the image (unreachable, 5xx, or refused the grant)."""


def _lease_id(lease: common_pb2.LeaseRef) -> LeaseId:
    return (lease.run_id, lease.job_id, lease.generation)


@dataclasses.dataclass(frozen=True)
class _Write:
    """What one slot's POST sends: where, under which key, with which form fields."""

    url: str
    object_key: str
    fields: Mapping[str, str]  # the grant's form fields, without the key


@dataclasses.dataclass
class _Lease:
    grant: pb.LeasePreviewWriteGrant | None = None  # for every slot of the lease
    grants: dict[int, pb.PreviewWriteGrant] = dataclasses.field(default_factory=dict)
    pending: set[asyncio.Future[Message]] = dataclasses.field(default_factory=set)
    refused: BaseException | None = None


class DirectPreviews:
    def __init__(
        self,
        previews: Any,  # PreviewServiceAsyncStub
        call: Call,
        refusal: Callable[[pub.Refusal], Exception],
        code_sha256: str,
        *,
        records: Any = None,  # SessionJobs.RecordPreviews; None: the preview service's
        max_batch: int = MAX_BATCH,
        linger_seconds: float = LINGER_SECONDS,
        retry_seconds: float = 0.0,
    ) -> None:
        self._previews = previews
        self._call = call  # the worker's RPC wrapper: retries, LeaseLost, ServiceUnavailable
        self._refusal = refusal  # one preview's refusal as the worker's exception
        self._records = records  # the session's record_previews, until it is not served
        self._code = code_sha256
        self._max_batch = max_batch
        self._linger = linger_seconds
        self._retry_seconds = retry_seconds  # how long a write the store does not take is retried
        self._leases: dict[LeaseId, _Lease] = {}
        self._queue: list[tuple[pub.RecordPreviewRequest, asyncio.Future[Message]]] = []
        self.batches: list[int] = []  # records per batch sent (tests, benchmarks)
        self._sender: asyncio.Task[None] | None = None
        self._full = asyncio.Event()  # set when a batch is full or must go now
        self._flush = False  # a job waits for its records: the next batch goes at once
        self._http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=WRITE_TIMEOUT_SECONDS, read=WRITE_TIMEOUT_SECONDS),
            retries=urllib3.Retry(
                total=WRITE_RETRIES,
                backoff_factor=0.2,
                status_forcelist=(500, 502, 503, 504),
                allowed_methods=None,  # a POST of the same key again is idempotent
            ),
            maxsize=8,
        )

    async def publish(
        self,
        job: Any,  # jobs_pb2.ClaimedJob
        slot: int,
        frame_time: Any,  # Timestamp
        image: bytes,
        content_type: str,
        boxes: Sequence[Any],
        sha256: str,
    ) -> str:
        """Writes the slot's image and queues its record; returns the object key."""
        lease = job.lease
        state = self._leases.setdefault(_lease_id(lease), _Lease())
        if state.refused is not None:
            raise state.refused
        grant = await self._grant(job, state, slot, content_type)
        try:
            await self._write(grant, image, content_type)
        except WriteFailed:
            # A grant the store calls expired or invalid (a clock apart): one fresh try.
            state.grant = None
            state.grants.clear()
            grant = await self._grant(job, state, slot, content_type)
            await self._write(grant, image, content_type)
        written = pub.RecordPreviewRequest(
            lease=lease,
            code_sha256=self._code,
            slot_index=slot,
            object_key=grant.object_key,
            frame_time=frame_time,
            boxes=boxes,
            byte_size=len(image),
            sha256=sha256,
            content_type=content_type,
        )
        answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        state.pending.add(answer)
        answer.add_done_callback(lambda done: self._settled(lease, done))
        self._queue.append((written, answer))
        if len(self._queue) >= self._max_batch:
            self._full.set()
        if self._sender is None:
            self._sender = asyncio.create_task(self._send())
        return grant.object_key

    async def settle(self, lease: common_pb2.LeaseRef) -> None:
        """Waits until every record of the lease is answered; raises its first refusal."""
        state = self._leases.get(_lease_id(lease))
        if state is None:
            return
        try:
            if state.pending:
                self._flush = True  # the job waits for its records: send what is queued now
                self._full.set()
                await asyncio.wait(list(state.pending))
            if state.refused is not None:
                raise state.refused
        finally:
            self._leases.pop(_lease_id(lease), None)

    def _settled(self, lease: common_pb2.LeaseRef, done: asyncio.Future[Message]) -> None:
        state = self._leases.get(_lease_id(lease))
        if state is None:
            return
        state.pending.discard(done)
        if not done.cancelled() and done.exception() is not None and state.refused is None:
            state.refused = done.exception()

    async def _grant(self, job: Any, state: _Lease, slot: int, content_type: str) -> _Write:
        """The slot's write: under the lease's grant, else under the slot's own grant; asked
        for again when neither is there or what is there is about to expire."""
        now = datetime.now(UTC)
        lease_grant = state.grant
        if (
            lease_grant is not None
            and lease_grant.content_type == content_type
            and _lasts(lease_grant, now)
        ):
            return _lease_write(lease_grant, slot)
        slot_grant = state.grants.get(slot)
        if slot_grant is not None and _lasts(slot_grant, now):
            return _Write(slot_grant.url, slot_grant.object_key, slot_grant.fields)
        # Both kinds asked at once: a preview service from before lease grants ignores
        # `lease_grant` and answers the slots' grants, so no call is spent finding out.
        slots = list(range(slot, min(slot + GRANT_BATCH, len(job.input.slots))))
        reply = await self._call(
            self._previews.GrantPreviewWrites,
            pb.GrantPreviewWritesRequest(
                lease=job.lease,
                code_sha256=self._code,
                slot_indices=slots,
                content_type=content_type,
                lease_grant=True,
                # the claim's signed word that the lease held: the preview service need
                # not ask the coordinator (unset from a coordinator without a key)
                lease_attestation=job.lease_attestation
                if job.HasField("lease_attestation")
                else None,
            ),
        )
        if reply.HasField("lease_grant"):
            state.grant, state.grants = reply.lease_grant, {}
            return _lease_write(reply.lease_grant, slot)
        state.grant = None
        state.grants = {granted.slot_index: granted for granted in reply.grants}
        slot_grant = state.grants[slot]
        return _Write(slot_grant.url, slot_grant.object_key, slot_grant.fields)

    async def _write(self, grant: _Write, image: bytes, content_type: str) -> None:
        """POSTs the image with its grant; a store that does not take it (WriteUnavailable)
        is asked again with backoff for up to `retry_seconds`. The same key again is
        idempotent, and a grant that expires meanwhile is refused (WriteFailed): renewed."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._retry_seconds
        pause = WRITE_FIRST_PAUSE_SECONDS
        while True:
            try:
                await asyncio.to_thread(self._post, grant, image, content_type)
                return
            except WriteUnavailable as error:
                if loop.time() + pause > give_up:
                    raise
                log.warning("%s; asking again in %.1f s", error, pause)
            await asyncio.sleep(pause)
            pause = min(WRITE_MAX_PAUSE_SECONDS, 2 * pause)

    def _post(self, grant: _Write, image: bytes, content_type: str) -> None:
        fields: dict[str, Any] = dict(grant.fields)
        fields["key"] = grant.object_key  # a lease grant's fields name no key
        fields["file"] = ("image", image, content_type)  # S3 wants the file last
        try:
            response = self._http.request("POST", grant.url, fields=fields)
        except urllib3.exceptions.HTTPError as error:
            raise WriteUnavailable(
                f"Object storage did not take preview {grant.object_key}: {type(error).__name__}"
            ) from None
        if response.status >= 500:
            raise WriteUnavailable(
                f"Object storage did not take preview {grant.object_key}: HTTP {response.status}"
            )
        if response.status >= 300:
            raise WriteFailed(
                f"Object storage refused preview {grant.object_key} with its grant: HTTP "
                f"{response.status} {response.data[:300].decode(errors='replace')}"
            )

    async def _send(self) -> None:
        try:
            while self._queue:
                if len(self._queue) < self._max_batch and not self._flush:
                    self._full.clear()
                    # A batch waits a moment for more records, or until it is full.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._full.wait(), self._linger)
                self._flush = False
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
                await self._send_batch(batch)
        finally:
            self._sender = None

    async def _send_batch(
        self, batch: list[tuple[pub.RecordPreviewRequest, asyncio.Future[Message]]]
    ) -> None:
        # Records of a lease already refused (or given up) are not sent: its job has
        # stopped, and a batch of them would hold up the records of other jobs.
        live = []
        for written, answer in batch:
            state = self._leases.get(_lease_id(written.lease))
            if state is None or state.refused is None:
                live.append((written, answer))
            elif not answer.done():
                answer.set_exception(state.refused)
        batch = live
        if not batch:
            return
        self.batches.append(len(batch))
        try:
            outcomes: list[Any] = await self._record([written for written, _ in batch])
            if len(outcomes) != len(batch):
                raise WriteUnavailable(f"{len(outcomes)} outcomes answered for {len(batch)}.")
        except Exception as error:  # the whole batch: no answer, or a refusal of the call
            outcomes = [error] * len(batch)
        for (_, answer), outcome in zip(batch, outcomes, strict=True):
            if answer.done():
                continue
            if isinstance(outcome, BaseException):
                answer.set_exception(outcome)
            elif outcome.HasField("refused"):
                answer.set_exception(self._refusal(outcome.refused))
            else:
                answer.set_result(outcome.recorded)

    async def _record(self, previews: list[pub.RecordPreviewRequest]) -> list[Any]:
        """The outcomes of one batch: on the session while the coordinator takes it there,
        else through the preview service."""
        if self._records is not None:
            try:
                reply = await self._call(
                    self._records, pub.RecordPreviewsRequest(previews=previews)
                )
            except RecordsNotServed:
                log.info(  # the session's own warning said why
                    "previews are recorded through the preview service (RecordWrittenPreviews) "
                    "from now on: the coordinator takes no record_previews on the session"
                )
                self._records = None
            else:
                return list(reply.outcomes)
        reply = await self._call(
            self._previews.RecordWrittenPreviews,
            pb.RecordWrittenPreviewsRequest(previews=[_written(one) for one in previews]),
        )
        return list(reply.outcomes)

    def close(self) -> None:
        self._http.clear()


def _lasts(grant: pb.LeasePreviewWriteGrant | pb.PreviewWriteGrant, now: datetime) -> bool:
    """Whether the grant works for a while yet (it is renewed within GRANT_MARGIN of expiry)."""
    return grant.expires_at.ToDatetime(tzinfo=UTC) - GRANT_MARGIN >= now


def _lease_write(grant: pb.LeasePreviewWriteGrant, slot: int) -> _Write:
    """The slot's write under the lease's grant: the lease's preview key for the slot, the
    only key of all those the grant allows that a record may name."""
    return _Write(grant.url, f"{grant.key_prefix}{slot}{grant.key_suffix}", grant.fields)


def _written(record: pub.RecordPreviewRequest) -> pb.WrittenPreview:
    """A record as the preview service's RecordWrittenPreviews takes it."""
    return pb.WrittenPreview(
        lease=record.lease,
        code_sha256=record.code_sha256,
        slot_index=record.slot_index,
        object_key=record.object_key,
        frame_time=record.frame_time,
        boxes=record.boxes,
        byte_size=record.byte_size,
        sha256=record.sha256,
        content_type=record.content_type,
    )


class WriteUnavailable(Exception):
    """Object storage could not be reached for a preview: the job is handed back."""
