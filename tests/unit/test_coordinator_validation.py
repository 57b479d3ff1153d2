"""Workflow validation (docs/workflows.md): every problem kind, its path and step, all at once."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest

from services.coordinator.workflows.validation import (
    MAX_STEPS,
    TRACKING_CAPABILITY,
    Catalog,
    Problem,
    Validation,
    dropped_allowed,
    validate_workflow,
)
from workshop.v1 import common_pb2, workflow_pb2

K = workflow_pb2.ValidationProblemKind
NEXT = workflow_pb2.EDGE_BRANCH_NEXT
MATCH = workflow_pb2.EDGE_BRANCH_MATCH
NO_MATCH = workflow_pb2.EDGE_BRANCH_NO_MATCH
UNSPECIFIED = workflow_pb2.EDGE_BRANCH_UNSPECIFIED

CATALOG = Catalog(
    camera_ids=frozenset({"cam-1", "cam-2"}),
    bucket_ids=frozenset({"cars"}),
    models={
        "detector": {1: ("person",), 2: ("person", "car")},
        "plates": {1: ("plate",)},
        "unpublished": {},
    },
)


# --- spec builder ----------------------------------------------------------------------------


def tod(hours: int, minutes: int = 0, seconds: int = 0) -> common_pb2.TimeOfDay:
    return common_pb2.TimeOfDay(hours=hours, minutes=minutes, seconds=seconds)


def input_step(step_id: str = "in", **fields: Any) -> workflow_pb2.Step:
    values: dict[str, Any] = {
        "camera_ids": ["cam-1"],
        "day": workflow_pb2.INPUT_DAY_RUN_DAY,
        "window_start": tod(8),
        "window_end": tod(18),
    }
    values.update(fields)
    return workflow_pb2.Step(step_id=step_id, input=workflow_pb2.InputStep(**values))


def sample_step(step_id: str = "s", **fields: Any) -> workflow_pb2.Step:
    values: dict[str, Any] = {"interval_seconds": 60, **fields}
    return workflow_pb2.Step(step_id=step_id, sample=workflow_pb2.SampleStep(**values))


def model_step(
    step_id: str, name: str = "detector", version: int | None = None
) -> workflow_pb2.Step:
    model = workflow_pb2.ModelStep(model_name=name)
    if version is not None:
        model.version = version
    return workflow_pb2.Step(step_id=step_id, model=model)


def rule_step(step_id: str, *class_names: str, **fields: Any) -> workflow_pb2.Step:
    rule = workflow_pb2.RuleStep(class_names=class_names, **fields)
    return workflow_pb2.Step(step_id=step_id, rule=rule)


def output_step(step_id: str, bucket_id: str = "cars") -> workflow_pb2.Step:
    return workflow_pb2.Step(step_id=step_id, output=workflow_pb2.OutputStep(bucket_id=bucket_id))


def drop_step(step_id: str) -> workflow_pb2.Step:
    return workflow_pb2.Step(step_id=step_id, do_nothing=workflow_pb2.DoNothingStep())


def edge(source: str, target: str, branch: int = NEXT) -> workflow_pb2.Edge:
    return workflow_pb2.Edge(
        from_step_id=source, to_step_id=target, branch=workflow_pb2.EdgeBranch.ValueType(branch)
    )


def make_spec(
    steps: list[workflow_pb2.Step],
    edges: list[workflow_pb2.Edge],
    time_zone: str = "Europe/Berlin",
    schedule: common_pb2.TimeOfDay | None = None,
) -> workflow_pb2.WorkflowSpec:
    spec = workflow_pb2.WorkflowSpec(
        name="cars at the gate",
        time_zone=time_zone,
        graph=workflow_pb2.WorkflowGraph(steps=steps, edges=edges),
    )
    if schedule is not None:
        spec.schedule.time_of_day.CopyFrom(schedule)
    return spec


def good_steps() -> list[workflow_pb2.Step]:
    """in -> s -> det -> cars -(match)-> save, -(no match)-> drop."""
    return [
        input_step(),
        sample_step(),
        model_step("det"),
        rule_step("cars", "car", min_score=0.5),
        output_step("save"),
        drop_step("drop"),
    ]


def good_edges() -> list[workflow_pb2.Edge]:
    return [
        edge("in", "s"),
        edge("s", "det"),
        edge("det", "cars"),
        edge("cars", "save", MATCH),
        edge("cars", "drop", NO_MATCH),
    ]


def good_spec(**overrides: Any) -> workflow_pb2.WorkflowSpec:
    return make_spec(good_steps(), good_edges(), **overrides)


def step_of(spec: workflow_pb2.WorkflowSpec, step_id: str) -> workflow_pb2.Step:
    return next(step for step in spec.graph.steps if step.step_id == step_id)


def check(spec: workflow_pb2.WorkflowSpec) -> Validation:
    return validate_workflow(spec, CATALOG)


def found(spec: workflow_pb2.WorkflowSpec) -> list[tuple[int, str, str]]:
    return [(p.kind, p.path, p.step_id) for p in check(spec).problems]


def only(spec: workflow_pb2.WorkflowSpec) -> Problem:
    problems = check(spec).problems
    assert len(problems) == 1, [p.message for p in problems]
    return problems[0]


# --- a valid workflow --------------------------------------------------------------------------


def test_a_valid_workflow_has_no_problem() -> None:
    validation = check(good_spec(schedule=tod(6, 30)))
    assert validation.problems == ()
    assert validation.valid
    assert validation.required_capabilities == ()
    assert validation.summary() == ""


def test_several_successors_and_latest_and_pinned_models_are_valid() -> None:
    steps = [*good_steps(), model_step("plates", "plates", version=1), rule_step("p", "plate")]
    steps.append(output_step("save2"))
    edges = [
        *good_edges(),
        edge("s", "plates"),
        edge("plates", "p"),
        edge("p", "save2", MATCH),
        edge("p", "drop", NO_MATCH),
        edge("s", "save"),
    ]
    assert check(make_spec(steps, edges)).problems == ()


def test_empty_time_zone_means_utc_and_end_of_day_window_is_valid() -> None:
    spec = good_spec(time_zone="")
    step_of(spec, "in").input.window_end.CopyFrom(tod(0))
    assert check(spec).valid


def test_validation_is_deterministic() -> None:
    spec = good_spec(time_zone="Nowhere/City")
    spec.graph.edges.extend([edge("det", "det"), edge("save", "ghost"), edge("in", "cars")])
    first = check(spec)
    assert len(first.problems) > 3
    assert first == check(spec)


# --- size, ids and kinds ----------------------------------------------------------------------


def test_more_than_64_steps_is_too_large_and_nothing_else() -> None:
    chain = [model_step(f"m{n}") for n in range(MAX_STEPS - 2)]
    steps = [input_step(), sample_step(), *chain, output_step("save")]
    ids = ["in", "s", *(step.step_id for step in chain), "save"]
    edges = [edge(a, b) for a, b in itertools.pairwise(ids)]
    assert len(steps) == MAX_STEPS + 1
    problem = only(make_spec(steps, edges))
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_TOO_LARGE,
        "graph.steps",
        "",
    )
    assert "65 steps" in problem.message


def test_more_than_256_edges_is_too_large() -> None:
    models = [model_step(f"m{n}") for n in range(24)]
    ids = [step.step_id for step in models]
    edges = [edge("in", "s"), edge("s", "m0"), edge(ids[-1], "save")]
    edges += [edge(a, b) for i, a in enumerate(ids) for b in ids[i + 1 :]]
    assert len(edges) > 256
    spec = make_spec([input_step(), sample_step(), *models, output_step("save")], edges)
    problem = only(spec)
    assert (problem.kind, problem.path) == (K.VALIDATION_PROBLEM_KIND_TOO_LARGE, "graph.edges")


@pytest.mark.parametrize("step_id", ["-drop", "drop it", "x" * 65, "drop/1", "dröp"])
def test_malformed_step_id(step_id: str) -> None:
    spec = good_spec()
    step_of(spec, "drop").step_id = step_id
    spec.graph.edges[4].to_step_id = step_id
    problem = only(spec)
    assert problem.kind == K.VALIDATION_PROBLEM_KIND_BAD_STEP_ID
    assert problem.path == "graph.steps[5].step_id"
    assert problem.step_id == step_id
    assert "malformed" in problem.message


def test_empty_step_id_is_bad_and_that_step_is_left_out_of_graph_checks() -> None:
    spec = good_spec()
    spec.graph.steps.append(model_step(""))
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_BAD_STEP_ID,
        "graph.steps[6].step_id",
        "",
    )
    assert "has no id" in problem.message


def test_a_64_character_id_with_dots_dashes_and_underscores_is_fine() -> None:
    spec = good_spec()
    long_id = "9" + "a._-" * 15 + "bcd"
    assert len(long_id) == 64
    spec.graph.steps.append(drop_step(long_id))
    spec.graph.edges.append(edge("cars", long_id, NO_MATCH))
    assert check(spec).valid


def test_repeated_step_id_is_reported_on_the_repetition() -> None:
    spec = good_spec()
    spec.graph.steps.append(output_step("save"))
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_BAD_STEP_ID,
        "graph.steps[6].step_id",
        "save",
    )
    assert "graph.steps[4]" in problem.message


def test_step_without_kind() -> None:
    spec = good_spec()
    spec.graph.steps.append(workflow_pb2.Step(step_id="blank"))
    spec.graph.edges.append(edge("det", "blank"))
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_MISSING_STEP_KIND,
        "graph.steps[6]",
        "blank",
    )


# --- shape ---------------------------------------------------------------------------------------


def test_no_input_step_is_one_bad_shape() -> None:
    steps = good_steps()[1:]
    problem = only(make_spec(steps, good_edges()[1:]))
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_BAD_SHAPE,
        "graph.steps",
        "",
    )
    assert "no input step" in problem.message


def test_no_sample_step_is_bad_shape() -> None:
    steps = [step for step in good_steps() if step.step_id != "s"]
    edges = [edge("in", "det"), *good_edges()[2:]]
    kinds = {kind for kind, _, _ in found(make_spec(steps, edges))}
    assert K.VALIDATION_PROBLEM_KIND_BAD_SHAPE in kinds
    assert (K.VALIDATION_PROBLEM_KIND_BAD_SHAPE, "graph.steps", "") in found(
        make_spec(steps, edges)
    )


def test_second_input_and_second_sample_are_bad_shape_at_those_steps() -> None:
    spec = good_spec()
    spec.graph.steps.extend([input_step("in2"), sample_step("s2")])
    spec.graph.edges.extend([edge("in2", "s"), edge("in", "s2"), edge("s2", "det")])
    assert found(spec) == [
        (K.VALIDATION_PROBLEM_KIND_BAD_SHAPE, "graph.steps[6]", "in2"),
        (K.VALIDATION_PROBLEM_KIND_BAD_SHAPE, "graph.steps[7]", "s2"),
    ]


def test_no_output_step() -> None:
    steps = [step for step in good_steps() if step.step_id != "save"]
    steps.append(drop_step("drop2"))
    edges = [*good_edges()[:3], edge("cars", "drop2", MATCH), edge("cars", "drop", NO_MATCH)]
    problem = only(make_spec(steps, edges))
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_NO_OUTPUT,
        "graph.steps",
        "",
    )


def test_output_that_no_frame_reaches_is_no_output_and_unreachable() -> None:
    edges = [*good_edges()[:3], edge("cars", "drop", MATCH), edge("cars", "drop", NO_MATCH)]
    assert found(make_spec(good_steps(), edges)) == [
        (K.VALIDATION_PROBLEM_KIND_NO_OUTPUT, "graph.steps", ""),
        (K.VALIDATION_PROBLEM_KIND_UNREACHABLE_STEP, "graph.steps[4]", "save"),
    ]


def test_empty_spec_reports_missing_input_sample_and_output() -> None:
    kinds = [kind for kind, _, _ in found(workflow_pb2.WorkflowSpec())]
    assert kinds == [
        K.VALIDATION_PROBLEM_KIND_BAD_SHAPE,
        K.VALIDATION_PROBLEM_KIND_BAD_SHAPE,
        K.VALIDATION_PROBLEM_KIND_NO_OUTPUT,
    ]


# --- edges ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad_edge", "path", "words"),
    [
        (edge("det", "ghost"), "graph.edges[5].to_step_id", "'ghost', which is not in the graph"),
        (edge("ghost", "save"), "graph.edges[5].from_step_id", "'ghost'"),
        (edge("", "save"), "graph.edges[5].from_step_id", "at no step"),
    ],
)
def test_edge_naming_an_unknown_step(bad_edge: workflow_pb2.Edge, path: str, words: str) -> None:
    spec = good_spec()
    spec.graph.edges.append(bad_edge)
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_UNKNOWN_STEP,
        path,
        "",
    )
    assert words in problem.message


def test_edge_with_both_ends_unknown_reports_both() -> None:
    spec = good_spec()
    spec.graph.edges.append(edge("a", "b"))
    assert found(spec) == [
        (K.VALIDATION_PROBLEM_KIND_UNKNOWN_STEP, "graph.edges[5].from_step_id", ""),
        (K.VALIDATION_PROBLEM_KIND_UNKNOWN_STEP, "graph.edges[5].to_step_id", ""),
    ]


@pytest.mark.parametrize(
    ("bad_edge", "path", "step_id"),
    [
        (edge("in", "det"), "graph.edges[5].to_step_id", "det"),
        (edge("det", "s"), "graph.edges[5].to_step_id", "s"),
        (edge("det", "in"), "graph.edges[5].to_step_id", "in"),
        (edge("save", "drop"), "graph.edges[5].from_step_id", "save"),
        (edge("drop", "save"), "graph.edges[5].from_step_id", "drop"),
        (edge("s", "save", UNSPECIFIED), "graph.edges[5].branch", "s"),
        (edge("det", "save", MATCH), "graph.edges[5].branch", "det"),
        (edge("cars", "save", NEXT), "graph.edges[5].branch", "cars"),
        (edge("cars", "save", UNSPECIFIED), "graph.edges[5].branch", "cars"),
        (edge("det", "cars"), "graph.edges[5]", ""),
    ],
    ids=[
        "input-to-model",
        "model-to-sample",
        "into-input",
        "out-of-output",
        "out-of-do-nothing",
        "unspecified-branch",
        "match-on-model",
        "next-on-rule",
        "unspecified-on-rule",
        "repeated-edge",
    ],
)
def test_bad_connection(bad_edge: workflow_pb2.Edge, path: str, step_id: str) -> None:
    spec = good_spec()
    spec.graph.edges.append(bad_edge)
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_BAD_CONNECTION,
        path,
        step_id,
    )


def test_wrong_branch_and_wrong_target_on_one_edge_are_both_reported() -> None:
    spec = good_spec()
    spec.graph.edges.append(edge("det", "s", MATCH))
    assert found(spec) == [
        (K.VALIDATION_PROBLEM_KIND_BAD_CONNECTION, "graph.edges[5].branch", "det"),
        (K.VALIDATION_PROBLEM_KIND_BAD_CONNECTION, "graph.edges[5].to_step_id", "s"),
    ]


def test_match_and_no_match_to_the_same_step_is_not_a_repeat() -> None:
    edges = [*good_edges()[:3], edge("cars", "save", MATCH), edge("cars", "save", NO_MATCH)]
    steps = [step for step in good_steps() if step.step_id != "drop"]
    assert check(make_spec(steps, edges)).valid


# --- structure ---------------------------------------------------------------------------------


def test_cycle_is_reported_once_naming_its_steps_and_an_edge() -> None:
    spec = good_spec()
    spec.graph.steps.extend([model_step("a"), model_step("b")])
    spec.graph.edges.extend([edge("det", "a"), edge("a", "b"), edge("b", "a")])
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_CYCLE,
        "graph.edges[6]",
        "",
    )
    assert "'a' and 'b' form a cycle" in problem.message


def test_cycle_through_a_rule_back_to_a_model() -> None:
    spec = good_spec()
    spec.graph.edges.append(edge("cars", "det", NO_MATCH))
    problem = only(spec)
    assert (problem.kind, problem.path) == (K.VALIDATION_PROBLEM_KIND_CYCLE, "graph.edges[2]")
    assert "'det' and 'cars'" in problem.message


def test_self_loop_is_a_cycle() -> None:
    spec = good_spec()
    spec.graph.edges.append(edge("det", "det"))
    problem = only(spec)
    assert (problem.kind, problem.path) == (K.VALIDATION_PROBLEM_KIND_CYCLE, "graph.edges[5]")
    assert "edge to itself" in problem.message


def test_two_separate_cycles_are_two_problems() -> None:
    spec = good_spec()
    spec.graph.steps.extend([model_step("a"), model_step("b")])
    spec.graph.edges.extend([edge("det", "a"), edge("a", "a"), edge("a", "b"), edge("b", "b")])
    assert [kind for kind, _, _ in found(spec)] == [K.VALIDATION_PROBLEM_KIND_CYCLE] * 2


def test_unreachable_step() -> None:
    spec = good_spec()
    spec.graph.steps.append(model_step("lonely"))
    spec.graph.edges.append(edge("lonely", "save"))
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_UNREACHABLE_STEP,
        "graph.steps[6]",
        "lonely",
    )


def test_dangling_model_step() -> None:
    spec = good_spec()
    spec.graph.steps.append(model_step("m2"))
    spec.graph.edges.append(edge("s", "m2"))
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_DANGLING_STEP,
        "graph.steps[6]",
        "m2",
    )


def test_rule_needs_an_edge_on_each_branch() -> None:
    edges = [edge for edge in good_edges() if edge.to_step_id != "drop"]
    steps = [step for step in good_steps() if step.step_id != "drop"]
    problem = only(make_spec(steps, edges))
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_DANGLING_STEP,
        "graph.steps[3]",
        "cars",
    )
    assert "NO_MATCH" in problem.message


def test_input_without_edge_dangles_and_the_rest_is_unreachable() -> None:
    problems = found(make_spec(good_steps(), good_edges()[1:]))
    assert problems[0] == (K.VALIDATION_PROBLEM_KIND_NO_OUTPUT, "graph.steps", "")
    assert (K.VALIDATION_PROBLEM_KIND_DANGLING_STEP, "graph.steps[0]", "in") in problems
    unreachable = [
        step_id
        for kind, _, step_id in problems
        if kind == K.VALIDATION_PROBLEM_KIND_UNREACHABLE_STEP
    ]
    assert unreachable == ["s", "det", "cars", "save", "drop"]


# --- references -----------------------------------------------------------------------------


def test_input_without_cameras() -> None:
    spec = good_spec()
    del step_of(spec, "in").input.camera_ids[:]
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_UNKNOWN_CAMERA,
        "graph.steps[0].input.camera_ids",
        "in",
    )


def test_unknown_camera() -> None:
    spec = good_spec()
    step_of(spec, "in").input.camera_ids.append("cam-9")
    problem = only(spec)
    assert (problem.kind, problem.path) == (
        K.VALIDATION_PROBLEM_KIND_UNKNOWN_CAMERA,
        "graph.steps[0].input.camera_ids[1]",
    )
    assert "'cam-9'" in problem.message


def test_unknown_model_name_skips_the_class_check_downstream() -> None:
    spec = good_spec()
    step_of(spec, "det").model.model_name = "detektor"
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_UNKNOWN_MODEL,
        "graph.steps[2].model.model_name",
        "det",
    )
    assert "'detektor'" in problem.message


def test_unknown_pinned_version() -> None:
    spec = good_spec()
    step_of(spec, "det").model.version = 7
    problem = only(spec)
    assert (problem.kind, problem.path) == (
        K.VALIDATION_PROBLEM_KIND_UNKNOWN_MODEL,
        "graph.steps[2].model.version",
    )
    assert "v7" in problem.message
    assert "1, 2" in problem.message


def test_latest_of_a_model_without_versions() -> None:
    spec = good_spec()
    step_of(spec, "det").model.model_name = "unpublished"
    problem = only(spec)
    assert (problem.kind, problem.path) == (
        K.VALIDATION_PROBLEM_KIND_UNKNOWN_MODEL,
        "graph.steps[2].model.model_name",
    )


@pytest.mark.parametrize(("bucket_id", "words"), [("trucks", "'trucks'"), ("", "names no bucket")])
def test_unknown_bucket(bucket_id: str, words: str) -> None:
    spec = good_spec()
    step_of(spec, "save").output.bucket_id = bucket_id
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_UNKNOWN_BUCKET,
        "graph.steps[4].output.bucket_id",
        "save",
    )
    assert words in problem.message


def test_class_the_upstream_model_lacks() -> None:
    spec = good_spec()
    step_of(spec, "cars").rule.class_names.append("truck")
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_UNKNOWN_CLASS,
        "graph.steps[3].rule.class_names[1]",
        "cars",
    )
    assert problem.message == "Rule 'cars' names class 'truck', which model 'detector' v2 lacks."


def test_class_checked_against_the_pinned_version() -> None:
    spec = good_spec()
    step_of(spec, "det").model.version = 1
    problem = only(spec)
    assert (problem.kind, problem.path) == (
        K.VALIDATION_PROBLEM_KIND_UNKNOWN_CLASS,
        "graph.steps[3].rule.class_names[0]",
    )
    assert "v1" in problem.message


def test_class_of_a_model_on_another_branch_does_not_count() -> None:
    spec = good_spec()
    spec.graph.steps.append(model_step("plates", "plates"))
    spec.graph.edges.extend([edge("s", "plates"), edge("plates", "save")])
    step_of(spec, "cars").rule.class_names.append("plate")
    problem = only(spec)
    assert (problem.kind, problem.path) == (
        K.VALIDATION_PROBLEM_KIND_UNKNOWN_CLASS,
        "graph.steps[3].rule.class_names[1]",
    )


def test_classes_of_every_upstream_model_count() -> None:
    spec = good_spec()
    spec.graph.steps.append(model_step("plates", "plates"))
    spec.graph.edges.extend([edge("s", "plates"), edge("plates", "cars")])
    step_of(spec, "cars").rule.class_names.append("plate")
    assert check(spec).valid
    step_of(spec, "cars").rule.class_names.append("bus")
    problem = only(spec)
    assert "none of the models before it has" in problem.message
    assert "'detector' v2" in problem.message
    assert "'plates' v1" in problem.message


def test_rule_with_no_model_before_it() -> None:
    spec = good_spec()
    spec.graph.steps.append(rule_step("early", "car"))
    spec.graph.edges.extend(
        [edge("s", "early"), edge("early", "save", MATCH), edge("early", "drop", NO_MATCH)]
    )
    problem = only(spec)
    assert (problem.kind, problem.step_id) == (K.VALIDATION_PROBLEM_KIND_UNKNOWN_CLASS, "early")
    assert "no model step comes before it" in problem.message


def test_rule_with_no_classes_matches_any_class() -> None:
    spec = good_spec()
    del step_of(spec, "cars").rule.class_names[:]
    assert check(spec).valid


# --- values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "field", "words"),
    [
        (tod(24), tod(18), "window_start", "24:00:00"),
        (tod(8, 60), tod(18), "window_start", "08:60:00"),
        (tod(8), tod(18, 0, 60), "window_end", "18:00:60"),
        (tod(8), tod(-1), "window_end", "not a valid time"),
        (tod(18), tod(8), "window_end", "not after its start"),
        (tod(8), tod(8), "window_end", "not after its start"),
    ],
)
def test_bad_window(
    start: common_pb2.TimeOfDay, end: common_pb2.TimeOfDay, field: str, words: str
) -> None:
    spec = good_spec()
    step = step_of(spec, "in").input
    step.window_start.CopyFrom(start)
    step.window_end.CopyFrom(end)
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_BAD_WINDOW,
        f"graph.steps[0].input.{field}",
        "in",
    )
    assert words in problem.message


def test_window_must_be_set() -> None:
    spec = good_spec()
    step_of(spec, "in").input.ClearField("window_start")
    problem = only(spec)
    assert (problem.kind, problem.path) == (
        K.VALIDATION_PROBLEM_KIND_BAD_WINDOW,
        "graph.steps[0].input.window_start",
    )


def test_whole_day_window_from_midnight_to_midnight_is_valid() -> None:
    spec = good_spec()
    step_of(spec, "in").input.window_start.CopyFrom(tod(0))
    step_of(spec, "in").input.window_end.CopyFrom(tod(0))
    step_of(spec, "s").sample.interval_seconds = 3600
    assert check(spec).valid


@pytest.mark.parametrize(
    ("day", "date", "field"),
    [
        (workflow_pb2.INPUT_DAY_UNSPECIFIED, None, "day"),
        (workflow_pb2.INPUT_DAY_DATE, None, "date"),
        (workflow_pb2.INPUT_DAY_DATE, (2023, 2, 29), "date"),
        (workflow_pb2.INPUT_DAY_DATE, (0, 1, 1), "date"),
        (workflow_pb2.INPUT_DAY_RUN_DAY, (2024, 2, 29), "date"),
        (workflow_pb2.INPUT_DAY_PREVIOUS_DAY, (2024, 2, 29), "date"),
    ],
)
def test_bad_date(day: int, date: tuple[int, int, int] | None, field: str) -> None:
    spec = good_spec()
    step = step_of(spec, "in").input
    step.day = workflow_pb2.InputDay.ValueType(day)
    if date is not None:
        step.date.CopyFrom(common_pb2.CalendarDate(year=date[0], month=date[1], day=date[2]))
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_BAD_DATE,
        f"graph.steps[0].input.{field}",
        "in",
    )


def test_a_valid_fixed_date() -> None:
    spec = good_spec()
    step = step_of(spec, "in").input
    step.day = workflow_pb2.INPUT_DAY_DATE
    step.date.CopyFrom(common_pb2.CalendarDate(year=2024, month=2, day=29))
    assert check(spec).valid


@pytest.mark.parametrize(
    ("interval", "window_end", "words"),
    [
        (0, tod(18), "every 0 seconds; use 0.1 to 3600 seconds"),
        (-1, tod(18), "every -1 seconds; use 0.1 to 3600 seconds"),
        (0.05, tod(18), "every 0.05 seconds; use 0.1 to 3600 seconds"),
        (3600.5, tod(0), "every 3600.5 seconds; use 0.1 to 3600 seconds"),
        (0.0005, tod(18), "use 0.1 to 3600 seconds"),
        (0.1005, tod(18), "every 0.1005 seconds, which is not a whole number of milliseconds"),
        (2.0001, tod(18), "every 2.0001 seconds, which is not a whole number of milliseconds"),
        (math.nan, tod(18), "every nan seconds, which is not a number of seconds"),
        (math.inf, tod(18), "every inf seconds, which is not a number of seconds"),
        (-math.inf, tod(18), "every -inf seconds, which is not a number of seconds"),
        (61, tod(8, 1), "every 61 seconds, longer than the 60-second window"),
        (60.5, tod(8, 1), "every 60.5 seconds, longer than the 60-second window"),
    ],
)
def test_bad_interval(interval: float, window_end: common_pb2.TimeOfDay, words: str) -> None:
    spec = good_spec()
    step_of(spec, "s").sample.interval_seconds = interval
    step_of(spec, "in").input.window_end.CopyFrom(window_end)
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_BAD_INTERVAL,
        "graph.steps[1].sample.interval_seconds",
        "s",
    )
    assert words in problem.message


def test_interval_as_long_as_the_window_is_fine() -> None:
    spec = good_spec()
    step_of(spec, "s").sample.interval_seconds = 60
    step_of(spec, "in").input.window_end.CopyFrom(tod(8, 1))
    assert check(spec).valid


@pytest.mark.parametrize("interval", [0.1, 0.25, 0.5, 0.3, 0.1 + 0.2, 2.5, 1.001, 3599.999, 3600])
def test_fractional_whole_millisecond_intervals_are_fine(interval: float) -> None:
    # 0.1 + 0.2 is 0.30000000000000004: float noise, still 300 ms
    spec = good_spec()
    step_of(spec, "s").sample.interval_seconds = interval
    assert check(spec).valid, check(spec).summary()


def test_a_whole_second_interval_from_an_old_client_is_refused_not_misread() -> None:
    # Field 1 (varint 60) is what a client built against `uint32 interval_seconds = 1` sent;
    # the number is reserved now, so the value is dropped and the interval reads as 0.
    old_wire = bytes([0x08, 60])
    spec = good_spec()
    step_of(spec, "s").sample.CopyFrom(workflow_pb2.SampleStep.FromString(old_wire))
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_BAD_INTERVAL,
        "graph.steps[1].sample.interval_seconds",
        "s",
    )
    assert "every 0 seconds" in problem.message


@pytest.mark.parametrize(
    ("step_id", "setter", "path"),
    [
        ("cars", lambda s: setattr(s.rule, "min_score", 1.5), "graph.steps[3].rule.min_score"),
        ("cars", lambda s: setattr(s.rule, "min_score", -0.1), "graph.steps[3].rule.min_score"),
        (
            "cars",
            lambda s: setattr(s.rule, "min_score", float("nan")),
            "graph.steps[3].rule.min_score",
        ),
        (
            "cars",
            lambda s: setattr(s.rule.motion, "min_displacement", -1.0),
            "graph.steps[3].rule.motion.min_displacement",
        ),
        (
            "s",
            lambda s: setattr(s.sample.keep_by_change, "min_displacement", 1.5),
            "graph.steps[1].sample.keep_by_change.min_displacement",
        ),
    ],
)
def test_bad_threshold(
    step_id: str, setter: Callable[[workflow_pb2.Step], None], path: str
) -> None:
    spec = good_spec()
    setter(step_of(spec, step_id))
    problem = only(spec)
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_BAD_THRESHOLD,
        path,
        step_id,
    )


def test_thresholds_at_their_bounds_are_fine() -> None:
    spec = good_spec()
    step_of(spec, "cars").rule.min_score = 1.0
    step_of(spec, "cars").rule.motion.min_displacement = 0.0  # 0 means the default
    step_of(spec, "s").sample.keep_by_change.min_displacement = 1.0
    assert check(spec).valid


@pytest.mark.parametrize(
    "zone", ["Mars/Olympus", "localtime", "europe/berlin", "../etc/passwd", "UTC "]
)
def test_bad_time_zone(zone: str) -> None:
    problem = only(good_spec(time_zone=zone))
    assert (problem.kind, problem.path, problem.step_id) == (
        K.VALIDATION_PROBLEM_KIND_BAD_SCHEDULE,
        "time_zone",
        "",
    )


def test_bad_schedule_time() -> None:
    problem = only(good_spec(schedule=tod(25)))
    assert (problem.kind, problem.path) == (
        K.VALIDATION_PROBLEM_KIND_BAD_SCHEDULE,
        "schedule.time_of_day",
    )
    assert "25:00:00" in problem.message


def test_schedule_without_time_of_day() -> None:
    spec = good_spec()
    spec.schedule.SetInParent()
    problem = only(spec)
    assert (problem.kind, problem.path) == (
        K.VALIDATION_PROBLEM_KIND_BAD_SCHEDULE,
        "schedule.time_of_day",
    )


def test_midnight_schedule_is_fine() -> None:
    assert check(good_spec(schedule=tod(0))).valid


# --- together ----------------------------------------------------------------------------------


def test_every_problem_is_reported_at_once_in_document_order() -> None:
    spec = good_spec(time_zone="Nowhere/City", schedule=tod(30))
    step_of(spec, "in").input.camera_ids.append("cam-9")
    step_of(spec, "s").sample.interval_seconds = 0
    step_of(spec, "cars").rule.class_names.append("truck")
    step_of(spec, "save").output.bucket_id = "trucks"
    spec.graph.edges.append(edge("det", "ghost"))
    spec.graph.steps.append(model_step("lonely"))
    assert found(spec) == [
        (K.VALIDATION_PROBLEM_KIND_BAD_SCHEDULE, "time_zone", ""),
        (K.VALIDATION_PROBLEM_KIND_UNKNOWN_CAMERA, "graph.steps[0].input.camera_ids[1]", "in"),
        (K.VALIDATION_PROBLEM_KIND_BAD_INTERVAL, "graph.steps[1].sample.interval_seconds", "s"),
        (K.VALIDATION_PROBLEM_KIND_UNKNOWN_CLASS, "graph.steps[3].rule.class_names[1]", "cars"),
        (K.VALIDATION_PROBLEM_KIND_UNKNOWN_BUCKET, "graph.steps[4].output.bucket_id", "save"),
        (K.VALIDATION_PROBLEM_KIND_UNREACHABLE_STEP, "graph.steps[6]", "lonely"),
        (K.VALIDATION_PROBLEM_KIND_DANGLING_STEP, "graph.steps[6]", "lonely"),
        (K.VALIDATION_PROBLEM_KIND_UNKNOWN_STEP, "graph.edges[5].to_step_id", ""),
        (K.VALIDATION_PROBLEM_KIND_BAD_SCHEDULE, "schedule.time_of_day", ""),
    ]
    validation = check(spec)
    assert not validation.valid
    assert validation.summary().count("\n") == len(validation.problems) - 1


def test_messages_shorten_huge_values() -> None:
    spec = good_spec()
    step_of(spec, "in").input.camera_ids.append("c" * 5000)
    assert len(only(spec).message) < 200


def test_problem_to_proto() -> None:
    problem = Problem(
        kind=K.VALIDATION_PROBLEM_KIND_CYCLE, path="graph.edges[1]", step_id="", message="m"
    )
    message = problem.to_proto()
    assert message.kind == K.VALIDATION_PROBLEM_KIND_CYCLE
    assert (message.path, message.step_id, message.message) == ("graph.edges[1]", "", "m")


# --- capabilities and dropped slots ------------------------------------------------------------


def test_keep_by_change_needs_tracking_and_allows_dropped() -> None:
    steps = [step for step in good_steps() if step.step_id != "drop"]
    edges = [*good_edges()[:4], edge("cars", "save", NO_MATCH)]
    spec = make_spec(steps, edges)
    assert not dropped_allowed(spec)
    assert check(spec).required_capabilities == ()
    step_of(spec, "s").sample.keep_by_change.SetInParent()
    assert dropped_allowed(spec)
    assert check(spec).required_capabilities == (TRACKING_CAPABILITY,)


def test_motion_route_needs_tracking() -> None:
    spec = good_spec()
    step_of(spec, "cars").rule.motion.SetInParent()
    validation = check(spec)
    assert validation.valid
    assert validation.required_capabilities == ("workshop-v3",)


def test_do_nothing_step_allows_dropped() -> None:
    assert dropped_allowed(good_spec())
