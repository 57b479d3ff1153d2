"""Checks of what a workflow names in the catalog: cameras, models (and the classes a
rule expects of the models upstream of it) and buckets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.coordinator.workflows.validation.graph import Graph, walk
from services.coordinator.workflows.validation.problems import (
    Found,
    K,
    quoted,
    step_name,
    steps_path,
)
from workshop.v1 import workflow_pb2


@dataclass(frozen=True)
class Catalog:
    """What exists, loaded by the caller from the database."""

    camera_ids: frozenset[str]
    bucket_ids: frozenset[str]
    # model name -> version -> class names (in class-index order)
    models: Mapping[str, Mapping[int, tuple[str, ...]]]


def check_cameras(step: workflow_pb2.Step, index: int, catalog: Catalog, found: Found) -> None:
    path = f"{steps_path(index)}.input.camera_ids"
    name = step_name(step, index)
    if not step.input.camera_ids:
        found.add(
            K.VALIDATION_PROBLEM_KIND_UNKNOWN_CAMERA,
            path,
            f"{name} names no camera; choose at least one.",
            step.step_id,
        )
    for position, camera_id in enumerate(step.input.camera_ids):
        if camera_id not in catalog.camera_ids:
            found.add(
                K.VALIDATION_PROBLEM_KIND_UNKNOWN_CAMERA,
                f"{path}[{position}]",
                f"{name} reads camera {quoted(camera_id)}, which is not registered.",
                step.step_id,
            )


def check_model(step: workflow_pb2.Step, index: int, catalog: Catalog, found: Found) -> None:
    path = f"{steps_path(index)}.model"
    name = step_name(step, index)
    model = step.model
    versions = catalog.models.get(model.model_name)
    if versions is None:
        found.add(
            K.VALIDATION_PROBLEM_KIND_UNKNOWN_MODEL,
            f"{path}.model_name",
            f"{name} uses model {quoted(model.model_name)}, which is not published.",
            step.step_id,
        )
    elif model.HasField("version"):
        if model.version not in versions:
            published = ", ".join(str(version) for version in sorted(versions)) or "none"
            found.add(
                K.VALIDATION_PROBLEM_KIND_UNKNOWN_MODEL,
                f"{path}.version",
                f"{name} pins model {quoted(model.model_name)} v{model.version}, which is not "
                f"published (published versions: {published}).",
                step.step_id,
            )
    elif not versions:
        found.add(
            K.VALIDATION_PROBLEM_KIND_UNKNOWN_MODEL,
            f"{path}.model_name",
            f"{name} uses the latest version of model {quoted(model.model_name)}, "
            "which has no published version.",
            step.step_id,
        )


def resolved_model(
    model: workflow_pb2.ModelStep, catalog: Catalog
) -> tuple[int, tuple[str, ...]] | None:
    """(version, classes) the step runs: its pinned version or the latest; None if unpublished."""
    versions = catalog.models.get(model.model_name)
    if not versions:
        return None
    version = model.version if model.HasField("version") else max(versions)
    classes = versions.get(version)
    return None if classes is None else (version, classes)


def check_output(step: workflow_pb2.Step, index: int, catalog: Catalog, found: Found) -> None:
    bucket_id = step.output.bucket_id
    if bucket_id in catalog.bucket_ids:
        return
    name = step_name(step, index)
    message = (
        f"{name} names no bucket; choose one."
        if not bucket_id
        else f"{name} saves into bucket {quoted(bucket_id)}, which does not exist."
    )
    found.add(
        K.VALIDATION_PROBLEM_KIND_UNKNOWN_BUCKET,
        f"{steps_path(index)}.output.bucket_id",
        message,
        step.step_id,
    )


def check_rule_classes(graph: Graph, catalog: Catalog, found: Found) -> None:
    for index in graph.addressable:
        if graph.kinds[index] != "rule" or not graph.steps[index].rule.class_names:
            continue
        upstream = walk(graph.predecessors[index], graph.predecessors.__getitem__)
        models = [other for other in sorted(upstream) if graph.kinds[other] == "model"]
        resolved = [resolved_model(graph.steps[other].model, catalog) for other in models]
        known = [entry for entry in resolved if entry is not None]
        if len(known) < len(resolved):
            continue  # an unpublished model upstream: its UNKNOWN_MODEL problem explains it
        labels = [
            f"model {quoted(graph.steps[other].model.model_name)} v{entry[0]}"
            for other, entry in zip(models, known, strict=True)
        ]
        emitted = {name for _, classes in known for name in classes}
        _report_unknown_classes(graph, index, emitted, labels, found)


def _report_unknown_classes(
    graph: Graph, index: int, emitted: set[str], model_labels: Sequence[str], found: Found
) -> None:
    step = graph.steps[index]
    for position, class_name in enumerate(step.rule.class_names):
        if class_name in emitted:
            continue
        found.add(
            K.VALIDATION_PROBLEM_KIND_UNKNOWN_CLASS,
            f"{steps_path(index)}.rule.class_names[{position}]",
            f"{graph.name(index)} names class {quoted(class_name)}, {_lacking(model_labels)}",
            step.step_id,
        )


def _lacking(model_labels: Sequence[str]) -> str:
    if not model_labels:
        return "but no model step comes before it to detect classes."
    if len(model_labels) == 1:
        return f"which {model_labels[0]} lacks."
    return f"which none of the models before it has ({', '.join(model_labels)})."
