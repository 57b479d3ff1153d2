"""`workshop devices|runtimes|models|keys|users|buckets`: OperatorService (and for bucket
items and exports WorkshopService and PreviewService) with an admin key."""

from __future__ import annotations

import getpass
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import grpc
import typer
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from tools.cli.context import Options, fail, options, run
from tools.cli.output import as_dict, emit
from tools.cli.paging import WHOLE_PAGE, limit_option
from workshop.kit.cli import Metadata
from workshop.v1 import (
    common_pb2,
    evaluation_pb2,
    operator_pb2_grpc,
    preview_pb2,
    preview_pb2_grpc,
    run_pb2,
    workshop_pb2_grpc,
)
from workshop.v1 import operator_pb2 as op
from workshop.v1 import workshop_pb2 as ws

devices = typer.Typer(help="Register and list devices (GPU hosts).", no_args_is_help=True)
runtimes = typer.Typer(
    help="Register and list runtimes (processor code on a device).", no_args_is_help=True
)
models = typer.Typer(help="Publish, list and evaluate model versions.", no_args_is_help=True)
keys = typer.Typer(help="Create, list and revoke keys.", no_args_is_help=True)
users = typer.Typer(help="Create and disable users; set a password.", no_args_is_help=True)
buckets = typer.Typer(
    help="Create and list buckets; list, correct, decide and export their items; review "
    "their sightings across runs (queue) and decide many at once (bulk-decide).",
    no_args_is_help=True,
)

SCOPES = {
    "workshop": common_pb2.SCOPE_WORKSHOP,
    "footage:read": common_pb2.SCOPE_FOOTAGE_READ,
    "workshop:run": common_pb2.SCOPE_WORKSHOP_RUN,
    "admin": common_pb2.SCOPE_ADMIN,
    "service": common_pb2.SCOPE_SERVICE,
    "gateway": common_pb2.SCOPE_GATEWAY,
}
SCOPE_NAMES = {value: name for name, value in SCOPES.items()}
REVIEW_STATES = {
    "pending": common_pb2.REVIEW_STATE_PENDING,
    "accepted": common_pb2.REVIEW_STATE_ACCEPTED,
    "rejected": common_pb2.REVIEW_STATE_REJECTED,
}
REVIEW_NAMES = {value: name for name, value in REVIEW_STATES.items()}
FORMATS = {"coco": run_pb2.DATASET_FORMAT_COCO, "yolo": run_pb2.DATASET_FORMAT_YOLO}


def _operator(channel: grpc.aio.Channel) -> operator_pb2_grpc.OperatorServiceStub:
    return operator_pb2_grpc.OperatorServiceStub(channel)


def _unary(opts: Options, rpc: str, request: Message) -> Any:
    """One OperatorService call by name."""

    async def call(channel: grpc.aio.Channel, md: Metadata) -> Any:
        return await getattr(_operator(channel), rpc)(request, metadata=md)

    return run(opts, call)


def _workshop(opts: Options, rpc: str, request: Message) -> Any:
    """One WorkshopService call by name."""

    async def call(channel: grpc.aio.Channel, md: Metadata) -> Any:
        return await getattr(workshop_pb2_grpc.WorkshopServiceStub(channel), rpc)(
            request, metadata=md
        )

    return run(opts, call)


def _listing(
    opts: Options,
    items: list[Message],
    row: Callable[[Any], dict[str, Any]],
    title: str,
) -> None:
    emit(opts, [as_dict(item) for item in items], table=[row(i) for i in items], title=title)


# devices -----------------------------------------------------------------------------------


@devices.command("register")
def device_register(
    ctx: typer.Context,
    device_id: str = typer.Argument(..., help="device id, e.g. gpu-box"),
    description: str = typer.Option("", help="what it is, for people"),
) -> None:
    """Register a device (idempotent)."""
    reply = _unary(
        options(ctx),
        "RegisterDevice",
        op.RegisterDeviceRequest(device_id=device_id, description=description),
    )
    emit(options(ctx), as_dict(reply.device))


@devices.command("list")
def device_list(ctx: typer.Context) -> None:
    """List registered devices."""
    reply = _unary(options(ctx), "ListDevices", op.ListDevicesRequest(page_size=WHOLE_PAGE))
    _listing(
        options(ctx),
        list(reply.devices),
        lambda d: {
            "device": d.device_id,
            "description": d.description,
            "registered": d.registered_at.ToJsonString(),
        },
        "devices",
    )


# runtimes ----------------------------------------------------------------------------------


def runtime_row(r: Any) -> dict[str, Any]:
    return {
        "runtime": r.runtime_id,
        "device": r.device_id,
        "engine": r.engine,
        "code_sha256": r.code_sha256[:12],
        "capabilities": ",".join(r.capabilities),
        "last seen": r.last_seen_at.ToJsonString() if r.HasField("last_seen_at") else "never",
    }


@runtimes.command("list")
def runtime_list(
    ctx: typer.Context, device: str = typer.Option("", help="only this device's runtimes")
) -> None:
    """List registered runtimes, with when each last checked in."""
    reply = _unary(
        options(ctx), "ListRuntimes", op.ListRuntimesRequest(device_id=device, page_size=WHOLE_PAGE)
    )
    _listing(options(ctx), list(reply.runtimes), runtime_row, "runtimes")


@runtimes.command("register")
def runtime_register(
    ctx: typer.Context, device: str = typer.Option(..., help="registered device id")
) -> None:
    """Register this checkout's processor code on a device (what `python -m services.processor
    register-runtime` does)."""
    from workshop.kit.processor_manifest import registration  # the processor's own manifest

    reply = _unary(options(ctx), "RegisterRuntime", registration(device))
    emit(
        options(ctx),
        {
            "runtime_id": reply.runtime.runtime_id,
            "created": reply.created,
            "manifest": json.loads(reply.manifest_json),
        },
    )


# models ------------------------------------------------------------------------------------


@models.command("list")
def model_list(
    ctx: typer.Context, name: str = typer.Option("", help="only this model's versions")
) -> None:
    """List published model versions."""
    reply = _unary(
        options(ctx), "ListModelVersions", op.ListModelVersionsRequest(page_size=WHOLE_PAGE)
    )
    versions = [v for v in reply.model_versions if not name or v.name == name]
    _listing(
        options(ctx),
        versions,
        lambda v: {
            "model": v.name,
            "version": v.version,
            "weights_sha256": v.weights_sha256[:12],
            "classes": ",".join(v.classes),
            "input": "x".join(str(n) for n in v.input_shape),
        },
        "model versions",
    )


@models.command(
    "publish", context_settings={"ignore_unknown_options": True, "allow_extra_args": True}
)
def model_publish(ctx: typer.Context) -> None:
    """Publish a model version into a Triton repository and register it: the options of
    `python -m tools.model_repository publish` (--repository, --name, --version, --onnx with
    --classes or --demo-detector, --backend, ...), with this command's coordinator and key."""
    from tools.model_repository.__main__ import main as publish

    opts = options(ctx)
    argv = ["publish", *ctx.args]
    if opts.coordinator:
        argv += ["--coordinator", opts.coordinator, "--key", opts.secret()]
    publish(argv)


@models.command("evaluate")
def model_evaluate(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="model name"),
    version: int = typer.Argument(..., help="the published version"),
    bucket: str = typer.Option(..., "--bucket", help="the bucket whose boxes are the truth"),
    processor: str = typer.Option(
        "",
        "--processor",
        envvar="WORKSHOP_PROCESSOR",
        help="a processor's gRPC address: it runs the evaluation beside its Triton "
        "(EvaluationService); or --triton to run it here",
    ),
    triton: str = typer.Option(
        "", "--triton", envvar="WORKSHOP_TRITON", help="the Triton serving the version"
    ),
    repository: Path | None = typer.Option(
        None, "--repository", help="Triton's model repository, to check the weights' pins"
    ),
    review: list[str] = typer.Option([], help="review states (default: accepted only)"),
    baseline: str = typer.Option(
        "",
        help="NAME:VERSION to compare with (default: the version the bucket's items came "
        "from, read from their runs' snapshots); 'none' for no comparison",
    ),
    workers: int = typer.Option(4, min=1, max=64, help="images in flight at once"),
) -> None:
    """Score a published version against a bucket's reviewed boxes (pycocotools: AP50-95,
    AP50, precision and recall by class), side by side with the version the bucket's items
    came from: on a processor (--processor, which checks the weights against its model
    repository) or here, through the Triton serving both (--triton; needs --coordinator and
    --preview)."""
    from tools.cli.evaluation import evaluate_here, evaluate_on
    from workshop.kit.evaluation_plan import report_json

    if bool(processor) == bool(triton):
        raise typer.BadParameter(
            "one of --processor (a processor runs it) or --triton (run it here)",
            param_hint="--processor / --triton",
        )
    if processor and repository is not None:
        raise typer.BadParameter(
            "the processor checks its own model repository", param_hint="--repository"
        )
    opts = options(ctx)
    ask = evaluation_pb2.EvaluateModelVersionRequest(
        model_name=name,
        version=version,
        bucket_id=bucket,
        review_states=_filter(run_pb2.BucketItemFilter, review, "", "").review_states,
        workers=workers,
    )
    if baseline == "none":
        ask.no_baseline = True
    elif baseline:
        model, _, number = baseline.rpartition(":")
        if not model or not number.isdigit():
            raise typer.BadParameter("NAME:VERSION or none", param_hint="--baseline")
        ask.baseline_version.model_name, ask.baseline_version.version = model, int(number)
    if processor:
        report = evaluate_on(opts, processor, ask)
    else:
        report = evaluate_here(opts, triton, ask, repository)
    result = report_json(report)
    emit(opts, result, table=_side_by_side(result, result["baseline"]), title=_title(result))


def _title(result: dict[str, Any]) -> str:
    def line(f: dict[str, Any]) -> str:
        return (
            f"{f['model']} v{f['version']}: AP50-95 {f['ap50_95']}, AP50 {f['ap50']}, "
            f"precision {f['precision']}, recall {f['recall']}"
        )

    text = (
        f"bucket {result['bucket']} ({result['images']} images, "
        f"{result['ground_truth_boxes']} boxes, {result['items_per_second']} items/s)\n"
        + line(result)
    )
    base = result["baseline"]
    if base is not None:
        text += f"\n{line(base)} (baseline: {base['items_from_it']} items came from it)"
    return text


def _side_by_side(figures: dict[str, Any], baseline: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A row a class: the version's figures, then the baseline's beside them."""
    rows = []
    names = list(figures["classes"])
    names += [c for c in (baseline or {}).get("classes", {}) if c not in names]
    for name in names:
        row: dict[str, Any] = {"class": name}
        own = ""
        sides = [("", figures)]
        if baseline is not None:
            same = baseline["model"] == figures["model"]
            own = f" v{figures['version']}" if same else f" {figures['model']}"
            sides.append(
                (f" v{baseline['version']}" if same else f" {baseline['model']}", baseline)
            )
        truth = figures["classes"].get(name) or (baseline or {})["classes"][name]
        row["ground_truth"] = truth["ground_truth"]  # the same truth on both sides
        for key in ("ap50_95", "ap50", "precision", "recall", "detections"):
            for label, side in sides:
                row[key + (label or own)] = side["classes"].get(name, {}).get(key, "")
        rows.append(row)
    return rows


# keys --------------------------------------------------------------------------------------


def parse_scope(text: str) -> common_pb2.KeyScope:
    """`NAME[@DEVICE][=CAMERA,CAMERA]`, e.g. `workshop`, `workshop:run@gpu-box`,
    `footage:read=cam-a,cam-b`."""
    head, _, cameras = text.partition("=")
    name, _, device = head.partition("@")
    if name not in SCOPES:
        raise typer.BadParameter(
            f"unknown scope {name!r}; one of {', '.join(SCOPES)}", param_hint="--scope"
        )
    return common_pb2.KeyScope(
        scope=SCOPES[name],
        device_id=device,
        camera_ids=[c for c in cameras.split(",") if c],
    )


def scope_text(scope: common_pb2.KeyScope) -> str:
    text = SCOPE_NAMES.get(scope.scope, str(scope.scope))
    if scope.device_id:
        text += f"@{scope.device_id}"
    if scope.camera_ids:
        text += "=" + ",".join(scope.camera_ids)
    return text


def key_row(k: Any) -> dict[str, Any]:
    return {
        "key": k.key_id,
        "name": k.name,
        "scopes": " ".join(scope_text(s) for s in k.scopes),
        "user": k.user_id,
        "created": k.created_at.ToJsonString(),
        "revoked": k.revoked_at.ToJsonString() if k.HasField("revoked_at") else "",
    }


@keys.command("create")
def key_create(
    ctx: typer.Context,
    name: str = typer.Option(..., help="a label for the key"),
    scope: list[str] = typer.Option(
        ...,
        help="NAME[@DEVICE][=CAMERA,...], repeatable: workshop, footage:read=cam-a, "
        "workshop:run@gpu-box, admin",
    ),
    user: str = typer.Option("", help="the user the key acts for (Agent keys)"),
    ttl_days: float | None = typer.Option(None, help="expires after this many days"),
) -> None:
    """Create a key; its secret is printed once."""
    request = op.CreateKeyRequest(name=name, scopes=[parse_scope(s) for s in scope], user_id=user)
    if ttl_days is not None:
        request.ttl.FromTimedelta(timedelta(days=ttl_days))
    reply = _unary(options(ctx), "CreateKey", request)
    emit(
        options(ctx),
        {"key": as_dict(reply.key), "secret": reply.secret},
        table=[key_row(reply.key) | {"secret (shown once)": reply.secret}],
    )


@keys.command("list")
def key_list(
    ctx: typer.Context, include_revoked: bool = typer.Option(False, help="list revoked too")
) -> None:
    """List keys (never their secrets)."""
    reply = _unary(
        options(ctx),
        "ListKeys",
        op.ListKeysRequest(include_revoked=include_revoked, page_size=WHOLE_PAGE),
    )
    _listing(options(ctx), list(reply.keys), key_row, "keys")


@keys.command("revoke")
def key_revoke(ctx: typer.Context, key_id: str = typer.Argument(..., help="key id")) -> None:
    """Revoke a key: every call with it is refused from now on."""
    reply = _unary(options(ctx), "RevokeKey", op.RevokeKeyRequest(key_id=key_id))
    emit(options(ctx), as_dict(reply.key), table=[key_row(reply.key)])


# users -------------------------------------------------------------------------------------


def user_row(u: Any) -> dict[str, Any]:
    return {
        "user": u.user_id,
        "name": u.display_name,
        "disabled": u.disabled,
        "has password": u.has_password,
    }


@users.command("create")
def user_create(
    ctx: typer.Context,
    user_id: str = typer.Argument(..., help="user id"),
    display_name: str = typer.Option("", help="name shown in the website"),
) -> None:
    """Create a user (no password yet: see `users set-password`)."""
    reply = _unary(
        options(ctx), "CreateUser", op.CreateUserRequest(user_id=user_id, display_name=display_name)
    )
    emit(options(ctx), as_dict(reply.user), table=[user_row(reply.user)])


@users.command("disable")
def user_disable(ctx: typer.Context, user_id: str = typer.Argument(..., help="user id")) -> None:
    """Disable a user: their sessions and keys stop working."""
    reply = _unary(options(ctx), "DisableUser", op.DisableUserRequest(user_id=user_id))
    emit(options(ctx), as_dict(reply.user), table=[user_row(reply.user)])


@users.command("set-password")
def user_set_password(
    ctx: typer.Context,
    user_id: str = typer.Argument(..., help="user id"),
    password_stdin: bool = typer.Option(
        False, "--password-stdin", help="read the password from stdin's first line"
    ),
) -> None:
    """Set a user's website password: typed twice at a prompt that does not echo, or with
    --password-stdin from stdin. Never from the arguments."""
    if password_stdin:
        password = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    else:
        password = getpass.getpass(f"New password for {user_id}: ")
        if getpass.getpass("Again: ") != password:
            fail("INVALID_FIELD", "the two passwords differ; nothing was changed")
    reply = _unary(
        options(ctx),
        "SetUserPassword",
        op.SetUserPasswordRequest(user_id=user_id, password=password),
    )
    emit(options(ctx), as_dict(reply.user), table=[user_row(reply.user)])


# buckets -----------------------------------------------------------------------------------


@buckets.command("create")
def bucket_create(
    ctx: typer.Context,
    bucket_id: str = typer.Argument(..., help="bucket id"),
    name: str = typer.Option("", help="display name"),
) -> None:
    """Create a bucket (idempotent)."""
    reply = _unary(
        options(ctx), "CreateBucket", op.CreateBucketRequest(bucket_id=bucket_id, name=name)
    )
    emit(options(ctx), as_dict(reply.bucket))


@buckets.command("list")
def bucket_list(ctx: typer.Context) -> None:
    """List buckets."""
    reply = _unary(options(ctx), "ListBuckets", op.ListBucketsRequest(page_size=WHOLE_PAGE))
    _listing(
        options(ctx),
        list(reply.buckets),
        lambda b: {"bucket": b.bucket_id, "name": b.name},
        "buckets",
    )


# The two filters the options build: a bucket's items, and the review queue's sightings.
FilterT = TypeVar("FilterT", run_pb2.BucketItemFilter, ws.SightingFilter)


def _filter(
    kind: type[FilterT],
    review: list[str],
    class_name: str,
    camera: str,
    *,
    run_id: str = "",
    since: str = "",
    until: str = "",
    min_score: float | None = None,
    max_score: float | None = None,
) -> FilterT:
    unknown = [r for r in review if r not in REVIEW_STATES]
    if unknown:
        raise typer.BadParameter(
            f"unknown review state {unknown[0]!r}; one of {', '.join(REVIEW_STATES)}",
            param_hint="--review",
        )
    return kind(
        review_states=[REVIEW_STATES[r] for r in review],
        class_name=class_name,
        camera_id=camera,
        run_id=run_id,
        frame_time_from=_instant(since, "--from"),
        frame_time_to=_instant(until, "--to"),
        min_score=min_score,
        max_score=max_score,
    )


# The run and score filters of a bucket's items (buckets items and export, datasets freeze).
RUN_OPTION = typer.Option("", "--run", help="only this run's items")
MIN_SCORE_OPTION = typer.Option(
    None,
    "--min-score",
    help="only items whose highest detected box score is at least this (0 without boxes)",
)
MAX_SCORE_OPTION = typer.Option(None, "--max-score", help="only items whose score is at most this")


@buckets.command("items")
def bucket_items(
    ctx: typer.Context,
    bucket_id: str = typer.Argument(..., help="bucket id"),
    review: list[str] = typer.Option([], help="pending, accepted or rejected (repeatable)"),
    class_name: str = typer.Option("", "--class", help="only items with a box of this class"),
    camera: str = typer.Option("", help="only this camera's items"),
    run_id: str = RUN_OPTION,
    since: str = typer.Option("", "--from", help="only frames at or after this instant (RFC 3339)"),
    until: str = typer.Option("", "--to", help="only frames before this instant (RFC 3339)"),
    min_score: float | None = MIN_SCORE_OPTION,
    max_score: float | None = MAX_SCORE_OPTION,
    limit: int = limit_option("oldest frame first"),
) -> None:
    """List a bucket's items (ListBucketItems)."""
    opts = options(ctx)
    wanted = _filter(
        run_pb2.BucketItemFilter,
        review,
        class_name,
        camera,
        run_id=run_id,
        since=since,
        until=until,
        min_score=min_score,
        max_score=max_score,
    )
    request = ws.ListBucketItemsRequest(bucket_id=bucket_id, filter=wanted, page_size=limit)

    reply = _workshop(opts, "ListBucketItems", request)
    _listing(
        opts,
        list(reply.items),
        lambda i: {
            "item": i.item_id,
            "run": i.run_id,
            "camera": i.camera_id,
            "frame": i.frame_time.ToJsonString(),
            "boxes": len(i.boxes),
            "review": REVIEW_NAMES.get(i.review_state, "unspecified"),
        },
        f"bucket {bucket_id}",
    )


@buckets.command("item")
def bucket_item(
    ctx: typer.Context, item_id: str = typer.Argument(..., help="bucket item id")
) -> None:
    """One item with its history: detections, corrections and their undos, decisions on it
    alone, its sightings' decisions (GetBucketItem)."""
    opts = options(ctx)
    request = ws.GetBucketItemRequest(item_id=item_id)

    async def call(channel: grpc.aio.Channel, md: Metadata) -> ws.GetBucketItemResponse:
        reply: ws.GetBucketItemResponse = await workshop_pb2_grpc.WorkshopServiceStub(
            channel
        ).GetBucketItem(request, metadata=md)
        return reply

    reply = run(opts, call)
    emit(opts, as_dict(reply), table=_history(reply), title=f"item {item_id}")


def _history(reply: ws.GetBucketItemResponse) -> list[dict[str, Any]]:
    """The item's history for people, one event a row, oldest first within each kind."""
    item = reply.item
    rows = [
        {
            "when": item.saved_at.ToJsonString(),
            "what": f"saved with {len(item.boxes)} detected boxes (kept as they were)",
            "by": "",
        }
    ]
    for c in reply.corrections:
        rows.append(
            {
                "when": c.corrected_at.ToJsonString(),
                "what": f"revision {c.revision}: corrected to {len(c.boxes)} boxes",
                "by": c.corrected_by.display_name,
            }
        )
        if c.HasField("undone_at"):
            rows.append(
                {
                    "when": c.undone_at.ToJsonString(),
                    "what": f"revision {c.revision}'s correction undone",
                    "by": c.undone_by.display_name,
                }
            )
    for d in reply.item_decisions:
        state = REVIEW_NAMES.get(d.review_state)
        what = "cleared: follows its sightings" if state is None else f"frame {state}"
        if d.HasField("relabel_class"):
            what += f" as {d.relabel_class}"
        rows.append(
            {
                "when": d.decided_at.ToJsonString(),
                "what": f"revision {d.revision}: {what}",
                "by": d.decided_by.display_name,
            }
        )
    for s in reply.sightings:
        state = REVIEW_NAMES.get(s.review_state, "unspecified")
        relabel = f" as {s.relabel_class}" if s.HasField("relabel_class") else ""
        rows.append(
            {
                "when": s.decided_at.ToJsonString() if s.HasField("decided_at") else "",
                "what": f"sighting {s.sighting_id} ({s.class_name}): {state}{relabel}",
                "by": s.decided_by.display_name if s.HasField("decided_by") else "",
            }
        )
    return rows


DECISIONS = {
    "confirm": ws.REVIEW_DECISION_CONFIRM,
    "none": ws.REVIEW_DECISION_NONE,
    "relabel": ws.REVIEW_DECISION_RELABEL,
}
EXPECTED_REVISION_HELP = (
    "the item's revision you saw (refused with STALE_REVISION when another reviewer changed it)"
)


def _correction_box(text: str) -> ws.BoxCorrectionInput:
    """SOURCE:CLASS:X,Y,W,H (SOURCE the detected box's index, -1 for a box added)."""
    try:
        source, class_name, geometry = text.split(":", 2)
        x, y, w, h = (float(value) for value in geometry.split(","))
        return ws.BoxCorrectionInput(
            source_box_index=int(source), class_name=class_name, x=x, y=y, w=w, h=h
        )
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not SOURCE:CLASS:X,Y,W,H (e.g. 0:person:0.1,0.2,0.3,0.4; "
            "-1 as SOURCE adds a box)",
            param_hint="--box",
        ) from None


def _revision(value: int | None) -> dict[str, int]:
    return {} if value is None else {"expected_revision": value}


def _item_call(ctx: typer.Context, rpc: str, request: Message) -> None:
    """Calls a WorkshopService RPC answering an item and prints the item."""
    opts = options(ctx)
    emit(opts, as_dict(_workshop(opts, rpc, request).item))


@buckets.command("correct")
def bucket_item_correct(
    ctx: typer.Context,
    item_id: str = typer.Argument(..., help="bucket item id"),
    box: list[str] = typer.Option(
        [],
        "--box",
        help="a box of the correction, SOURCE:CLASS:X,Y,W,H (repeatable; SOURCE -1 adds a "
        "box; a detected box left out is deleted; none: delete every box)",
    ),
    expected_revision: int | None = typer.Option(None, help=EXPECTED_REVISION_HELP),
) -> None:
    """Correct a bucket item's boxes (CorrectItemBoxes); the detected boxes are kept."""
    request = ws.CorrectItemBoxesRequest(
        item_id=item_id,
        boxes=[_correction_box(text) for text in box],
        **_revision(expected_revision),
    )
    _item_call(ctx, "CorrectItemBoxes", request)


@buckets.command("undo-correction")
def bucket_item_undo(
    ctx: typer.Context,
    item_id: str = typer.Argument(..., help="bucket item id"),
    expected_revision: int | None = typer.Option(None, help=EXPECTED_REVISION_HELP),
) -> None:
    """Undo an item's last correction (UndoItemCorrection)."""
    request = ws.UndoItemCorrectionRequest(item_id=item_id, **_revision(expected_revision))
    _item_call(ctx, "UndoItemCorrection", request)


@buckets.command("decide")
def bucket_item_decide(
    ctx: typer.Context,
    item_id: str = typer.Argument(..., help="bucket item id"),
    decision: str = typer.Argument(..., help="confirm, none or relabel"),
    class_name: str = typer.Option("", "--class", help="relabel: the class"),
    expected_revision: int | None = typer.Option(None, help=EXPECTED_REVISION_HELP),
) -> None:
    """Decide one item apart from its sightings (DecideItem)."""
    if decision not in DECISIONS:
        raise typer.BadParameter("must be confirm, none or relabel", param_hint="DECISION")
    request = ws.DecideItemRequest(
        item_id=item_id,
        decision=DECISIONS[decision],
        class_name=class_name,
        **_revision(expected_revision),
    )
    _item_call(ctx, "DecideItem", request)


@buckets.command("clear-decision")
def bucket_item_clear(
    ctx: typer.Context,
    item_id: str = typer.Argument(..., help="bucket item id"),
    expected_revision: int | None = typer.Option(None, help=EXPECTED_REVISION_HELP),
) -> None:
    """Clear an item decision: the item follows its sightings again (ClearItemDecision)."""
    request = ws.ClearItemDecisionRequest(item_id=item_id, **_revision(expected_revision))
    _item_call(ctx, "ClearItemDecision", request)


QUEUE_ORDERS = {
    "oldest": ws.QUEUE_ORDER_OLDEST,
    "lowest-score": ws.QUEUE_ORDER_LOWEST_SCORE,
    "camera": ws.QUEUE_ORDER_CAMERA,
}


def _instant(text: str, hint: str) -> Timestamp | None:
    """An RFC 3339 instant (a date and time with its offset, or Z)."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise typer.BadParameter(
            f"{text!r} is not an instant with its offset (e.g. 2026-05-04T08:00:00Z)",
            param_hint=hint,
        )
    stamp = Timestamp()
    stamp.FromDatetime(moment.astimezone(UTC))
    return stamp


# The sighting filter's options (`_filter` of a SightingFilter), one definition for `buckets queue`
# and `buckets bulk-decide` (typer copies an option's definition for each command).
REVIEW_OPTION = typer.Option(
    [], "--review", help="pending, accepted or rejected (repeatable; default pending)"
)
CLASS_OPTION = typer.Option("", "--class", help="only sightings of this class as detected")
CAMERA_OPTION = typer.Option("", "--camera", help="only this camera's sightings")
RUN_OPTION = typer.Option("", "--run", help="only this run's sightings")
FROM_OPTION = typer.Option(
    "", "--from", help="only sightings starting at or after this instant (RFC 3339)"
)
TO_OPTION = typer.Option("", "--to", help="only sightings starting before this instant (RFC 3339)")
MIN_SCORE_OPTION = typer.Option(None, "--min-score", help="only sightings scoring at least this")
MAX_SCORE_OPTION = typer.Option(None, "--max-score", help="only sightings scoring at most this")


@buckets.command("queue")
def bucket_queue(
    ctx: typer.Context,
    bucket_id: str = typer.Argument(..., help="bucket id"),
    order: str = typer.Option("oldest", help="oldest, lowest-score or camera"),
    review: list[str] = REVIEW_OPTION,
    class_name: str = CLASS_OPTION,
    camera: str = CAMERA_OPTION,
    run_id: str = RUN_OPTION,
    since: str = FROM_OPTION,
    until: str = TO_OPTION,
    min_score: float | None = MIN_SCORE_OPTION,
    max_score: float | None = MAX_SCORE_OPTION,
    limit: int = typer.Option(10, min=1, max=100, help="at most this many (1..100)"),
) -> None:
    """The next sightings of a bucket's review queue, across runs (GetReviewQueue); decide
    one with DecideSighting (the API), or many with `buckets bulk-decide`."""
    if order not in QUEUE_ORDERS:
        raise typer.BadParameter("must be oldest, lowest-score or camera", param_hint="--order")
    opts = options(ctx)
    request = ws.GetReviewQueueRequest(
        bucket_id=bucket_id,
        filter=_filter(
            ws.SightingFilter,
            review,
            class_name,
            camera,
            run_id=run_id,
            since=since,
            until=until,
            min_score=min_score,
            max_score=max_score,
        ),
        order=QUEUE_ORDERS[order],
        page_size=limit,
    )

    reply = _workshop(opts, "GetReviewQueue", request)
    _listing(
        opts,
        list(reply.sightings),
        lambda q: {
            "run": q.run_id,
            "sighting": q.sighting.sighting_id,
            "camera": q.sighting.camera_id,
            "class": q.sighting.class_name,
            "first": q.sighting.first_frame_time.ToJsonString(),
            "items": len(q.sighting.item_ids),
            "score": f"{q.score:.2f}",
            "review": REVIEW_NAMES.get(q.sighting.review_state, "unspecified"),
            "decided by": q.sighting.decided_by.display_name
            if q.sighting.HasField("decided_by")
            else "",
        },
        f"review queue of bucket {bucket_id}",
    )


@buckets.command("bulk-decide")
def bucket_bulk_decide(
    ctx: typer.Context,
    bucket_id: str = typer.Argument(..., help="bucket id"),
    decision: str = typer.Argument(..., help="confirm, none or relabel"),
    relabel: str = typer.Option("", "--relabel", help="relabel: the new class"),
    review: list[str] = REVIEW_OPTION,
    class_name: str = CLASS_OPTION,
    camera: str = CAMERA_OPTION,
    run_id: str = RUN_OPTION,
    since: str = FROM_OPTION,
    until: str = TO_OPTION,
    min_score: float | None = MIN_SCORE_OPTION,
    max_score: float | None = MAX_SCORE_OPTION,
    dry_run: bool = typer.Option(False, "--dry-run", help="say what would change; change nothing"),
    expect: str = typer.Option(
        "",
        "--expect",
        help="the selection_revision of a --dry-run: refused (STALE_REVISION) when the "
        "selection changed since",
    ),
) -> None:
    """Decide every sighting of a bucket a filter selects, as one action that
    `buckets undo-bulk` undoes (BulkDecideSightings)."""
    if decision not in DECISIONS:
        raise typer.BadParameter("must be confirm, none or relabel", param_hint="DECISION")
    opts = options(ctx)
    request = ws.BulkDecideSightingsRequest(
        bucket_id=bucket_id,
        filter=_filter(
            ws.SightingFilter,
            review,
            class_name,
            camera,
            run_id=run_id,
            since=since,
            until=until,
            min_score=min_score,
            max_score=max_score,
        ),
        decision=DECISIONS[decision],
        class_name=relabel,
        dry_run=dry_run,
        expected_selection_revision=expect,
    )

    emit(opts, as_dict(_workshop(opts, "BulkDecideSightings", request)))


@buckets.command("undo-bulk")
def bucket_undo_bulk(
    ctx: typer.Context,
    action_id: str = typer.Argument(..., help="the action_id bulk-decide answered"),
) -> None:
    """Undo a bulk decision as one: its sightings' boxes go back to their review before
    (UndoBulkDecision)."""
    opts = options(ctx)
    request = ws.UndoBulkDecisionRequest(action_id=action_id)

    emit(opts, as_dict(_workshop(opts, "UndoBulkDecision", request)))


@buckets.command("export")
def bucket_export(
    ctx: typer.Context,
    bucket_id: str = typer.Argument(..., help="bucket id"),
    format: str = typer.Option("coco", help="coco or yolo"),
    out: Path | None = typer.Option(
        None, "--out", help="the tar file to write (default: the name the server gives)"
    ),
    review: list[str] = typer.Option([], help="review states (default: accepted only)"),
    class_name: str = typer.Option("", "--class", help="only items with a box of this class"),
    camera: str = typer.Option("", help="only this camera's items"),
    run_id: str = RUN_OPTION,
    min_score: float | None = MIN_SCORE_OPTION,
    max_score: float | None = MAX_SCORE_OPTION,
) -> None:
    """Export a bucket as a COCO or YOLO tar archive (PreviewService.ExportBucket; needs
    --preview / WORKSHOP_PREVIEW)."""
    opts = options(ctx)
    if format not in FORMATS:
        raise typer.BadParameter("must be coco or yolo", param_hint="--format")
    wanted = _filter(
        run_pb2.BucketItemFilter,
        review,
        class_name,
        camera,
        run_id=run_id,
        min_score=min_score,
        max_score=max_score,
    )
    request = preview_pb2.ExportBucketRequest(
        bucket_id=bucket_id, format=FORMATS[format], filter=wanted
    )

    async def call(channel: grpc.aio.Channel, md: Metadata) -> dict[str, Any]:
        stream = preview_pb2_grpc.PreviewServiceStub(channel).ExportBucket(request, metadata=md)
        # Chunks go to a part file beside the target, renamed once the last one arrived:
        # an export that breaks off never leaves a truncated archive under the name.
        target = out or Path(f"{bucket_id}-{format}.tar")
        part: Path | None = None
        size, items, last = 0, 0, False
        try:
            async for chunk in stream:
                if part is None:
                    target = out or Path(chunk.file_name or target.name)
                    part = target.with_name(target.name + ".part")
                    part.write_bytes(b"")
                with part.open("ab") as file:
                    file.write(chunk.data)
                size += len(chunk.data)
                if chunk.last:
                    items, last = chunk.items, True
            if part is None or not last:
                fail("UNAVAILABLE", "the export stream ended before its last chunk")
            part.replace(target)
        except OSError as error:
            fail("INVALID_FIELD", f"cannot write {target}: {error.strerror}")
        finally:
            if part is not None:
                part.unlink(missing_ok=True)
        return {"file": str(target), "bytes": size, "items": items}

    written = run(opts, call, service="preview")
    emit(opts, written)
    if not written["items"]:
        _nothing_exported(opts, bucket_id, review, class_name, camera)


def _nothing_exported(
    opts: Options, bucket_id: str, review: list[str], class_name: str, camera: str
) -> None:
    """Says on stderr why an export holds no item and what would give it some: the review
    states it took (accepted only, unless --review says otherwise) against those the
    bucket's items are in, when the coordinator can tell."""
    narrowed = "".join(
        f" of {what} {value}"
        for what, value in (("class", class_name), ("camera", camera))
        if value
    )
    counts = _review_counts(opts, bucket_id, class_name, camera)
    if counts is not None and not counts:
        print(
            f"workshop: nothing to export: bucket {bucket_id} holds no items{narrowed}; a full "
            f"run (`workshop runs create RUN_ID --workflow ID --mode full`) of a workflow whose "
            f"output step saves to {bucket_id} fills it",
            file=sys.stderr,
        )
        return
    took = review or ["accepted"]
    why = "" if review else " (the export takes accepted items only unless --review says otherwise)"
    wanted = " or ".join(took)
    text = f"workshop: nothing to export: no {wanted} items in bucket {bucket_id}{narrowed}{why}"
    others = {state: n for state, n in (counts or {}).items() if state not in took}
    if others:
        held = ", ".join(f"{n} {state}" for state, n in others.items())
        flags = " ".join(f"--review {state}" for state in [*took, *others])
        text += (
            f"; it holds {held}: accept items in review (the web console's review page), "
            f"or export them as they are with {flags}"
        )
    elif counts is None:
        text += f"; `workshop buckets items {bucket_id}` lists its items and their review state"
    print(text, file=sys.stderr)


def _review_counts(
    opts: Options, bucket_id: str, class_name: str, camera: str
) -> dict[str, int] | None:
    """Review state -> items of the bucket (of the first 1,000, the server's largest
    page); None when the coordinator is not known or does not answer: the export itself
    needed only the preview service."""
    if not opts.coordinator:
        return None
    request = ws.ListBucketItemsRequest(
        bucket_id=bucket_id,
        filter=_filter(run_pb2.BucketItemFilter, [], class_name, camera),
        page_size=WHOLE_PAGE,
    )

    async def call(channel: grpc.aio.Channel, md: Metadata) -> dict[str, int] | None:
        try:
            reply = await workshop_pb2_grpc.WorkshopServiceStub(channel).ListBucketItems(
                request, metadata=md
            )
        except grpc.aio.AioRpcError:
            return None
        counts: dict[str, int] = {}
        for item in reply.items:
            state = REVIEW_NAMES.get(item.review_state, "pending")
            counts[state] = counts.get(state, 0) + 1
        return counts

    return run(opts, call)
