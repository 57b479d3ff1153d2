"""Dataset versions and their frozen boxes as the contract shows them (DatasetService's and
PublicationService's answers)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from services.coordinator import convert
from services.coordinator.identity import auth
from services.coordinator.review.datasets import VersionRow
from services.coordinator.servicers import views
from workshop.v1 import common_pb2, run_pb2
from workshop.v1 import dataset_pb2 as pb


def version(row: VersionRow) -> pb.DatasetVersion:
    """A version as the contract shows it."""
    return pb.DatasetVersion(
        version_id=row.version_id,
        name=row.name,
        bucket_id=row.bucket_id,
        filter=item_filter(row.filter),
        classes=row.classes,
        seed=row.seed,
        val_fraction=row.val_fraction,
        item_count=row.item_count,
        train_count=row.item_count - row.val_count,
        val_count=row.val_count,
        box_count=row.box_count,
        camera_ids=row.camera_ids,
        created_by=auth.principal_proto(row.created_by),
        created_at=convert.ts(row.created_at),
    )


def item_filter(stored: dict[str, Any]) -> run_pb2.BucketItemFilter:
    """A version's stored filter (review/datasets.py, filter_json) as the contract's."""
    value = run_pb2.BucketItemFilter(
        review_states=[views.STATES[state] for state in stored.get("review_states", ())],
        class_name=stored.get("class_name", ""),
        camera_id=stored.get("camera_id", ""),
        run_id=stored.get("run_id", ""),
        min_score=stored.get("min_score"),
        max_score=stored.get("max_score"),
    )
    for field in ("frame_time_from", "frame_time_to"):
        if stored.get(field):
            getattr(value, field).CopyFrom(convert.ts(datetime.fromisoformat(stored[field])))
    return value


def frozen_boxes(values: list[dict[str, Any]] | None) -> list[common_pb2.Box]:
    """Frozen boxes ({"class_name", "score", "x", "y", "w", "h"}) as the contract's."""
    return [_frozen_box(box) for box in values or ()]


def _frozen_box(box: dict[str, Any]) -> common_pb2.Box:
    try:
        return common_pb2.Box(
            class_name=box["class_name"],
            score=box["score"],
            x=box["x"],
            y=box["y"],
            w=box["w"],
            h=box["h"],
        )
    except TypeError:  # a value spelled as a string: a NaN an earlier release stored
        frozen = common_pb2.Box(class_name=box["class_name"])
        convert.fill_box_floats(frozen, box)
        return frozen
