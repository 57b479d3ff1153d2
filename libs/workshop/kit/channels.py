"""Client channels between services: default deadlines and retry on UNAVAILABLE.

Retries are safe because every write in Workshop is idempotent by design
(client-chosen ids, lease generations, receipts; JobService.Claim through its
request_id, which answers the lease an earlier Claim with that id took instead of
leasing another job). Deadlines are added only to
unary calls, so server streams such as WatchRun can stay open.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import grpc

from workshop.kit.tls import ClientTls

DEFAULT_DEADLINE_SECONDS = 10.0
# gRPC's reconnect backoff grows to 120 s by default: a client whose server was down for a
# minute could wait that long after it is back. Callers retry on their own schedule
# (the processor for up to a minute), so reconnect attempts stay at most 5 s apart.
MAX_RECONNECT_BACKOFF_MS = 5_000
# A connection that goes silent without an RST (a firewall that forgot the flow, a peer
# host gone) is otherwise kept for as long as TCP retransmits, many minutes, every call on
# it ending at its deadline. While calls are open the channel pings after this long
# without hearing from the server, and drops the connection when the ping is not answered
# in KEEPALIVE_TIMEOUT_MS: the call fails UNAVAILABLE and is retried on a new connection
# (docs/reliability.md#network-faults). Servers accept pings this often (kit.server).
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000


def retry_service_config(max_attempts: int = 5) -> str:
    """A gRPC service config that retries every method on UNAVAILABLE with backoff."""
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": [{}],
                    "retryPolicy": {
                        "maxAttempts": max_attempts,
                        "initialBackoff": "0.1s",
                        "maxBackoff": "2s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ]
        }
    )


class _DefaultDeadline(grpc.aio.UnaryUnaryMultiCallable[Any, Any]):
    """A unary-unary method that sends the channel's default deadline unless the caller
    chose one. A plain wrapper costs about a microsecond a call; the same rule as a
    grpc.aio client interceptor cost 30-50 us of client CPU a call (measured on an echo
    service), because every intercepted call builds its own call objects and tasks."""

    def __init__(self, inner: grpc.aio.UnaryUnaryMultiCallable[Any, Any], seconds: float) -> None:
        self._inner = inner
        self._seconds = seconds

    def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        return self._inner(
            request,
            timeout=self._seconds if timeout is None else timeout,
            metadata=metadata,
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )


class DeadlineChannel(grpc.aio.Channel):
    """A grpc.aio channel whose unary-unary methods have a default deadline; streams
    (WatchRun, health Watch) keep theirs open. Everything else is the inner channel's."""

    def __init__(self, inner: grpc.aio.Channel, deadline_seconds: float) -> None:
        self._inner = inner
        self._seconds = deadline_seconds

    async def __aenter__(self) -> DeadlineChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._inner.close(None)

    async def close(self, grace: float | None = None) -> None:
        await self._inner.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._inner.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._inner.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._inner.channel_ready()

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _DefaultDeadline(self._inner.unary_unary(*args, **kwargs), self._seconds)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.unary_stream(*args, **kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.stream_unary(*args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.stream_stream(*args, **kwargs)


def open_channel(
    target: str,
    *,
    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
    max_attempts: int = 5,
    tls: ClientTls | None = None,
    interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
) -> grpc.aio.Channel:
    """An aio channel to `target` (host:port) with deadlines and retries: plaintext, or
    TLS when `tls` says which CA signs the server (workshop.kit.tls); and `interceptors`
    (the gateway's tracing: workshop.kit.telemetry.client_interceptors).
    """
    options: list[tuple[str, str | int]] = [
        ("grpc.max_receive_message_length", 16 * 1024 * 1024),
        ("grpc.max_send_message_length", 16 * 1024 * 1024),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 0),  # an idle channel sends nothing
        ("grpc.http2.max_pings_without_data", 0),  # a silent long poll is pinged throughout
    ]
    # gRPC rejects a retry policy of fewer than 2 attempts: 1 means "no retries".
    if max_attempts > 1:
        options += [
            ("grpc.enable_retries", 1),
            ("grpc.service_config", retry_service_config(max_attempts)),
        ]
    else:
        options.append(("grpc.enable_retries", 0))
    intercepted = list(interceptors) or None
    channel = (
        grpc.aio.insecure_channel(target, options=options, interceptors=intercepted)
        if tls is None
        else grpc.aio.secure_channel(
            target, tls.credentials(), options=options, interceptors=intercepted
        )
    )
    return DeadlineChannel(channel, deadline_seconds)
