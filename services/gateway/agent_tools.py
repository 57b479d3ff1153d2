"""The MCP tools of /v1/mcp (docs/mcp.md): `runs` and `footage`.

Each action is a thin translation to the RPC its /v1 route calls (the operations of
`services.gateway.routes`, with the same request mapping, `jsonmap.from_json`), made with
the caller's own credential, so the coordinator and the preview service decide what the
caller may do; answers are the gateway's JSON of the response (`jsonmap.to_json`), the
same shapes as HTTP. A refusal is a tool result with `isError` whose structured content
is the gateway's error body (`problems.problem_body`: code, status, reason, message,
details), the same reasons as HTTP and gRPC.

`runs watch` waits on the gateway's live hub (`LiveHub.listen`), the shared WatchRun
stream the run page's sockets follow, never on a stream of its own.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent, Tool
from pydantic import BaseModel, Field
from starlette.requests import Request

from services.gateway.dispatch import bearer_of
from services.gateway.live import LiveHub
from services.gateway.live_socket import CLOSE_GOING_AWAY
from services.gateway.problems import problem_body
from services.gateway.routes import OPERATIONS, Operation
from services.gateway.tool_arguments import Own, RequestField, ToolArguments
from services.gateway.upstream import Upstream, UpstreamError
from workshop.kit import errors, jsonmap, limits
from workshop.v1 import common_pb2, preview_pb2

WATCH_DEFAULT_SECONDS = 25.0
WATCH_MAX_SECONDS = 60.0
PHOTO_DEFAULT_SECONDS = 20.0
PHOTO_MAX_SECONDS = 60.0
PHOTO_POLL_SECONDS = 0.2  # GetPhoto while a photo is being taken (it takes about a second)
POLL_SECONDS = 1.0  # GetRun, when the live stream of a run is unavailable
RUN_ACTIONS = ("create", "list", "get", "watch", "cancel")
ACTIVE = ("queued", "running")  # run statuses as the JSON spells them
_PHOTO_WAITING = (common_pb2.RUN_STATUS_QUEUED, common_pb2.RUN_STATUS_RUNNING)
CURSOR = re.compile(r"w1\.(\d{1,3})\.([0-9a-f]{16})")
_OPERATIONS = {operation.name: operation for operation in OPERATIONS}

Report = Callable[[int], Awaitable[None]]


class RunsResult(BaseModel):
    """What `runs` answers; which fields are present depends on the action."""

    action: Literal["create", "list", "get", "watch", "cancel"]
    run: dict[str, Any] | None = Field(
        None, description="create, cancel: the run (workshop.v1.Run as the HTTP API's JSON)."
    )
    created: bool | None = Field(
        None, description="create: false when the run already existed with the same request."
    )
    jobs_cancelled: int | None = Field(None, description="cancel: jobs this call cancelled.")
    runs: list[dict[str, Any]] | None = Field(
        None, description="list: the runs, newest first (workshop.v1.RunListEntry)."
    )
    next_page_token: str | None = Field(
        None, description="list: pass as page_token for the next page; empty on the last."
    )
    detail: dict[str, Any] | None = Field(
        None,
        description="get, watch: the run detail (workshop.v1.RunDetail: run with status, "
        "counts and waiting_behind, jobs, recent_images).",
    )
    final: bool | None = Field(
        None, description="watch: the run reached a final status; no need to watch again."
    )
    progress_percent: int | None = Field(
        None, description="watch: 0-100, never less than the cursor's; 100 once final."
    )
    cursor: str | None = Field(
        None, description="watch: pass to the next watch of the run to go on from here."
    )
    changed: bool | None = Field(
        None, description="watch: whether the detail differs from the one the cursor named."
    )


class FootageResult(BaseModel):
    """What `footage` answers, besides the image block itself."""

    photo: dict[str, Any] = Field(
        description="The photo (workshop.v1.Photo: id, camera, requested time, recording, "
        "status, item id and frame time once taken, expires_at)."
    )
    taken: bool = Field(
        description="True when the image is in this result; false while the photo is still "
        "queued or running (call again: the same camera and time within the clock hour is "
        "the same photo), or when it ended without a frame."
    )
    expires_at: str | None = Field(
        None, description="When the image stops being readable (RFC 3339 UTC)."
    )
    content_type: str | None = Field(None, description="The image's MIME type (image/jpeg).")
    frame_time: str | None = Field(None, description="Presentation time of the frame.")


def secret_of(ctx: Context) -> str:
    """The caller's Agent key: the bearer of the HTTP request that carried the call."""
    request = ctx.request_context.request
    return bearer_of(request) if isinstance(request, Request) else ""


def refused(error: BaseException) -> CallToolResult:
    """A structured error result: the gateway's error body, and its message as text."""
    body = problem_body(error)
    text = f"{body['reason']} ({body['status']}): {body['message']}"
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=body, is_error=True
    )


def answered(structured: dict[str, Any], *blocks: ContentBlock) -> CallToolResult:
    text = TextContent(type="text", text=json.dumps(structured, separators=(",", ":")))
    return CallToolResult(content=[*blocks, text], structured_content=structured)


def _invalid(field: str, description: str) -> jsonmap.JsonInvalid:
    return jsonmap.JsonInvalid([jsonmap.FieldViolation(field, description)])


def progress_percent(detail: dict[str, Any], final: bool) -> int:
    """Committed slots, plus each leased job's reported share of its own, over the
    expected slots; 100 once the run is final (whatever its status)."""
    if final:
        return 100
    counts = detail.get("run", {}).get("counts", {})
    expected = int(counts.get("slots_expected", 0))
    if expected <= 0:
        return 0
    slots = ("slots_frame", "slots_empty", "slots_dropped")
    done = float(sum(int(counts.get(key, 0)) for key in slots))
    for job in detail.get("jobs", []):
        if job.get("state") == "leased":
            done += int(job.get("slot_count", 0)) * int(job.get("progress_percent", 0)) / 100
    return max(0, min(99, int(100 * done / expected)))


def digest(detail: dict[str, Any]) -> str:
    canonical = json.dumps(detail, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def read_cursor(cursor: str | None) -> tuple[int, str]:
    """(progress floor, digest of the detail last delivered) of a cursor; (0, "") for none."""
    if not cursor:
        return 0, ""
    match = CURSOR.fullmatch(cursor)
    if match is None or int(match.group(1)) > 100:
        raise _invalid("cursor", "not a cursor a watch returned (w1.<percent>.<16 hex>)")
    return int(match.group(1)), match.group(2)


class AgentTools:
    """The tools' bodies, on the gateway's gRPC clients and live hub."""

    def __init__(self, upstream: Upstream, hub: LiveHub) -> None:
        self.upstream = upstream
        self.hub = hub

    async def _call(self, name: str, fields: dict[str, Any], secret: str) -> Any:
        """The RPC of the /v1 operation `name`, its request read from `fields` as the
        route reads its body (the same renames; None means absent)."""
        operation: Operation = _OPERATIONS[name]
        given = {key: value for key, value in fields.items() if value is not None}
        message = jsonmap.from_json(given, operation.request_class(), rename=operation.rename)
        return await self.upstream.call(operation.service, operation.rpc, message, secret)

    # runs ---------------------------------------------------------------------------------

    async def runs(self, secret: str, action: str, args: dict[str, Any], report: Report) -> Any:
        run_id = args.get("id")
        if action == "create":
            if not run_id:
                raise _invalid("id", "required: the client-chosen run id (a retry reuses it)")
            body = {
                key: args.get(key)
                for key in ("workflow_id", "runtime_id", "revision", "mode", "image_limit")
            }
            answer = await self._call("createRun", {"id": run_id, **body}, secret)
            return {"action": action, **jsonmap.to_json(answer)}
        if action == "list":
            fields = {
                "workflow_id": args.get("workflow_id"),
                "page_size": args.get("page_size"),
                "page_token": args.get("page_token"),
            }
            answer = await self._call("listRuns", fields, secret)
            return {"action": action, **jsonmap.to_json(answer)}
        if not run_id:
            raise _invalid("id", f"required for {action}: the run id")
        if action == "get":
            fields = {"run_id": run_id, "job_limit": args.get("job_limit")}
            answer = await self._call("getRun", fields, secret)
            return {"action": action, **jsonmap.to_json(answer)}
        if action == "cancel":
            answer = await self._call("cancelRun", {"run_id": run_id}, secret)
            return {"action": action, **jsonmap.to_json(answer)}
        limit = args.get("job_limit")
        timeout = float(args["timeout_seconds"])
        answer = await self.watch(secret, run_id, args.get("cursor"), timeout, report, limit)
        if limit and len(answer["detail"]["jobs"]) > limit:
            # The hub's stream carries the first jobs (JOB_LIMIT's default); the answer
            # keeps the first `limit`.
            answer["detail"] = {**answer["detail"], "jobs": answer["detail"]["jobs"][:limit]}
            answer["detail"]["jobs_truncated"] = True
        return answer

    async def watch(
        self,
        secret: str,
        run_id: str,
        cursor: str | None,
        seconds: float,
        report: Report,
        job_limit: int | None = None,
    ) -> dict[str, Any]:
        """Waits until the run is final or `seconds` passed, reporting progress on
        every update; the answer is the latest detail with a cursor for the next call.
        The first read carries `job_limit`, so the coordinator checks it as for `get`."""
        floor, seen = read_cursor(cursor)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        asked = {"run_id": run_id, "job_limit": job_limit}
        first = await self._call("getRun", asked, secret)
        detail: dict[str, Any] = jsonmap.to_json(first)["detail"]
        final = detail["run"]["status"] not in ACTIVE
        percent = max(floor, progress_percent(detail, final))
        await report(percent)
        if not final:
            async with self.hub.listen(run_id, first) as listener:
                while not final and (left := deadline - loop.time()) > 0:
                    text = await listener.next(left)
                    if text is not None:
                        message = json.loads(text)
                        detail, final = message["detail"], bool(message["final"])
                    elif listener.closed is not None:
                        if listener.closed[0] == CLOSE_GOING_AWAY:
                            break  # the gateway is stopping: answer what we have
                        # The hub cannot follow the run (its stream was refused for
                        # good): ask the coordinator now and then instead.
                        await asyncio.sleep(min(POLL_SECONDS, max(left, 0.0)))
                        answer = await self._call("getRun", {"run_id": run_id}, secret)
                        detail = jsonmap.to_json(answer)["detail"]
                        final = detail["run"]["status"] not in ACTIVE
                    new = max(percent, progress_percent(detail, final))
                    if new != percent:
                        percent = new
                        await report(percent)
        state = digest(detail)
        return {
            "action": "watch",
            "detail": detail,
            "final": final,
            "progress_percent": percent,
            "cursor": f"w1.{percent}.{state}",
            "changed": state != seen,
        }

    # footage ------------------------------------------------------------------------------

    async def footage(
        self, secret: str, camera_id: str, time: str, seconds: float
    ) -> tuple[dict[str, Any], ImageContent | None]:
        """Requests the photo, waits (at most `seconds`) until it is taken, and reads its
        image."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        asked = await self._call("requestPhoto", {"camera_id": camera_id, "time": time}, secret)
        photo = asked.photo
        while photo.status in _PHOTO_WAITING and loop.time() < deadline:
            await asyncio.sleep(min(PHOTO_POLL_SECONDS, max(deadline - loop.time(), 0.0)))
            photo = (await self._call("getPhoto", {"photo_id": photo.photo_id}, secret)).photo
        shown = jsonmap.to_json(photo)
        result: dict[str, Any] = {"photo": shown, "taken": False}
        if not photo.item_id:
            return result, None
        read = preview_pb2.ReadImageRequest(run_id=photo.photo_id, item_id=photo.item_id)
        image = await self.upstream.call("preview", "ReadImage", read, secret)
        read_json = jsonmap.to_json(image, exclude=("image", "boxes"))
        result.update(
            taken=True,
            content_type=image.content_type,
            frame_time=read_json.get("frame_time"),
            expires_at=read_json.get("expires_at", shown.get("expires_at")),
        )
        block = ImageContent(
            type="image",
            data=base64.b64encode(image.image).decode("ascii"),
            mime_type=image.content_type,
        )
        return result, block


RUNS_ARGUMENTS = ToolArguments(
    (
        Own("action", "string", "What to do.", required=True, choices=RUN_ACTIONS),
        RequestField(
            "id",
            "createRun",
            "run_id",
            "create: the client-chosen run id (required; the same id with the same arguments "
            "returns the same run, with other arguments it is a conflict, ID_CONFLICT). get, "
            "watch, cancel: the run.",
        ),
        RequestField(
            "workflow_id",
            "createRun",
            "workflow_id",
            "create: the workflow to run. list: only this workflow's runs.",
        ),
        RequestField("runtime_id", "createRun", "runtime_id", "create: the runtime."),
        RequestField(
            "revision", "createRun", "revision", "create: the workflow's current revision."
        ),
        RequestField("mode", "createRun", "mode", "create: test or full."),
        RequestField(
            "image_limit",
            "createRun",
            "image_limit",
            f"create, test runs: expected slots, {limits.IMAGE_LIMIT.phrase()}.",
        ),
        RequestField("page_size", "listRuns", "page_size", f"list: {limits.PAGE.phrase()}."),
        RequestField(
            "page_token", "listRuns", "page_token", "list: next_page_token of the previous page."
        ),
        RequestField(
            "job_limit",
            "getRun",
            "job_limit",
            f"get, watch: most jobs in the detail, in job order; {limits.JOB_LIMIT.phrase()} "
            f"(a watch follows the live channel, which carries the first "
            f"{limits.JOB_LIMIT.default:,}).",
        ),
        Own("cursor", "string", "watch: the cursor the previous watch returned."),
        Own(
            "timeout_seconds",
            "number",
            "watch: return after this long if the run is not final yet.",
            low=1,
            high=WATCH_MAX_SECONDS,
            default=WATCH_DEFAULT_SECONDS,
        ),
    )
)
FOOTAGE_ARGUMENTS = ToolArguments(
    (
        RequestField("camera_id", "requestPhoto", "camera_id", "The camera.", required=True),
        RequestField(
            "time",
            "requestPhoto",
            "time",
            "The instant wanted: RFC 3339 with an offset, 2026-11-29T08:00:07Z.",
            required=True,
        ),
        Own(
            "timeout_seconds",
            "number",
            "Return after this long if the photo is not taken yet.",
            low=1,
            high=PHOTO_MAX_SECONDS,
            default=PHOTO_DEFAULT_SECONDS,
        ),
    )
)

Body = Callable[[Context[Any, Any], dict[str, Any]], Awaitable[CallToolResult]]


@dataclasses.dataclass(frozen=True)
class AgentTool:
    """One tool: what tools/list says of it, and its body, which gets the arguments as
    `arguments.read` returns them."""

    name: str
    description: str
    arguments: ToolArguments
    output: type[BaseModel]
    body: Body

    def listed(self) -> Tool:
        return Tool(
            name=self.name,
            description=self.description,
            input_schema=self.arguments.schema(),
            output_schema=self.output.model_json_schema(),
        )


def agent_tools(tools: AgentTools) -> tuple[AgentTool, ...]:
    """`runs` and `footage` on `tools`."""

    async def runs(ctx: Context[Any, Any], args: dict[str, Any]) -> CallToolResult:
        async def report(percent: int) -> None:
            await ctx.report_progress(percent, 100, f"{args['id']}: {percent}%")

        try:
            answer = await tools.runs(secret_of(ctx), args["action"], args, report)
        except (UpstreamError, errors.WorkshopError) as error:
            return refused(error)
        return answered(RunsResult(**answer).model_dump(mode="json", exclude_none=True))

    async def footage(ctx: Context[Any, Any], args: dict[str, Any]) -> CallToolResult:
        try:
            result, block = await tools.footage(
                secret_of(ctx), args["camera_id"], args["time"], args["timeout_seconds"]
            )
        except (UpstreamError, errors.WorkshopError) as error:
            return refused(error)
        structured = FootageResult(**result).model_dump(mode="json", exclude_none=True)
        return answered(structured, *([block] if block is not None else []))

    return (
        AgentTool(
            "runs",
            "Workshop runs: create one (with a client-chosen id, safe to retry), list them, "
            "get one (status, counts, jobs, and `waiting_behind`: the older runs a queued run "
            "waits for), watch one until it finishes (bounded per call: call again with the "
            "returned cursor; progress notifications 0-100 meanwhile), or cancel one.",
            RUNS_ARGUMENTS,
            RunsResult,
            runs,
        ),
        AgentTool(
            "footage",
            "A photo: one camera's frame at one instant, from its stored recordings. Waits "
            "until it is taken and returns it as an image (JPEG) with when it expires.",
            FOOTAGE_ARGUMENTS,
            FootageResult,
            footage,
        ),
    )
