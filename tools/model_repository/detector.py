"""A small deterministic ONNX detector for the synthetic scenes, built from ONNX operators.

No training and no downloads: each class is one solid colour (`tools.demo.scenes`), so a
pixel belongs to a class when its class channel is bright and the other two are dark. Per
frame and class the model reports at most one object, the bounding box of that class's mask.

Contract (the EfficientNMS output layout):

- input `images`: uint8 `[N, H, W, 3]` RGB; H and W are fixed when the model is built, N is
  dynamic. Normalization (/255) happens inside the model.
- `num_dets` int32 `[N, 1]`: how many leading slots hold detections.
- `det_boxes` float32 `[N, K, 4]`: `x1, y1, x2, y2` in pixels of the input frame; x1/y1 are the
  first covered column/row and x2/y2 one past the last, so `w = x2 - x1`.
- `det_scores` float32 `[N, K]`: the fraction of the box the class's mask fills (1.0 for a
  clean rectangle), sorted descending; padding slots score 0.
- `det_classes` int32 `[N, K]`: index into the class list; padding slots hold -1 and
  zero boxes.

K equals the number of classes. A morphological opening (3x3 erosion then dilation) drops
isolated pixels that survive lossy encoding before the boxes are measured.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CLASSES: tuple[str, ...] = ("person", "vehicle", "animal")
# The RGB channel that carries each class's colour (person red, animal green, vehicle blue).
CLASS_CHANNELS: Mapping[str, int] = {"person": 0, "animal": 1, "vehicle": 2}
INPUT_NAME = "images"
OUTPUT_NAMES = ("num_dets", "det_boxes", "det_scores", "det_classes")
OPSET = 17
# onnxruntime reads IR versions up to its own release; pin one every supported release reads.
IR_VERSION = 8
_OPENING_KERNEL = 3


@dataclass(frozen=True)
class Thresholds:
    """Normalized channel levels: the class channel above `high`, the others below `low`."""

    high: float = 0.5
    low: float = 0.35

    def __post_init__(self) -> None:
        if not 0.0 <= self.low < self.high <= 1.0:
            raise ValueError(f"need 0 <= low < high <= 1, got {self}")


def weights_sha256(onnx_bytes: bytes) -> str:
    """The pin a run records: SHA-256 of the serialized model file."""
    return hashlib.sha256(onnx_bytes).hexdigest()


def build_detector(
    height: int,
    width: int,
    classes: Sequence[str] = CLASSES,
    *,
    thresholds: Thresholds = Thresholds(),
) -> bytes:
    """Serialized ONNX model for `[N, height, width, 3]` uint8 frames; deterministic bytes."""
    if height < _OPENING_KERNEL or width < _OPENING_KERNEL:
        raise ValueError(f"frames of {width}x{height} are too small")
    unknown = [name for name in classes if name not in CLASS_CHANNELS]
    if unknown or not classes or len(set(classes)) != len(classes):
        raise ValueError(f"classes must be distinct names from {sorted(CLASS_CHANNELS)}")
    graph = helper.make_graph(
        nodes=[*_mask_nodes(), *_box_nodes(), *_output_nodes()],
        name="colour_blob_detector",
        inputs=[
            helper.make_tensor_value_info(
                INPUT_NAME, TensorProto.UINT8, ["batch", height, width, 3]
            )
        ],
        outputs=_output_infos(len(classes)),
        initializer=_initializers(height, width, classes, thresholds),
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="tools.model_repository.detector",
        doc_string=f"classes={','.join(classes)} high={thresholds.high} low={thresholds.low}",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def _initializers(
    height: int, width: int, classes: Sequence[str], thresholds: Thresholds
) -> list[TensorProto]:
    # Per class k and channel c: weight * x + bias > 0 must hold for every channel, i.e.
    # x > high on the class channel (+x - high) and x < low elsewhere (-x + low).
    weight = np.full((len(classes), 3), -1.0, dtype=np.float32)
    bias = np.full((len(classes), 3), thresholds.low, dtype=np.float32)
    for k, name in enumerate(classes):
        weight[k, CLASS_CHANNELS[name]] = 1.0
        bias[k, CLASS_CHANNELS[name]] = -thresholds.high
    arrays: dict[str, np.ndarray[tuple[int, ...], np.dtype[np.generic]]] = {
        "scale": np.array(1.0 / 255.0, dtype=np.float32),
        "class_axis": np.array([1], dtype=np.int64),
        "weight": weight.reshape(len(classes), 3, 1, 1),
        "bias": bias.reshape(len(classes), 3, 1, 1),
        "zero": np.array(0.0, dtype=np.float32),
        "one": np.array(1.0, dtype=np.float32),
        "row_ramp": np.arange(height, dtype=np.float32),
        "col_ramp": np.arange(width, dtype=np.float32),
        "height": np.array(float(height), dtype=np.float32),
        "width": np.array(float(width), dtype=np.float32),
        "hw_axes": np.array([2, 3], dtype=np.int64),
        "last_axis": np.array([-1], dtype=np.int64),
        "slot_axis": np.array([1], dtype=np.int64),
        "k": np.array([len(classes)], dtype=np.int64),
        "box_tile": np.array([1, 1, 4], dtype=np.int64),
        "no_class": np.array(-1, dtype=np.int64),
    }
    return [numpy_helper.from_array(value, name) for name, value in arrays.items()]


def _mask_nodes() -> list[onnx.NodeProto]:
    """`images` -> `mask` float `[N, K, H, W]` (1 where a pixel has the class colour)."""
    kernel, pads = [_OPENING_KERNEL] * 2, [_OPENING_KERNEL // 2] * 4
    return [
        helper.make_node("Cast", [INPUT_NAME], ["pixels"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["pixels", "scale"], ["normalized"]),
        helper.make_node("Transpose", ["normalized"], ["nchw"], perm=[0, 3, 1, 2]),
        # [N, 1, 3, H, W] against [K, 3, 1, 1] broadcasts to [N, K, 3, H, W].
        helper.make_node("Unsqueeze", ["nchw", "class_axis"], ["n1chw"]),
        helper.make_node("Mul", ["n1chw", "weight"], ["weighted"]),
        helper.make_node("Add", ["weighted", "bias"], ["margins"]),
        helper.make_node("ReduceMin", ["margins"], ["worst_margin"], axes=[2], keepdims=0),
        helper.make_node("Greater", ["worst_margin", "zero"], ["raw_mask_bool"]),
        helper.make_node("Cast", ["raw_mask_bool"], ["raw_mask"], to=TensorProto.FLOAT),
        # Opening: erosion (a min-pool, as -maxpool(-x)) then dilation (maxpool).
        helper.make_node("Neg", ["raw_mask"], ["negated"]),
        helper.make_node(
            "MaxPool", ["negated"], ["negated_pooled"], kernel_shape=kernel, pads=pads
        ),
        helper.make_node("Neg", ["negated_pooled"], ["eroded"]),
        helper.make_node("MaxPool", ["eroded"], ["mask"], kernel_shape=kernel, pads=pads),
    ]


def _box_nodes() -> list[onnx.NodeProto]:
    """`mask` -> `boxes` `[N, K, 4]` and `scores` `[N, K]` (0 where a class is absent)."""
    return [
        helper.make_node("ReduceMax", ["mask"], ["rows"], axes=[3], keepdims=0),
        helper.make_node("ReduceMax", ["mask"], ["cols"], axes=[2], keepdims=0),
        *_extent_nodes("rows", "row_ramp", "height", "y"),
        *_extent_nodes("cols", "col_ramp", "width", "x"),
        helper.make_node("Concat", ["x1", "y1", "x2", "y2"], ["boxes"], axis=-1),
        helper.make_node("ReduceSum", ["mask", "hw_axes"], ["area"], keepdims=0),
        helper.make_node("Sub", ["x2", "x1"], ["box_w"]),
        helper.make_node("Sub", ["y2", "y1"], ["box_h"]),
        helper.make_node("Mul", ["box_w", "box_h"], ["box_area_k1"]),
        helper.make_node("Squeeze", ["box_area_k1", "last_axis"], ["box_area"]),
        helper.make_node("Max", ["box_area", "one"], ["safe_box_area"]),
        helper.make_node("Div", ["area", "safe_box_area"], ["scores"]),
    ]


def _extent_nodes(occupied: str, ramp: str, size: str, axis: str) -> list[onnx.NodeProto]:
    """First covered index and one past the last along `occupied` `[N, K, L]`, as `[N, K, 1]`.

    max(occupied * i) is the last index; max(occupied * (L - i)) is L minus the first.
    Absent classes come out as (L, 0); the output stage zeroes them.
    """
    return [
        helper.make_node("Mul", [occupied, ramp], [f"{axis}_ramped"]),
        helper.make_node("ReduceMax", [f"{axis}_ramped"], [f"{axis}_last"], axes=[2]),
        helper.make_node("Add", [f"{axis}_last", "one"], [f"{axis}2"]),
        helper.make_node("Sub", [size, ramp], [f"{axis}_reverse_ramp"]),
        helper.make_node("Mul", [occupied, f"{axis}_reverse_ramp"], [f"{axis}_reversed"]),
        helper.make_node("ReduceMax", [f"{axis}_reversed"], [f"{axis}_from_end"], axes=[2]),
        helper.make_node("Sub", [size, f"{axis}_from_end"], [f"{axis}1"]),
    ]


def _output_nodes() -> list[onnx.NodeProto]:
    """Sort slots by score so detections lead, as EfficientNMS does; zero the padding."""
    return [
        helper.make_node("TopK", ["scores", "k"], ["sorted_scores", "order"], axis=1),
        helper.make_node("Greater", ["sorted_scores", "zero"], ["sorted_present"]),
        helper.make_node("Cast", ["sorted_present"], ["present_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["sorted_scores", "present_f"], ["det_scores"]),
        helper.make_node("Unsqueeze", ["order", "last_axis"], ["order_k1"]),
        helper.make_node("Tile", ["order_k1", "box_tile"], ["order_k4"]),
        helper.make_node("GatherElements", ["boxes", "order_k4"], ["sorted_boxes"], axis=1),
        helper.make_node("Unsqueeze", ["present_f", "last_axis"], ["present_k1"]),
        helper.make_node("Mul", ["sorted_boxes", "present_k1"], ["det_boxes"]),
        helper.make_node("Where", ["sorted_present", "order", "no_class"], ["classes_i64"]),
        helper.make_node("Cast", ["classes_i64"], ["det_classes"], to=TensorProto.INT32),
        helper.make_node("ReduceSum", ["present_f", "slot_axis"], ["count"], keepdims=1),
        helper.make_node("Cast", ["count"], ["num_dets"], to=TensorProto.INT32),
    ]


def _output_infos(k: int) -> list[onnx.ValueInfoProto]:
    return [
        helper.make_tensor_value_info("num_dets", TensorProto.INT32, ["batch", 1]),
        helper.make_tensor_value_info("det_boxes", TensorProto.FLOAT, ["batch", k, 4]),
        helper.make_tensor_value_info("det_scores", TensorProto.FLOAT, ["batch", k]),
        helper.make_tensor_value_info("det_classes", TensorProto.INT32, ["batch", k]),
    ]
