"""Detector families: what an operator's ONNX file emits, and the one graph Triton serves for it.

Workshop's processor speaks one output contract, the EfficientNMS layout (`num_dets` [N, 1],
`det_boxes` [N, K, 4] x1, y1, x2, y2 in the model's input pixels, `det_scores` [N, K],
`det_classes` [N, K], detections first). Models people train and export do not emit it; this
module recognises them by their input and output signature and writes the *served graph*: the
operator's graph with a preprocessing prefix and a decoding suffix, in ONNX operators, so one
Triton model (any backend that runs ONNX: the python wrapper on the bundled CPU Triton,
onnxruntime with CUDA or TensorRT on a GPU) runs all of it where the model runs:

- `yolov8`: Ultralytics YOLOv8/11 raw head `[N, 4+C, A]` (cx, cy, w, h in input pixels, then
  the C class scores, sigmoid-ed; no objectness).
- `yolov5`: YOLOv5 raw head `[N, A, 5+C]` (cx, cy, w, h, objectness, class scores); a box's
  score is objectness times class score.
- `nms`: a graph with ONNX `NonMaxSuppression` inside that emits its selected boxes as
  `[N, K, 6]` (x1, y1, x2, y2, score, class), as Ultralytics' `export nms=True` does.
- `efficient-nms`: the contract itself; a model that already emits it passes through (with the
  preprocessing prefix when it takes float NCHW frames).

Preprocessing: the served graph takes `letterboxed_images`, uint8 `[N, H, W, 3]` RGB at the
model's input size, letterboxed by the decoder (aspect kept, padded with 114 gray, as
Ultralytics does), and casts it to the model's input type (float32 or float16), scales it to
0..1 and transposes it to NCHW. The input's name tells the processor to letterbox; a processor
that does not know it (release 0.1) sends `images` and Triton refuses the request, so an old
processor fails such a job instead of reporting boxes of a stretched frame.

Postprocessing: each anchor keeps its best class (as Ultralytics' default, one label a box);
boxes under the confidence threshold go; class-wise NMS (`NonMaxSuppression`, each class on its
own) at the version's IoU threshold; the best `max_detections` of each frame, by score, fill
the contract's outputs. The thresholds are constants of the served graph, so the weights pin
(SHA-256 of the served file) pins them too.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from workshop.kit.model_io import CONTRACT_OUTPUTS, LETTERBOX_INPUT

Family = Literal["yolov8", "yolov5", "nms", "efficient-nms"]
FAMILIES: tuple[Family, ...] = get_args(Family)
STRIDE = 32  # the largest stride of YOLO heads: a letterboxed size must be a multiple of it
DEFAULT_CONFIDENCE = 0.25
DEFAULT_IOU = 0.45
DEFAULT_MAX_DETECTIONS = 100
MIN_OPSET = 11  # NonMaxSuppression with its threshold inputs, TopK's K input
_PREFIX = "workshop_"


class ModelRefused(ValueError):
    """The model cannot be served as a detector; the message says why and what to do."""


@dataclass(frozen=True)
class Inspection:
    """What a model's signature says: its family and the frames it takes."""

    family: Family
    input_name: str
    input_type: int  # TensorProto element type of the model's own input
    layout: Literal["NCHW", "NHWC"]
    batch: int | None  # None: a dynamic batch dimension
    height: int
    width: int
    output_names: tuple[str, ...]
    num_classes: int | None  # from the output's shape, where the layout says it
    metadata_classes: tuple[str, ...] | None  # the ONNX metadata's `names`
    opset: int

    @property
    def letterboxed(self) -> bool:
        """Whether the served graph takes letterboxed frames (every float NCHW model)."""
        return self.layout == "NCHW"


@dataclass(frozen=True)
class Postprocess:
    """A version's decoding settings, constants of its served graph."""

    confidence: float = DEFAULT_CONFIDENCE
    iou: float = DEFAULT_IOU
    max_detections: int = DEFAULT_MAX_DETECTIONS

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence < 1.0:
            raise ModelRefused(f"the confidence threshold must be in [0, 1), not {self.confidence}")
        if not 0.0 < self.iou <= 1.0:
            raise ModelRefused(f"the IoU threshold must be in (0, 1], not {self.iou}")
        if not 1 <= self.max_detections <= 1000:
            raise ModelRefused(
                f"max detections must be between 1 and 1000, not {self.max_detections}"
            )


def metadata_classes(model: onnx.ModelProto) -> tuple[str, ...] | None:
    """Class names from the metadata key `names`, a Python dict literal of index to name
    ("{0: 'person', 1: 'car'}", as Ultralytics writes it) or a list; None without it."""
    text = next((p.value for p in model.metadata_props if p.key == "names"), None)
    if text is None:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ModelRefused(
            f"the ONNX metadata's names is not a dict or list literal: {text[:80]!r}"
        ) from None
    if isinstance(value, dict):
        if sorted(value) != list(range(len(value))):
            raise ModelRefused(
                "the ONNX metadata's names must number the classes 0, 1, 2, ... without gaps; "
                f"found keys {sorted(value, key=str)[:10]}"
            )
        names = [value[i] for i in range(len(value))]
    elif isinstance(value, list | tuple):
        names = list(value)
    else:
        raise ModelRefused("the ONNX metadata's names is not a dict or list")
    if not names or not all(isinstance(n, str) and n and "\n" not in n for n in names):
        raise ModelRefused("the ONNX metadata's names must be non-empty strings")
    return tuple(names)


def inspect(
    onnx_bytes: bytes, *, family: Family | None = None, input_size: int | None = None
) -> Inspection:
    """The family (detected from the signature, or `family` checked against it) and input."""
    try:
        model = onnx.load_from_string(onnx_bytes)
    except Exception as error:  # onnx raises DecodeError and others for a non-ONNX file
        raise ModelRefused(f"not an ONNX model: {error}") from None
    graph = model.graph
    opset = _default_opset(model)
    initializers = {i.name for i in graph.initializer}
    inputs = [v for v in graph.input if v.name not in initializers]
    if len(inputs) != 1:
        names = ", ".join(v.name for v in inputs) or "none"
        raise ModelRefused(f"a detector takes one input (frames); this model takes {names}")
    source = inputs[0]
    elem = source.type.tensor_type.elem_type
    dims = _dims(source)
    outputs = {v.name: _dims(v) for v in graph.output}
    stride, exported = _metadata_geometry(model)
    layout, batch, height, width = _input_geometry(
        source.name, elem, dims, input_size, stride, exported
    )
    named_classes = metadata_classes(model)
    detected, num_classes = _family(
        graph, outputs, None if named_classes is None else len(named_classes)
    )
    if family is not None and family != detected:
        raise ModelRefused(
            f"--family {family} does not fit this model: its outputs "
            f"{_describe(outputs)} are the {detected} layout"
            + (f" ({_LAYOUTS[family]} expected)" if family in _LAYOUTS else "")
        )
    if layout == "NHWC" and detected != "efficient-nms":
        raise ModelRefused(
            f"input {source.name!r} takes uint8 NHWC frames; a {detected} model must take "
            "float32 or float16 NCHW frames (Ultralytics' export)"
        )
    if opset < MIN_OPSET and (detected != "efficient-nms" or layout == "NCHW"):
        raise ModelRefused(
            f"the model's opset is {opset}; decoding needs opset {MIN_OPSET} or newer "
            "(export with opset=12 or later)"
        )
    return Inspection(
        family=detected,
        input_name=source.name,
        input_type=elem,
        layout=layout,
        batch=batch,
        height=height,
        width=width,
        output_names=tuple(outputs),
        num_classes=num_classes,
        metadata_classes=named_classes,
        opset=opset,
    )


_LAYOUTS: dict[Family, str] = {
    "yolov8": "one output [N, 4+C, anchors]",
    "yolov5": "one output [N, anchors, 5+C]",
    "nms": "one output [N, K, 6] from a graph with NonMaxSuppression",
    "efficient-nms": "outputs num_dets, det_boxes, det_scores, det_classes",
}


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _dims(value: onnx.ValueInfoProto) -> tuple[int | None, ...]:
    shape = value.type.tensor_type.shape
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in shape.dim)


def _describe(outputs: dict[str, tuple[int | None, ...]]) -> str:
    return ", ".join(
        f"{name} [{', '.join('?' if d is None else str(d) for d in dims)}]"
        for name, dims in outputs.items()
    )


def _metadata_geometry(model: onnx.ModelProto) -> tuple[int, tuple[int, int] | None]:
    """The stride (`stride`, else STRIDE) and the size the model was exported for (`imgsz`,
    "[640, 640]" as Ultralytics writes it), from the metadata; None where it is not said."""
    props = {p.key: p.value for p in model.metadata_props}
    stride = STRIDE
    with contextlib.suppress(ValueError, SyntaxError, TypeError):
        value = ast.literal_eval(props.get("stride", ""))
        if isinstance(value, int) and value > 0:
            stride = value
    exported = None
    with contextlib.suppress(ValueError, SyntaxError, TypeError):
        value = ast.literal_eval(props.get("imgsz", ""))
        if isinstance(value, int):
            value = [value, value]
        if (
            isinstance(value, list | tuple)
            and len(value) == 2
            and all(isinstance(v, int) and v > 0 for v in value)
        ):
            exported = (int(value[0]), int(value[1]))
    return stride, exported


def _input_geometry(
    name: str,
    elem: int,
    dims: tuple[int | None, ...],
    input_size: int | None,
    stride: int = STRIDE,
    exported: tuple[int, int] | None = None,
) -> tuple[Literal["NCHW", "NHWC"], int | None, int, int]:
    if len(dims) != 4:
        raise ModelRefused(f"input {name!r} has rank {len(dims)}; a detector takes [N, 3, H, W]")
    batch = dims[0]
    if batch is not None and batch != 1:
        raise ModelRefused(
            f"input {name!r} has a fixed batch of {batch}: export with batch=1 or dynamic=True"
        )
    if elem == TensorProto.UINT8 and dims[3] == 3:
        layout: Literal["NCHW", "NHWC"] = "NHWC"
        height, width = dims[1], dims[2]
    elif elem in (TensorProto.FLOAT, TensorProto.FLOAT16) and dims[1] == 3:
        layout = "NCHW"
        height, width = dims[2], dims[3]
    else:
        raise ModelRefused(
            f"input {name!r} is {TensorProto.DataType.Name(elem)} {list(dims)}; a detector "
            "takes float32 or float16 [N, 3, H, W] (or the contract's uint8 [N, H, W, 3])"
        )
    if height is None or width is None:
        if input_size is not None:
            wanted = (input_size, input_size)
        elif exported is not None:  # the size it was exported for (Ultralytics' imgsz)
            wanted = exported
        else:
            raise ModelRefused(
                f"input {name!r} has a dynamic height and width and the metadata names no "
                "imgsz: frames cannot be letterboxed to an unknown size; pass --input-size "
                f"(a multiple of {stride}, e.g. 640)"
            )
        if min(wanted) <= 0 or wanted[0] % stride or wanted[1] % stride:
            source = "--input-size" if input_size is not None else "the metadata's imgsz"
            raise ModelRefused(
                f"{source} {wanted[0]}x{wanted[1]} cannot be letterboxed to: it must be a "
                f"positive multiple of the model's stride {stride}"
            )
        height = height or wanted[0]
        width = width or wanted[1]
    elif input_size is not None and (height, width) != (input_size, input_size):
        raise ModelRefused(
            f"--input-size {input_size} disagrees with the model's fixed input {height}x{width}"
        )
    return layout, batch, height, width


def _family(
    graph: onnx.GraphProto, outputs: dict[str, tuple[int | None, ...]], named: int | None
) -> tuple[Family, int | None]:
    """The family and class count from the output's shape: the class dimension is the static
    one, or the smaller (anchors outnumber classes in any real head); with class names in the
    metadata, the layout their count fits decides."""
    if set(CONTRACT_OUTPUTS) <= set(outputs):
        return "efficient-nms", None
    if len(outputs) != 1:
        raise ModelRefused(
            f"unsupported output layout: {_describe(outputs)}; Workshop serves "
            + "; ".join(f"{f}: {text}" for f, text in _LAYOUTS.items())
        )
    ((_, dims),) = outputs.items()
    has_nms = "NonMaxSuppression" in _op_types(graph)
    if len(dims) == 3:
        first, second = dims[1], dims[2]
        if has_nms:
            if second == 6:
                return "nms", None
        elif named is not None and first == 4 + named:
            return "yolov8", named
        elif named is not None and second == 5 + named:
            return "yolov5", named
        elif first is not None and (second is None or first < second):
            if first > 4:
                return "yolov8", first - 4
        elif second is not None and (first is None or second < first) and second > 5:
            return "yolov5", second - 5
    raise ModelRefused(
        f"unsupported output layout: {_describe(outputs)}"
        + (" (with NonMaxSuppression inside)" if has_nms else "")
        + "; Workshop serves "
        + "; ".join(f"{f}: {text}" for f, text in _LAYOUTS.items())
    )


def _op_types(graph: onnx.GraphProto) -> set[str]:
    """Every operator of the graph and its subgraphs (an export may run NMS in a Loop)."""
    found = set()
    for node in graph.node:
        found.add(node.op_type)
        for attribute in node.attribute:
            for sub in [attribute.g, *attribute.graphs]:
                found |= _op_types(sub)
    return found


def check_classes(inspection: Inspection, classes: Sequence[str]) -> None:
    """Refuses a class list whose length disagrees with the output's class dimension."""
    if not classes:
        raise ModelRefused("no class names: the model's metadata has no names; pass --classes")
    if len(set(classes)) != len(classes):
        raise ModelRefused("class names must be unique")
    if inspection.num_classes is not None and inspection.num_classes != len(classes):
        raise ModelRefused(
            f"{len(classes)} class names, but the {inspection.family} output "
            f"{inspection.output_names[0]} holds {inspection.num_classes} class scores"
        )


def served_graph(
    onnx_bytes: bytes,
    inspection: Inspection,
    classes: Sequence[str],
    post: Postprocess = Postprocess(),
) -> bytes:
    """The graph Triton serves for the model: the model itself when it already takes uint8
    NHWC frames and emits the contract, else the model between a letterbox-input prefix and
    a decoding suffix. Deterministic bytes for the same inputs."""
    check_classes(inspection, classes)
    if not inspection.letterboxed:
        return onnx_bytes
    model = onnx.load_from_string(onnx_bytes)
    graph = model.graph
    builder = _Builder(inspection.opset)
    internal = f"{_PREFIX}model_input"
    _rename_input(graph, inspection.input_name, internal)
    if inspection.family != "efficient-nms":
        # The served graph's own names may be taken inside the model: those tensors move.
        for name in (*CONTRACT_OUTPUTS, LETTERBOX_INPUT):
            _rename_tensor(graph, name, f"{_PREFIX}source_{name}")
    builder.preprocess(inspection, internal)
    prefix, builder.nodes = builder.nodes, []
    if inspection.family != "efficient-nms":
        builder.decode(inspection, len(classes), post)
    batch: str | int = "batch" if inspection.batch is None else 1
    del graph.input[:]
    graph.input.append(
        helper.make_tensor_value_info(
            LETTERBOX_INPUT, TensorProto.UINT8, [batch, inspection.height, inspection.width, 3]
        )
    )
    if inspection.family != "efficient-nms":  # a contract model keeps its outputs
        k = post.max_detections
        del graph.output[:]
        graph.output.extend(
            [
                helper.make_tensor_value_info("num_dets", TensorProto.INT32, [batch, 1]),
                helper.make_tensor_value_info("det_boxes", TensorProto.FLOAT, [batch, k, 4]),
                helper.make_tensor_value_info("det_scores", TensorProto.FLOAT, [batch, k]),
                helper.make_tensor_value_info("det_classes", TensorProto.INT32, [batch, k]),
            ]
        )
    body = list(graph.node)
    del graph.node[:]
    graph.node.extend([*prefix, *body, *builder.nodes])
    graph.initializer.extend(builder.initializers)
    # Dimension values the model's own outputs carried would contradict the new outputs.
    del graph.value_info[:]
    model.doc_string = (
        f"Workshop served graph ({inspection.family}): letterboxed uint8 NHWC in, "
        f"EfficientNMS layout out; confidence {post.confidence}, IoU {post.iou}, "
        f"max detections {post.max_detections}. " + model.doc_string
    )
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        raise ModelRefused(f"the served graph is not valid ONNX: {error}") from None
    return model.SerializeToString()


def _rename_tensor(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Renames a tensor the graph makes (a node's output) everywhere it is read."""
    if not any(old in node.output for node in graph.node):
        return
    for node in graph.node:
        for index, name in enumerate(node.output):
            if name == old:
                node.output[index] = new
    _rename_input(graph, old, new)
    for value in graph.value_info:
        if value.name == old:
            value.name = new


def _rename_input(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new
        for attribute in node.attribute:  # subgraphs (If, Loop) may read the input too
            for sub in [attribute.g, *attribute.graphs]:
                _rename_input(sub, old, new)


class _Builder:
    """Nodes and constants appended to the model's graph, valid at the model's opset."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._count = 0
        self.head = ""

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{_PREFIX}{hint}_{self._count}"

    def const(self, hint: str, value: npt.NDArray[Any]) -> str:
        name = self._name(hint)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str, **attrs: Any) -> str:
        return self.ops(op_type, inputs, hint, 1, **attrs)[0]

    def ops(
        self, op_type: str, inputs: list[str], hint: str, count: int, **attrs: Any
    ) -> list[str]:
        names = [self._name(hint) for _ in range(count)]
        self.nodes.append(
            helper.make_node(op_type, inputs, names, name=self._name(op_type), **attrs)
        )
        return names

    def named(self, op_type: str, inputs: list[str], output: str, **attrs: Any) -> None:
        self.nodes.append(
            helper.make_node(op_type, inputs, [output], name=self._name(op_type), **attrs)
        )

    def slice(self, x: str, start: int, end: int, axis: int) -> str:
        return self.op(
            "Slice",
            [
                x,
                self.const("start", np.array([start], np.int64)),
                self.const("end", np.array([end], np.int64)),
                self.const("axis", np.array([axis], np.int64)),
            ],
            "slice",
        )

    def unsqueeze(self, x: str, axis: int) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.const("axes", np.array([axis], np.int64))], "unsq")
        return self.op("Unsqueeze", [x], "unsq", axes=[axis])

    def reduce_sum(self, x: str, axis: int) -> str:
        if self.opset >= 13:
            axes = self.const("axes", np.array([axis], np.int64))
            return self.op("ReduceSum", [x, axes], "sum", keepdims=1)
        return self.op("ReduceSum", [x], "sum", axes=[axis], keepdims=1)

    def preprocess(self, inspection: Inspection, output: str) -> None:
        """uint8 NHWC 0..255 -> the model's float type, NCHW, 0..1."""
        elem = inspection.input_type
        dtype = np.float16 if elem == TensorProto.FLOAT16 else np.float32
        pixels = self.op("Cast", [LETTERBOX_INPUT], "pixels", to=elem)
        scaled = self.op("Mul", [pixels, self.const("scale", np.array(1 / 255, dtype))], "scaled")
        self.named("Transpose", [scaled], output, perm=[0, 3, 1, 2])

    def decode(self, inspection: Inspection, num_classes: int, post: Postprocess) -> None:
        head = self.op("Cast", [inspection.output_names[0]], "head", to=TensorProto.FLOAT)
        if inspection.family == "yolov8":  # [N, 4+C, A]
            boxes = self.op("Transpose", [self.slice(head, 0, 4, 1)], "cxcywh", perm=[0, 2, 1])
            scores = self.slice(head, 4, 4 + num_classes, 1)  # [N, C, A]
            xyxy = self._corners(boxes)
        elif inspection.family == "yolov5":  # [N, A, 5+C]
            boxes = self.slice(head, 0, 4, 2)
            objectness = self.slice(head, 4, 5, 2)
            joint = self.op("Mul", [self.slice(head, 5, 5 + num_classes, 2), objectness], "p")
            scores = self.op("Transpose", [joint], "scores", perm=[0, 2, 1])
            xyxy = self._corners(boxes)
        else:  # nms: [N, K, 6] x1, y1, x2, y2, score, class
            xyxy = self.slice(head, 0, 4, 2)
            score = self.slice(head, 4, 5, 2)  # [N, K, 1]
            label = self.op("Cast", [self.slice(head, 5, 6, 2)], "label", to=TensorProto.INT64)
            ids = self.const("class_ids", np.arange(num_classes, dtype=np.int64).reshape(1, 1, -1))
            hot = self.op("Equal", [label, ids], "hot")  # [N, K, C]
            zero = self.const("zero", np.array(0.0, np.float32))
            per_class = self.op("Where", [hot, score, zero], "per_class")
            scores = self.op("Transpose", [per_class], "scores", perm=[0, 2, 1])  # [N, C, K]
        self._select(xyxy, scores, num_classes, post)

    def _corners(self, cxcywh: str) -> str:
        """[N, A, 4] cx, cy, w, h -> x1, y1, x2, y2."""
        centre = self.slice(cxcywh, 0, 2, 2)
        half = self.op(
            "Mul",
            [self.slice(cxcywh, 2, 4, 2), self.const("half", np.array(0.5, np.float32))],
            "half",
        )
        low = self.op("Sub", [centre, half], "low")
        high = self.op("Add", [centre, half], "high")
        return self.op("Concat", [low, high], "xyxy", axis=2)

    def _select(self, xyxy: str, scores: str, num_classes: int, post: Postprocess) -> None:
        """Best class per box, class-wise NMS, the best K of each frame in contract order."""
        k = post.max_detections
        best = self.op("ArgMax", [scores], "best", axis=1, keepdims=1)  # [N, 1, A]
        ids = self.const("class_ids", np.arange(num_classes, dtype=np.int64).reshape(1, -1, 1))
        only_best = self.op("Equal", [ids, best], "only_best")  # [N, C, A]
        zero = self.const("zero", np.array(0.0, np.float32))
        single = self.op("Where", [only_best, scores, zero], "single")
        selected = self.op(
            "NonMaxSuppression",
            [
                xyxy,
                single,
                self.const("max_out", np.array([k], np.int64)),
                self.const("iou", np.array([post.iou], np.float32)),
                self.const("conf", np.array([post.confidence], np.float32)),
            ],
            "selected",
            center_point_box=0,
        )  # [M, 3]: frame, class, box
        frame = self.op(
            "Gather", [selected, self.const("i0", np.array(0, np.int64))], "frame", axis=1
        )
        label = self.op(
            "Gather", [selected, self.const("i1", np.array(1, np.int64))], "label", axis=1
        )
        frame_box = self.op(
            "Gather", [selected, self.const("i02", np.array([0, 2], np.int64))], "fb", axis=1
        )
        chosen_scores = self.op("GatherND", [single, selected], "chosen_scores")  # [M]
        chosen_boxes = self.op("GatherND", [xyxy, frame_box], "chosen_boxes")  # [M, 4]
        # K placeholders of no frame, so that every frame has K candidates for TopK.
        pad_scores = self.op(
            "Concat",
            [chosen_scores, self.const("pad_s", np.full(k, -1.0, np.float32))],
            "ps",
            axis=0,
        )
        pad_boxes = self.op(
            "Concat",
            [chosen_boxes, self.const("pad_b", np.zeros((k, 4), np.float32))],
            "pb",
            axis=0,
        )
        none = np.full(k, -1, np.int64)
        pad_labels = self.op("Concat", [label, self.const("pad_l", none)], "pl", axis=0)
        pad_frames = self.op("Concat", [frame, self.const("pad_f", none)], "pf", axis=0)
        shape = self.op("Shape", [xyxy], "shape")
        frames = self.op("Gather", [shape, self.const("i0", np.array(0, np.int64))], "n", axis=0)
        one = self.const("one", np.array(1, np.int64))
        frame_ids = self.op("Range", [self.const("z", np.array(0, np.int64)), frames, one], "ids")
        mine = self.op("Equal", [self.unsqueeze(frame_ids, 1), pad_frames], "mine")  # [N, M+K]
        minus = self.const("minus", np.array(-1.0, np.float32))
        table = self.op("Where", [mine, pad_scores, minus], "table")
        top, order = self.ops(
            "TopK", [table, self.const("k", np.array([k], np.int64))], "top", 2, axis=1
        )  # [N, K], best first; ties keep the lower index
        valid = self.op("Greater", [top, self.const("half_neg", np.array(-0.5, np.float32))], "ok")
        self.named("Where", [valid, top, zero], "det_scores")
        boxes = self.op("Gather", [pad_boxes, order], "boxes", axis=0)  # [N, K, 4]
        self.named("Where", [self.unsqueeze(valid, 2), boxes, zero], "det_boxes")
        labels = self.op("Gather", [pad_labels, order], "labels", axis=0)
        minus_one = self.const("minus_one", np.array(-1, np.int64))
        chosen = self.op("Where", [valid, labels, minus_one], "chosen")
        self.named("Cast", [chosen], "det_classes", to=TensorProto.INT32)
        counted = self.op("Cast", [valid], "counted", to=TensorProto.INT32)
        self.named("Identity", [self.reduce_sum(counted, 1)], "num_dets")
