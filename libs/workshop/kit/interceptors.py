"""The server interceptor that turns domain exceptions into gRPC statuses.

A WorkshopError becomes the status of `workshop.kit.status`, with its message
and a `google.rpc.ErrorInfo` (reason + metadata) in the rich status details, so
clients can read e.g. the current revision of a stale save; both are bounded in
size first (`workshop.kit.bounds`). A standard library connection error or timeout
that the table names is answered with its status (UNAVAILABLE). Anything else is a
bug: it is logged with its traceback and answered INTERNAL without internals.

It also owns request decoding: each handler's deserializer is wrapped by
`workshop.kit.requests.request_decoder`, so bytes that are no request of the
method's type, a request over its service's size limit or an enum number outside
its enum are answered INVALID_ARGUMENT before the handler runs (grpc would answer
a deserializer's exception as UNKNOWN).
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from workshop.kit.bounds import bounded_message, bounded_metadata
from workshop.kit.errors import WorkshopError
from workshop.kit.requests import Refusal, request_decoder
from workshop.kit.status import INTERNAL, status_for

log = logging.getLogger(__name__)

ERROR_DOMAIN = "workshop"

# The reason of the refusal this call was answered with, for the metrics interceptor that
# wraps this one (workshop.kit.rpc_metrics): set in the call's own context, read after.
refusal_reason: contextvars.ContextVar[str] = contextvars.ContextVar("refusal_reason")


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], error: Exception) -> None:
    """Abort the RPC in `context` with the status that `error` maps to."""
    code, message, info = error_status(error, _method_name(context))
    refusal_reason.set(info.reason)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = rpc_status.to_status(
        status_pb2.Status(code=code.value[0], message=message, details=[detail])
    )
    await context.abort(status.code, status.details, status.trailing_metadata)


def error_status(
    error: BaseException, method: str = "rpc"
) -> tuple[grpc.StatusCode, str, error_details_pb2.ErrorInfo]:
    """The status `error` is answered with: its code, its message and its ErrorInfo (see
    the module docstring); what is not a WorkshopError is logged here, under `method`.

    The one mapping of errors to statuses: `abort_with` answers a call with it, and a
    stream that answers each of its messages on its own (JobService.Session) answers a
    message's error with it."""
    if isinstance(error, WorkshopError):
        code = status_for(error).grpc_code
        message = bounded_message(error.message)
        info = error_details_pb2.ErrorInfo(
            reason=error.reason, domain=ERROR_DOMAIN, metadata=bounded_metadata(error.metadata)
        )
    elif (status := status_for(error)) is not INTERNAL:
        log.warning("%s in %s: %s", type(error).__name__, method, error)
        code = status.grpc_code
        message = "A dependency of this service cannot be reached now; ask again shortly."
        info = error_details_pb2.ErrorInfo(reason=code.name, domain=ERROR_DOMAIN)
    else:
        log.exception("unhandled error in %s", method, exc_info=error)
        code = grpc.StatusCode.INTERNAL
        message = "internal error; the server log has the details"
        info = error_details_pb2.ErrorInfo(reason="INTERNAL", domain=ERROR_DOMAIN)
    return code, message, info


def _method_name(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    method = getattr(context, "_rpc_event", None)
    return str(getattr(method, "call_details", "rpc")) if method else "rpc"


def _is_abort(error: BaseException) -> bool:
    # context.abort() raises grpc.aio.AbortError; it must pass through untouched.
    return isinstance(error, grpc.aio.AbortError)


async def _abort_unimplemented(context: grpc.aio.ServicerContext[Any, Any]) -> None:
    # Generated base servicers raise NotImplementedError for RPCs a service
    # does not serve yet: that is UNIMPLEMENTED, never INTERNAL.
    refusal_reason.set("UNIMPLEMENTED")
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "This RPC is not implemented yet.")


def _wrap_unary(
    behaviour: Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any],
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            if isinstance(request, Refusal):
                raise request.error
            if isinstance(request, AsyncIterable):
                request = _refusing(request)
            result = behaviour(request, context)
            return await result if inspect.isawaitable(result) else result
        except NotImplementedError:
            await _abort_unimplemented(context)
        except Exception as error:
            if _is_abort(error):
                raise
            await abort_with(context, error)
        raise AssertionError("abort() returned")  # pragma: no cover

    return wrapped


def _wrap_stream(
    behaviour: Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any],
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any]:
    # Streaming handlers come in two styles that grpc.aio does not let us mix:
    # async generators, and coroutines that call context.write() (the aio
    # health servicer's Watch). Keep the style of the handler we wrap.
    if inspect.isasyncgenfunction(behaviour):

        async def generator(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            try:
                if isinstance(request, Refusal):
                    raise request.error
                if isinstance(request, AsyncIterable):
                    request = _refusing(request)
                async for item in behaviour(request, context):
                    yield item
            except NotImplementedError:
                await _abort_unimplemented(context)
            except Exception as error:
                if _is_abort(error):
                    raise
                await abort_with(context, error)

        return generator
    return _wrap_unary(behaviour)


async def _refusing(requests: AsyncIterable[Any]) -> AsyncIterator[Any]:
    """A client stream's requests, raising the error of the first one that was refused."""
    async for request in requests:
        if isinstance(request, Refusal):
            raise request.error
        yield request


_HANDLER_KINDS: tuple[tuple[str, Any, Callable[[Any], Any]], ...] = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler, _wrap_unary),
    ("unary_stream", grpc.unary_stream_rpc_method_handler, _wrap_stream),
    ("stream_unary", grpc.stream_unary_rpc_method_handler, _wrap_unary),
    ("stream_stream", grpc.stream_stream_rpc_method_handler, _wrap_stream),
)


class HandlerWrappingInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor that wraps each method's handler (`wrap`), once: the wrapped
    handler is reused for every later call that gets the same handler (registered
    handlers are long-lived objects), not rebuilt per call. Methods `passes` names keep
    their handler as it is."""

    def __init__(self) -> None:
        # method -> (the handler found, its wrapped version)
        self._wrapped: dict[str, tuple[Any, grpc.RpcMethodHandler[Any, Any]]] = {}

    def wrap(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        raise NotImplementedError

    def passes(self, method: str) -> bool:
        return False

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or self.passes(method):
            return handler
        found = self._wrapped.get(method)
        if found is not None and found[0] is handler:
            return found[1]
        wrapped = self.wrap(handler, method)
        self._wrapped[method] = (handler, wrapped)
        return wrapped


class ErrorMappingInterceptor(HandlerWrappingInterceptor):
    """Maps exceptions raised by servicers to statuses (see module docstring).

    `request_limits` maps a service's full name to the most bytes one request of its
    methods may have.
    """

    def __init__(self, request_limits: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self._limits = dict(request_limits or {})

    def wrap(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        service = method.lstrip("/").partition("/")[0]
        return _wrap_handler(handler, method, self._limits.get(service))


def _wrap_handler(
    handler: grpc.RpcMethodHandler[Any, Any], method: str, max_request_bytes: int | None
) -> grpc.RpcMethodHandler[Any, Any]:
    serializers = {
        "request_deserializer": request_decoder(
            handler.request_deserializer,
            max_bytes=max_request_bytes,
            type_name=f"request of {method.lstrip('/')}",
        ),
        "response_serializer": handler.response_serializer,
    }
    # The stubs type behaviours as sync callables with the sync context;
    # under grpc.aio they are coroutines taking the aio context.
    for attribute, factory, wrap in _HANDLER_KINDS:
        behaviour: Any = getattr(handler, attribute)
        if behaviour is not None:
            return factory(wrap(behaviour), **serializers)  # type: ignore[no-any-return]
    return handler
