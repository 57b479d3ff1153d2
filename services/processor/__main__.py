"""`python -m services.processor [serve | workshop-manifest --device ID | register-runtime ...]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import cast

import grpc

from services.processor.calls import Transport, job_transport
from services.processor.decode import gpu_available
from services.processor.evaluation import evaluation_service
from services.processor.inference import ModelServer, SharedMemoryMode
from services.processor.recordings import RecordingStore
from services.processor.settings import PREFIX, ProcessorSettings
from services.processor.worker import Processor
from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.kit.cli import (
    Metadata,
    add_coordinator_arguments,
    call_coordinator,
    check_coordinator_arguments,
)
from workshop.kit.identity import KeyRefused, check_own_key, has_scope
from workshop.kit.processor_manifest import code_sha256, manifest_for, registration
from workshop.kit.server import serve
from workshop.kit.settings import EXIT_BAD_SETTINGS, settings_or_exit
from workshop.kit.telemetry import configure_logging, configure_tracing
from workshop.kit.tls import client_tls
from workshop.v1 import (
    common_pb2,
    jobs_pb2_grpc,
    operator_pb2_grpc,
    preview_pb2_grpc,
)

LABEL = "processor"


async def run_server(settings: ProcessorSettings) -> None:
    """Health and reflection on the gRPC port, and the claim loop as a worker."""
    credentials = bearer_metadata(settings.key)
    recordings = RecordingStore(
        settings.s3_endpoint,
        settings.s3_access_key,
        settings.s3_secret_key,
        settings.recordings_bucket,
        secure=settings.s3_secure,
    )
    models = ModelServer(
        settings.triton_target,
        settings.model_repository,
        shared_memory=cast(SharedMemoryMode, settings.triton_shared_memory),
    )
    async with (
        open_channel(settings.coordinator_target, tls=client_tls(settings)) as coordinator,
        open_channel(settings.preview_target, tls=client_tls(settings)) as preview,
    ):
        await check_own_key(
            coordinator,
            settings.key,
            variable=f"{PREFIX}_KEY",
            target=settings.coordinator_target,
            requirement=has_scope(common_pb2.SCOPE_WORKSHOP_RUN, device_id=settings.device_id),
        )
        # the transport of the calls about jobs, chosen once (calls.py)
        jobs = job_transport(
            cast(Transport, settings.job_transport), jobs_pb2_grpc.JobServiceStub(coordinator)
        )
        processor = Processor(
            jobs=jobs,
            previews=preview_pb2_grpc.PreviewServiceStub(preview),
            credentials=credentials,
            runtime_id=settings.runtime_id or str(manifest_for(settings.device_id)["runtime_id"]),
            code_sha256=code_sha256(),
            recordings=recordings,
            models=models,
            gpu=gpu_available(),
            in_flight=settings.in_flight,
            claim_wait_seconds=settings.claim_wait_seconds,
            heartbeat_seconds=settings.heartbeat_seconds,
            progress_after_seconds=settings.progress_after_seconds,
            retry_seconds=settings.rpc_retry_seconds,
            direct_writes=settings.direct_writes,
            job_grace_seconds=settings.job_grace_seconds,
        )
        try:
            await serve(
                label=LABEL,
                settings=settings,
                services=[
                    evaluation_service(
                        coordinator, preview, settings.triton_target, settings.model_repository
                    )
                ],
                workers=[processor],
            )
        finally:
            await jobs.close()
            await models.close()
            recordings.close()


def register_runtime(target: str, key: str, device_id: str) -> dict[str, object]:
    """Registers this code on `device_id` (OperatorService.RegisterRuntime); returns its id."""

    async def call(channel: grpc.aio.Channel, metadata: Metadata) -> dict[str, object]:
        reply = await operator_pb2_grpc.OperatorServiceStub(channel).RegisterRuntime(
            registration(device_id), metadata=metadata
        )
        return {
            "runtime_id": reply.runtime.runtime_id,
            "created": reply.created,
            "manifest": json.loads(reply.manifest_json),
        }

    return call_coordinator(target, key, call)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.processor")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("serve", help="run the processor (default)")
    manifest = commands.add_parser(
        "workshop-manifest", help="print the runtime manifest, code_sha256 and runtime id"
    )
    manifest.add_argument("--device", required=True, help="device id, e.g. gpu-box")
    register = commands.add_parser(
        "register-runtime", help="register this code as a runtime of a registered device"
    )
    register.add_argument("--device", required=True, help="registered device id")
    add_coordinator_arguments(register, required=True)
    args = parser.parse_args(argv)
    if args.command == "workshop-manifest":
        print(json.dumps(manifest_for(args.device), indent=2, sort_keys=True))
        return
    if args.command == "register-runtime":
        if not args.coordinator:
            register.error("needs --coordinator and --key (or their environment variables)")
        check_coordinator_arguments(register, args)
        print(json.dumps(register_runtime(args.coordinator, args.key, args.device), indent=2))
        return
    settings = settings_or_exit(ProcessorSettings, PREFIX, os.environ)
    configure_logging(LABEL, settings.log_level)
    configure_tracing(LABEL)
    try:
        asyncio.run(run_server(settings))
    except KeyRefused as error:
        print(f"{LABEL}: cannot start: {error}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_SETTINGS) from None
    except OSError as error:
        print(f"{LABEL}: cannot start: {error}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
