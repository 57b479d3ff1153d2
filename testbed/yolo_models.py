"""Small ONNX models with the exact signatures of the YOLO families (docs/bring-your-own-model.md).

A *planted* model ignores its frames and emits a head the test chose, so decoding can be
checked exactly: `yolov8_head`, `yolov5_head` and `nms_head` lay out boxes given as
(class, score, x1, y1, x2, y2) in input pixels the way each family's export does, and
`planted_model` wraps a head in a graph with the family's input (float32 or float16 NCHW,
fixed or dynamic batch and size) and output. With `second`, a frame whose top-left pixel is
white emits that head instead, so a batch can hold frames with different answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from tools.model_repository.detector import build_detector

Head = npt.NDArray[np.float32]
IR_VERSION = 8


@dataclass(frozen=True)
class Planted:
    """One box a planted head emits: input pixels, corners."""

    class_index: int
    score: float
    x1: float
    y1: float
    x2: float
    y2: float


def yolov8_head(boxes: Sequence[Planted], num_classes: int, anchors: int) -> Head:
    """[1, 4+C, A]: cx, cy, w, h then class scores; anchors past the boxes score 0."""
    head = np.zeros((1, 4 + num_classes, anchors), np.float32)
    for a, box in enumerate(boxes):
        head[0, :4, a] = _centre(box)
        head[0, 4 + box.class_index, a] = box.score
    return head


def yolov5_head(
    boxes: Sequence[Planted], num_classes: int, anchors: int, objectness: float = 1.0
) -> Head:
    """[1, A, 5+C]: cx, cy, w, h, objectness, class scores (score = objectness x class)."""
    head = np.zeros((1, anchors, 5 + num_classes), np.float32)
    for a, box in enumerate(boxes):
        head[0, a, :4] = _centre(box)
        head[0, a, 4] = objectness
        head[0, a, 5 + box.class_index] = box.score / objectness
    return head


def nms_head(boxes: Sequence[Planted], slots: int = 300) -> Head:
    """[1, K, 6]: x1, y1, x2, y2, score, class; unused slots are zeros."""
    head = np.zeros((1, slots, 6), np.float32)
    for k, box in enumerate(boxes):
        head[0, k] = (box.x1, box.y1, box.x2, box.y2, box.score, box.class_index)
    return head


def _centre(box: Planted) -> tuple[float, float, float, float]:
    return ((box.x1 + box.x2) / 2, (box.y1 + box.y2) / 2, box.x2 - box.x1, box.y2 - box.y1)


def planted_model(
    head: Head,
    *,
    size: tuple[int | None, int | None] = (640, 640),
    batch: int | None = 1,
    dtype: Literal["float32", "float16"] = "float32",
    second: Head | None = None,
    names: str | None = None,
    with_nms_node: bool = False,
    opset: int = 17,
    input_name: str = "images",
    output_name: str = "output0",
    raw_served: bool = False,
) -> bytes:
    """A model taking [batch, 3, H, W] frames (None: dynamic) and emitting `head` for each
    (`second` for frames whose top-left pixel is 1.0); `names` goes into the metadata;
    `with_nms_node` adds a NonMaxSuppression node (its result unused), as `nms` exports have.
    `raw_served`: the model as Triton would serve it without decoding (uint8 NHWC
    `letterboxed_images` in, the served graph's cast, scale and transpose, the raw head
    out), the alternative bench.yolo_decode measures against."""
    elem = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.FLOAT
    np_type = np.float16 if dtype == "float16" else np.float32
    heads = [head] if second is None else [head, second - head]
    inits = [numpy_helper.from_array(h.astype(np_type), f"head{i}") for i, h in enumerate(heads)]
    inits += [
        numpy_helper.from_array(np.array([0, 0, 0], np.int64), "corner_start"),
        numpy_helper.from_array(np.array([1, 1, 1], np.int64), "corner_end"),
        numpy_helper.from_array(np.array([1, 2, 3], np.int64), "corner_axes"),
        numpy_helper.from_array(np.array([-1, 1, 1], np.int64), "corner_shape"),
        numpy_helper.from_array(np.array(0, np.dtype(np_type)), "zero"),
    ]
    # Every frame gets head0 (times 1 + 0 x its corner pixel, so the output has its batch).
    nodes = [
        helper.make_node(
            "Slice", [input_name, "corner_start", "corner_end", "corner_axes"], ["corner4"]
        ),
        helper.make_node("Reshape", ["corner4", "corner_shape"], ["corner"]),  # [N, 1, 1]
        helper.make_node("Mul", ["corner", "zero"], ["nothing"]),
        helper.make_node("Add", ["nothing", "head0"], ["first"]),
    ]
    result = "first"
    if second is not None:
        nodes += [
            helper.make_node("Mul", ["corner", "head1"], ["delta"]),
            helper.make_node("Add", ["first", "delta"], ["both"]),
        ]
        result = "both"
    if with_nms_node:
        inits += [
            numpy_helper.from_array(np.zeros((1, 1, 4), np.float32), "nms_boxes"),
            numpy_helper.from_array(np.zeros((1, 1, 1), np.float32), "nms_scores"),
        ]
        nodes.append(helper.make_node("NonMaxSuppression", ["nms_boxes", "nms_scores"], ["kept"]))
    nodes.append(helper.make_node("Identity", [result], [output_name]))
    height, width = size
    if raw_served:
        frames = "letterboxed_images"
        inits.append(numpy_helper.from_array(np.array(1 / 255, np.dtype(np_type)), "scale"))
        nodes = [
            helper.make_node("Cast", [frames], ["pixels"], to=elem),
            helper.make_node("Mul", ["pixels", "scale"], ["scaled"]),
            helper.make_node("Transpose", ["scaled"], [input_name], perm=[0, 3, 1, 2]),
            *nodes,
        ]
        batch_dim: int | str = "batch" if batch is None else batch
        if height is None or width is None:
            raise ValueError("a raw served model has a fixed size")
        frames_info = helper.make_tensor_value_info(
            frames, TensorProto.UINT8, [batch_dim, height, width, 3]
        )
    out_dims: list[int | str] = ["batch" if batch is None else batch, *head.shape[1:]]
    graph = helper.make_graph(
        nodes,
        "planted",
        [
            frames_info
            if raw_served
            else helper.make_tensor_value_info(
                input_name,
                elem,
                [
                    "batch" if batch is None else batch,
                    3,
                    "height" if height is None else height,
                    "width" if width is None else width,
                ],
            )
        ],
        [helper.make_tensor_value_info(output_name, elem, out_dims)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION
    if names is not None:
        helper.set_model_props(model, {"names": names, "stride": "32"})
    onnx.checker.check_model(model)
    return model.SerializeToString()


def colour_blob_yolov8(
    size: int = 640, classes: Sequence[str] = ("person", "vehicle", "animal")
) -> bytes:
    """The demo's colour-blob detector (tools.model_repository.detector) with a YOLOv8 export's
    signature: float32 [N, 3, size, size] 0..1 in, [N, 4+C, 2C] raw head out, class names in the
    metadata. Each object shows twice: its box, and a copy one pixel to the right at 0.9 of its
    score, which class-wise NMS must suppress."""
    inner = onnx.load_from_string(build_detector(size, size, classes))
    graph = inner.graph
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == "images":
                node.input[index] = "frames_u8"
    count = len(classes)
    consts: dict[str, npt.NDArray[Any]] = {
        "to_bytes": np.array(255.0, np.float32),
        "ids": np.arange(count, dtype=np.int32).reshape(1, 1, -1),
        "two": np.array(2.0, np.float32),
        "shift": np.array([1.0, 0.0, 0.0, 0.0], np.float32),
        "ninety": np.array(0.9, np.float32),
        "slot_axis": np.array([2], np.int64),
        "lo": np.array([0], np.int64),
        "mid": np.array([2], np.int64),
        "hi": np.array([4], np.int64),
        "last": np.array([2], np.int64),
    }
    graph.initializer.extend(numpy_helper.from_array(v, f"yolo_{k}") for k, v in consts.items())
    c = {k: f"yolo_{k}" for k in consts}
    nodes = [
        helper.make_node("Mul", ["images", c["to_bytes"]], ["yolo_bytes_f"]),
        helper.make_node("Transpose", ["yolo_bytes_f"], ["yolo_bytes_nhwc"], perm=[0, 2, 3, 1]),
        helper.make_node("Cast", ["yolo_bytes_nhwc"], ["frames_u8"], to=TensorProto.UINT8),
    ]
    tail = [
        helper.make_node("Slice", ["det_boxes", c["lo"], c["mid"], c["last"]], ["yolo_xy1"]),
        helper.make_node("Slice", ["det_boxes", c["mid"], c["hi"], c["last"]], ["yolo_xy2"]),
        helper.make_node("Sub", ["yolo_xy2", "yolo_xy1"], ["yolo_wh"]),
        helper.make_node("Add", ["yolo_xy1", "yolo_xy2"], ["yolo_twice_centre"]),
        helper.make_node("Div", ["yolo_twice_centre", c["two"]], ["yolo_centre"]),
        helper.make_node(
            "Concat", ["yolo_centre", "yolo_wh"], ["yolo_cxcywh"], axis=2
        ),  # [N, K, 4]
        helper.make_node(
            "Unsqueeze", ["det_classes", c["slot_axis"]], ["yolo_labels"]
        ),  # [N, K, 1]
        helper.make_node("Equal", ["yolo_labels", c["ids"]], ["yolo_hot"]),  # [N, K, C]
        helper.make_node("Cast", ["yolo_hot"], ["yolo_hot_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["det_scores", c["slot_axis"]], ["yolo_score_k1"]),
        helper.make_node("Mul", ["yolo_hot_f", "yolo_score_k1"], ["yolo_class_scores"]),
        helper.make_node("Concat", ["yolo_cxcywh", "yolo_class_scores"], ["yolo_rows"], axis=2),
        helper.make_node("Add", ["yolo_cxcywh", c["shift"]], ["yolo_shifted"]),
        helper.make_node("Mul", ["yolo_class_scores", c["ninety"]], ["yolo_weaker"]),
        helper.make_node("Concat", ["yolo_shifted", "yolo_weaker"], ["yolo_copies"], axis=2),
        helper.make_node(
            "Concat", ["yolo_rows", "yolo_copies"], ["yolo_anchors"], axis=1
        ),  # [N, 2K, 4+C]
        helper.make_node("Transpose", ["yolo_anchors"], ["output0"], perm=[0, 2, 1]),
    ]
    body = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + body + tail)
    del graph.input[:]
    graph.input.append(
        helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, size, size])
    )
    del graph.output[:]
    graph.output.append(
        helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 4 + count, 2 * count])
    )
    names = "{" + ", ".join(f"{i}: {name!r}" for i, name in enumerate(classes)) + "}"
    helper.set_model_props(inner, {"names": names, "stride": "32", "task": "detect"})
    onnx.checker.check_model(inner)
    return inner.SerializeToString()
