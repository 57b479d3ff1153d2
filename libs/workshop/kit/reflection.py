"""Server reflection that serves the contracts with their comments.

The generated modules register descriptors without source info, so reflection alone
would show `grpcurl describe` names and types but none of the comments that explain
them. `make proto` also writes workshop/v1/descriptors.binpb, the same files with
their source info; this servicer answers with those bytes for Workshop's own files
and with the registered descriptors for everything else (health, reflection,
well-known types).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

DESCRIPTOR_SET = "descriptors.binpb"


@functools.cache
def documented_files() -> dict[str, bytes]:
    """File name -> serialized FileDescriptorProto with comments, for workshop/v1/*.proto."""
    data = resources.files("workshop.v1").joinpath(DESCRIPTOR_SET).read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(data).file
    for file in files:
        _drop_json_names(file.message_type)
    return {file.name: file.SerializeToString() for file in files}


def _drop_json_names(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
    # protoc writes each field's json_name (lowerCamelCase) into the set; the registered
    # descriptors carry none, so grpcurl has always printed the fields' own names
    # (run_id). Serving json_name would change every reply operators script against.
    for message in messages:
        for field in message.field:
            field.ClearField("json_name")
        _drop_json_names(message.nested_type)


class DocumentedReflectionServicer(ReflectionServicer):  # type: ignore[misc]
    """grpc.reflection.v1alpha, answering file requests with the commented descriptors."""

    def __init__(self, service_names: list[str]) -> None:
        super().__init__(service_names)
        self._default_pool = descriptor_pool.Default()

    def _file_by_filename(self, request: Any, filename: str) -> Any:
        try:
            found = self._default_pool.FindFileByName(filename)
        except KeyError:
            return super()._file_by_filename(request, filename)
        return self._response(found, request)

    def _file_containing_symbol(self, request: Any, fully_qualified_name: str) -> Any:
        try:
            found = self._default_pool.FindFileContainingSymbol(fully_qualified_name)
        except KeyError:
            return super()._file_containing_symbol(request, fully_qualified_name)
        return self._response(found, request)

    @staticmethod
    def _response(found: FileDescriptor, request: Any) -> Any:
        documented = documented_files()
        serialized = []
        for file in _with_dependencies(found):
            if file.name in documented:
                serialized.append(documented[file.name])
            else:
                plain = descriptor_pb2.FileDescriptorProto()
                file.CopyToProto(plain)
                serialized.append(plain.SerializeToString())
        return reflection_pb2.ServerReflectionResponse(
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(
                file_descriptor_proto=serialized
            ),
            original_request=request,
        )


def _with_dependencies(file: FileDescriptor) -> list[FileDescriptor]:
    """`file` and every file it imports, transitively, each once."""
    seen: dict[str, FileDescriptor] = {}
    pending = [file]
    while pending:
        current = pending.pop()
        if current.name not in seen:
            seen[current.name] = current
            pending.extend(current.dependencies)
    return list(seen.values())
