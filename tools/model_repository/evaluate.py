"""`workshop models evaluate NAME VERSION --bucket B`: a published version against a bucket's
boxes (docs/bring-your-own-model.md#evaluating-a-version).

The bucket's items come from the preview service's COCO export (accepted items unless
`--review` says otherwise: the boxes people confirmed or relabelled are the ground truth);
each image goes through the Triton that serves the version, prepared as the processor
prepares frames (letterboxed or resized, as the model's input asks), and the detections are
scored the COCO way: average precision over IoU 0.50:0.95 and at 0.50 (101 recall points,
up to 100 detections an image, per class, then the mean over the classes both the bucket and
the model know), and precision and recall at IoU 0.50 of everything the version reports (it
has thresholded at its own confidence already). Before any image, the repository's weights
for the version are checked against the coordinator's pin, as the processor does.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
import numpy.typing as npt
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from tools.model_repository.families import CONTRACT_OUTPUTS, LETTERBOX_INPUT, STRETCH_INPUT
from workshop.kit.letterbox import PAD_VALUE, Placement, letterbox, stretch

IOU_THRESHOLDS = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))
RECALL_POINTS = np.linspace(0.0, 1.0, 101)
MAX_DETECTIONS = 100  # per image, as COCO's default


class EvaluationError(RuntimeError):
    """The evaluation cannot run; the message says why."""


Box = tuple[float, float, float, float]  # x1, y1, x2, y2 in image pixels


@dataclass(frozen=True)
class Found:
    image: int
    class_name: str
    score: float
    box: Box


@dataclass
class Scores:
    """COCO-style figures; `per_class` by class name."""

    ap50_95: float
    ap50: float
    precision: float
    recall: float
    per_class: dict[str, dict[str, float]] = field(default_factory=dict)


def _iou(box: Box, others: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    if not len(others):
        return np.zeros(0)
    low = np.maximum(others[:, :2], box[:2])
    high = np.minimum(others[:, 2:], box[2:])
    inter = np.prod(np.clip(high - low, 0, None), axis=1)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = np.prod(others[:, 2:] - others[:, :2], axis=1)
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _matches(
    truth: dict[int, list[Box]], found: list[Found], threshold: float
) -> tuple[list[bool], int]:
    """Each detection (best score first) taken by the unmatched truth box it overlaps most
    at `threshold` or more, as COCOeval matches; its flags and the truth count."""
    taken = {image: np.zeros(len(boxes), bool) for image, boxes in truth.items()}
    arrays = {image: np.array(boxes, float).reshape(-1, 4) for image, boxes in truth.items()}
    flags = []
    for detection in found:
        boxes = arrays.get(detection.image, np.zeros((0, 4)))
        overlaps = _iou(detection.box, boxes)
        best, best_iou = -1, min(threshold, 1 - 1e-10)
        for index, overlap in enumerate(overlaps):
            if taken[detection.image][index] or overlap < best_iou:
                continue
            best, best_iou = index, overlap
        if best >= 0:
            taken[detection.image][best] = True
        flags.append(best >= 0)
    return flags, sum(len(boxes) for boxes in truth.values())


def _average_precision(flags: list[bool], positives: int) -> float:
    """COCO's interpolated AP over 101 recall points of matches in score order."""
    if not flags:
        return 0.0
    hits = np.cumsum(flags)
    misses = np.cumsum([not f for f in flags])
    recall = hits / positives
    precision = hits / np.maximum(hits + misses, np.spacing(1))
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    at = np.searchsorted(recall, RECALL_POINTS, side="left")
    return float(np.mean([precision[i] if i < len(precision) else 0.0 for i in at]))


def _best_per_image(found: Iterable[Found]) -> list[Found]:
    """At most MAX_DETECTIONS an image (its best), then best score first, stable."""
    by_image: dict[int, list[Found]] = defaultdict(list)
    for detection in found:
        by_image[detection.image].append(detection)
    kept = [
        detection
        for image in sorted(by_image)
        for detection in sorted(by_image[image], key=lambda d: -d.score)[:MAX_DETECTIONS]
    ]
    return sorted(kept, key=lambda d: -d.score)


def score(
    truth: dict[int, list[tuple[str, Box]]], found: Sequence[Found], classes: Sequence[str]
) -> Scores:
    """The figures over `classes` (those both sides know): AP per class and IoU threshold,
    their means, and precision and recall at IoU 0.50 of all detections."""
    per_class: dict[str, dict[str, float]] = {}
    hits = positives = reported = 0
    for name in classes:
        class_truth = {
            image: [box for label, box in boxes if label == name] for image, boxes in truth.items()
        }
        count = sum(len(boxes) for boxes in class_truth.values())
        ranked = _best_per_image(d for d in found if d.class_name == name)
        if count == 0:
            continue  # COCO leaves a class without truth out of the mean
        aps = []
        for threshold in IOU_THRESHOLDS:
            flags, _ = _matches(class_truth, ranked, threshold)
            aps.append(_average_precision(flags, count))
            if threshold == 0.5:
                hits += sum(flags)
        positives += count
        reported += len(ranked)
        per_class[name] = {
            "ap50_95": float(np.mean(aps)),
            "ap50": aps[0],
            "ground_truth": count,
            "detections": len(ranked),
        }
    if not per_class:
        raise EvaluationError("the bucket's items hold no box of a class the model knows")
    return Scores(
        ap50_95=float(np.mean([c["ap50_95"] for c in per_class.values()])),
        ap50=float(np.mean([c["ap50"] for c in per_class.values()])),
        precision=hits / reported if reported else 0.0,
        recall=hits / positives,
        per_class=per_class,
    )


# --- the bucket -------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    images: dict[int, bytes]  # image id -> JPEG
    sizes: dict[int, tuple[int, int]]  # image id -> (height, width)
    truth: dict[int, list[tuple[str, Box]]]
    classes: tuple[str, ...]


def read_coco_archive(archive: bytes) -> Dataset:
    """The images and boxes of the preview service's COCO export (a tar)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            if "annotations.json" not in members:
                raise EvaluationError("the export holds no annotations.json")
            index = json.loads(_read(tar, members["annotations.json"]))
            images = {
                int(image["id"]): _read(tar, members[image["file_name"]])
                for image in index["images"]
            }
    except (tarfile.TarError, KeyError) as error:
        raise EvaluationError(f"the export is not a COCO archive: {error}") from None
    names = {int(c["id"]): str(c["name"]) for c in index["categories"]}
    truth: dict[int, list[tuple[str, Box]]] = {image: [] for image in images}
    for annotation in index["annotations"]:
        x, y, w, h = (float(v) for v in annotation["bbox"])
        truth[int(annotation["image_id"])].append(
            (names[int(annotation["category_id"])], (x, y, x + w, y + h))
        )
    sizes = {int(i["id"]): (int(i["height"]), int(i["width"])) for i in index["images"]}
    return Dataset(images, sizes, truth, tuple(names[k] for k in sorted(names)))


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    if handle is None:
        raise EvaluationError(f"cannot read {member.name} from the export")
    return handle.read()


def decode_jpeg(data: bytes, placement: Placement) -> npt.NDArray[np.uint8]:
    """The image placed in the model's input as the processor places a frame."""
    try:
        with av.open(io.BytesIO(data), "r") as container:
            frame = next(container.decode(video=0))
            picture = frame.to_ndarray(
                width=placement.width,
                height=placement.height,
                format="rgb24",
                interpolation="BILINEAR",
            )
    except (av.error.FFmpegError, StopIteration) as error:
        raise EvaluationError(f"cannot decode an image of the export: {error}") from None
    canvas = np.full((placement.out_height, placement.out_width, 3), PAD_VALUE, np.uint8)
    canvas[
        placement.top : placement.top + placement.height,
        placement.left : placement.left + placement.width,
    ] = picture
    return canvas


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
        raise EvaluationError(f"Triton: {error.message()}") from None
    inputs = [i for i in config["input"] if i["name"] in (LETTERBOX_INPUT, STRETCH_INPUT)]
    if not inputs:
        raise EvaluationError(f"{name} v{version} takes no frames Workshop sends")
    unbatched = int(config.get("max_batch_size", 0)) == 0
    dims = [int(d) for d in inputs[0]["dims"]][1 if unbatched else 0 :]
    return ServedModel(
        name, version, tuple(classes), inputs[0]["name"], dims[0], dims[1], unbatched
    )


def detect(
    client: triton.InferenceServerClient,
    model: ServedModel,
    image: int,
    frame: Any,
    place: Placement,
) -> list[Found]:
    """The version's detections on one prepared image, in the image's pixels."""
    request = triton.InferInput(model.input_name, [1, *frame.shape], "UINT8")
    request.set_data_from_numpy(frame[np.newaxis])
    try:
        reply = client.infer(
            model.name,
            [request],
            model_version=str(model.version),
            outputs=[triton.InferRequestedOutput(n) for n in CONTRACT_OUTPUTS],
        )
    except InferenceServerException as error:
        raise EvaluationError(f"Triton: {error.message()}") from None
    counts, boxes, scores, labels = (np.asarray(reply.as_numpy(n)) for n in CONTRACT_OUTPUTS)
    found = []
    for k in range(int(counts.reshape(-1)[0])):
        x1, y1, x2, y2 = (float(v) for v in boxes[0, k])
        if place.padded:
            x, y, w, h = place.to_picture(x1, y1, x2, y2)
        else:
            x, y, w, h = (
                x1 / model.width,
                y1 / model.height,
                (x2 - x1) / model.width,
                (y2 - y1) / model.height,
            )
        found.append(
            Found(
                image, model.classes[int(labels[0, k])], float(scores[0, k]), (x, y, x + w, y + h)
            )
        )
    return found


def evaluate(
    client: triton.InferenceServerClient, model: ServedModel, dataset: Dataset
) -> dict[str, Any]:
    """Every image of the bucket through the version, scored against the bucket's boxes."""
    found: list[Found] = []
    for image, jpeg in dataset.images.items():
        height, width = dataset.sizes[image]
        place = model.placement(height, width)
        for detection in detect(client, model, image, decode_jpeg(jpeg, place), place):
            x1, y1, x2, y2 = detection.box  # fractions of the image: into its pixels
            box = (x1 * width, y1 * height, x2 * width, y2 * height)
            found.append(Found(image, detection.class_name, detection.score, box))
    common = [c for c in model.classes if c in dataset.classes]
    scores = score(dataset.truth, found, common)
    return {
        "images": len(dataset.images),
        "ground_truth_boxes": sum(len(boxes) for boxes in dataset.truth.values()),
        "detections": len(found),
        "ap50_95": round(scores.ap50_95, 4),
        "ap50": round(scores.ap50, 4),
        "precision": round(scores.precision, 4),
        "recall": round(scores.recall, 4),
        "classes": {
            name: {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}
            for name, figures in scores.per_class.items()
        },
        "bucket_classes_not_in_model": [c for c in dataset.classes if c not in model.classes],
        "model_classes_not_in_bucket": [c for c in model.classes if c not in dataset.classes],
    }
