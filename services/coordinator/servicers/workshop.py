"""WorkshopService: translates the contract to calls of the workflows room (`Workflows`),
the runs (`Runs`), photos and review, and back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from google.protobuf import json_format

from services.coordinator import convert
from services.coordinator.identity import auth
from services.coordinator.identity.auth import Principal
from services.coordinator.leases.jobs import job_id
from services.coordinator.leases.timeline import Attempt, JobTimeline, Timelines
from services.coordinator.platform.errors import InvalidField
from services.coordinator.platform.fields import bounded, page_size
from services.coordinator.review import reviews
from services.coordinator.review.history import ItemHistories
from services.coordinator.review.queue import ReviewQueue
from services.coordinator.review.reviews import ReviewApi
from services.coordinator.runs.admission import RunRequest, run_request
from services.coordinator.runs.events import RunEvents
from services.coordinator.runs.photos import PhotosApi, PhotoView
from services.coordinator.runs.rows import JobRow, RunImageRow
from services.coordinator.runs.runs import Runs, RunView
from services.coordinator.servicers import views
from services.coordinator.servicers.common import (
    Authenticator,
    Context,
    next_token,
    split_token,
    time_and_id_token,
)
from services.coordinator.workflows.documents import WorkflowRow, Workflows, spec_from_json
from workshop.kit import limits
from workshop.v1 import common_pb2, run_pb2, snapshot_pb2, workflow_pb2, workshop_pb2_grpc
from workshop.v1 import workshop_pb2 as pb

MODES = {common_pb2.RUN_MODE_TEST: "test", common_pb2.RUN_MODE_FULL: "full"}
STATUSES = {
    "queued": common_pb2.RUN_STATUS_QUEUED,
    "running": common_pb2.RUN_STATUS_RUNNING,
    "completed": common_pb2.RUN_STATUS_COMPLETED,
    "failed": common_pb2.RUN_STATUS_FAILED,
    "cancelled": common_pb2.RUN_STATUS_CANCELLED,
    "expired": common_pb2.RUN_STATUS_EXPIRED,
}
STATUS_NAMES = {value: name for name, value in STATUSES.items()}
JOB_STATES = {
    "queued": common_pb2.JOB_STATE_QUEUED,
    "leased": common_pb2.JOB_STATE_LEASED,
    "completed": common_pb2.JOB_STATE_COMPLETED,
    "failed": common_pb2.JOB_STATE_FAILED,
    "cancelled": common_pb2.JOB_STATE_CANCELLED,
    "expired": common_pb2.JOB_STATE_EXPIRED,
}
FAILURE_REASONS = {
    "processor_failed": common_pb2.FAILURE_REASON_PROCESSOR_FAILED,
    "attempts_exhausted": common_pb2.FAILURE_REASON_ATTEMPTS_EXHAUSTED,
    "source_changed": common_pb2.FAILURE_REASON_SOURCE_CHANGED,
    "authority_lost": common_pb2.FAILURE_REASON_AUTHORITY_LOST,
}


ATTEMPT_OUTCOMES = {
    "running": run_pb2.ATTEMPT_OUTCOME_RUNNING,
    "completed": run_pb2.ATTEMPT_OUTCOME_COMPLETED,
    "failed": run_pb2.ATTEMPT_OUTCOME_FAILED,
    "lapsed": run_pb2.ATTEMPT_OUTCOME_LAPSED,
    "handed_back": run_pb2.ATTEMPT_OUTCOME_HANDED_BACK,
    "cancelled": run_pb2.ATTEMPT_OUTCOME_CANCELLED,
    "expired": run_pb2.ATTEMPT_OUTCOME_EXPIRED,
}


def job_attempt(attempt: Attempt) -> run_pb2.JobAttempt:
    answer = run_pb2.JobAttempt(
        generation=attempt.generation,
        claimed_by=attempt.claimed_by,
        runtime_id=attempt.runtime_id,
        device_id=attempt.device_id,
        claimed_at=convert.ts(attempt.claimed_at),
        outcome=ATTEMPT_OUTCOMES.get(attempt.outcome, run_pb2.ATTEMPT_OUTCOME_UNSPECIFIED),
        heartbeats_missed=attempt.heartbeats_missed,
        refusals=[
            run_pb2.FenceRefusals(reason=reason, count=count)
            for reason, count in sorted(attempt.refusals.items())
        ],
        failure_reason=FAILURE_REASONS.get(
            attempt.failure_reason or "", common_pb2.FAILURE_REASON_UNSPECIFIED
        ),
    )
    if attempt.ended_at is not None:
        answer.ended_at.CopyFrom(convert.ts(attempt.ended_at))
    if attempt.lease_until is not None:
        answer.lease_until.CopyFrom(convert.ts(attempt.lease_until))
    return answer


def job_timeline(job: JobTimeline) -> run_pb2.JobTimeline:
    return run_pb2.JobTimeline(
        job_id=job.job_id,
        state=JOB_STATES[job.state],
        camera_id=job.camera_id,
        recording_id=job.recording_id,
        lapses=job.lapses,
        failure_reason=FAILURE_REASONS.get(
            job.failure_reason or "", common_pb2.FAILURE_REASON_UNSPECIFIED
        ),
        failure_message=job.failure_message or "",
        attempts=[job_attempt(attempt) for attempt in job.attempts],
    )


def workflow(row: WorkflowRow) -> workflow_pb2.Workflow:
    return workflow_pb2.Workflow(
        workflow_id=row.workflow_id,
        revision=row.revision,
        spec=spec_from_json(row.spec),
        created_at=convert.ts(row.created_at),
        updated_at=convert.ts(row.updated_at),
        updated_by=auth.principal_proto(row.updated_by),
    )


def run(view: RunView) -> run_pb2.Run:
    row, counts = view.row, view.row.counts
    kind = common_pb2.RUN_KIND_PHOTO if row.kind == "photo" else common_pb2.RUN_KIND_WORKFLOW
    return run_pb2.Run(
        run_id=row.run_id,
        kind=kind,
        mode=common_pb2.RUN_MODE_TEST if row.mode == "test" else common_pb2.RUN_MODE_FULL,
        workflow_id=row.workflow_id,
        workflow_revision=row.workflow_revision,
        runtime_id=row.runtime_id,
        image_limit=row.image_limit,
        status=STATUSES[view.status],
        counts=run_pb2.RunCounts(
            jobs_total=counts.jobs_total,
            jobs_queued=counts.jobs_queued,
            jobs_leased=counts.jobs_leased,
            jobs_completed=counts.jobs_completed,
            jobs_failed=counts.jobs_failed,
            jobs_cancelled=counts.jobs_cancelled,
            jobs_expired=counts.jobs_expired,
            slots_expected=counts.slots_expected,
            slots_frame=counts.slots_frame,
            slots_empty=counts.slots_empty,
            slots_dropped=counts.slots_dropped,
            previews_published=counts.previews_published,
            items_saved=counts.items_saved,
        ),
        waiting_behind=view.waiting_behind,
        created_by=auth.principal_proto(row.created_by),
        created_at=convert.ts(row.created_at),
        finished_at=convert.opt_ts(view.finished_at),
        expires_at=convert.opt_ts(row.expires_at),
    )


def job(row: JobRow) -> run_pb2.JobSummary:
    return run_pb2.JobSummary(
        job_id=job_id(row.job_index),
        job_index=row.job_index,
        camera_id=row.camera_id,
        recording_id=row.recording_id,
        recording_generation=row.recording_generation,
        state=JOB_STATES[row.state],
        phase=common_pb2.JobPhase.Value(f"JOB_PHASE_{row.leased_phase.upper()}")
        if row.leased_phase
        else common_pb2.JOB_PHASE_UNSPECIFIED,
        progress_percent=row.progress,
        slot_count=row.slot_count,
        generation=row.generation,
        failure_reason=FAILURE_REASONS.get(
            row.failure_reason or "", common_pb2.FAILURE_REASON_UNSPECIFIED
        ),
        failure_message=row.failure_message or "",
        decoder=row.decoder or "",
        updated_at=convert.ts(row.updated_at),
        lease_expires_at=convert.opt_ts(row.lease_held_until),
    )


def image(row: RunImageRow) -> run_pb2.RunImage:
    source = run_pb2.IMAGE_SOURCE_PREVIEW if row.source == "preview" else run_pb2.IMAGE_SOURCE_ITEM
    return run_pb2.RunImage(
        item_id=row.item_id,
        source=source,
        job_id=job_id(row.job_index),
        slot_index=row.slot_index,
        camera_id=row.camera_id,
        frame_time=convert.ts(row.frame_time),
        boxes=convert.boxes(row.boxes),
        bucket_id=row.bucket_id,
        published_at=convert.ts(row.published_at),
        expires_at=convert.opt_ts(row.expires_at),
    )


def detail(view: RunView, job_limit: int) -> run_pb2.RunDetail:
    return run_pb2.RunDetail(
        run=run(view),
        jobs=[job(row) for row in view.jobs],
        jobs_truncated=view.row.counts.jobs_total > job_limit,
        recent_images=[image(row) for row in view.images],
    )


class WorkshopServicer(workshop_pb2_grpc.WorkshopServiceServicer):
    def __init__(
        self,
        workflows: Workflows,
        api: Runs,
        photos: PhotosApi,
        reviews: ReviewApi,
        authenticate: Authenticator,
        events: RunEvents,
        timelines: Timelines,
    ) -> None:
        self.workflows = workflows
        self.api = api
        self.photos = photos
        self.review = reviews
        self.queue = ReviewQueue(reviews.db, reviews.clock)
        self.histories = ItemHistories(reviews.db)
        self.who = authenticate
        self.events = events
        self.timelines = timelines

    async def SaveWorkflow(
        self, request: pb.SaveWorkflowRequest, context: Context
    ) -> pb.SaveWorkflowResponse:
        row = await self.workflows.save_workflow(
            await self.who(context), request.workflow_id, request.expected_revision, request.spec
        )
        return pb.SaveWorkflowResponse(workflow=workflow(row))

    async def GetWorkflow(
        self, request: pb.GetWorkflowRequest, context: Context
    ) -> pb.GetWorkflowResponse:
        row = await self.workflows.get_workflow(await self.who(context), request.workflow_id)
        return pb.GetWorkflowResponse(workflow=workflow(row))

    async def ListWorkflows(
        self, request: pb.ListWorkflowsRequest, context: Context
    ) -> pb.ListWorkflowsResponse:
        limit = page_size(request.page_size)
        after = time_and_id_token(request.page_token)
        rows = await self.workflows.list_workflows(await self.who(context), after, limit)
        return pb.ListWorkflowsResponse(
            workflows=[workflow(row) for row in rows],
            next_page_token=next_token(rows, limit, lambda row: (row.updated_at, row.workflow_id)),
        )

    async def DeleteWorkflow(
        self, request: pb.DeleteWorkflowRequest, context: Context
    ) -> pb.DeleteWorkflowResponse:
        expected = request.expected_revision if request.HasField("expected_revision") else None
        cancelled = await self.workflows.delete_workflow(
            await self.who(context), request.workflow_id, expected
        )
        return pb.DeleteWorkflowResponse(cancelled_run_ids=cancelled)

    async def ValidateWorkflow(
        self, request: pb.ValidateWorkflowRequest, context: Context
    ) -> pb.ValidateWorkflowResponse:
        result = await self.workflows.validate(await self.who(context), request.spec)
        return pb.ValidateWorkflowResponse(
            valid=result.valid,
            problems=[problem.to_proto() for problem in result.problems],
            required_capabilities=list(result.required_capabilities),
        )

    async def GetCatalog(
        self, request: pb.GetCatalogRequest, context: Context
    ) -> pb.GetCatalogResponse:
        found = await self.workflows.catalog(await self.who(context))
        return pb.GetCatalogResponse(
            cameras=[convert.camera(row) for row in found.cameras],
            buckets=[convert.bucket(row) for row in found.buckets],
            model_versions=[convert.model_version(row) for row in found.models],
            runtimes=[convert.runtime(row) for row in found.runtimes],
        )

    async def ChooseRuntime(
        self, request: pb.ChooseRuntimeRequest, context: Context
    ) -> pb.ChooseRuntimeResponse:
        who = await self.who(context)  # an unknown caller hears 401 before any 400
        if request.choice == pb.RUNTIME_CHOICE_UNSPECIFIED:
            raise InvalidField("choice must be RECENT_CAPABLE (website) or NEWEST (agents).")
        row = await self.workflows.choose_runtime(
            who,
            request.workflow_id,
            recent=request.choice == pb.RUNTIME_CHOICE_RECENT_CAPABLE,
        )
        return pb.ChooseRuntimeResponse(runtime=convert.runtime(row))

    async def CreateRun(
        self, request: pb.CreateRunRequest, context: Context
    ) -> pb.CreateRunResponse:
        who = await self.who(context)
        asked = run_request(
            run_id=request.run_id,
            workflow_id=request.workflow_id,
            runtime_id=request.runtime_id,
            revision=request.revision,
            mode=MODES.get(request.mode, ""),
            image_limit=request.image_limit if request.HasField("image_limit") else None,
        )
        if request.validate_only:
            return await self._plan(who, asked)
        view, created = await self.api.create_run_view(who, asked)
        return pb.CreateRunResponse(run=run(view), created=created)

    async def _plan(self, who: Principal, asked: RunRequest) -> pb.CreateRunResponse:
        """CreateRun validate_only: the snapshot and jobs the run would get."""
        admission = await self.api.plan_run(who, asked)
        jobs = [
            snapshot_pb2.SnapshotRecording(
                job_id=job_id(job.job_index),
                job_index=job.job_index,
                recording_id=job.recording.recording_id,
                camera_id=job.recording.camera_id,
                generation=job.recording.generation,
                sha256=job.recording.sha256,
                byte_size=job.recording.byte_size,
                object_key=job.recording.object_key,
                start=convert.ts(job.recording.start),
                end=convert.ts(job.recording.end),
                fps=job.recording.fps,
                slot_count=job.slot_count,
            )
            for job in admission.jobs
        ]
        return pb.CreateRunResponse(planned_snapshot=admission.snapshot, planned_jobs=jobs)

    async def GetRun(self, request: pb.GetRunRequest, context: Context) -> pb.GetRunResponse:
        limit = bounded("job_limit", request.job_limit, limits.JOB_LIMIT)
        view = await self.api.run_detail(await self.who(context), request.run_id, limit)
        return pb.GetRunResponse(detail=detail(view, limit))

    async def ListRuns(self, request: pb.ListRunsRequest, context: Context) -> pb.ListRunsResponse:
        limit = page_size(request.page_size)
        token = split_token(request.page_token, 1)
        if token is not None and not token[0].isdigit():
            raise InvalidField("page_token is malformed.")
        listed = await self.review.list_runs(
            await self.who(context),
            request.workflow_id,
            int(token[0]) if token else None,
            limit,
            status=STATUS_NAMES.get(request.status, ""),
            mode=MODES.get(request.mode, ""),
        )
        return pb.ListRunsResponse(
            runs=[
                pb.RunListEntry(run=run(one.view), review_counts=review_counts(one.counts))
                for one in listed
            ],
            next_page_token=str(listed[-1].view.row.seq) if len(listed) == limit else "",
        )

    async def GetRunSnapshot(
        self, request: pb.GetRunSnapshotRequest, context: Context
    ) -> pb.GetRunSnapshotResponse:
        limit = page_size(request.page_size)
        token = split_token(request.page_token, 1)
        if token is not None and not token[0].isdigit():
            raise InvalidField("page_token is malformed.")
        snapshot, rows = await self.api.run_snapshot(
            await self.who(context), request.run_id, int(token[0]) if token else -1, limit
        )
        return pb.GetRunSnapshotResponse(
            snapshot=json_format.ParseDict(snapshot, snapshot_pb2.RunSnapshot()),
            recordings=[views.snapshot_recording(row) for row in rows],
            next_page_token=next_token(rows, limit, lambda row: (row.job_index,)),
        )

    async def GetRunTimeline(
        self, request: pb.GetRunTimelineRequest, context: Context
    ) -> pb.GetRunTimelineResponse:
        limit = page_size(request.page_size)
        token = split_token(request.page_token, 1)
        if token is not None and not token[0].isdigit():
            raise InvalidField("page_token is malformed.")
        jobs = await self.timelines.page(
            await self.who(context), request.run_id, int(token[0]) if token else -1, limit
        )
        return pb.GetRunTimelineResponse(
            run_id=request.run_id,
            jobs=[job_timeline(job) for job in jobs],
            next_page_token=next_token(jobs, limit, lambda job: (job.job_index,)),
        )

    async def CancelRun(
        self, request: pb.CancelRunRequest, context: Context
    ) -> pb.CancelRunResponse:
        view, cancelled = await self.api.cancel_run_view(await self.who(context), request.run_id)
        return pb.CancelRunResponse(run=run(view), jobs_cancelled=cancelled)

    # Live following, review and the summary.

    async def WatchRun(
        self, request: pb.WatchRunRequest, context: Context
    ) -> AsyncIterator[pb.WatchRunResponse]:
        """The run detail now, then after every change; ends once the run has finished."""
        who = await self.who(context)
        limit = bounded("job_limit", request.job_limit, limits.JOB_LIMIT)
        watched = self.api.watch_run(who, request.run_id, limit, self.events)
        async with aclosing(watched) as views:  # a call that ends unsubscribes at once
            async for view in views:
                yield pb.WatchRunResponse(
                    detail=detail(view, limit),
                    sent_at=convert.ts(self.api.clock.now()),
                    final=view.final,
                )

    async def GetReview(
        self, request: pb.GetReviewRequest, context: Context
    ) -> pb.GetReviewResponse:
        limit = page_size(request.page_size, limits.REVIEW_PAGE)
        scope = views.scope_of_run(request.run_id)
        page = await self.review.review(
            await self.who(context),
            request.run_id,
            views.page_key(request.page_token, scope),
            limit,
        )
        response = pb.GetReviewResponse(
            recordings=[views.snapshot_recording(row) for row in page.recordings],
            models=views.pinned_models(page.run.snapshot),
            sightings=[views.sighting(row) for row in page.sightings],
            has_more=page.next_key is not None,
            next_page_token=views.page_token(scope, page.next_key),
        )
        for item in page.items:
            boxes = page.boxes.get(item.item_id, ())
            entry = response.items.add(sighting_ids=[box.sighting_id for box in boxes])
            views.fill_bucket_item(entry.item, item, boxes, page.reviewed.get(item.item_id))
        return response

    async def DecideSighting(
        self, request: pb.DecideSightingRequest, context: Context
    ) -> pb.DecideSightingResponse:
        who = await self.who(context)
        state, relabel = decision(request)
        decided = await self.review.decide(
            who,
            request.run_id,
            request.sighting_id,
            state,
            relabel,
            request.seen_item_count if request.HasField("seen_item_count") else None,
        )
        return pb.DecideSightingResponse(
            sighting=views.sighting(decided.sighting),
            items_updated=decided.items_updated,
            items_joined=decided.items_joined,
        )

    async def CorrectItemBoxes(
        self, request: pb.CorrectItemBoxesRequest, context: Context
    ) -> pb.CorrectItemBoxesResponse:
        who = await self.who(context)
        view = await self.review.correct(
            who,
            request.item_id,
            [
                reviews.CorrectionBox(
                    source_box_index=box.source_box_index,
                    class_name=box.class_name,
                    x=box.x,
                    y=box.y,
                    w=box.w,
                    h=box.h,
                )
                for box in request.boxes
            ],
            expected_revision(request),
        )
        return pb.CorrectItemBoxesResponse(item=views.item_view(view))

    async def UndoItemCorrection(
        self, request: pb.UndoItemCorrectionRequest, context: Context
    ) -> pb.UndoItemCorrectionResponse:
        who = await self.who(context)
        view = await self.review.undo_correction(who, request.item_id, expected_revision(request))
        return pb.UndoItemCorrectionResponse(item=views.item_view(view))

    async def DecideItem(
        self, request: pb.DecideItemRequest, context: Context
    ) -> pb.DecideItemResponse:
        who = await self.who(context)
        state, relabel = decision(request)
        view = await self.review.decide_item(
            who, request.item_id, state, relabel, expected_revision(request)
        )
        return pb.DecideItemResponse(item=views.item_view(view))

    async def ClearItemDecision(
        self, request: pb.ClearItemDecisionRequest, context: Context
    ) -> pb.ClearItemDecisionResponse:
        who = await self.who(context)
        view = await self.review.decide_item(
            who, request.item_id, None, None, expected_revision(request)
        )
        return pb.ClearItemDecisionResponse(item=views.item_view(view))

    async def GetReviewQueue(
        self, request: pb.GetReviewQueueRequest, context: Context
    ) -> pb.GetReviewQueueResponse:
        who = await self.who(context)
        wanted = views.sighting_filter(request.filter)
        order = views.queue_order(request.order)
        limit = bounded("page_size", request.page_size, limits.QUEUE_PAGE)
        scope = wanted.fingerprint(request.bucket_id, order)
        page = await self.queue.page(
            who,
            request.bucket_id,
            wanted,
            order,
            views.queue_key(request.page_token, scope),
            limit,
        )
        return pb.GetReviewQueueResponse(
            sightings=[views.queued_sighting(row) for row in page.sightings],
            next_page_token=views.queue_token(scope, page.next_key),
        )

    async def BulkDecideSightings(
        self, request: pb.BulkDecideSightingsRequest, context: Context
    ) -> pb.BulkDecideSightingsResponse:
        who = await self.who(context)
        state, relabel = decision(request)
        outcome = await self.queue.bulk_decide(
            who,
            request.bucket_id,
            views.sighting_filter(request.filter),
            state,
            relabel,
            dry_run=request.dry_run,
            expected_revision=request.expected_selection_revision or None,
        )
        return pb.BulkDecideSightingsResponse(
            sightings_selected=outcome.sightings_selected,
            sightings_changed=outcome.sightings_changed,
            items_changed=outcome.items_changed,
            selection_revision=outcome.selection_revision,
            action=views.bulk_decision(outcome.action) if outcome.action else None,
        )

    async def UndoBulkDecision(
        self, request: pb.UndoBulkDecisionRequest, context: Context
    ) -> pb.UndoBulkDecisionResponse:
        who = await self.who(context)
        action = await self.queue.undo(who, request.action_id)
        return pb.UndoBulkDecisionResponse(action=views.bulk_decision(action))

    async def GetSummary(
        self, request: pb.GetSummaryRequest, context: Context
    ) -> pb.GetSummaryResponse:
        found = await self.review.summary(await self.who(context), request.time_zone, request.days)
        return pb.GetSummaryResponse(
            buckets=[
                run_pb2.BucketSummary(
                    bucket_id=row.bucket_id,
                    name=row.name,
                    images=row.images,
                    accepted=row.accepted,
                    rejected=row.rejected,
                    pending=row.pending,
                    saved=row.saved,
                    last_added_at=convert.opt_ts(row.last_added_at),
                )
                for row in found.buckets
            ],
            workflows=[
                run_pb2.WorkflowSummary(
                    workflow_id=entry.row.workflow_id,
                    name=entry.row.name,
                    runs=entry.row.runs,
                    last_run=run(entry.last_run) if entry.last_run else None,
                    classes=[
                        run_pb2.ClassCount(
                            class_name=count.class_name,
                            detections=count.detections,
                            confirmations=count.confirmations,
                        )
                        for count in entry.classes
                    ],
                    images_per_day=[
                        run_pb2.DailyCount(
                            date=common_pb2.CalendarDate(
                                year=day.day.year, month=day.day.month, day=day.day.day
                            ),
                            images=day.images,
                        )
                        for day in entry.days
                    ],
                )
                for entry in found.workflows
            ],
        )

    async def ListBucketItems(
        self, request: pb.ListBucketItemsRequest, context: Context
    ) -> pb.ListBucketItemsResponse:
        who = await self.who(context)
        wanted = views.item_filter(request.filter)
        scope = wanted.fingerprint(request.bucket_id)
        page = await self.review.bucket_items(
            who,
            request.bucket_id,
            wanted,
            views.page_key(request.page_token, scope),
            page_size(request.page_size),
        )
        response = pb.ListBucketItemsResponse(
            next_page_token=views.page_token(scope, page.next_key)
        )
        for row in page.items:
            views.fill_bucket_item(
                response.items.add(),
                row.item,
                page.boxes.get(row.item.item_id, ()),
                page.reviewed.get(row.item.item_id, ()),
            )
        return response

    async def GetBucketItem(
        self, request: pb.GetBucketItemRequest, context: Context
    ) -> pb.GetBucketItemResponse:
        history = await self.histories.get(await self.who(context), request.item_id)
        return views.item_history(history)

    async def RequestPhoto(
        self, request: pb.RequestPhotoRequest, context: Context
    ) -> pb.RequestPhotoResponse:
        who = await self.who(context)  # the credential before the request's fields
        moment = convert.from_ts("time", request.time)
        view, created = await self.photos.request(who, request.camera_id, moment)
        return pb.RequestPhotoResponse(photo=photo(view), created=created)

    async def GetPhoto(self, request: pb.GetPhotoRequest, context: Context) -> pb.GetPhotoResponse:
        view = await self.photos.get(await self.who(context), request.photo_id)
        return pb.GetPhotoResponse(photo=photo(view))


def review_counts(row: reviews.RunReviewCounts | None) -> run_pb2.ReviewCounts:
    if row is None:
        return run_pb2.ReviewCounts()
    return run_pb2.ReviewCounts(pending=row.pending, accepted=row.accepted, rejected=row.rejected)


def expected_revision(
    request: pb.CorrectItemBoxesRequest
    | pb.UndoItemCorrectionRequest
    | pb.DecideItemRequest
    | pb.ClearItemDecisionRequest,
) -> int | None:
    """The revision the caller saw (None: not given, no check)."""
    return request.expected_revision if request.HasField("expected_revision") else None


def decision(
    request: pb.DecideSightingRequest | pb.DecideItemRequest | pb.BulkDecideSightingsRequest,
) -> tuple[str, str | None]:
    """The review state and relabel class a decision sets."""
    if request.decision == pb.REVIEW_DECISION_RELABEL:
        return "accepted", reviews.check_class(request.class_name)
    if request.class_name:
        raise InvalidField(
            "class_name is only for RELABEL; leave it empty for CONFIRM and NONE.",
            metadata={"field": "class_name"},
        )
    if request.decision == pb.REVIEW_DECISION_CONFIRM:
        return "accepted", None
    if request.decision == pb.REVIEW_DECISION_NONE:
        return "rejected", None
    raise InvalidField("decision must be CONFIRM, NONE or RELABEL.", metadata={"field": "decision"})


def photo(view: PhotoView) -> run_pb2.Photo:
    row = view.row
    return run_pb2.Photo(
        photo_id=row.run_id,
        camera_id=row.camera_id,
        requested_time=convert.ts(row.first_slot_at),
        recording_id=row.recording_id,
        status=STATUSES[view.status],
        item_id=row.item_id or "",
        frame_time=convert.opt_ts(row.frame_time),
        created_at=convert.ts(row.created_at),
        expires_at=convert.ts(row.expires_at),
    )
