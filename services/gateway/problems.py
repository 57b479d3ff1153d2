"""The one place that turns a refusal into an HTTP answer, with one JSON shape:

    {"code": "ABORTED", "status": 409, "reason": "STALE_REVISION",
     "message": "Revision 3 is stale; the workflow is at revision 4.",
     "details": {"metadata": {"current_revision": "4"}, "field_violations": [...]}}

`code` is the gRPC code name, `status` the HTTP status and `reason` the ErrorInfo reason,
all from the error catalog (`workshop.kit.status.REASONS`); `details.metadata` is the
ErrorInfo metadata as sent, `details.field_violations` lists each bad field of a body or
query the gateway could not read (`field`, `description`), and `details.problems` the
validation problems of a workflow (VALIDATION_FAILED). A 429 carries `Retry-After`.

A credential that is missing or unusable is told in the terms of the route that read it:
the services word it for gRPC callers ("send metadata 'authorization: Bearer <key>'"),
`/v1` callers send an `Authorization` header, and people on the website (`cookie`: the
`/api` routes) hold a session cookie, which signing in sets. A status that gRPC made on
the way (no ErrorInfo) is answered by what it means (`UpstreamError.transport`): never a
429, which tells a client to retry later.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.responses import JSONResponse

from services.gateway.upstream import UpstreamError, problems_metadata
from workshop.kit import errors
from workshop.kit.jsonmap import JsonInvalid
from workshop.kit.status import INTERNAL, status_for

log = logging.getLogger(__name__)

RETRY_AFTER_KEY = "retry_after_seconds"
SIGN_IN_FIRST = "You are not signed in; sign in first (POST /api/session sets the session cookie)."
SEND_BEARER = "Missing credential: send the header 'Authorization: Bearer <key>'."
# A 64 KiB body can break thousands of rules; the first hundred say enough.
VIOLATIONS_SHOWN = 100


def error_body(
    *,
    code: str,
    status: int,
    reason: str,
    message: str,
    metadata: dict[str, str] | None = None,
    violations: list[dict[str, str]] | None = None,
    problems: list[Any] | None = None,
) -> dict[str, Any]:
    details: dict[str, Any] = {"metadata": dict(metadata or {}), "field_violations": []}
    if violations:
        details["field_violations"] = violations
    if problems is not None:
        details["problems"] = problems
    return {
        "code": code,
        "status": status,
        "reason": reason,
        "message": message,
        "details": details,
    }


def problem_response(error: BaseException, *, cookie: bool = False) -> JSONResponse:
    """The answer to `error`: a refusal from a service, one of the gateway's own, or a bug;
    `cookie` on the routes whose credential is the session cookie."""
    body = problem_body(error, cookie=cookie)
    return _json(body, body["status"], body["details"]["metadata"])


def problem_body(error: BaseException, *, cookie: bool = False) -> dict[str, Any]:
    """The error body of `error` (what `problem_response` answers, and what an MCP tool's
    error result carries as its structured content)."""
    if isinstance(error, UpstreamError):
        return error_body(
            code=error.code.name,
            status=error.http_status,
            reason=error.reason,
            message=_worded(error.reason, error.message, error.metadata, cookie),
            metadata=error.metadata,
            violations=_field_of(error),
            problems=problems_metadata(error.metadata),
        )
    if isinstance(error, errors.WorkshopError):
        known = status_for(error)
        violations = None
        if isinstance(error, JsonInvalid):
            violations = [
                {"field": v.field, "description": v.description}
                for v in error.violations[:VIOLATIONS_SHOWN]
            ]
        return error_body(
            code=known.grpc_code.name,
            status=known.http_status,
            reason=error.reason,
            message=_worded(error.reason, error.message, error.metadata, cookie),
            metadata=error.metadata,
            violations=violations,
        )
    log.exception("unhandled error in the gateway", exc_info=error)
    return error_body(
        code=INTERNAL.grpc_code.name,
        status=500,
        reason="INTERNAL",
        message="internal error; the gateway log has the details",
    )


def _worded(reason: str, message: str, metadata: dict[str, str], cookie: bool) -> str:
    """`message`, or for a missing or malformed credential, what its HTTP caller sends."""
    if reason == "CREDENTIAL_MISSING":
        return SIGN_IN_FIRST if cookie else SEND_BEARER
    if reason == "CREDENTIAL_MALFORMED" and cookie:
        length, limit = metadata.get("length_bytes"), metadata.get("limit_bytes")
        if length and limit:
            return (
                f"The session cookie is {length} bytes, longer than any this site sets (a "
                f"credential is at most {limit}); sign in again."
            )
        return "The session cookie is not one this site sets; sign in again."
    return message


def _field_of(error: UpstreamError) -> list[dict[str, str]] | None:
    field = error.metadata.get("field")
    return [{"field": field, "description": error.message}] if field else None


def _json(body: dict[str, Any], status: int, metadata: dict[str, str]) -> JSONResponse:
    headers = {"Cache-Control": "no-store"}
    retry_after = metadata.get(RETRY_AFTER_KEY)
    if status in (429, 503) and retry_after and retry_after.isdigit():
        headers["Retry-After"] = retry_after
    return JSONResponse(body, status_code=status, headers=headers)
