"""Client channels between services: default deadlines and retry on UNAVAILABLE.

Retries are safe because every write in Workshop is idempotent by design
(client-chosen ids, lease generations, receipts). Deadlines are added only to
unary calls, so server streams such as WatchRun can stay open.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

DEFAULT_DEADLINE_SECONDS = 10.0


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


class DefaultDeadlineInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Gives every unary call a deadline unless the caller chose one."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        if client_call_details.timeout is None:
            client_call_details = grpc.aio.ClientCallDetails(
                method=client_call_details.method,
                timeout=self._seconds,
                metadata=client_call_details.metadata,
                credentials=client_call_details.credentials,
                wait_for_ready=client_call_details.wait_for_ready,
            )
        return await continuation(client_call_details, request)


def open_channel(
    target: str,
    *,
    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
    max_attempts: int = 5,
) -> grpc.aio.Channel:
    """An insecure aio channel to `target` (host:port) with deadlines and retries.

    In-cluster traffic is plaintext here; terminate TLS in the mesh or ingress.
    """
    options: list[tuple[str, str | int]] = [
        ("grpc.max_receive_message_length", 16 * 1024 * 1024),
        ("grpc.max_send_message_length", 16 * 1024 * 1024),
    ]
    # gRPC rejects a retry policy of fewer than 2 attempts: 1 means "no retries".
    if max_attempts > 1:
        options += [
            ("grpc.enable_retries", 1),
            ("grpc.service_config", retry_service_config(max_attempts)),
        ]
    else:
        options.append(("grpc.enable_retries", 0))
    return grpc.aio.insecure_channel(
        target, options=options, interceptors=[DefaultDeadlineInterceptor(deadline_seconds)]
    )
