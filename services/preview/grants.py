"""Direct writes: the processor writes preview bytes into object storage itself.

Relaying every image through this service cost more CPU than the rest of the control
plane together (docs/benchmarks.md). Instead, for a lease that holds, the service
hands out S3 POST policies (GrantPreviewWrites): one for every slot of the lease (a
lease grant: keys that start with the lease's preview key prefix, one signature per
lease and grant lifetime), or, for processors from before it, one per slot asked for,
bound to the lease's preview key for the slot. Both bind one content type and
1..max_image_bytes bytes, and expire within `grant_seconds` and never after the lease.
The processor then records what it wrote (RecordWrittenPreviews, or the coordinator's
record_previews) in batches that the coordinator runs as one fenced statement, exactly
as the records of PublishPreview: a record whose key is not the lease's key for its
slot is refused, a refused record leaves its object collectable, and bytes written but
never recorded (any key a lease grant allows lies under the job's preview prefix) are
found by the job's sweep (a grant lives at most 600 s and never past the lease, so it is
dead before the sweep's 10 minutes after the job ended).

What the store cannot check is the SHA-256 and the size the record names: the bytes
do not pass here. The digest is checked where it matters, by every reader (ReadImage
and exports never serve bytes that differ from it), so a wrong one only makes that
processor's own image unreadable; the size is bounded by the policy.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp

from services.preview.errors import InvalidField
from services.preview.images import CONTENT_TYPES
from services.preview.leases import LeaseChecks
from services.preview.metrics import count_put
from services.preview.recorder import PreviewRecorder
from services.preview.storage import ObjectStore
from workshop.kit.errors import PermissionDenied, Unauthenticated, Unavailable, WorkshopError
from workshop.kit.object_keys import EXTENSIONS, job_prefix, object_key
from workshop.kit.status import status_for
from workshop.kit.written_previews import check_written_preview
from workshop.v1 import common_pb2
from workshop.v1 import preview_pb2 as pb
from workshop.v1 import publication_pb2 as pub

MAX_PER_CALL = 256
MIN_GRANT_SECONDS = 1  # a lease about to lapse still gets a grant; its record is then refused


class WriteGrants:
    def __init__(
        self,
        store: ObjectStore,
        leases: LeaseChecks,
        recorder: PreviewRecorder,
        *,
        grant_seconds: int,
        max_image_bytes: int,
    ) -> None:
        self.store = store
        self.leases = leases
        self.recorder = recorder
        self.grant_seconds = grant_seconds
        self.max_image_bytes = max_image_bytes

    async def grant(
        self, processor: str, request: pb.GrantPreviewWritesRequest
    ) -> pb.GrantPreviewWritesResponse:
        slots = list(request.slot_indices)
        fewest = 0 if request.lease_grant else 1
        if not fewest <= len(slots) <= MAX_PER_CALL:
            raise InvalidField("slot_indices", f"Ask for {fewest} to {MAX_PER_CALL} slots.")
        if request.content_type not in CONTENT_TYPES:
            raise InvalidField(
                "content_type", f"content_type must be one of {', '.join(CONTENT_TYPES)}."
            )
        lease = request.lease
        attestation = request.lease_attestation if request.HasField("lease_attestation") else None
        facts = await self.leases.facts(processor, lease, request.code_sha256, attestation)
        unexpected = [slot for slot in slots if slot >= facts.slot_count]
        if unexpected:
            raise InvalidField(
                "slot_indices",
                f"Slot {unexpected[0]} is not an expected slot of job {lease.job_id} "
                f"(it has {facts.slot_count}).",
            )
        now = datetime.now(UTC)
        expires = now + timedelta(seconds=min(self.grant_seconds, self._lease_left(facts)))
        expires = max(expires, now + timedelta(seconds=MIN_GRANT_SECONDS)).replace(microsecond=0)
        expires_at = Timestamp(seconds=int(expires.timestamp()))  # whole seconds (above)
        test = facts.mode != common_pb2.RUN_MODE_FULL
        answer = pb.GrantPreviewWritesResponse()
        if request.lease_grant:
            # One policy for every slot: keys that start with the lease's own prefix (its
            # generation, and the "/" after it, so generation 3 never writes 30's keys).
            prefix = job_prefix("preview", lease.run_id, lease.job_id, test=test)
            prefix = f"{prefix}{lease.generation}/"
            fields = self.store.prefix_post_policy(
                prefix, request.content_type, self.max_image_bytes, expires
            )
            granted = answer.lease_grant
            granted.key_prefix = prefix
            granted.key_suffix = "." + EXTENSIONS[request.content_type]
            granted.url = self.store.bucket_url
            granted.fields.update(fields)
            granted.expires_at.CopyFrom(expires_at)
            granted.max_bytes = self.max_image_bytes
            granted.content_type = request.content_type
            return answer
        keys = [
            object_key(
                "preview",
                lease.run_id,
                lease.job_id,
                lease.generation,
                slot,
                test=test,
                content_type=request.content_type,
            )
            for slot in slots
        ]
        policies = self.store.post_policies(
            keys, request.content_type, self.max_image_bytes, expires
        )
        for slot, key, fields in zip(slots, keys, policies, strict=True):
            grant = answer.grants.add(
                slot_index=slot,
                object_key=key,
                url=self.store.bucket_url,
                max_bytes=self.max_image_bytes,
                expires_at=expires_at,
            )
            grant.fields.update(fields)
        return answer

    def _lease_left(self, facts: pub.CheckLeaseResponse) -> float:
        """Seconds the lease has left at least, by the coordinator's clock (which may differ
        from ours): its expiry minus the check's time, less the time an answer is reused."""
        if not facts.HasField("checked_at"):  # an older coordinator: the grant's own limit
            return self.grant_seconds
        left = facts.lease_expires_at.ToDatetime() - facts.checked_at.ToDatetime()
        return left.total_seconds() - self.leases.seconds

    async def record(
        self, processor: str, request: pb.RecordWrittenPreviewsRequest
    ) -> pb.RecordWrittenPreviewsResponse:
        """Every well-formed preview goes to the coordinator in one RecordPreviews call
        (PreviewRecorder groups it with this processor's other records); a malformed
        one is refused on its own."""
        if not 1 <= len(request.previews) <= MAX_PER_CALL:
            raise InvalidField("previews", f"Send 1 to {MAX_PER_CALL} previews.")
        outcomes: list[pub.RecordPreviewResponse | WorkshopError | None] = []
        sent: list[tuple[int, pub.RecordPreviewRequest]] = []
        for position, written in enumerate(request.previews):
            try:
                sent.append((position, self._record_request(written)))
                outcomes.append(None)
            except WorkshopError as error:
                outcomes.append(error)
        if sent:
            answered = await self.recorder.record_many(processor, [r for _, r in sent])
            for (position, _), answer in zip(sent, answered, strict=True):
                # No answer (the whole call may be retried), or a refusal of the caller
                # rather than of one preview: the call's own error, never an outcome.
                if isinstance(answer, Unavailable | Unauthenticated | PermissionDenied):
                    raise answer
                outcomes[position] = answer
        reply = pb.RecordWrittenPreviewsResponse()
        for written, outcome in zip(request.previews, outcomes, strict=True):
            assert outcome is not None
            if isinstance(outcome, WorkshopError):
                reply.outcomes.add(refused=_refusal(outcome))
                continue
            count_put(written.object_key, written.byte_size, path="direct")
            recorded = reply.outcomes.add().recorded
            recorded.item_id = outcome.item_id
            recorded.object_key = written.object_key
            recorded.sha256 = written.sha256
            if outcome.HasField("expires_at"):
                recorded.expires_at.CopyFrom(outcome.expires_at)
        return reply

    def _record_request(self, written: pb.WrittenPreview) -> pub.RecordPreviewRequest:
        check_written_preview(written, self.max_image_bytes)  # as the coordinator checks it
        # The coordinator refuses a key that is not this lease's preview key for the slot
        # and content type, so a grant's key is the only one that can be recorded.
        return pub.RecordPreviewRequest(
            lease=written.lease,
            code_sha256=written.code_sha256,
            slot_index=written.slot_index,
            object_key=written.object_key,
            frame_time=written.frame_time,
            boxes=written.boxes,
            byte_size=written.byte_size,
            sha256=written.sha256,
            content_type=written.content_type,
        )


def _refusal(error: WorkshopError) -> pub.Refusal:
    return pub.Refusal(
        code=status_for(error).grpc_code.value[0],
        message=error.message,
        reason=error.reason,
        metadata=error.metadata,
    )
