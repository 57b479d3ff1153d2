"""`python -m tools.model_repository publish ...`: publish a model version and register it.

Writes `<repository>/<name>/<version>/` (weights, class list, weight pin, the python-backend
wrapper unless `--backend onnxruntime`) and the model's `config.pbtxt`, then, given a
coordinator and an admin key, registers the version, its weights SHA-256, classes and input
shape (OperatorService.PublishModelVersion), so runs can pin it. Republishing identical weights
is a no-op on both sides; other weights under a published version are refused by both.
Prints the published version as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import grpc

from tools.model_repository.detector import CLASSES, build_detector
from tools.model_repository.repository import ModelFiles, RepositoryError, publish_version
from workshop.kit.cli import (
    Metadata,
    add_coordinator_arguments,
    call_coordinator,
    check_coordinator_arguments,
)
from workshop.v1 import operator_pb2, operator_pb2_grpc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.model_repository")
    commands = parser.add_subparsers(dest="command", required=True)
    publish = commands.add_parser("publish", help="publish a model version")
    publish.add_argument("--repository", type=Path, required=True, help="Triton model repository")
    publish.add_argument("--name", required=True, help="model name, as Triton serves it")
    publish.add_argument("--version", type=int, required=True, help="version number, >= 1")
    weights = publish.add_mutually_exclusive_group(required=True)
    weights.add_argument("--onnx", type=Path, help="ONNX file following the output contract")
    weights.add_argument(
        "--demo-detector",
        action="store_true",
        help=f"build the demo colour-blob detector (classes {','.join(CLASSES)})",
    )
    publish.add_argument("--height", type=int, default=360, help="demo detector input height")
    publish.add_argument("--width", type=int, default=640, help="demo detector input width")
    publish.add_argument(
        "--classes", help="comma-separated class names in class-index order (with --onnx)"
    )
    publish.add_argument(
        "--backend",
        choices=("python", "onnxruntime"),
        default="python",
        help="python: a wrapper running the ONNX with onnxruntime (the bundled Triton); "
        "onnxruntime: platform onnxruntime_onnx (a production Triton)",
    )
    publish.add_argument("--max-batch-size", type=int, default=8)
    publish.add_argument("--instances", type=int, default=2, help="model instances")
    publish.add_argument("--threads", type=int, default=1, help="inference threads per instance")
    add_coordinator_arguments(publish, required=False)
    return parser


def _weights_and_classes(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[bytes, list[str]]:
    if args.demo_detector:
        if args.classes:
            parser.error("--classes goes with --onnx; the demo detector has its own")
        return build_detector(args.height, args.width), list(CLASSES)
    if not args.classes:
        parser.error("--onnx needs --classes")
    try:
        return args.onnx.read_bytes(), [c.strip() for c in args.classes.split(",")]
    except OSError as error:
        parser.error(f"cannot read {args.onnx}: {error.strerror}")


def _register(target: str, key: str, name: str, version: int, files: ModelFiles) -> bool:
    async def call(channel: grpc.aio.Channel, metadata: Metadata) -> bool:
        reply = await operator_pb2_grpc.OperatorServiceStub(channel).PublishModelVersion(
            operator_pb2.PublishModelVersionRequest(
                name=name,
                version=version,
                weights_sha256=files.weights_sha256,
                classes=files.classes,
                input_shape=files.input_shape,
            ),
            metadata=metadata,
        )
        return bool(reply.created)

    return call_coordinator(target, key, call)


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    check_coordinator_arguments(parser, args)
    onnx_bytes, classes = _weights_and_classes(parser, args)
    try:
        files = publish_version(
            args.repository,
            args.name,
            args.version,
            onnx_bytes,
            classes=classes,
            max_batch_size=args.max_batch_size,
            instances=args.instances,
            threads=args.threads,
            backend=args.backend,
        )
    except (RepositoryError, ValueError) as error:
        print(f"cannot publish: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    published: dict[str, object] = {
        "name": args.name,
        "version": args.version,
        "path": str(files.path),
        "weights_sha256": files.weights_sha256,
        "classes": list(files.classes),
        "input_shape": list(files.input_shape),
    }
    if args.coordinator:
        created = _register(args.coordinator, args.key, args.name, args.version, files)
        published["registered"] = "created" if created else "already registered"
    print(json.dumps(published, indent=2))


if __name__ == "__main__":
    main()
