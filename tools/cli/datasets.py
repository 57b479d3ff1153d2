"""`workshop datasets freeze|list|show|diff|versions|export`: dataset versions
(DatasetService; exports through PreviewService.ExportBucket). docs/datasets.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import typer

from tools.cli.context import fail, options, run
from tools.cli.operator import FORMATS, MAX_SCORE_OPTION, MIN_SCORE_OPTION, RUN_OPTION, _filter
from tools.cli.output import as_dict, emit
from workshop.kit.cli import Metadata
from workshop.v1 import dataset_pb2 as pb
from workshop.v1 import dataset_pb2_grpc, preview_pb2, preview_pb2_grpc, run_pb2

app = typer.Typer(
    help="Freeze buckets into dataset versions, compare and export them.", no_args_is_help=True
)
KINDS = {
    pb.DATASET_CHANGE_KIND_ADDED: "added",
    pb.DATASET_CHANGE_KIND_REMOVED: "removed",
    pb.DATASET_CHANGE_KIND_RELABELLED: "relabelled",
    pb.DATASET_CHANGE_KIND_BOXES_CHANGED: "boxes changed",
}


def _call(ctx: typer.Context, rpc: str, request: Any) -> Any:
    opts = options(ctx)

    async def call(channel: grpc.aio.Channel, md: Metadata) -> Any:
        stub = dataset_pb2_grpc.DatasetServiceStub(channel)
        return await getattr(stub, rpc)(request, metadata=md)

    return run(opts, call)


def _row(version: pb.DatasetVersion) -> dict[str, Any]:
    return {
        "version": version.version_id,
        "name": version.name,
        "items": version.item_count,
        "train": version.train_count,
        "val": version.val_count,
        "created": version.created_at.ToJsonString(),
    }


def _versions(ctx: typer.Context, versions: list[pb.DatasetVersion], title: str) -> None:
    emit(
        options(ctx),
        [as_dict(v) for v in versions],
        table=[_row(v) for v in versions],
        title=title,
    )


@app.command("freeze")
def freeze(
    ctx: typer.Context,
    bucket_id: str = typer.Argument(..., help="bucket id"),
    name: str = typer.Option(..., "--name", help="the version's name"),
    review: list[str] = typer.Option([], help="review states (default: accepted only)"),
    class_name: str = typer.Option("", "--class", help="only items with a box of this class"),
    camera: str = typer.Option("", help="only this camera's items"),
    run_id: str = RUN_OPTION,
    min_score: float | None = MIN_SCORE_OPTION,
    max_score: float | None = MAX_SCORE_OPTION,
    seed: int = typer.Option(0, help="seed of the train/val split"),
    val_fraction: float = typer.Option(0.2, help="share of items in val, 0 <= f < 1"),
) -> None:
    """Freeze a bucket's reviewed items into a version (CreateDatasetVersion); the same
    content answers the same version."""
    request = pb.CreateDatasetVersionRequest(
        bucket_id=bucket_id,
        name=name,
        filter=_filter(
            run_pb2.BucketItemFilter,
            review,
            class_name,
            camera,
            run_id=run_id,
            min_score=min_score,
            max_score=max_score,
        ),
        seed=seed,
        val_fraction=val_fraction,
    )
    answer = _call(ctx, "CreateDatasetVersion", request)
    emit(options(ctx), {**as_dict(answer.version), "created": answer.created})


@app.command("list")
def list_versions(
    ctx: typer.Context, bucket_id: str = typer.Argument(..., help="bucket id")
) -> None:
    """A bucket's versions, newest first (ListDatasetVersions, every page)."""
    versions: list[pb.DatasetVersion] = []
    token = ""
    while True:
        page = _call(
            ctx,
            "ListDatasetVersions",
            pb.ListDatasetVersionsRequest(bucket_id=bucket_id, page_size=1000, page_token=token),
        )
        versions.extend(page.versions)
        token = page.next_page_token
        if not token:
            break
    _versions(ctx, versions, f"versions of {bucket_id}")


@app.command("show")
def show(ctx: typer.Context, version_id: str = typer.Argument(..., help="version id")) -> None:
    """One version (GetDatasetVersion)."""
    answer = _call(ctx, "GetDatasetVersion", pb.GetDatasetVersionRequest(version_id=version_id))
    emit(options(ctx), as_dict(answer.version))


@app.command("versions")
def item_versions(ctx: typer.Context, item_id: str = typer.Argument(..., help="item id")) -> None:
    """The versions that hold an item (ListItemVersions)."""
    answer = _call(ctx, "ListItemVersions", pb.ListItemVersionsRequest(item_id=item_id))
    _versions(ctx, list(answer.versions), f"versions holding {item_id}")


@app.command("diff")
def diff(
    ctx: typer.Context,
    from_version: str = typer.Argument(..., help="the older version"),
    to_version: str = typer.Argument(..., help="the newer version"),
) -> None:
    """What changed between two versions, item by item (DiffDatasetVersions, every page)."""
    changes: list[pb.DatasetItemChange] = []
    counts: pb.DatasetDiffCounts | None = None
    token = ""
    while True:
        page = _call(
            ctx,
            "DiffDatasetVersions",
            pb.DiffDatasetVersionsRequest(
                from_version_id=from_version,
                to_version_id=to_version,
                page_size=1000,
                page_token=token,
            ),
        )
        counts = counts or page.counts
        changes.extend(page.changes)
        token = page.next_page_token
        if not token:
            break
    value = {"counts": as_dict(counts) if counts else {}, "changes": [as_dict(c) for c in changes]}
    if options(ctx).json:
        emit(options(ctx), value)
        return
    emit(
        options(ctx),
        value,
        table=[
            {
                "item": c.item_id,
                "change": KINDS.get(c.kind, "?"),
                "before": ", ".join(b.class_name for b in c.before),
                "after": ", ".join(b.class_name for b in c.after),
            }
            for c in changes
        ],
        title=f"{from_version} -> {to_version}",
    )


@app.command("export")
def export(
    ctx: typer.Context,
    version_id: str = typer.Argument(..., help="version id"),
    format: str = typer.Option("yolo", help="coco or yolo"),
    out: Path | None = typer.Option(
        None, "--out", help="the tar file (default: the server's name)"
    ),
) -> None:
    """Download a version's archive. A download that broke off left `<out>.part`: the
    same command resumes it where it stopped (ExportBucket offset), never from the start."""
    opts = options(ctx)
    if format not in FORMATS:
        raise typer.BadParameter("must be coco or yolo", param_hint="--format")
    target = out or Path(f"{version_id[:18]}-{format}.tar")
    part = target.with_name(target.name + ".part")
    offset = part.stat().st_size if part.exists() else 0
    request = preview_pb2.ExportBucketRequest(
        dataset_version_id=version_id, format=FORMATS[format], offset=offset
    )

    async def call(channel: grpc.aio.Channel, md: Metadata) -> dict[str, Any]:
        stream = preview_pb2_grpc.PreviewServiceStub(channel).ExportBucket(request, metadata=md)
        size, items, last = offset, 0, False
        try:
            with part.open("ab") as file:
                async for chunk in stream:
                    file.write(chunk.data)
                    size += len(chunk.data)
                    if chunk.last:
                        items, last = chunk.items, True
            if not last:
                fail("UNAVAILABLE", f"the export broke off; run again to resume from {part}")
            part.replace(target)
        except OSError as error:
            fail("INVALID_FIELD", f"cannot write {target}: {error.strerror}")
        return {"file": str(target), "bytes": size, "items": items, "resumed_at": offset}

    emit(opts, run(opts, call, service="preview"))
