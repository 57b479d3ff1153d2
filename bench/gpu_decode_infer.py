"""NVDEC decoding with DALI and Triton inference on a GPU: frames/s of each and end to end.

    .venv/bin/python -m bench.gpu_decode_infer [--recordings 10] [--seconds 60] [--interval 0.5]
        [--triton HOST:PORT --repository PATH] [--in-flight 3]

Runs only where DALI sees a CUDA device. Elsewhere it prints one line starting with
`SKIP` and exits with status 0 (nothing failed, there was nothing to measure) without a
RESULT line.

Recordings: the H.264 scenes of `bench.processor_throughput` (640x360, 10 fps, same cache).
Measured, each over every recording's sampled frames (one every `--interval` seconds):
- **decode**: the processor's own `DaliDecoder("gpu")`: NVDEC through
  `fn.decoders.video(device="mixed")`, `fn.resize` on the GPU when the size differs, and
  the copy to host memory the processor makes; one recording after another. Also every
  frame of the first recording (`nvdec_all_fps`), NVDEC's own pace.
- **infer**: `ModelServer.infer` on those frames (already decoded, in host memory),
  batches spread over the model's instances. With `--triton` and `--repository` (a GPU
  build of Triton, e.g. NGC's `tritonserver` image, whose repository this host can write)
  the demo detector is published for its onnxruntime backend with `KIND_GPU` instances.
  Without them the bundled Triton serves it with the python backend, whose onnxruntime
  runs on the CPU: the output says so, and that figure is not GPU inference.
- **end to end**: `--in-flight` recordings at once as the processor runs them (decode a
  chunk on a thread, then one model pass at a time), without previews or uploads.

Last line: `RESULT decode_fps=<x> nvdec_all_fps=<y> infer_fps=<z> end_to_end_fps=<w>`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import tritonclient.grpc as triton_client

from bench.footage import DEFAULT_CACHE, Recording, cached_recordings, sampled_frames
from services.processor.decode import DaliDecoder, Frames, gpu_available, probe
from services.processor.inference import ModelServer, Pin, Served
from tools.localstack.triton import TritonServer, TritonStartError, running_triton
from tools.model_repository.detector import CLASSES, build_detector, weights_sha256
from tools.model_repository.repository import publish_version

HEIGHT, WIDTH = 360, 640
MODEL = "detector_gpu"
MAX_BATCH = 16  # batching pays on a GPU
GPU_INSTANCES = 2
T = TypeVar("T")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_decode_infer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--recordings", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument(
        "--interval", type=float, default=0.5, help="sampling interval, seconds (0.5 = 2 fps)"
    )
    parser.add_argument("--in-flight", type=int, default=3)
    parser.add_argument("--triton", help="a GPU Triton's gRPC address (default: bundled)")
    parser.add_argument("--repository", type=Path, help="that Triton's model repository")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    if (args.triton is None) != (args.repository is None):
        parser.error("--triton and --repository go together")
    if not gpu_available():
        print("SKIP gpu_decode_infer: DALI sees no CUDA device on this machine", flush=True)
        return 0
    recordings = cached_recordings(args.cache_dir, args.recordings, args.seconds, "h264")
    wanted = sampled_frames(recordings, args.seconds, args.interval)
    frames = sum(len(indices) for indices in wanted)
    decoder = DaliDecoder("gpu")
    decoder.decode(recordings[0].path, wanted[0][:2], out_height=HEIGHT, out_width=WIDTH)
    decoded, decode_s = _timed(lambda: _decode_all(decoder, recordings, wanted))
    say(f"decode (NVDEC, to host): {frames} frames in {decode_s:.2f} s, {frames / decode_s:.1f}/s")
    every = list(range(probe(recordings[0].path).frame_count))
    _, all_s = _timed(
        lambda: decoder.decode(recordings[0].path, every, out_height=HEIGHT, out_width=WIDTH)
    )
    say(f"decode every frame of one recording: {len(every)} in {all_s:.2f} s")
    try:
        with _triton(args) as (server, repository, on_gpu):
            infer_fps, end_fps = asyncio.run(
                _inference(server, repository, on_gpu, decoder, recordings, wanted, decoded, args)
            )
    except TritonStartError as problem:
        say(f"cannot start Triton: {problem}")
        return 2
    say(
        f"RESULT decode_fps={frames / decode_s:.1f} nvdec_all_fps={len(every) / all_s:.1f} "
        f"infer_fps={infer_fps:.1f} end_to_end_fps={end_fps:.1f}"
    )
    return 0


def say(line: str) -> None:
    print(line, flush=True)


def _timed(work: Callable[[], T]) -> tuple[T, float]:
    began = time.perf_counter()
    result = work()
    return result, time.perf_counter() - began


def _decode_all(
    decoder: DaliDecoder, recordings: list[Recording], wanted: list[list[int]]
) -> list[Frames]:
    return [
        decoder.decode(recording.path, indices, out_height=HEIGHT, out_width=WIDTH)
        for recording, indices in zip(recordings, wanted, strict=True)
    ]


@contextlib.contextmanager
def _triton(args: argparse.Namespace) -> Iterator[tuple[str, Path, bool]]:
    """(gRPC address, repository, whether inference runs on the GPU)."""
    if args.triton is not None:
        yield args.triton, args.repository, True
        return
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as folder:
        server: TritonServer
        with running_triton(Path(folder)) as server:
            say("triton: the bundled server; its python backend runs onnxruntime on the CPU")
            yield server.grpc_url, server.model_repository, False


async def _inference(
    url: str,
    repository: Path,
    on_gpu: bool,
    decoder: DaliDecoder,
    recordings: list[Recording],
    wanted: list[list[int]],
    decoded: list[Frames],
    args: argparse.Namespace,
) -> tuple[float, float]:
    weights = build_detector(HEIGHT, WIDTH)
    publish_version(
        repository,
        MODEL,
        1,
        weights,
        classes=CLASSES,
        max_batch_size=MAX_BATCH if on_gpu else 8,
        instances=GPU_INSTANCES if on_gpu else 2,
        backend="onnxruntime" if on_gpu else "python",
        instance_kind="KIND_GPU" if on_gpu else "KIND_CPU",
    )
    loader = triton_client.InferenceServerClient(url)
    try:
        loader.load_model(MODEL)
    finally:
        loader.close()
    models = ModelServer(url, repository)
    try:
        served = await models.ensure(Pin(MODEL, 1, weights_sha256(weights)))
        batches = decoded
        await models.infer(served, batches[0][:MAX_BATCH])
        began = time.perf_counter()
        for frames in batches:
            await models.infer(served, frames)
        infer_s = time.perf_counter() - began
        total = sum(len(frames) for frames in batches)
        where = "GPU" if on_gpu else "CPU (bundled Triton)"
        say(
            f"infer ({where}, {served.transport}, {served.instances} instances): "
            f"{total} frames in {infer_s:.2f} s, {total / infer_s:.1f}/s"
        )
        began = time.perf_counter()
        await _end_to_end(models, served, decoder, recordings, wanted, args.in_flight)
        end_s = time.perf_counter() - began
        say(f"end to end ({args.in_flight} in flight): {total} frames in {end_s:.2f} s")
        return total / infer_s, total / end_s
    finally:
        await models.close()


async def _end_to_end(
    models: ModelServer,
    served: Served,
    decoder: DaliDecoder,
    recordings: list[Recording],
    wanted: list[list[int]],
    in_flight: int,
) -> None:
    """Like the processor's jobs: chunks decoded on a thread, one model pass at a time."""
    turn = asyncio.Lock()
    slots = asyncio.Semaphore(in_flight)

    async def job(recording: Recording, indices: list[int]) -> None:
        async with slots:
            chunks = decoder.chunks(recording.path, indices, out_height=HEIGHT, out_width=WIDTH)
            while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
                async with turn:
                    found = await models.infer(served, np.asarray(chunk))
                if len(found) != len(chunk):
                    raise AssertionError("a frame went missing")

    await asyncio.gather(*(job(r, i) for r, i in zip(recordings, wanted, strict=True)))


if __name__ == "__main__":
    sys.exit(main())
