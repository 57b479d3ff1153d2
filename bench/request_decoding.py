"""What the kit's request decoding costs over protobuf's own parse.

Every handler's deserializer is wrapped by `workshop.kit.requests.request_decoder`:
besides parsing it checks the raw size limit and walks the fields below which an
enum number outside its enum, an out-of-range Timestamp or a NUL in a string can
occur. This measures, per request, the plain `FromString` (the baseline, what grpc
would call without the kit) against the kit's decoder, for three requests:

- a CreateRun (small: no enums below a string or two);
- a Claim answer's opposite, a Heartbeat (small, a nested LeaseRef);
- a Complete of a 10,000-slot job (the largest request a processor sends: an enum,
  a Timestamp and boxes in every slot).

Pure CPU in this process, no servers: `.venv/bin/python -m bench.request_decoding`
(about 10 s). Last line: `RESULT create_run_overhead_us=... heartbeat_overhead_us=...
complete_10k_overhead_ms=... complete_10k_ratio=...` where a ratio is the kit's time
over the baseline's.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from workshop.kit.requests import request_decoder
from workshop.v1 import common_pb2, jobs_pb2, workshop_pb2

SLOTS = 10_000


def create_run() -> workshop_pb2.CreateRunRequest:
    return workshop_pb2.CreateRunRequest(
        run_id="run-2026-12-01-a",
        workflow_id="yard-watch",
        runtime_id="workshop-" + "0" * 32,
        revision=3,
        mode=common_pb2.RUN_MODE_TEST,
        image_limit=20,
    )


def lease() -> common_pb2.LeaseRef:
    return common_pb2.LeaseRef(run_id="run-a", job_id="7", generation=2, token=str(uuid.uuid4()))


def heartbeat() -> jobs_pb2.HeartbeatRequest:
    return jobs_pb2.HeartbeatRequest(lease=lease())


def complete(slots: int) -> jobs_pb2.CompleteRequest:
    result = jobs_pb2.JobResult()
    for index in range(slots):
        slot = result.slots.add(slot_index=index, outcome=common_pb2.SLOT_OUTCOME_FRAME)
        slot.frame_time.FromSeconds(1_764_576_000 + index * 3)
        for name in ("person", "vehicle"):
            slot.boxes.add(class_name=name, score=0.9, x=10, y=20, w=30, h=40)
        slot.outputs.add(step_id="save").boxes.add(class_name="person", score=0.9, w=30, h=40)
        slot.upload_key = f"previews/run-a/7/2/{index}.jpg"
        slot.upload_sha256 = "0" * 64
    return jobs_pb2.CompleteRequest(
        lease=lease(), code_sha256="0" * 64, result=result, result_sha256="0" * 64
    )


def per_call_seconds(call: Callable[[], Any], budget_seconds: float) -> float:
    """The best of five rounds of as many calls as fit in a fifth of the budget."""
    began = time.perf_counter()
    call()
    once = max(time.perf_counter() - began, 1e-7)
    count = max(1, int(budget_seconds / 5 / once))
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(count):
            call()
        best = min(best, (time.perf_counter() - began) / count)
    return best


def measure(request: Message, budget_seconds: float) -> tuple[float, float]:
    """(baseline, kit) seconds per decode of `request`'s bytes."""
    data = request.SerializeToString()
    parse = type(request).FromString
    decode = request_decoder(parse, max_bytes=None, type_name=type(request).__name__)
    assert not hasattr(decode(data), "error"), "the benchmark's request must be accepted"
    return (
        per_call_seconds(lambda: parse(data), budget_seconds),
        per_call_seconds(lambda: decode(data), budget_seconds),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per request")
    args = parser.parse_args()
    cases = {
        "create_run": create_run(),
        "heartbeat": heartbeat(),
        "complete_10k": complete(SLOTS),
    }
    print(
        f"{'request':<14} {'bytes':>9} {'protobuf':>12} {'kit':>12} {'overhead':>12} {'ratio':>6}"
    )
    figures: dict[str, tuple[float, float]] = {}
    for name, request in cases.items():
        baseline, kit = measure(request, args.seconds)
        figures[name] = (baseline, kit)
        print(
            f"{name:<14} {request.ByteSize():>9} {baseline * 1e6:>10.1f}us {kit * 1e6:>10.1f}us "
            f"{(kit - baseline) * 1e6:>10.1f}us {kit / baseline:>6.2f}"
        )
    big_base, big_kit = figures["complete_10k"]
    print(
        "RESULT "
        f"create_run_overhead_us={(figures['create_run'][1] - figures['create_run'][0]) * 1e6:.1f} "
        f"heartbeat_overhead_us={(figures['heartbeat'][1] - figures['heartbeat'][0]) * 1e6:.1f} "
        f"complete_10k_overhead_ms={(big_kit - big_base) * 1e3:.1f} "
        f"complete_10k_ratio={big_kit / big_base:.2f}"
    )


if __name__ == "__main__":
    main()
