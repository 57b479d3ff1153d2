"""Host a contract that is not implemented yet.

Every method of the service answers UNIMPLEMENTED with the method's name, while
health, reflection and `grpcurl describe` already show the full contract. This
is never a fake success: callers learn at once that the RPC is not served.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from workshop.kit.server import GrpcService


def _handler(method: MethodDescriptor) -> grpc.RpcMethodHandler[Any, Any]:
    request_class = GetMessageClass(method.input_type)
    message = f"{method.full_name} is not implemented yet."

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

    factory = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(method.client_streaming, method.server_streaming)]
    return factory(
        refuse,
        request_deserializer=request_class.FromString,
        response_serializer=lambda response: response.SerializeToString(),
    )


def unimplemented_service(service: ServiceDescriptor) -> GrpcService:
    """A GrpcService answering UNIMPLEMENTED for every method of `service`."""
    handlers = {method.name: _handler(method) for method in service.methods}
    generic = grpc.method_handlers_generic_handler(service.full_name, handlers)

    def register(server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers((generic,))

    return GrpcService(service.full_name, register)
