"""The OpenAPI 3.1 documents of `/api` and `/v1`, generated from the route table.

Each operation of `services.gateway.routes` becomes one path item: its path and query
parameters typed by their request fields, its body and answer as schemas generated
from the protobuf messages (`jsonmap.SchemaSet`, descriptions from the proto comments),
and every status it may answer with the one error shape. The session routes and the
live channel (whose messages a JSON Schema describes under `x-live-message`, since
OpenAPI has no WebSocket operations) are added from their own modules' definitions.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from google.protobuf.descriptor import Descriptor

from services.gateway.routes import API, IMAGE, OPERATIONS, SERVICES, TAR, V1, Operation
from workshop.kit import jsonmap
from workshop.kit.auth import MAX_SECRET_BYTES
from workshop.kit.status import REASONS
from workshop.v1 import identity_pb2, run_pb2

Schema = dict[str, Any]
VERSION = "1"
_TITLES = {
    API: "Workshop website API (session cookie)",
    V1: "Workshop Agent API (bearer Agent key)",
}
_ERROR_NAMES = {
    400: "Bad request: a malformed body, query or field.",
    401: "No credential, or one that is unknown, revoked or expired, or its user is disabled.",
    403: "The credential lacks the scope or camera, or a cross-site request was refused.",
    404: "Not found, or expired.",
    409: "Conflict: a stale revision, an id used with another body, or a state that forbids it.",
    413: "The request body is over its limit (refused before it is read).",
    422: "Well-formed but breaks a rule (workflow validation, no media, limits).",
    426: "This route is a WebSocket: connect with `Upgrade: websocket`.",
    429: "Too many requests or at capacity; see Retry-After.",
    500: "Stored data is no longer what was recorded (DATA_LOSS).",
    502: "A service behind the gateway gave no answer of its own (its transport failed: "
    "BAD_GATEWAY); the gateway's log has the detail.",
    503: "A service behind the gateway cannot be reached now; ask again.",
}


@cache
def openapi_document(prefix: str) -> dict[str, Any]:
    """The whole document for `prefix` ("api" or "v1"), built once."""
    schemas = jsonmap.SchemaSet()
    paths: dict[str, dict[str, Any]] = {}
    for operation in OPERATIONS:
        if prefix in operation.prefixes:
            item = paths.setdefault(f"/{prefix}{operation.path}", {})
            item[operation.method.lower()] = _operation(operation, prefix, schemas)
    paths[f"/{prefix}/workshop/runs/{{run_id}}/live"] = {"get": _live(prefix, schemas)}
    if prefix == API:
        paths["/api/session"] = _session_paths(schemas)
    components: dict[str, Any] = {
        "schemas": {**schemas.components(), "Error": ERROR_SCHEMA},
        "securitySchemes": SECURITY[prefix],
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": _TITLES[prefix],
            "version": VERSION,
            "description": "Generated from the gateway's route table and the protobuf "
            "contracts; errors have one shape (`Error`), reasons in docs/limits-and-errors.md.",
        },
        "paths": dict(sorted(paths.items())),
        "components": components,
        "security": [{name: []} for name in SECURITY[prefix]],
    }


SECURITY: dict[str, dict[str, Any]] = {
    API: {
        "session": {
            "type": "apiKey",
            "in": "cookie",
            "name": "workshop_session",
            "description": "Set by POST /api/session. State-changing requests also need the "
            "X-CSRF-Token header (GET /api/session) and a same-site origin.",
        }
    },
    V1: {"agentKey": {"type": "http", "scheme": "bearer", "description": "An Agent key."}},
}

ERROR_SCHEMA: Schema = {
    "type": "object",
    "description": "Every error answer.",
    "required": ["code", "status", "reason", "message", "details"],
    "additionalProperties": False,
    "properties": {
        "code": {"type": "string", "description": "gRPC status code name."},
        "status": {"type": "integer", "description": "HTTP status."},
        "reason": {
            "type": "string",
            "description": "Stable reason for programs; one of: " + ", ".join(sorted(REASONS)),
        },
        "message": {"type": "string", "description": "For people."},
        "details": {
            "type": "object",
            "required": ["metadata", "field_violations"],
            "additionalProperties": False,
            "properties": {
                "metadata": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "Facts to recover with, e.g. current_revision.",
                },
                "field_violations": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["field", "description"],
                        "additionalProperties": False,
                        "properties": {
                            "field": {"type": "string"},
                            "description": {"type": "string"},
                        },
                    },
                },
                "problems": {"type": "array", "description": "Workflow validation problems."},
            },
        },
    },
}


def _operation(operation: Operation, prefix: str, schemas: jsonmap.SchemaSet) -> Schema:
    request = operation.request_type
    parameters = [_path_parameter(request, name) for name in operation.path_fields]
    parameters += [
        _query_parameter(operation, name, path, schemas) for name, path in operation.query.items()
    ]
    if prefix == API and operation.writes:
        parameters.append(CSRF_PARAMETER)
    document: Schema = {
        "operationId": f"{prefix}_{operation.name}",
        "tags": [operation.tag],
        "summary": _summary(operation),
        "description": jsonmap.comment(operation.descriptor.full_name)
        + f"\n\ngRPC: `{SERVICES[operation.service].full_name}/{operation.rpc}`.",
        "parameters": parameters,
        "responses": {"200": _success(operation, schemas), **_errors(operation.statuses())},
    }
    if operation.body:
        document["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {
                    "schema": schemas.ref(
                        request,
                        direction="request",
                        rename=operation.rename,
                        exclude=operation.body_exclude,
                    )
                }
            },
        }
    return document


def _summary(operation: Operation) -> str:
    words = "".join(f" {ch.lower()}" if ch.isupper() else ch for ch in operation.name)
    return words[:1].upper() + words[1:]


def _success(operation: Operation, schemas: jsonmap.SchemaSet) -> Schema:
    if operation.answer == IMAGE:
        content: dict[str, Any] = {"image/jpeg": {}, "image/png": {}}
        return {
            "description": "The image bytes, with ETag and Cache-Control.",
            "content": {
                kind: {"schema": {"type": "string", "contentMediaType": kind}} for kind in content
            },
        }
    if operation.answer == TAR:
        return {
            "description": "The archive, streamed (chunked); a failure mid-stream aborts it.",
            "content": {
                "application/x-tar": {
                    "schema": {"type": "string", "contentMediaType": "application/x-tar"}
                }
            },
        }
    return {
        "description": "OK",
        "content": {
            "application/json": {
                "schema": schemas.ref(operation.response_type, direction="response")
            }
        },
    }


def _errors(statuses: tuple[int, ...] | list[int]) -> dict[str, Any]:
    return {
        str(status): {
            "description": _ERROR_NAMES.get(status, "Error."),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for status in statuses
    }


CSRF_PARAMETER: Schema = {
    "name": "X-CSRF-Token",
    "in": "header",
    "required": False,
    "description": "The csrf_token of GET /api/session; required with a session cookie.",
    "schema": {"type": "string"},
}


def _path_parameter(request: Descriptor, name: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": jsonmap.comment(request.fields_by_name[name].full_name),
        "schema": {"type": "string", "minLength": 1},
    }


def _query_parameter(
    operation: Operation, name: str, path: str, schemas: jsonmap.SchemaSet
) -> Schema:
    field = operation.field(path)
    value = schemas.parameter_schema(field)
    repeated = field.is_repeated
    schema = {"type": "array", "items": value} if repeated else value
    parameter: Schema = {
        "name": name,
        "in": "query",
        "required": False,
        "description": jsonmap.comment(field.full_name),
        "schema": schema,
    }
    if repeated:
        parameter.update(style="form", explode=True)
    return parameter


def _live(prefix: str, schemas: jsonmap.SchemaSet) -> Schema:
    detail = schemas.ref(run_pb2.RunDetail, direction="response")
    return {
        "operationId": f"{prefix}_watchRunLive",
        "tags": ["runs"],
        "summary": "Follow a run live (WebSocket)",
        "description": "Connect with `Upgrade: websocket`. The first message is the run "
        "detail; then one after every progress report, published frame, completion, "
        "failure or cancellation, bursts within 120 ms sent once (latest wins). Each "
        "message is `x-live-message`; close codes in docs/live.md.",
        "parameters": [
            {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}
        ],
        "responses": {
            "101": {"description": "Switching to the WebSocket protocol."},
            **_errors([401, 403, 404, 426, 502, 503]),
        },
        "x-live-message": live_message_schema(detail),
    }


def live_message_schema(detail: Schema) -> Schema:
    return {
        "type": "object",
        "required": ["seq", "sent_at", "final", "detail"],
        "properties": {
            "seq": {
                "type": "integer",
                "minimum": 0,
                "description": "Per run and gateway process; a jump means states were merged.",
            },
            "sent_at": {"type": "string", "format": "date-time"},
            "final": {"type": "boolean", "description": "The run reached a final status."},
            "detail": detail,
        },
    }


SESSION_SCHEMA: Schema = {
    "type": "object",
    "required": ["signed_in", "user_id", "expires_at", "csrf_token"],
    "properties": {
        "signed_in": {"const": True},
        "user_id": {"type": "string"},
        "display_name": {"type": "string"},
        "expires_at": {"type": "string", "format": "date-time"},
        "csrf_token": {"type": "string", "description": "Send as X-CSRF-Token on changes."},
    },
}


SIGNED_OUT_SCHEMA: Schema = {
    "type": "object",
    "required": ["signed_in", "ended"],
    "additionalProperties": False,
    "properties": {
        "signed_in": {"const": False},
        "ended": {
            "type": "boolean",
            "description": "The cookie names a session that ended (expired, signed out, "
            "revoked, or of a disabled user), rather than none.",
        },
    },
}


def _session_paths(schemas: jsonmap.SchemaSet) -> dict[str, Any]:
    login = schemas.ref(identity_pb2.LoginRequest, direction="request", exclude=("client_address",))
    session = {
        "description": "The session",
        "content": {"application/json": {"schema": SESSION_SCHEMA}},
    }
    return {
        "post": {
            "operationId": "api_login",
            "tags": ["session"],
            "summary": "Sign in",
            "description": "Checks the password and sets the HttpOnly session cookie. Failed "
            "logins are throttled per user and per client address (429, Retry-After).",
            "security": [],
            "requestBody": {"required": True, "content": {"application/json": {"schema": login}}},
            "responses": {"200": session, **_errors([400, 401, 403, 413, 429, 502, 503])},
        },
        "get": {
            "operationId": "api_getSession",
            "tags": ["session"],
            "summary": "The current session and its CSRF token, or that there is none",
            "description": "200 signed in or not; 401 only for a cookie that is no "
            f"credential (malformed, or over {MAX_SECRET_BYTES} bytes).",
            "responses": {
                "200": {
                    "description": "The session, or signed out",
                    "content": {
                        "application/json": {
                            "schema": {"oneOf": [SESSION_SCHEMA, SIGNED_OUT_SCHEMA]}
                        }
                    },
                },
                **_errors([401, 502, 503]),
            },
        },
        "delete": {
            "operationId": "api_logout",
            "tags": ["session"],
            "summary": "Sign out (revokes the session)",
            "parameters": [CSRF_PARAMETER],
            "responses": {
                "204": {"description": "Signed out; the cookie is cleared."},
                **_errors([401, 403, 502, 503]),
            },
        },
    }
