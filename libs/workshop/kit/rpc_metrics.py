"""The server interceptor that counts and times every RPC (docs/metrics.md).

Outermost of the kit's interceptors, it sees each call's final answer: OK when the
handler returned, else the status the error mapper aborted with, and that error's
ErrorInfo reason (`workshop.kit.interceptors.refusal_reason`). Health and reflection
are left out: probes are noise. Like the error mapper, a method's handler is wrapped
once and reused, and its labelled series are looked up once per method, not per call.

A stream that answers calls of its own (JobService.Session: each message a job call) counts
each of them with `observe_call`, in the same series as the stream itself under the method
it names (`workshop.v1.JobService/Session/Complete`), with the serving process's label of
the stream's call.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import Counter, Histogram

from workshop.kit.interceptors import HandlerWrappingInterceptor, refusal_reason
from workshop.kit.metrics import RPC_DURATION, RPC_REFUSALS, RPC_REQUESTS

_INFRASTRUCTURE = ("/grpc.health.", "/grpc.reflection.")
# The serving process's label of the call being measured, for `observe_call` (set in the
# call's own context, which the tasks it starts copy).
_serving: contextvars.ContextVar[str] = contextvars.ContextVar("rpc_metrics_serving")
_CODES = {code.value[0]: code for code in grpc.StatusCode}


class _Series:
    """One method's series: its histogram, and a counter per code seen so far."""

    def __init__(self, service: str, method: str) -> None:
        self.service = service
        self.method = method
        self.duration: Histogram = RPC_DURATION.labels(service, method)
        self.ok: Counter = RPC_REQUESTS.labels(service, method, "OK")

    def answered(self, started: float) -> None:
        self.duration.observe(time.perf_counter() - started)
        self.ok.inc()

    def refused(self, started: float, code: grpc.StatusCode, reason: str) -> None:
        self.duration.observe(time.perf_counter() - started)
        RPC_REQUESTS.labels(self.service, self.method, code.name).inc()
        if reason:
            RPC_REFUSALS.labels(self.service, self.method, reason).inc()


def _code_of(context: grpc.aio.ServicerContext[Any, Any]) -> grpc.StatusCode:
    code: Any = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return _CODES.get(code, grpc.StatusCode.UNKNOWN)


def _measured_unary(
    behaviour: Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any], series: _Series
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
    async def measured(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.perf_counter()
        _serving.set(series.service)
        try:
            result = behaviour(request, context)
            answer = await result if inspect.isawaitable(result) else result
        except asyncio.CancelledError:
            series.refused(started, grpc.StatusCode.CANCELLED, "")
            raise
        except BaseException:
            series.refused(started, _code_of(context), refusal_reason.get(""))
            raise
        series.answered(started)
        return answer

    return measured


def _measured_stream(
    behaviour: Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any], series: _Series
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any]:
    if not inspect.isasyncgenfunction(behaviour):  # a handler that calls context.write()
        return _measured_unary(behaviour, series)

    async def measured(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        started = time.perf_counter()
        _serving.set(series.service)
        try:
            async for item in behaviour(request, context):
                yield item
        except (asyncio.CancelledError, GeneratorExit):
            series.refused(started, grpc.StatusCode.CANCELLED, "")
            raise
        except BaseException:
            series.refused(started, _code_of(context), refusal_reason.get(""))
            raise
        series.answered(started)

    return measured


_CALL_SERIES: dict[tuple[str, str], _Series] = {}


def observe_call(method: str, started: float, code: grpc.StatusCode, reason: str = "") -> None:
    """Counts and times one call answered inside a measured stream (see the module
    docstring): `method` is its full name, `started` its time.perf_counter() on arrival,
    `code` and `reason` what it was answered with. Outside a measured call, nothing."""
    service = _serving.get(None)
    if service is None:
        return
    series = _CALL_SERIES.get((service, method))
    if series is None:
        series = _CALL_SERIES[(service, method)] = _Series(service, method)
    if code is grpc.StatusCode.OK:
        series.answered(started)
    else:
        series.refused(started, code, reason)


_HANDLER_KINDS: tuple[tuple[str, Any, Callable[..., Any]], ...] = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler, _measured_unary),
    ("unary_stream", grpc.unary_stream_rpc_method_handler, _measured_stream),
    ("stream_unary", grpc.stream_unary_rpc_method_handler, _measured_unary),
    ("stream_stream", grpc.stream_stream_rpc_method_handler, _measured_stream),
)


class RpcMetricsInterceptor(HandlerWrappingInterceptor):
    """Counts calls by method and code, times them, and counts refusals by reason.

    `service` is the serving process's label (coordinator, preview, processor, gateway),
    so processes that serve the same method stay apart.
    """

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def passes(self, method: str) -> bool:
        return method.startswith(_INFRASTRUCTURE)

    def wrap(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        return _wrap(handler, _Series(self._service, method.lstrip("/")))


def _wrap(
    handler: grpc.RpcMethodHandler[Any, Any], series: _Series
) -> grpc.RpcMethodHandler[Any, Any]:
    for attribute, factory, measure in _HANDLER_KINDS:
        behaviour: Any = getattr(handler, attribute)
        if behaviour is not None:
            return factory(  # type: ignore[no-any-return]
                measure(behaviour, series),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler
