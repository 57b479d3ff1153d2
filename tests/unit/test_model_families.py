"""YOLO-family models: detection of the family from the signature, the served graph's decoding
(thresholds, best class, class-wise NMS, top K), class names from the metadata, every refusal,
and the letterbox's way back to the frame's pixels (docs/bring-your-own-model.md).

The served graph runs in onnxruntime here, the engine the python backend runs it with; the
same graphs go through the real Triton in tests/service/test_model_families_publish.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from services.processor.inference import Pin, Served, _detection
from testbed.yolo_models import (
    Planted,
    colour_blob_yolov8,
    nms_head,
    planted_model,
    yolov5_head,
    yolov8_head,
)
from tools.model_repository.__main__ import main as publish
from tools.model_repository.detector import build_detector
from tools.model_repository.families import (
    ModelRefused,
    Postprocess,
    check_classes,
    inspect,
    served_graph,
)
from workshop.kit.letterbox import letterbox, stretch
from workshop.kit.model_io import CONTRACT_OUTPUTS, LETTERBOX_INPUT

NAMES = "{0: 'person', 1: 'car', 2: 'dog'}"
CLASSES = ("person", "car", "dog")
A8, A5 = 8400, 25200  # anchors of 640x640 YOLOv8 and YOLOv5 heads


def run(served: bytes, frames: Any) -> dict[str, Any]:
    session = ort.InferenceSession(served, providers=["CPUExecutionProvider"])
    values = session.run(list(CONTRACT_OUTPUTS), {LETTERBOX_INPUT: frames})
    return dict(zip(CONTRACT_OUTPUTS, values, strict=True))


def frames(count: int = 1, size: int = 640, corner: tuple[int, ...] = ()) -> Any:
    """Gray frames; frame i's top-left pixel is `corner[i]` (planted models read it)."""
    batch = np.full((count, size, size, 3), 114, np.uint8)
    for i, value in enumerate(corner):
        batch[i, 0, 0, 0] = value
    return batch


def detections(out: dict[str, Any], frame: int = 0) -> list[tuple[int, float, list[float]]]:
    count = int(out["num_dets"][frame, 0])
    return [
        (
            int(out["det_classes"][frame, k]),
            round(float(out["det_scores"][frame, k]), 5),
            [float(v) for v in out["det_boxes"][frame, k]],
        )
        for k in range(count)
    ]


def serve(model: bytes, classes: tuple[str, ...] = CLASSES, **post: Any) -> bytes:
    return served_graph(model, inspect(model), classes, Postprocess(**post))


# --- families from signatures --------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "options", "family", "count"),
    [
        (yolov8_head([], 3, A8), {}, "yolov8", 3),
        (yolov8_head([], 80, A8), {"opset": 12}, "yolov8", 80),
        (yolov5_head([], 3, A5), {"opset": 12}, "yolov5", 3),
        (yolov5_head([], 1, A5), {}, "yolov5", 1),  # [N, A, 6]: no NMS inside, so not nms
        (nms_head([]), {"with_nms_node": True}, "nms", None),
    ],
)
def test_the_family_comes_from_the_signature(
    head: Any, options: dict[str, Any], family: str, count: int | None
) -> None:
    found = inspect(planted_model(head, names=NAMES, **options))
    assert (found.family, found.num_classes) == (family, count)
    assert found.metadata_classes == CLASSES
    assert (found.height, found.width, found.batch, found.letterboxed) == (640, 640, 1, True)


def test_dynamic_exports_need_an_input_size_a_multiple_of_the_stride() -> None:
    model = planted_model(yolov8_head([], 3, A8), size=(None, None), batch=None)
    with pytest.raises(ModelRefused, match=r"dynamic height and width.*--input-size"):
        inspect(model)
    with pytest.raises(ModelRefused, match=r"--input-size 500x500 cannot be letterboxed to.*32"):
        inspect(model, input_size=500)
    found = inspect(model, input_size=320)
    assert (found.height, found.width, found.batch) == (320, 320, None)


def test_a_dynamic_export_takes_the_size_its_metadata_names() -> None:
    """Ultralytics writes `imgsz` and `stride` into the metadata; --input-size overrides."""
    model = onnx.load_from_string(planted_model(yolov8_head([], 3, A8), size=(None, None)))
    helper.set_model_props(model, {"imgsz": "[384, 640]", "stride": "32"})
    found = inspect(model.SerializeToString())
    assert (found.height, found.width) == (384, 640)
    assert (inspect(model.SerializeToString(), input_size=320).height) == 320
    helper.set_model_props(model, {"imgsz": "[400, 640]", "stride": "32"})
    with pytest.raises(ModelRefused, match=r"the metadata's imgsz 400x640 .* stride 32"):
        inspect(model.SerializeToString())


def test_the_contract_itself_passes_through_unchanged() -> None:
    demo = build_detector(360, 640)
    found = inspect(demo)
    assert (found.family, found.letterboxed) == ("efficient-nms", False)
    assert served_graph(demo, found, ("person", "vehicle", "animal")) == demo


@pytest.mark.parametrize(
    ("model", "options", "message"),
    [
        (
            planted_model(np.zeros((1, 84), np.float32)),
            {},
            r"unsupported output layout: output0 \[1, 84\]",
        ),
        (
            planted_model(np.zeros((1, 300, 7), np.float32), with_nms_node=True),
            {},
            r"unsupported output layout: output0 \[1, 300, 7\] \(with NonMaxSuppression inside\)",
        ),
        (
            planted_model(yolov8_head([], 3, A8)),
            {"family": "yolov5"},
            r"--family yolov5 does not fit this model: .* the yolov8 layout",
        ),
        (
            planted_model(yolov8_head([], 3, A8), batch=4),
            {},
            "fixed batch of 4: export with batch=1 or dynamic=True",
        ),
        (
            planted_model(yolov8_head([], 3, A8), opset=10),
            {},
            "opset is 10; decoding needs opset 11",
        ),
        (b"not a model", {}, "not an ONNX model"),
    ],
)
def test_refusals_say_why(model: bytes, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelRefused, match=message):
        inspect(model, **options)


def test_a_class_list_must_agree_with_the_output() -> None:
    found = inspect(planted_model(yolov8_head([], 3, A8)))
    with pytest.raises(ModelRefused, match="2 class names, but the yolov8 output output0 holds 3"):
        check_classes(found, ("a", "b"))
    with pytest.raises(ModelRefused, match="unique"):
        check_classes(found, ("a", "a", "b"))
    check_classes(found, ("a", "b", "c"))


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ("{0: 'person', 1: 'car'}", ("person", "car")),
        ("['person', 'car']", ("person", "car")),
        ("{1: 'car', 0: 'person'}", ("person", "car")),
    ],
)
def test_class_names_come_from_the_metadata(names: str, expected: tuple[str, ...]) -> None:
    found = inspect(planted_model(yolov8_head([], 2, 100), names=names))
    assert found.metadata_classes == expected


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ("{0: 'person', 2: 'car'}", "without gaps"),
        ("person, car", "not a dict or list literal"),
        ("{0: ''}", "non-empty strings"),
    ],
)
def test_bad_metadata_names_are_refused(names: str, message: str) -> None:
    with pytest.raises(ModelRefused, match=message):
        inspect(planted_model(yolov8_head([], 2, 100), names=names))


# --- decoding --------------------------------------------------------------------------------


def test_yolov8_boxes_come_out_exactly_best_first() -> None:
    planted = [
        Planted(1, 0.6, 10.0, 20.0, 110.0, 220.0),
        Planted(0, 0.9, 300.5, 301.25, 400.75, 420.0),
        Planted(2, 0.3, 0.0, 0.0, 640.0, 640.0),
    ]
    out = run(serve(planted_model(yolov8_head(planted, 3, A8))), frames())
    assert detections(out) == [
        (0, 0.9, [300.5, 301.25, 400.75, 420.0]),
        (1, 0.6, [10.0, 20.0, 110.0, 220.0]),
        (2, 0.3, [0.0, 0.0, 640.0, 640.0]),
    ]
    # Padding slots: zero boxes and scores, class -1.
    assert out["det_boxes"].shape == (1, 100, 4)
    assert (out["det_classes"][0, 3:] == -1).all()
    assert not out["det_scores"][0, 3:].any()
    assert not out["det_boxes"][0, 3:].any()


def test_the_confidence_threshold_drops_boxes_at_or_below_it() -> None:
    planted = [
        Planted(0, 0.5, 0, 0, 10, 10),
        Planted(1, 0.25, 100, 100, 110, 110),
        Planted(2, 0.2501, 200, 200, 210, 210),
    ]
    model = planted_model(yolov8_head(planted, 3, 64))
    assert [d[0] for d in detections(run(serve(model), frames()))] == [0, 2]
    assert [d[0] for d in detections(run(serve(model, confidence=0.4), frames()))] == [0]
    assert [d[0] for d in detections(run(serve(model, confidence=0.0), frames()))] == [0, 2, 1]


def test_nms_is_class_wise_at_the_versions_iou() -> None:
    planted = [
        Planted(0, 0.9, 100, 100, 200, 200),
        Planted(0, 0.8, 110, 100, 210, 200),  # IoU 0.82 with the first: suppressed at 0.45
        Planted(1, 0.7, 110, 100, 210, 200),  # the same box, another class: kept
        Planted(0, 0.6, 150, 100, 250, 200),  # IoU 0.33 with the first: kept
    ]
    model = planted_model(yolov8_head(planted, 3, 64))
    kept = detections(run(serve(model), frames()))
    assert [(c, s) for c, s, _ in kept] == [(0, 0.9), (1, 0.7), (0, 0.6)]
    loose = detections(run(serve(model, iou=0.9), frames()))
    assert [(c, s) for c, s, _ in loose] == [(0, 0.9), (0, 0.8), (1, 0.7), (0, 0.6)]
    strict = detections(run(serve(model, iou=0.3), frames()))
    assert [(c, s) for c, s, _ in strict] == [(0, 0.9), (1, 0.7)]


def test_each_box_keeps_only_its_best_class() -> None:
    head = yolov8_head([Planted(0, 0.9, 10, 10, 50, 50)], 3, 16)
    head[0, 4 + 2, 0] = 0.8  # the same anchor also scores 0.8 for class 2
    out = run(serve(planted_model(head)), frames())
    assert detections(out) == [(0, 0.9, [10.0, 10.0, 50.0, 50.0])]


def test_yolov5_scores_are_objectness_times_class() -> None:
    planted = [Planted(2, 0.72, 20, 30, 60, 90), Planted(1, 0.2, 0, 0, 5, 5)]
    model = planted_model(yolov5_head(planted, 3, A5, objectness=0.8), opset=12)
    assert detections(run(serve(model), frames())) == [(2, 0.72, [20.0, 30.0, 60.0, 90.0])]


def test_nms_exports_are_thresholded_and_capped_again() -> None:
    planted = [Planted(1, 0.95, 5, 5, 50, 50), Planted(0, 0.1, 1, 1, 2, 2)]
    model = planted_model(nms_head(planted), with_nms_node=True)
    out = run(serve(model, max_detections=10), frames())
    assert detections(out) == [(1, 0.95, [5.0, 5.0, 50.0, 50.0])]
    assert out["det_scores"].shape == (1, 10)


def test_max_detections_keeps_the_best_of_each_frame() -> None:
    planted = [Planted(k % 3, 0.3 + k / 100, 20 * k, 0, 20 * k + 10, 10) for k in range(30)]
    out = run(serve(planted_model(yolov8_head(planted, 3, 64)), max_detections=5), frames())
    assert [s for _, s, _ in detections(out)] == [0.59, 0.58, 0.57, 0.56, 0.55]


def test_frames_of_a_batch_are_decoded_apart() -> None:
    first = [Planted(0, 0.9, 10, 10, 20, 20)]
    second = [Planted(2, 0.7, 30, 30, 60, 60), Planted(1, 0.5, 0, 0, 9, 9)]
    model = planted_model(yolov8_head(first, 3, 64), second=yolov8_head(second, 3, 64), batch=None)
    out = run(serve(model), frames(3, corner=(0, 255, 0)))
    assert detections(out, 0) == detections(out, 2) == [(0, 0.9, [10.0, 10.0, 20.0, 20.0])]
    assert detections(out, 1) == [
        (2, 0.7, [30.0, 30.0, 60.0, 60.0]),
        (1, 0.5, [0.0, 0.0, 9.0, 9.0]),
    ]


def test_float16_models_get_float16_frames() -> None:
    planted = [Planted(1, 0.75, 64, 32, 128, 96)]
    model = planted_model(yolov8_head(planted, 3, 64), dtype="float16")
    found = inspect(model)
    assert found.input_type == TensorProto.FLOAT16
    assert detections(run(serve(model), frames())) == [(1, 0.75, [64.0, 32.0, 128.0, 96.0])]


def test_the_served_graph_reads_normalised_rgb_nchw() -> None:
    """The prefix hands the model pixel/255 in NCHW: a model whose one box is made of the
    pixel at row 5, column 7 (cx, cy, w = 100 x its r, g, b) shows what it was given."""
    graph = helper.make_graph(
        [
            helper.make_node("Slice", ["images", "s", "e", "ax"], ["px"]),  # [N, 3, 1, 1]
            helper.make_node("Reshape", ["px", "shape"], ["rgb"]),  # [N, 3, 1]
            helper.make_node("Mul", ["rgb", "hundred"], ["cxcyw"]),
            helper.make_node("Concat", ["cxcyw", "rest"], ["anchor"], axis=1),  # [N, 7, 1]
            helper.make_node("Concat", ["anchor", "empty"], ["output0"], axis=2),  # [N, 7, 8]
        ],
        "echo",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 7, 8])],
        initializer=[
            helper.make_tensor("s", TensorProto.INT64, [2], [5, 7]),
            helper.make_tensor("e", TensorProto.INT64, [2], [6, 8]),
            helper.make_tensor("ax", TensorProto.INT64, [2], [2, 3]),
            helper.make_tensor("shape", TensorProto.INT64, [3], [1, 3, 1]),
            helper.make_tensor("hundred", TensorProto.FLOAT, [], [100.0]),
            # h = 50, then the scores of classes 0, 1, 2.
            helper.make_tensor("rest", TensorProto.FLOAT, [1, 4, 1], [50.0, 0.9, 0.0, 0.0]),
            helper.make_tensor("empty", TensorProto.FLOAT, [1, 7, 7], [0.0] * 49),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    image = np.zeros((1, 64, 64, 3), np.uint8)
    image[0, 5, 7] = (51, 102, 255)  # 0.2, 0.4, 1.0: cx 20, cy 40, w 100
    out = run(serve(model.SerializeToString()), image)
    [(label, score, box)] = detections(out)
    assert (label, score) == (0, 0.9)
    assert np.allclose(box, [-30.0, 15.0, 70.0, 65.0], atol=1e-4)


# --- the letterbox and the way back ----------------------------------------------------------


@pytest.mark.parametrize(
    ("height", "width", "expected"),
    [
        (360, 640, (140, 0, 360, 640)),
        (481, 853, (139, 0, 361, 640)),  # odd padding: the extra row goes below
        (1080, 1919, (140, 0, 360, 640)),
        (777, 333, (0, 183, 640, 274)),  # portrait
        (640, 640, (0, 0, 640, 640)),
    ],
)
def test_letterbox_geometry_is_ultralytics(
    height: int, width: int, expected: tuple[int, int, int, int]
) -> None:
    place = letterbox(height, width, 640, 640)
    assert (place.top, place.left, place.height, place.width) == expected
    # Ultralytics: top = round(dh - 0.1), bottom = round(dh + 0.1) fill the rest exactly.
    dh = (640 - place.height) / 2
    assert place.top + place.height + round(dh + 0.1) == 640


@pytest.mark.parametrize(("height", "width"), [(481, 853), (1080, 1919), (777, 333), (99, 1001)])
def test_boxes_map_back_to_the_frames_pixels_within_a_pixel(height: int, width: int) -> None:
    """A box in the frame's pixels, letterboxed as the decoder places the frame, comes back
    through `_detection` to within one pixel of where it was."""
    place = letterbox(height, width, 640, 640)
    served = Served(Pin("m", 1, "0" * 64), CLASSES, 1, 640, 640, input_name=LETTERBOX_INPUT)
    assert served.placement(height, width) == place
    rng = np.random.default_rng(height * width)
    for _ in range(50):
        x1, x2 = sorted(rng.uniform(0, width, 2))
        y1, y2 = sorted(rng.uniform(0, height, 2))
        sx, sy = place.width / width, place.height / height  # the decoder's resize
        model_box = np.array(
            [place.left + x1 * sx, place.top + y1 * sy, place.left + x2 * sx, place.top + y2 * sy]
        )
        found = _detection(served, place, model_box, 0.5, 2)
        assert found.class_name == "dog"
        for got, want in (
            (found.x * width, x1),
            (found.y * height, y1),
            ((found.x + found.w) * width, x2),
            ((found.y + found.h) * height, y2),
        ):
            assert abs(got - want) <= 1.0


def test_boxes_reaching_into_the_padding_are_clipped_to_the_picture() -> None:
    place = letterbox(360, 640, 640, 640)
    served = Served(Pin("m", 1, "0" * 64), CLASSES, 1, 640, 640, input_name=LETTERBOX_INPUT)
    found = _detection(served, place, np.array([-5.0, 100.0, 700.0, 560.0]), 0.5, 0)
    assert (found.x, found.y, found.w, found.h) == (0.0, 0.0, 1.0, 1.0)


def test_a_stretched_model_maps_boxes_as_before() -> None:
    served = Served(Pin("m", 1, "0" * 64), CLASSES, 8, 360, 640)
    found = _detection(served, stretch(360, 640), np.array([64.0, 36.0, 128.0, 72.0]), 0.5, 1)
    assert (found.x, found.y, found.w, found.h) == (0.1, 0.1, 0.1, 0.1)


def test_a_models_own_tensors_named_like_the_contract_move_aside() -> None:
    """The colour-blob YOLO model computes num_dets, det_boxes, ... inside (it is the demo
    detector with a YOLOv8 head on top): the served graph's outputs are still its own."""
    model = colour_blob_yolov8(64)
    image = np.zeros((1, 64, 64, 3), np.uint8)
    image[0, 10:20, 30:50] = (255, 0, 0)  # a person (red), 20 wide and 10 high
    out = run(serve(model, classes=("person", "vehicle", "animal")), image)
    assert detections(out) == [(0, 1.0, [30.0, 10.0, 50.0, 20.0])]


def test_gpu_instances_need_a_backend_that_runs_on_the_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "best.onnx"
    model.write_bytes(planted_model(yolov8_head([], 3, A8), names=NAMES))
    argv = ["publish", "--repository", str(tmp_path / "repo"), "--name", "m", "--version", "1"]
    with pytest.raises(SystemExit) as exit_:
        publish([*argv, "--onnx", str(model), "--skip-triton-check", "--device", "gpu"])
    assert exit_.value.code == 2
    assert "--device gpu needs --backend onnxruntime" in capsys.readouterr().err
    gpu = ["--device", "gpu", "--backend", "onnxruntime"]
    publish([*argv, "--onnx", str(model), "--skip-triton-check", *gpu])
    config = (tmp_path / "repo" / "m" / "config.pbtxt").read_text()
    assert "kind: KIND_GPU" in config
    assert 'platform: "onnxruntime_onnx"' in config
