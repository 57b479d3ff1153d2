"""`workshop models evaluate`'s pass over a bucket: its speed through Triton, its memory at
100,000 items.

    .venv/bin/python -m bench.model_evaluate [--items 2000] [--memory-items 100000]
        [--workers 4] [--check]

Speed: the evaluation's own pass (`workshop.kit.evaluation.run_over`: the YOLO
export read as a stream of 1 MiB chunks, each JPEG decoded and resized with PyAV as the
processor prepares a frame, Triton, the boxes kept in arrays, then pycocotools) over
`--items` items of a synthetic bucket: 640x360 JPEGs of 64 frames of the demo's scenes
(`tools.demo.scenes`, PyAV's mjpeg, about 6 KB) with their scenes' boxes as the truth,
generated as the export's tar stream in this process (no coordinator or preview service:
the export's own speed is `bench.export`'s), through the bundled Triton serving the demo
detector (640x360 uint8 frames, max batch 8, two instances of one onnxruntime thread, as
`bench.processor_throughput` serves it), `--workers` requests in flight (`--batch` images
each, default 1). Two passes: the version alone (`items_per_s`), then the version and a
baseline (the same detector as version 2) side by side, each image decoded once and sent
to both (`side_by_side_items_per_s`). Scoring's seconds are printed apart.

Memory: a child process (so its peak is its own) runs the same pass over
`--memory-items` items of 64x48 JPEGs against a stand-in for Triton that answers ten boxes
an image (none of the transfer is measured there, only what the evaluation keeps), then
scores them with pycocotools; reported: its peak resident set (VmHWM) less its resident set
after the imports, the arrays' bytes, and the scoring's seconds.

The last line is `RESULT items_per_s=... side_by_side_items_per_s=...
cpu_bound_items_per_s=... peak_rss_mb=... rss_growth_mb=... memory_items=...
others_cores=...`; `others_cores` is the most cores other processes of the machine kept busy
during a speed pass; `cpu_bound_items_per_s` the rate the machine's cores would give at the
CPU an item of this process and Triton together (one version), which other work disturbs
much less than wall time. `--check`: exit 1 below 200 items/s or above
1,000 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import tritonclient.grpc as triton

from bench.proc_stats import CpuMeter, busy_cores_s, status_kb
from bench.results import result_line
from testbed.harness.preview import jpeg_bytes
from testbed.yolo_exports import export_chunks, scene_items
from tools.localstack.triton import running_triton
from tools.model_repository.detector import CLASSES, build_detector
from tools.model_repository.repository import publish_version
from workshop.kit.evaluation import (
    BATCH,
    BYTES_PER_BOX,
    Evaluation,
    ServedModel,
    run_over,
    served_model,
)
from workshop.kit.model_io import CONTRACT_OUTPUTS, STRETCH_INPUT
from workshop.kit.shared_memory import is_loopback

LABELS = b"0 0.25 0.5 0.2 0.4\n1 0.7 0.5 0.3 0.3\n"
ITEMS_PER_S_TARGET = 200.0
PEAK_MB_TARGET = 1000.0


def say(line: str = "") -> None:
    print(line, flush=True)


def timed_scores(evaluation: Evaluation) -> tuple[float, list[dict[str, Any]]]:
    began = time.perf_counter()
    reports = [evaluation.report(n) for n in range(len(evaluation.models))]
    return time.perf_counter() - began, reports


# --- memory: the child ------------------------------------------------------------------


class _StandIn:
    """Answers ten boxes an image, of the three classes, as Triton's contract does."""

    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        xy = rng.uniform(0, 40, (1, 100, 2)).astype(np.float32)
        self._outputs = {
            CONTRACT_OUTPUTS[0]: np.array([[10]], np.int32),
            CONTRACT_OUTPUTS[1]: np.concatenate([xy, xy + 20], axis=2),
            CONTRACT_OUTPUTS[2]: rng.uniform(0.3, 1.0, (1, 100)).astype(np.float32),
            CONTRACT_OUTPUTS[3]: (np.arange(100) % 3).reshape(1, 100).astype(np.int32),
        }

    def infer(self, *_: Any, **__: Any) -> _StandIn:
        return self

    def as_numpy(self, name: str) -> Any:
        return self._outputs[name]

    def close(self) -> None:
        pass


def memory_child(items: int, workers: int) -> None:
    before_kb = status_kb(os.getpid(), "VmRSS")
    images = [(jpeg_bytes(64, 48, seed=n), LABELS) for n in range(64)]
    model = ServedModel("stand-in", 1, CLASSES, STRETCH_INPUT, 48, 64, False)
    began = time.perf_counter()
    evaluation = run_over(
        export_chunks(items, images),
        _StandIn,
        [model],
        workers=workers,
    )
    passed = time.perf_counter() - began
    kept = evaluation.truth.nbytes + sum(f.nbytes for f in evaluation.found)
    boxes = evaluation.truth.count + sum(f.count for f in evaluation.found)
    scoring_s, reports = timed_scores(evaluation)
    peak_kb = status_kb(os.getpid(), "VmHWM")
    print(
        json.dumps(
            {
                "items": evaluation.items,
                "boxes": boxes,
                "kept_mb": kept / 2**20,
                "pass_s": passed,
                "scoring_s": scoring_s,
                "rss_before_mb": before_kb / 1024,
                "peak_mb": peak_kb / 1024,
                "growth_mb": (peak_kb - before_kb) / 1024,
                "ap50": reports[0]["ap50"],
            }
        )
    )


# --- speed --------------------------------------------------------------------------------


def speed(items: int, workers: int, batch: int) -> dict[str, float]:
    images = scene_items(64)
    say(f"images: 64 scenes, {sum(len(j) for j, _ in images) // 64:,} bytes of JPEG each")
    weights = build_detector(360, 640)
    with tempfile.TemporaryDirectory(prefix="bench-evaluate-") as scratch:
        (Path(scratch) / "triton").mkdir()
        with running_triton(Path(scratch) / "triton") as server:
            for version in (1, 2):
                publish_version(
                    server.model_repository,
                    "detector",
                    version,
                    weights,
                    classes=CLASSES,
                    max_batch_size=8,
                    instances=2,
                )
            client = triton.InferenceServerClient(server.grpc_url)
            try:
                models = [served_model(client, "detector", v, CLASSES) for v in (1, 2)]
            finally:
                client.close()
            meter = CpuMeter({"triton": server.pid})
            figures: dict[str, float] = {}
            others = []

            def connect() -> triton.InferenceServerClient:
                return triton.InferenceServerClient(server.grpc_url)

            run_over(export_chunks(32, images), connect, models[:1], workers=workers)  # warm
            for label, chosen in (("alone", models[:1]), ("side_by_side", models)):
                cpu, busy = meter.mark(), busy_cores_s()
                evaluation = run_over(
                    export_chunks(items, images),
                    connect,
                    chosen,
                    workers=workers,
                    batch=batch,
                    shared_memory=is_loopback(server.grpc_url),  # as evaluation_plan decides
                )
                cpu_after, busy_after = meter.mark(), busy_cores_s()
                ours = sum(cpu_after[k] - cpu[k] for k in cpu)
                busy_elsewhere = max(0.0, busy_after - busy - ours) / evaluation.seconds
                others.append(busy_elsewhere)
                scoring_s, _ = timed_scores(evaluation)
                rate = evaluation.items / evaluation.seconds
                cpu_ms = ours / evaluation.items * 1000
                figures[f"{label}_cpu_bound"] = (os.cpu_count() or 1) * 1000 / cpu_ms
                say(
                    f"{label}: {evaluation.items} items through {len(chosen)} version(s) in "
                    f"{evaluation.seconds:.2f} s: {rate:.1f} items/s "
                    f"(CPU s: this process {cpu_after['bench'] - cpu['bench']:.2f}, "
                    f"Triton {cpu_after['triton'] - cpu['triton']:.2f}; "
                    f"{busy_elsewhere:.2f} cores busy elsewhere); scoring {scoring_s:.2f} s"
                )
                say(
                    f"  {cpu_ms:.2f} ms CPU an item: CPU-bound "
                    f"{figures[f'{label}_cpu_bound']:.1f} items/s on {os.cpu_count()} cores"
                )
                figures[label] = rate
            figures["others_cores"] = max(others)
    return figures


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # so that Triton and the temporary folder are cleaned up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.model_evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--items", type=int, default=2000, help="items of the speed passes")
    parser.add_argument("--memory-items", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=4, help="batches in flight")
    parser.add_argument("--batch", type=int, default=BATCH, help="images in a request")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.memory_child:
        memory_child(args.memory_items, args.workers)
        return 0
    say(f"machine: {os.cpu_count()} cores; {BYTES_PER_BOX} bytes kept a box")
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.model_evaluate",
            "--memory-child",
            f"--memory-items={args.memory_items}",
            f"--workers={args.workers}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    memory = json.loads(child.stdout.strip().splitlines()[-1])
    say(
        f"memory: {memory['items']:,} items, {memory['boxes']:,} boxes kept "
        f"({memory['kept_mb']:.1f} MB of arrays); pass {memory['pass_s']:.1f} s "
        f"({memory['items'] / memory['pass_s']:.0f} items/s with a stand-in for Triton), "
        f"scoring {memory['scoring_s']:.1f} s; RSS {memory['rss_before_mb']:.1f} MB after "
        f"the imports, peak {memory['peak_mb']:.1f} MB: growth {memory['growth_mb']:.1f} MB"
    )
    figures = speed(args.items, args.workers, args.batch)
    say(
        result_line(
            {
                "items_per_s": f"{figures['alone']:.1f}",
                "side_by_side_items_per_s": f"{figures['side_by_side']:.1f}",
                "cpu_bound_items_per_s": f"{figures['alone_cpu_bound']:.1f}",
                "peak_rss_mb": f"{memory['peak_mb']:.1f}",
                "rss_growth_mb": f"{memory['growth_mb']:.1f}",
                "memory_items": str(memory["items"]),
                "others_cores": f"{figures['others_cores']:.2f}",
            }
        )
    )
    if args.check and (figures["alone"] < ITEMS_PER_S_TARGET or memory["peak_mb"] > PEAK_MB_TARGET):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
