"""Turning one HTTP request into one RPC request, and reading its credential and body.

The request message is the JSON body (minus the fields the path and query give) merged
with the path parameters and the query parameters, each converted by the field's type
and checked by `jsonmap.from_json` like any body: a query parameter the operation does
not take, a repeated non-repeated one, or a value of the wrong type is a field violation
(400), never ignored.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from starlette.requests import Request

from services.gateway.routes import Operation
from workshop.kit import errors, jsonmap
from workshop.kit.auth import bearer_secret

SESSION_COOKIE = "workshop_session"
JSON_TYPES = ("application/json",)


def session_secret(request: Request) -> str:
    """The website session's secret from its cookie ("" without one)."""
    return request.cookies.get(SESSION_COOKIE, "")


def bearer_of(request: Request) -> str:
    """The Agent key from `Authorization: Bearer` ("" without the header)."""
    values = request.headers.getlist("authorization")
    if not values:
        return ""
    return bearer_secret([("authorization", value) for value in values])


def credential(request: Request, prefix: str) -> str:
    """`/api` reads only the cookie, `/v1` only the bearer header (so `/v1` is immune to
    cross-site requests: a browser never adds that header by itself)."""
    return session_secret(request) if prefix == "api" else bearer_of(request)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 by its Content-Length before reading, and by counting
    the bytes of a body streamed without one."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    received = bytearray()
    async for chunk in request.stream():
        received += chunk
        if len(received) > limit:
            raise _too_large(limit)
    return bytes(received)


def _too_large(limit: int) -> errors.PayloadTooLarge:
    return errors.PayloadTooLarge(
        f"The request body is over {limit} bytes.", metadata={"limit_bytes": str(limit)}
    )


def parse_json(raw: bytes, content_type: str | None) -> Any:
    if not raw.strip():
        return {}
    media = (content_type or "").split(";")[0].strip().lower()
    if media not in JSON_TYPES:
        raise errors.InvalidArgument(
            "Send the body as JSON with 'Content-Type: application/json'.",
            reason="UNSUPPORTED_MEDIA_TYPE",
        )
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise errors.InvalidArgument(
            f"The body is not valid JSON: {error}"[:300], reason="MALFORMED_JSON"
        ) from None


def build_request(operation: Operation, request: Request, body: Any) -> Message:
    """The RPC request: body fields, then the path and query fields over them."""
    cls = operation.request_class()
    message = (
        jsonmap.from_json(body, cls, rename=operation.rename, exclude=operation.body_exclude)
        if operation.body
        else cls()
    )
    given = _params(operation, request)
    if given:
        message.MergeFrom(jsonmap.from_json(given, cls))
    return message


def _params(operation: Operation, request: Request) -> dict[str, Any]:
    """Path and query parameters as a JSON object shaped like the request message."""
    violations: list[jsonmap.FieldViolation] = []
    tree: dict[str, Any] = dict(request.path_params)
    for name in request.query_params:
        path = operation.query.get(name)
        if path is None:
            violations.append(jsonmap.FieldViolation(name, "unknown query parameter"))
            continue
        field = operation.field(path)
        values = request.query_params.getlist(name)
        repeated = field.is_repeated
        if not repeated and len(values) > 1:
            violations.append(jsonmap.FieldViolation(name, "given more than once"))
            continue
        converted = [_query_value(field, value) for value in values]
        _put(tree, path.split("."), converted if repeated else converted[0])
    if violations:
        raise jsonmap.JsonInvalid(violations)
    return tree


def _query_value(field: FieldDescriptor, value: str) -> Any:
    """A query string as the JSON value the field reads (a bad one stays a string, and
    from_json names the field's expected type)."""
    if field.type in jsonmap.INTEGER_KINDS:
        stripped = value.strip()
        if stripped.isascii() and stripped.lstrip("-").isdigit():
            return int(stripped)
        return value
    if field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        try:
            return float(value) if value.strip().isascii() else value
        except ValueError:
            return value  # from_json names the field's expected type
    if field.type == FieldDescriptor.TYPE_BOOL:
        return {"true": True, "false": False}.get(value.lower(), value)
    return value


def _put(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = value
