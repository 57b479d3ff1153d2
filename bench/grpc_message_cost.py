"""What one message costs a Workshop gRPC server at a control plane's message rates.

    .venv/bin/python -m bench.grpc_message_cost [--seconds 8] [--rates 1,5,20,100]

A processor sends the coordinator a few messages a second (a record batch every 1.4 s, a
Complete per job) and the preview service one grant per job, so what matters is the
server's CPU per message at 1-20 messages a second, not at its peak. This starts a bare
echo server as its own process (grpc.aio on uvloop with the services' channel arguments,
`workshop.kit.server.server_options`; no interceptor, no handler work) and, for each rate
of `--rates`, sends it messages of 1 KB at that rate for `--seconds`: unary calls, then
messages on one open bidirectional stream (the processor's session). It reads the
server's CPU from /proc/<pid>/task/*/schedstat (nanoseconds, by thread: `main` is the
event loop, `event_engine` gRPC's thread pool) and prints it per message.

Two sides, alternated per rate in one run: gRPC's defaults, as the coordinator and the
preview service run, and the alternative (GRPC_EXPERIMENTS=-event_engine_listener: the
server's connections on gRPC core's own poller instead of the EventEngine's thread pool,
whose idle workers wake again and again after each message), the one runtime setting
found to move these figures (docs/scaling.md says why the services keep the default).

The last line is `RESULT unary_ms_1hz=<x> stream_ms_1hz=<y> stream_ms_20hz=<z>
stream_ms_100hz=<w> alternative_stream_ms_1hz=<a> alternative_stream_ms_100hz=<b>`: the
server's CPU ms per message (rates missing from `--rates` are left out). No target: it
explains the per-message part of `bench.processor_throughput`'s control plane
(docs/scaling.md, "Per message: the gRPC runtime").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence

import grpc
import uvloop

from bench.proc_stats import delta, thread_cpu
from workshop.kit.server import server_options

SERVICE = "bench.Echo"
PAYLOAD = b"x" * 1024
EXPERIMENTS = "GRPC_EXPERIMENTS"  # gRPC core reads it once, when grpc is imported
SIDES = {"default": "", "alternative": "-event_engine_listener"}
RESULT_FIGURES = (("unary", 1), ("stream", 1), ("stream", 20), ("stream", 100))


def serve() -> None:
    """The echo server (run as `--serve`; the parent sets its GRPC_EXPERIMENTS)."""

    async def unary(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    async def stream(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    async def run() -> None:
        server = grpc.aio.server(options=server_options())
        handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.stream_stream_rpc_method_handler(stream),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    uvloop.run(run())


class Server:
    def __init__(self, experiments: str) -> None:
        env = {**os.environ, EXPERIMENTS: experiments}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.grpc_message_cost", "--serve"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


async def measure(server: Server, kind: str, rate: float, seconds: float) -> tuple[float, str]:
    """Server CPU ms per message at `rate` messages a second; and its split by thread."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            f"/{SERVICE}/Unary"
        )
        call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(
            f"/{SERVICE}/Stream"
        )()

        async def once() -> None:
            if kind == "unary":
                await unary(PAYLOAD)
            else:
                await call.write(PAYLOAD)
                await call.read()

        await once()  # the connection and the stream are up before the clock starts
        await asyncio.sleep(1.0)
        before = thread_cpu(server.process.pid)
        start = time.monotonic()
        sent = 0
        while time.monotonic() - start < seconds:
            await once()
            sent += 1
            await asyncio.sleep(max(0.0, start + sent / rate - time.monotonic()))
        spent = {
            name: cpu_s * 1000 / sent
            for name, cpu_s in delta(thread_cpu(server.process.pid), before).items()
        }
        await call.done_writing()
    split = ", ".join(
        f"{name} {ms:.2f}" for name, ms in sorted(spent.items(), key=lambda i: -i[1]) if ms >= 0.01
    )
    return sum(spent.values()), split


async def run(rates: Sequence[float], seconds: float) -> dict[str, float]:
    servers = {side: Server(experiments) for side, experiments in SIDES.items()}
    figures: dict[str, float] = {}
    try:
        print(f"{'side':11} {'kind':6} {'msgs/s':>7} {'ms/msg':>7}  by thread (ms per message)")
        for rate in rates:
            for kind in ("unary", "stream"):
                for side, server in servers.items():
                    ms, split = await measure(server, kind, rate, seconds)
                    print(f"{side:11} {kind:6} {rate:7g} {ms:7.2f}  {split}", flush=True)
                    figures[f"{side}_{kind}_{rate:g}"] = ms
    finally:
        for server in servers.values():
            server.stop()
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.grpc_message_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per rate and side")
    parser.add_argument("--rates", default="1,5,20,100", help="messages a second, comma-separated")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return 0
    rates = [float(rate) for rate in args.rates.split(",")]
    print(
        f"server: grpc.aio {grpc.__version__} on uvloop, {os.cpu_count()} cores; "
        f"alternative: {EXPERIMENTS}={SIDES['alternative']}"
    )
    figures = asyncio.run(run(rates, args.seconds))
    named = [("default", "", kind, rate) for kind, rate in RESULT_FIGURES] + [
        ("alternative", "alternative_", "stream", rate) for rate in (1, 100)
    ]
    result = {
        f"{prefix}{kind}_ms_{rate}hz": figures[f"{side}_{kind}_{rate}"]
        for side, prefix, kind, rate in named
        if f"{side}_{kind}_{rate}" in figures
    }
    print("RESULT " + " ".join(f"{name}={value:.2f}" for name, value in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
