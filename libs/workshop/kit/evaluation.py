"""`workshop models evaluate NAME VERSION --bucket B`: a published version against a bucket's
reviewed boxes, side by side with the version the bucket's items came from
(docs/bring-your-own-model.md#evaluating-a-version).

The bucket's items arrive as the preview service's YOLO export, read as a stream
(`images/<id>.jpg`, `labels/<id>.txt` for each item, `classes.txt` last): accepted items unless
`--review` says otherwise, with the reviewers' relabels applied, so the boxes people confirmed
are the ground truth. Each image is prepared as the processor prepares frames (letterboxed or
resized, as the model's input asks) and goes through the Triton that serves each version, a
few images in flight (in system shared memory when that Triton is on this host, as the
processor's frames). What is kept of an image is its boxes in compact arrays (`Boxes`: 28
bytes a box, `BYTES_PER_BOX`), never the image, so memory grows with the boxes, not with the
bucket's bytes. At the end pycocotools' COCOeval scores each class on its own (only the
images with a box of that class on either side, one area range, up to 100 detections an
image; matched IMAGES_PER_BLOCK images at a time, of each image's match only the arrays
`accumulate` reads kept, then accumulated over all: the same AP, without COCO's records of
every box at once): AP over IoU 0.50:0.95 and at 0.50, and precision and recall at IoU 0.50 of
everything the version reports (it has thresholded at its own confidence already); the means
are over the classes both the bucket and the model know.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tarfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
import numpy.typing as npt
import tritonclient.grpc as triton
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from tritonclient.utils import InferenceServerException

from workshop.kit.letterbox import PAD_VALUE, Placement, letterbox, stretch
from workshop.kit.model_io import (
    CONTRACT_OUTPUTS,
    LETTERBOX_INPUT,
    STRETCH_INPUT,
    UNREACHABLE_STATUSES,
)
from workshop.kit.shared_memory import (
    UNREGISTER_ATTEMPTS,
    UNREGISTER_PAUSE_S,
    Region,
    still_in_use,
)

log = logging.getLogger(__name__)

MAX_DETECTIONS = 100  # per image, as COCO's default
BYTES_PER_BOX = 4 + 4 + 4 + 4 * 4  # image, class, score, x1 y1 x2 y2
# COCOeval's records of one block at a time: a python dict a box and a match an image
IMAGES_PER_BLOCK = 5000
ACCUMULATED = ("dtScores", "dtMatches", "dtIgnore", "gtIgnore")  # what accumulate() reads
WORKERS = 4  # batches of images in preparation or on Triton at once
BATCH = 1  # images a request: Triton's dynamic batcher groups them (8 a request cost the
# python backend more CPU a frame than 1: bench.model_evaluate --batch 8)
REGION_PREFIX = "workshop-evaluation"


class EvaluationError(RuntimeError):
    """The evaluation cannot run; the message says why."""


class TritonUnreachable(EvaluationError):
    """Triton did not answer (down, restarting, too slow): worth asking again."""


def _triton_error(error: InferenceServerException) -> EvaluationError:
    if error.status() in UNREACHABLE_STATUSES:
        return TritonUnreachable(f"Triton did not answer: {error.message()}")
    return EvaluationError(f"Triton: {error.message()}")


Box = tuple[float, float, float, float]  # x1, y1, x2, y2 in image pixels
FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int32]


class Boxes:
    """Boxes of many images as growing columns: image number, class index, score and
    x1, y1, x2, y2 in the image's pixels (float32)."""

    def __init__(self, capacity: int = 4096) -> None:
        self.count = 0
        self._image = np.empty(capacity, np.int32)
        self._cls = np.empty(capacity, np.int32)
        self._score = np.empty(capacity, np.float32)
        self._box = np.empty((capacity, 4), np.float32)

    def add(self, image: int, classes: IntArray, scores: FloatArray, boxes: FloatArray) -> None:
        n = len(classes)
        if self.count + n > len(self._image):
            size = max(2 * len(self._image), self.count + n)
            self._image = _grown(self._image, size)
            self._cls = _grown(self._cls, size)
            self._score = _grown(self._score, size)
            self._box = _grown(self._box, size)
        end = self.count + n
        self._image[self.count : end] = image
        self._cls[self.count : end] = classes
        self._score[self.count : end] = scores
        self._box[self.count : end] = boxes
        self.count = end

    def of_class(self, cls: int) -> tuple[IntArray, FloatArray, FloatArray]:
        """Image numbers, scores and boxes of one class."""
        chosen = self._cls[: self.count] == cls
        return (
            self._image[: self.count][chosen],
            self._score[: self.count][chosen],
            (self._box[: self.count][chosen]),
        )

    def count_of(self, cls: int) -> int:
        return int(np.count_nonzero(self._cls[: self.count] == cls))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self._image, self._cls, self._score, self._box))


def _grown(array: Any, size: int) -> Any:
    bigger = np.empty((size, *array.shape[1:]), array.dtype)
    bigger[: len(array)] = array
    return bigger


@dataclass
class Scores:
    """COCO figures; `per_class` by class name."""

    ap50_95: float
    ap50: float
    precision: float
    recall: float
    detections: int = 0
    per_class: dict[str, dict[str, float | int]] = field(default_factory=dict)


def score(truth: Boxes, found: Boxes, classes: Sequence[tuple[str, int, int]]) -> Scores:
    """pycocotools' figures for `classes`: (name, class index in `truth`, class index in
    `found`) of each class both sides know."""
    per_class: dict[str, dict[str, float | int]] = {}
    hits = positives = reported = 0
    for name, truth_cls, found_cls in classes:
        if truth.count_of(truth_cls) == 0:
            continue  # COCO leaves a class without truth out of the mean
        figures = _class_scores(truth.of_class(truth_cls), found.of_class(found_cls))
        per_class[name] = figures
        hits += int(figures.pop("hits"))
        positives += int(figures["ground_truth"])
        reported += int(figures["detections"])
    if not per_class:
        raise EvaluationError("the bucket's items hold no box of a class the model knows")
    return Scores(
        ap50_95=float(np.mean([c["ap50_95"] for c in per_class.values()])),
        ap50=float(np.mean([c["ap50"] for c in per_class.values()])),
        precision=hits / reported if reported else 0.0,
        recall=hits / positives,
        detections=found.count,
        per_class=per_class,
    )


def _coco(
    images: Sequence[int], columns: tuple[IntArray, FloatArray, FloatArray], scored: bool
) -> COCO:
    image_ids, scores, boxes = columns
    widths, heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    annotations = []
    for n in range(len(image_ids)):
        w, h = float(widths[n]), float(heights[n])
        annotation: dict[str, Any] = {
            "id": n + 1,
            "image_id": int(image_ids[n]),
            "category_id": 1,
            "bbox": [float(boxes[n, 0]), float(boxes[n, 1]), w, h],
            "area": w * h,
            "iscrowd": 0,
        }
        if scored:
            annotation["score"] = float(scores[n])
        annotations.append(annotation)
    coco = COCO()
    coco.dataset = {
        "images": [{"id": i} for i in images],
        "categories": [{"id": 1}],
        "annotations": annotations,
    }
    coco.createIndex()
    return coco


def _class_scores(
    truth: tuple[IntArray, FloatArray, FloatArray], found: tuple[IntArray, FloatArray, FloatArray]
) -> dict[str, float | int]:
    """COCOeval on one class, over the images holding a box of it on either side: matched
    (`evaluate`) a block of IMAGES_PER_BLOCK images at a time, of each image's match only the
    arrays `accumulate` reads kept, then pycocotools' `accumulate` over all of them."""
    truth, found = _by_image(truth), _by_image(found)
    images = sorted(set(truth[0].tolist()) | set(found[0].tolist()))
    kept: list[dict[str, Any] | None] = []
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints as it goes
        for start in range(0, len(images), IMAGES_PER_BLOCK):
            block = images[start : start + IMAGES_PER_BLOCK]
            low, high = block[0], block[-1]
            evaluation = COCOeval(
                _coco(block, _between(truth, low, high), False),
                _coco(block, _between(found, low, high), True),
                "bbox",
            )
            _one_class(evaluation.params, block)
            evaluation.evaluate()
            kept.extend(
                None if e is None else {k: e[k] for k in ACCUMULATED} for e in evaluation.evalImgs
            )
        evaluation = COCOeval(iouType="bbox")
        _one_class(evaluation.params, images)
        evaluation.evalImgs, evaluation._paramsEval = kept, evaluation.params
        evaluation.accumulate()
    precision = evaluation.eval["precision"][:, :, 0, 0, 0]  # [IoU, recall point]
    ap50_95 = float(np.mean(precision[precision > -1])) if (precision > -1).any() else 0.0
    at_half = precision[0]
    ap50 = float(np.mean(at_half[at_half > -1])) if (at_half > -1).any() else 0.0
    hits = detections = positives = 0
    for image in kept:
        if image is None:
            continue
        scored = ~np.asarray(image["dtIgnore"][0], bool)
        hits += int(np.count_nonzero(image["dtMatches"][0][scored] > 0))
        detections += int(np.count_nonzero(scored))
        positives += int(np.count_nonzero(np.asarray(image["gtIgnore"]) == 0))
    return {
        "ground_truth": positives,
        "detections": detections,
        "ap50_95": ap50_95,
        "ap50": ap50,
        "precision": hits / detections if detections else 0.0,
        "recall": hits / positives if positives else 0.0,
        "hits": hits,
    }


def _one_class(params: Any, images: list[int]) -> None:
    params.imgIds, params.catIds = images, [1]
    params.areaRng, params.areaRngLbl = [[0.0, 1e5**2]], ["all"]
    params.maxDets = [MAX_DETECTIONS]


def _by_image(
    columns: tuple[IntArray, FloatArray, FloatArray],
) -> tuple[IntArray, FloatArray, FloatArray]:
    order = np.argsort(columns[0], kind="stable")  # a pass adds them in order already
    return columns[0][order], columns[1][order], columns[2][order]


def _between(
    columns: tuple[IntArray, FloatArray, FloatArray], low: int, high: int
) -> tuple[IntArray, FloatArray, FloatArray]:
    """The rows of images low..high (the columns are in image order)."""
    image_ids = columns[0]
    start, end = np.searchsorted(image_ids, [low, high + 1])
    return image_ids[start:end], columns[1][start:end], columns[2][start:end]


# --- the bucket -------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    number: int  # the item's place in the export, from 0
    item_id: str
    jpeg: bytes
    labels: FloatArray  # one row a box: class index, cx, cy, w, h (fractions of the image)


class _ChunkFile(io.RawIOBase):
    """The export's chunks, read as one file (forward only)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = memoryview(chunk)
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


class YoloStream:
    """The items of a YOLO export as its chunks arrive; `classes` is known once the stream is
    read to its end (classes.txt closes the archive)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.classes: tuple[str, ...] | None = None

    def __iter__(self) -> Iterator[Item]:
        number = 0
        image: tuple[str, bytes] | None = None
        raw = io.BufferedReader(_ChunkFile(self._chunks), buffer_size=1 << 20)
        try:
            with tarfile.open(fileobj=raw, mode="r|") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    handle = tar.extractfile(member)
                    data = handle.read() if handle is not None else b""
                    folder, _, base = member.name.partition("/")
                    if folder == "images" and base.endswith(".jpg"):
                        image = (base.removesuffix(".jpg"), data)
                    elif folder == "labels" and base.endswith(".txt"):
                        item_id = base.removesuffix(".txt")
                        if image is None or image[0] != item_id:
                            raise EvaluationError(f"the export's labels of {item_id} come alone")
                        yield Item(number, item_id, image[1], _labels(data, item_id))
                        number, image = number + 1, None
                    elif member.name == "classes.txt":
                        self.classes = tuple(data.decode().splitlines())
        except tarfile.TarError as error:
            raise EvaluationError(f"the export is not a YOLO archive: {error}") from None
        if self.classes is None:
            raise EvaluationError("the export ended without its classes.txt")


def _labels(data: bytes, item_id: str) -> FloatArray:
    try:
        rows = [[float(v) for v in line.split()] for line in data.decode().splitlines() if line]
        labels = np.array(rows, np.float32).reshape(-1, 5)
    except ValueError:
        raise EvaluationError(f"the export's labels of {item_id} are not YOLO lines") from None
    return labels


def truth_boxes(labels: FloatArray, height: int, width: int) -> FloatArray:
    """YOLO label rows as x1, y1, x2, y2 in the image's pixels."""
    cx, cy, w, h = (labels[:, k] for k in range(1, 5))
    boxes: FloatArray = np.stack(
        [(cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height],
        axis=1,
    ).astype(np.float32)
    return boxes


# --- the model --------------------------------------------------------------------------


@dataclass(frozen=True)
class ServedModel:
    name: str
    version: int
    classes: tuple[str, ...]
    input_name: str
    height: int
    width: int
    unbatched: bool
    max_batch: int = 1  # images in one request (the config's max_batch_size; 1 unbatched)

    def placement(self, height: int, width: int) -> Placement:
        if self.input_name == LETTERBOX_INPUT:
            return letterbox(height, width, self.height, self.width)
        return stretch(self.height, self.width)


def served_model(
    client: triton.InferenceServerClient, name: str, version: int, classes: Sequence[str]
) -> ServedModel:
    """Makes the version ready on Triton (explicit model control) and reads its input."""
    try:
        if not client.is_model_ready(name, str(version)):
            client.load_model(name)
        if not client.is_model_ready(name, str(version)):
            raise EvaluationError(f"Triton did not make {name} v{version} ready")
        config = client.get_model_config(name, str(version), as_json=True)["config"]
    except InferenceServerException as error:
        raise _triton_error(error) from None
    inputs = [i for i in config["input"] if i["name"] in (LETTERBOX_INPUT, STRETCH_INPUT)]
    if not inputs:
        raise EvaluationError(f"{name} v{version} takes no frames Workshop sends")
    unbatched = int(config.get("max_batch_size", 0)) == 0
    dims = [int(d) for d in inputs[0]["dims"]][1 if unbatched else 0 :]
    return ServedModel(
        name,
        version,
        tuple(classes),
        inputs[0]["name"],
        dims[0],
        dims[1],
        unbatched,
        max(1, int(config.get("max_batch_size", 0))),
    )


def jpeg_decoder() -> Any:
    """A JPEG decoder that one thread reuses for every image: opening each JPEG as a file
    (`av.open`, which probes its format) cost as much again as decoding it. One thread, so
    that each packet gives its frame at once."""
    decoder = av.CodecContext.create("mjpeg", "r")
    decoder.thread_count = 1
    return decoder


def prepare(
    jpeg: bytes, models: Sequence[ServedModel], decoder: Any = None
) -> tuple[int, int, list[tuple[npt.NDArray[np.uint8], Placement]]]:
    """The image's height and width, and the image placed in each model's input as the
    processor places a frame (decoded once, by `decoder` or a new one; one canvas for models
    taking the same)."""
    try:
        decoded = (decoder or jpeg_decoder()).decode(av.Packet(jpeg))
        if not decoded:
            raise EvaluationError("cannot decode an image of the export: no picture in it")
        frame = decoded[0]
        height, width = frame.height, frame.width
        made: dict[Placement, npt.NDArray[np.uint8]] = {}
        frames = []
        for model in models:
            place = model.placement(height, width)
            if place not in made:
                made[place] = _placed(frame, place)
            frames.append((made[place], place))
    except av.error.FFmpegError as error:
        raise EvaluationError(f"cannot decode an image of the export: {error}") from None
    return height, width, frames


def _placed(frame: Any, place: Placement) -> npt.NDArray[np.uint8]:
    picture = frame.to_ndarray(
        width=place.width, height=place.height, format="rgb24", interpolation="BILINEAR"
    )
    if not place.padded:
        return np.ascontiguousarray(picture, np.uint8)
    canvas = np.full((place.out_height, place.out_width, 3), PAD_VALUE, np.uint8)
    canvas[place.top : place.top + place.height, place.left : place.left + place.width] = picture
    return canvas


Found = tuple[IntArray, FloatArray, FloatArray]  # class indexes, scores, boxes in pixels


def detect(
    client: triton.InferenceServerClient,
    model: ServedModel,
    frames: Sequence[tuple[npt.NDArray[np.uint8], Placement]],
    sizes: Sequence[tuple[int, int]],
    region: Region | None = None,
) -> list[Found]:
    """The version's detections on prepared images (up to `model.max_batch` in a request,
    through `region` when Triton has mapped one, else in the request): for each, class
    indexes, scores and boxes in the image's pixels (clipped to it, as the processor clips)."""
    found: list[Found] = []
    for start in range(0, len(frames), model.max_batch):
        chosen = [frame for frame, _ in frames[start : start + model.max_batch]]
        batch = chosen[0][np.newaxis] if len(chosen) == 1 else np.stack(chosen)
        request = triton.InferInput(model.input_name, list(batch.shape), "UINT8")
        if region is None:
            request.set_data_from_numpy(batch)
        else:
            request.set_shared_memory(region.name, region.write(batch))
        try:
            reply = client.infer(
                model.name,
                [request],
                model_version=str(model.version),
                outputs=[triton.InferRequestedOutput(n) for n in CONTRACT_OUTPUTS],
            )
        except InferenceServerException as error:
            raise _triton_error(error) from None
        counts, boxes, scores, labels = (np.asarray(reply.as_numpy(n)) for n in CONTRACT_OUTPUTS)
        for row in range(len(batch)):
            (_, place), (height, width) = frames[start + row], sizes[start + row]
            found.append(_mapped(model, place, height, width, row, counts, boxes, scores, labels))
    return found


def _mapped(
    model: ServedModel,
    place: Placement,
    height: int,
    width: int,
    row: int,
    counts: Any,
    boxes: Any,
    scores: Any,
    labels: Any,
) -> Found:
    k = int(counts.reshape(len(counts), -1)[row, 0])
    classes = labels[row].reshape(-1)[:k].astype(np.int32)
    if k and (classes.min() < 0 or classes.max() >= len(model.classes)):
        raise EvaluationError(f"{model.name} v{model.version} answered a class past its list")
    xy = boxes[row].reshape(-1, 4)[:k].astype(np.float32)
    x = np.clip(xy[:, 0::2] - place.left, 0, place.width) * (width / place.width)
    y = np.clip(xy[:, 1::2] - place.top, 0, place.height) * (height / place.height)
    picture = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1).astype(np.float32)
    return classes, scores[row].reshape(-1)[:k].astype(np.float32), picture


# --- the run over the bucket ------------------------------------------------------------


@dataclass
class Progress:
    items: int = 0
    seconds: float = 0.0


@dataclass
class Evaluation:
    """What a pass over the bucket gathered: its truth and each model's detections."""

    models: Sequence[ServedModel]
    truth: Boxes = field(default_factory=Boxes)
    found: list[Boxes] = field(default_factory=list)
    items: int = 0
    seconds: float = 0.0
    bucket_classes: tuple[str, ...] = ()

    def report(self, model: int) -> dict[str, Any]:
        """The figures of `models[model]`."""
        served, found = self.models[model], self.found[model]
        common = [
            (name, self.bucket_classes.index(name), served.classes.index(name))
            for name in served.classes
            if name in self.bucket_classes
        ]
        scores = score(self.truth, found, common)
        return {
            "model": served.name,
            "version": served.version,
            "detections": found.count,
            "ap50_95": round(scores.ap50_95, 4),
            "ap50": round(scores.ap50, 4),
            "precision": round(scores.precision, 4),
            "recall": round(scores.recall, 4),
            "classes": {
                name: {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}
                for name, figures in scores.per_class.items()
            },
            "bucket_classes_not_in_model": [
                c for c in self.bucket_classes if c not in served.classes
            ],
            "model_classes_not_in_bucket": [
                c for c in served.classes if c not in self.bucket_classes
            ],
        }


@dataclass
class _Lane:
    """What one worker thread keeps for the whole pass: its Triton client, its JPEG decoder,
    and with Triton on this host the region its requests' images travel in."""

    client: triton.InferenceServerClient
    decoder: Any
    region: Region | None


def run_over(
    chunks: Iterable[bytes],
    connect: Callable[[], triton.InferenceServerClient],
    models: Sequence[ServedModel],
    *,
    workers: int = WORKERS,
    batch: int = BATCH,
    progress: Callable[[Progress], None] | None = None,
    shared_memory: bool = False,
) -> Evaluation:
    """Every item of the export through every model, in order: `workers` batches at once
    (of `batch` images, or the smallest max batch of the models), two more waiting; what is
    kept of an image is its boxes. With `shared_memory` (Triton on this host) each worker's
    images travel in a region of system shared memory instead of in its requests, as the
    processor's frames do, unless Triton cannot map it."""
    size = max(1, min(batch, *(model.max_batch for model in models)))
    evaluation = Evaluation(models, found=[Boxes() for _ in models])
    stream = YoloStream(chunks)
    local = threading.local()
    lanes: list[_Lane] = []
    region_bytes = size * max(model.height * model.width * 3 for model in models)

    def lane() -> _Lane:
        found: _Lane | None = getattr(local, "lane", None)
        if found is None:
            client = connect()
            region = registered_region(client, region_bytes) if shared_memory else None
            found = local.lane = _Lane(client, jpeg_decoder(), region)
            lanes.append(found)
        return found

    def one(items: list[Item]) -> list[tuple[Item, FloatArray, list[Found]]]:
        mine = lane()
        prepared = [prepare(item.jpeg, models, mine.decoder) for item in items]
        sizes = [(height, width) for height, width, _ in prepared]
        answers = [
            detect(mine.client, model, [frames[m] for _, _, frames in prepared], sizes, mine.region)
            for m, model in enumerate(models)
        ]
        return [
            (item, truth_boxes(item.labels, *sizes[n]), [found[n] for found in answers])
            for n, item in enumerate(items)
        ]

    started = time.monotonic()
    window: deque[Future[Any]] = deque()
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="evaluate") as pool:
            items: list[Item] = []
            for item in stream:
                items.append(item)
                if len(items) < size:
                    continue
                window.append(pool.submit(one, items))
                items = []
                while len(window) > 2 * workers or (window and window[0].done()):
                    _take(evaluation, window.popleft().result())
                    if progress is not None:
                        progress(Progress(evaluation.items, time.monotonic() - started))
            if items:
                window.append(pool.submit(one, items))
            while window:
                _take(evaluation, window.popleft().result())
    finally:
        for future in window:
            future.cancel()
        for done in lanes:
            if done.region is not None:
                unregister_region(done.client, done.region)
            done.client.close()
    evaluation.seconds = time.monotonic() - started
    evaluation.bucket_classes = stream.classes or ()
    return evaluation


def registered_region(client: triton.InferenceServerClient, byte_size: int) -> Region | None:
    """A new region of `byte_size` that Triton has mapped; None (the images then go in the
    requests) when it cannot: Triton in a container that does not share this host's
    /dev/shm, say."""
    region = None
    try:
        region = Region.create(f"{REGION_PREFIX}-{os.getpid()}", byte_size)
        client.register_system_shared_memory(region.name, region.key, byte_size)
    except (OSError, InferenceServerException) as error:
        reason = error.message() if isinstance(error, InferenceServerException) else error
        log.warning(
            "Triton cannot read this host's shared memory (%s): sending the images over gRPC",
            reason,
        )
        if region is not None:
            region.close()
        return None
    region.release_name()  # Triton has mapped it: a crash now leaves no file behind
    return region


def unregister_region(client: triton.InferenceServerClient, region: Region) -> None:
    """Unregisters the region once Triton lets go of it (`still_in_use`), then unmaps it."""
    try:
        for _ in range(UNREGISTER_ATTEMPTS):
            try:
                client.unregister_system_shared_memory(region.name)
                return
            except InferenceServerException as error:
                if not still_in_use(error.message()):
                    log.info("unregistering %s: %s", region.name, error.message())
                    return
            time.sleep(UNREGISTER_PAUSE_S)
        log.warning("Triton still uses region %s; left registered", region.name)
    finally:
        region.close()


def _take(evaluation: Evaluation, done: list[tuple[Item, FloatArray, list[Found]]]) -> None:
    for item, truth, answers in done:
        evaluation.truth.add(
            item.number, item.labels[:, 0].astype(np.int32), np.ones(len(truth), np.float32), truth
        )
        for found, (classes, scores, boxes) in zip(evaluation.found, answers, strict=True):
            found.add(item.number, classes, scores, boxes)
        evaluation.items += 1
