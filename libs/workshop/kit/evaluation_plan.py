"""A whole evaluation of a model version against a bucket (docs/bring-your-own-model.md,
"Evaluating a version"): what it asks the services, the pass, and its report.

Two callers run it the same way: `workshop models evaluate --triton` in the operator's
shell, and the processor's EvaluationService (`--processor`), beside the Triton that serves
its models. Every read is made with the caller's own credential, so the services that own
the data decide what the caller may read:

1. the version (and the baseline) as the coordinator pinned them (ListModelVersions), with
   the served weights checked against the pins when the model repository is at hand;
2. unless a baseline is named, the version the bucket's items came from: the items' run ids
   page by page (only their counts kept), then each of those runs' snapshots;
3. the bucket's YOLO export streamed from the preview service, a few chunks ahead of the pass
   (`workshop.kit.evaluation.run_over`, in a worker thread: it blocks on Triton), the images
   handed to a Triton on this host through system shared memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import tritonclient.grpc as triton_client

from workshop.kit.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from workshop.kit.evaluation import (
    Evaluation,
    EvaluationError,
    Progress,
    ServedModel,
    TritonUnreachable,
    run_over,
    served_model,
)
from workshop.kit.model_repository import RepositoryError, served_weights_sha256
from workshop.kit.shared_memory import is_loopback
from workshop.v1 import (
    common_pb2,
    evaluation_pb2,
    operator_pb2,
    operator_pb2_grpc,
    preview_pb2,
    preview_pb2_grpc,
    resources_pb2,
    run_pb2,
    workshop_pb2_grpc,
)
from workshop.v1 import workshop_pb2 as ws

Metadata = Sequence[tuple[str, str]]

ITEMS_PAGE = 1000  # ListBucketItems' largest page
CHUNKS_AHEAD = 8  # export chunks (up to 1 MiB each) read ahead of the pass
DEFAULT_WORKERS = 4
MAX_WORKERS = 64


@dataclass(frozen=True)
class Pin:
    """A model version some of the bucket's items came from (or one named as a baseline)."""

    name: str
    version: int
    classes: tuple[str, ...]
    items: int = 0  # of the bucket's (filtered) items, saved by runs pinning it
    runs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Ask:
    """What to evaluate: the version, the bucket, its items' review states (empty: accepted
    only), the baseline (None: the one the items came from; `NO_BASELINE`: none)."""

    name: str
    version: int
    bucket: str
    review_states: tuple[common_pb2.ReviewState.ValueType, ...] = ()
    baseline: tuple[str, int] | None = None
    no_baseline: bool = False
    workers: int = DEFAULT_WORKERS


def plan_of(request: evaluation_pb2.EvaluateModelVersionRequest) -> Ask:
    """The request as an Ask, or INVALID_FIELD naming the first field out of range."""

    def invalid(field: str, message: str) -> InvalidArgument:
        return InvalidArgument(message, reason="INVALID_FIELD", metadata={"field": field})

    if not request.model_name:
        raise invalid("model_name", "model_name is required")
    if request.version < 1:
        raise invalid("version", "version must be 1 or more")
    if not request.bucket_id:
        raise invalid("bucket_id", "bucket_id is required")
    if any(s == common_pb2.REVIEW_STATE_UNSPECIFIED for s in request.review_states):
        raise invalid("review_states", "review_states holds REVIEW_STATE_UNSPECIFIED")
    if not 0 <= request.workers <= MAX_WORKERS:
        raise invalid("workers", f"workers must be 0 (the default, 4) to {MAX_WORKERS}")
    baseline = None
    if request.HasField("baseline_version"):
        named = request.baseline_version
        if not named.model_name:
            raise invalid("baseline_version.model_name", "baseline_version needs a model_name")
        if named.version < 1:
            raise invalid("baseline_version.version", "baseline_version.version must be 1 or more")
        baseline = (named.model_name, named.version)
    return Ask(
        name=request.model_name,
        version=request.version,
        bucket=request.bucket_id,
        review_states=tuple(request.review_states),
        baseline=baseline,
        no_baseline=request.no_baseline,
        workers=request.workers or DEFAULT_WORKERS,
    )


class Services:
    """The coordinator and the preview service, called with the caller's credential."""

    def __init__(
        self, coordinator: grpc.aio.Channel, preview: grpc.aio.Channel, metadata: Metadata
    ) -> None:
        self.operator = operator_pb2_grpc.OperatorServiceStub(coordinator)
        self.workshop = workshop_pb2_grpc.WorkshopServiceStub(coordinator)
        self.preview = preview_pb2_grpc.PreviewServiceStub(preview)
        self.metadata = tuple(metadata)


async def pinned(
    services: Services, name: str, version: int, repository: Path | None
) -> resources_pb2.ModelVersion:
    """The coordinator's record of the version; with `repository`, its served weights must be
    the pinned ones (as the processor checks them before a job)."""
    reply = await services.operator.ListModelVersions(
        operator_pb2.ListModelVersionsRequest(name=name), metadata=services.metadata
    )
    found = next((v for v in reply.model_versions if v.version == version), None)
    if found is None:
        raise NotFound(f"model {name} has no published version {version}")
    if repository is not None:
        try:
            served = await asyncio.to_thread(served_weights_sha256, repository, name, version)
        except (OSError, RepositoryError) as error:
            raise NotFound(f"{name} v{version} is not in {repository}: {error}") from None
        if served != found.weights_sha256:
            raise FailedPrecondition(
                f"{repository} serves {name} v{version} with weights {served}, but the "
                f"coordinator pinned {found.weights_sha256}",
                reason="CODE_MISMATCH",
            )
    return found


async def source_pins(
    services: Services, bucket: str, item_filter: run_pb2.BucketItemFilter
) -> list[Pin]:
    """The model versions pinned by the runs that saved the bucket's items (those the filter
    keeps), most items first."""
    by_run: Counter[str] = Counter()
    token = ""
    while True:
        page = await services.workshop.ListBucketItems(
            ws.ListBucketItemsRequest(
                bucket_id=bucket, filter=item_filter, page_size=ITEMS_PAGE, page_token=token
            ),
            metadata=services.metadata,
        )
        by_run.update(item.run_id for item in page.items)
        token = page.next_page_token
        if not token:
            break
    items: Counter[tuple[str, int]] = Counter()
    runs: dict[tuple[str, int], list[str]] = {}
    classes: dict[tuple[str, int], tuple[str, ...]] = {}
    for run_id, count in by_run.items():
        reply = await services.workshop.GetRunSnapshot(
            ws.GetRunSnapshotRequest(run_id=run_id, page_size=1), metadata=services.metadata
        )
        for model in reply.snapshot.models:
            key = (model.name, model.version)
            items[key] += count
            runs.setdefault(key, []).append(run_id)
            classes[key] = tuple(model.classes)
    return [
        Pin(name, version, classes[(name, version)], count, tuple(sorted(runs[(name, version)])))
        for (name, version), count in items.most_common()
    ]


def baseline_of(pins: list[Pin], name: str, version: int) -> Pin | None:
    """The version to compare with: of the same model, the one most items came from; else
    the model most items came from (the bucket was filled by another detector). None when
    that is the version evaluated, or no run pinned a model."""
    same = [p for p in pins if p.name == name]
    chosen = same[0] if same else pins[0] if pins else None
    if chosen is None or (chosen.name, chosen.version) == (name, version):
        return None
    return chosen


class ExportFeed:
    """The bucket's export, read on the event loop and handed to the pass's thread as a
    plain iterator, at most CHUNKS_AHEAD chunks ahead; a failure of the stream is raised
    where the pass reads it, and a pass that stops early stops the stream."""

    _END = object()

    def __init__(self, services: Services, request: preview_pb2.ExportBucketRequest) -> None:
        self._ahead: queue.Queue[Any] = queue.Queue()
        # places left ahead of the pass: taken on the loop, given back by the pass's thread
        self._places = asyncio.Semaphore(CHUNKS_AHEAD)
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._read(services, request))

    async def _read(self, services: Services, request: preview_pb2.ExportBucketRequest) -> None:
        end: Any = self._END
        try:
            last = False
            async for chunk in services.preview.ExportBucket(request, metadata=services.metadata):
                await self._put(chunk.data)
                last = last or chunk.last
            if not last:
                end = Unavailable("the export stream ended before its last chunk")
        except asyncio.CancelledError:
            return
        except BaseException as error:  # raised where the pass reads it
            end = error
        await self._put(end)

    async def _put(self, value: Any) -> None:
        await self._places.acquire()  # the pass's thread gives a place back per chunk taken
        self._ahead.put_nowait(value)

    def _give_back_place(self) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nothing waits for places
            self._loop.call_soon_threadsafe(self._places.release)

    def chunks(self) -> Iterator[bytes]:
        while True:
            value = self._ahead.get()
            self._give_back_place()
            if value is self._END:
                return
            if isinstance(value, BaseException):
                raise value
            yield value

    def close(self) -> None:
        self._task.cancel()


async def evaluate(
    services: Services,
    triton: str,
    ask: Ask,
    *,
    repository: Path | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> evaluation_pb2.EvaluationReport:
    """The whole evaluation (module docstring); `on_progress` is called on the event loop."""
    candidate = await pinned(services, ask.name, ask.version, repository)
    item_filter = run_pb2.BucketItemFilter(
        review_states=list(ask.review_states) or [common_pb2.REVIEW_STATE_ACCEPTED]
    )
    base: Pin | None
    if ask.no_baseline:
        base = None
    elif ask.baseline is not None:
        other = await pinned(services, *ask.baseline, repository)
        base = Pin(other.name, other.version, tuple(other.classes))
        if (base.name, base.version) == (ask.name, ask.version):
            base = None
    else:
        base = baseline_of(
            await source_pins(services, ask.bucket, item_filter), ask.name, ask.version
        )
        if base is not None:
            await pinned(services, base.name, base.version, repository)
    loop = asyncio.get_running_loop()
    progress = None
    if on_progress is not None:
        callback = on_progress

        def progress(done: Progress) -> None:
            loop.call_soon_threadsafe(callback, done)

    feed = ExportFeed(
        services,
        preview_pb2.ExportBucketRequest(
            bucket_id=ask.bucket, format=run_pb2.DATASET_FORMAT_YOLO, filter=item_filter
        ),
    )
    try:
        evaluation = await asyncio.to_thread(
            _pass, triton, ask, candidate, base, feed.chunks(), progress
        )
    finally:
        feed.close()
    if not evaluation.items:
        raise NotFound(f"bucket {ask.bucket} exports no item (see its review states)")
    try:
        figures = evaluation.report(0)
        compared = evaluation.report(1) if base is not None else None
    except EvaluationError as error:
        raise FailedPrecondition(str(error)) from None
    return evaluation_pb2.EvaluationReport(
        bucket_id=ask.bucket,
        weights_checked=repository is not None,
        images=evaluation.items,
        ground_truth_boxes=evaluation.truth.count,
        seconds=round(evaluation.seconds, 3),
        items_per_second=round(evaluation.items / max(evaluation.seconds, 1e-9), 1),
        version=_scores(figures),
        baseline=_scores(compared, base) if compared is not None else None,
    )


def _pass(
    triton: str,
    ask: Ask,
    candidate: resources_pb2.ModelVersion,
    base: Pin | None,
    chunks: Iterator[bytes],
    progress: Callable[[Progress], None] | None,
) -> Evaluation:
    client = triton_client.InferenceServerClient(triton)
    try:
        models: list[ServedModel] = [
            served_model(client, ask.name, ask.version, list(candidate.classes))
        ]
        if base is not None:
            models.append(served_model(client, base.name, base.version, list(base.classes)))
        return run_over(
            chunks,
            lambda: triton_client.InferenceServerClient(triton),
            models,
            workers=ask.workers,
            progress=progress,
            shared_memory=is_loopback(triton),
        )
    except TritonUnreachable as error:
        raise Unavailable(str(error)) from None
    except EvaluationError as error:
        raise FailedPrecondition(str(error)) from None
    finally:
        client.close()


def _scores(figures: dict[str, Any], base: Pin | None = None) -> evaluation_pb2.VersionScores:
    return evaluation_pb2.VersionScores(
        model_name=figures["model"],
        version=figures["version"],
        detections=figures["detections"],
        ap50_95=figures["ap50_95"],
        ap50=figures["ap50"],
        precision=figures["precision"],
        recall=figures["recall"],
        classes=[
            evaluation_pb2.ClassScores(name=name, **values)
            for name, values in figures["classes"].items()
        ],
        bucket_classes_not_in_model=figures["bucket_classes_not_in_model"],
        model_classes_not_in_bucket=figures["model_classes_not_in_bucket"],
        items_from_it=base.items if base is not None else 0,
        run_ids=base.runs if base is not None else (),
    )


def report_json(report: evaluation_pb2.EvaluationReport) -> dict[str, Any]:
    """The report as `workshop models evaluate -o json` prints it (docs)."""

    def scores(s: evaluation_pb2.VersionScores) -> dict[str, Any]:
        return {
            "model": s.model_name,
            "version": s.version,
            "detections": s.detections,
            "ap50_95": s.ap50_95,
            "ap50": s.ap50,
            "precision": s.precision,
            "recall": s.recall,
            "classes": {
                c.name: {
                    "ground_truth": c.ground_truth,
                    "detections": c.detections,
                    "ap50_95": c.ap50_95,
                    "ap50": c.ap50,
                    "precision": c.precision,
                    "recall": c.recall,
                }
                for c in s.classes
            },
            "bucket_classes_not_in_model": list(s.bucket_classes_not_in_model),
            "model_classes_not_in_bucket": list(s.model_classes_not_in_bucket),
        }

    result: dict[str, Any] = {
        "bucket": report.bucket_id,
        "weights_checked": report.weights_checked,
        "images": report.images,
        "ground_truth_boxes": report.ground_truth_boxes,
        "seconds": report.seconds,
        "items_per_second": report.items_per_second,
        **scores(report.version),
        "baseline": None,
    }
    if report.HasField("baseline"):
        result["baseline"] = {
            **scores(report.baseline),
            "items_from_it": report.baseline.items_from_it,
            "runs": list(report.baseline.run_ids),
        }
    return result
