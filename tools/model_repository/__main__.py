"""`python -m tools.model_repository publish ...`: publish a model version and register it.

With `--onnx FILE` the model is inspected first (docs/bring-your-own-model.md): its family comes
from its input and output signature (or `--family`), its class names from its ONNX metadata
(`names`) or `--classes`, and the graph Triton serves is built from it (letterboxed input,
decoding, class-wise NMS). That graph is then run once on a synthetic frame on the Triton that
will serve it (`--triton`), and only when all of that passes is anything written: the version
under `<repository>/<name>/<version>/` (served weights, class list, weight pin, `workshop.json`
with the family and thresholds, the python-backend wrapper unless `--backend onnxruntime`) and
the model's `config.pbtxt`; then, given a coordinator and an admin key, the version is
registered with its pin (OperatorService.PublishModelVersion), so runs can pin it. Republishing
identical weights is a no-op on both sides; other weights under a published version are refused
by both. Prints the published version as JSON; a refusal is one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import grpc

from tools.model_repository.detector import CLASSES, build_detector
from tools.model_repository.families import (
    DEFAULT_CONFIDENCE,
    DEFAULT_IOU,
    DEFAULT_MAX_DETECTIONS,
    FAMILIES,
    Family,
    ModelRefused,
    Postprocess,
    check_classes,
    inspect,
    served_graph,
)
from tools.model_repository.repository import (
    ModelFiles,
    RepositoryError,
    VersionPlan,
    check_version,
    plan_version,
    write_version,
)
from tools.model_repository.triton_check import TritonUnreachable, check_on_triton
from workshop.kit.cli import (
    Metadata,
    add_coordinator_arguments,
    call_coordinator,
    check_coordinator_arguments,
)
from workshop.v1 import operator_pb2, operator_pb2_grpc

TRITON_ENV = "WORKSHOP_TRITON"
DECODING_FILE = "workshop.json"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.model_repository")
    commands = parser.add_subparsers(dest="command", required=True)
    publish = commands.add_parser("publish", help="publish a model version")
    publish.add_argument("--repository", type=Path, required=True, help="Triton model repository")
    publish.add_argument("--name", required=True, help="model name, as Triton serves it")
    publish.add_argument("--version", type=int, required=True, help="version number, >= 1")
    weights = publish.add_mutually_exclusive_group(required=True)
    weights.add_argument(
        "--onnx",
        type=Path,
        help="ONNX file: a YOLOv8/11 or YOLOv5 export, one with NonMaxSuppression inside, or "
        "one following the EfficientNMS output contract",
    )
    weights.add_argument(
        "--demo-detector",
        action="store_true",
        help=f"build the demo colour-blob detector (classes {','.join(CLASSES)})",
    )
    publish.add_argument("--height", type=int, default=360, help="demo detector input height")
    publish.add_argument("--width", type=int, default=640, help="demo detector input width")
    publish.add_argument(
        "--classes",
        help="comma-separated class names in class-index order (with --onnx; default: the "
        "ONNX metadata's names)",
    )
    publish.add_argument(
        "--family",
        choices=FAMILIES,
        help="the model's output layout (default: detected from its signature)",
    )
    publish.add_argument(
        "--input-size",
        type=int,
        help="the square size to letterbox frames to, for a model exported with a dynamic "
        "height and width (default: the metadata's imgsz; a multiple of the stride)",
    )
    publish.add_argument(
        "--confidence",
        type=float,
        default=DEFAULT_CONFIDENCE,
        help="boxes scoring at or below it are dropped",
    )
    publish.add_argument(
        "--iou",
        type=float,
        default=DEFAULT_IOU,
        help="class-wise NMS keeps the better of two boxes of one class overlapping more",
    )
    publish.add_argument(
        "--max-detections", type=int, default=DEFAULT_MAX_DETECTIONS, help="per frame"
    )
    publish.add_argument(
        "--triton",
        default=os.environ.get(TRITON_ENV, ""),
        help=f"the gRPC address HOST:PORT of the Triton that will serve the model (default "
        f"${TRITON_ENV}): the version runs once there on a synthetic frame before anything "
        "is written; required with --onnx unless --skip-triton-check",
    )
    publish.add_argument(
        "--skip-triton-check",
        action="store_true",
        help="publish an --onnx model without the check on Triton",
    )
    publish.add_argument(
        "--backend",
        choices=("python", "onnxruntime"),
        default="python",
        help="python: a wrapper running the ONNX with onnxruntime (the bundled Triton); "
        "onnxruntime: platform onnxruntime_onnx (a production Triton)",
    )
    publish.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="where Triton places the model's instances (gpu: KIND_GPU)",
    )
    publish.add_argument(
        "--max-batch-size",
        type=int,
        default=8,
        help="largest batch (a model exported with a fixed batch of 1 is served unbatched)",
    )
    publish.add_argument("--instances", type=int, default=2, help="model instances")
    publish.add_argument("--threads", type=int, default=1, help="inference threads per instance")
    add_coordinator_arguments(publish, required=False)
    return parser


@dataclass(frozen=True)
class Prepared:
    """The bytes Triton serves and what the coordinator records about them."""

    served: bytes
    classes: tuple[str, ...]
    batched: bool
    family: str = ""
    post: Postprocess | None = None
    source_sha256: str = ""

    def decoding_json(self) -> bytes:
        post = self.post
        return (
            json.dumps(
                {
                    "family": self.family,
                    "confidence_threshold": post.confidence if post else 0.0,
                    "iou_threshold": post.iou if post else 0.0,
                    "max_detections": post.max_detections if post else 0,
                    "source_sha256": self.source_sha256,
                },
                indent=2,
                sort_keys=True,
            )
            + "\n"
        ).encode()


def _prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Prepared:
    if args.demo_detector:
        if args.classes or args.family:
            parser.error("--classes and --family go with --onnx; the demo detector has its own")
        return Prepared(build_detector(args.height, args.width), CLASSES, batched=True)
    try:
        source = args.onnx.read_bytes()
    except OSError as error:
        parser.error(f"cannot read {args.onnx}: {error.strerror}")
    if not args.triton and not args.skip_triton_check:
        parser.error(
            f"--onnx needs --triton HOST:PORT (or ${TRITON_ENV}): the Triton that will serve "
            "the model, where it runs once before anything is written (or --skip-triton-check)"
        )
    post = Postprocess(args.confidence, args.iou, args.max_detections)
    inspection = inspect(
        source, family=cast(Family | None, args.family), input_size=args.input_size
    )
    if args.classes:
        classes = tuple(c.strip() for c in args.classes.split(","))
    elif inspection.metadata_classes is not None:
        classes = inspection.metadata_classes
    else:
        raise ModelRefused(
            "no class names: the ONNX metadata has no 'names' (Ultralytics writes it); "
            "pass --classes a,b,c in class-index order"
        )
    check_classes(inspection, classes)
    served = served_graph(source, inspection, classes, post)
    decodes = inspection.family != "efficient-nms"
    return Prepared(
        served=served,
        classes=classes,
        batched=inspection.batch is None,
        family=inspection.family,
        post=post if decodes else None,
        source_sha256=hashlib.sha256(source).hexdigest() if served != source else "",
    )


def _register(
    target: str, key: str, name: str, version: int, files: ModelFiles, prepared: Prepared
) -> bool:
    post = prepared.post

    async def call(channel: grpc.aio.Channel, metadata: Metadata) -> bool:
        reply = await operator_pb2_grpc.OperatorServiceStub(channel).PublishModelVersion(
            operator_pb2.PublishModelVersionRequest(
                name=name,
                version=version,
                weights_sha256=files.weights_sha256,
                classes=files.classes,
                input_shape=files.input_shape,
                family=prepared.family,
                confidence_threshold=post.confidence if post else 0.0,
                iou_threshold=post.iou if post else 0.0,
                max_detections=post.max_detections if post else 0,
                source_sha256=prepared.source_sha256,
            ),
            metadata=metadata,
        )
        return bool(reply.created)

    return call_coordinator(target, key, call)


def _plan(args: argparse.Namespace, prepared: Prepared) -> VersionPlan:
    batched = prepared.batched and args.max_batch_size > 0
    return plan_version(
        args.name,
        args.version,
        prepared.served,
        classes=prepared.classes,
        max_batch_size=args.max_batch_size if batched else 0,
        instances=args.instances,
        threads=args.threads,
        backend=args.backend,
        # A YOLO version joins the requests that queue up into one batch.
        max_queue_delay_microseconds=0 if prepared.family and batched else None,
        instance_kind="KIND_GPU" if args.device == "gpu" else "KIND_CPU",
        extra_files={DECODING_FILE: prepared.decoding_json()} if prepared.family else None,
    )


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    check_coordinator_arguments(parser, args)
    if args.device == "gpu" and args.backend == "python":
        parser.error(
            "--device gpu needs --backend onnxruntime: the python wrapper runs onnxruntime "
            "on the CPU whatever its instances' kind"
        )
    try:
        prepared = _prepare(parser, args)
        plan = _plan(args, prepared)
        check_version(args.repository, plan)
        if args.triton and not args.skip_triton_check:
            check_on_triton(args.triton, plan)
        files = write_version(args.repository, plan)
    except (ModelRefused, RepositoryError, ValueError, TritonUnreachable) as error:
        print(f"cannot publish: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    post = prepared.post
    published: dict[str, object] = {
        "name": args.name,
        "version": args.version,
        "path": str(files.path),
        "weights_sha256": files.weights_sha256,
        "classes": list(files.classes),
        "input_shape": list(files.input_shape),
    }
    if prepared.family:
        published |= {
            "family": prepared.family,
            "source_sha256": prepared.source_sha256,
            "confidence_threshold": post.confidence if post else 0.0,
            "iou_threshold": post.iou if post else 0.0,
            "max_detections": post.max_detections if post else 0,
        }
    if args.coordinator:
        created = _register(args.coordinator, args.key, args.name, args.version, files, prepared)
        published["registered"] = "created" if created else "already registered"
    print(json.dumps(published, indent=2))


if __name__ == "__main__":
    main()
