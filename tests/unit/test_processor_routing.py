"""Routing frames through a workflow graph (services.processor.routing)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import pytest

from services.coordinator.workflows.validation import Catalog, validate_workflow
from services.processor.routing import (
    Box,
    JobRouter,
    Routed,
    Router,
    RoutingError,
    empty_slot_result,
    needs_tracking,
    to_slot_result,
)
from workshop.v1 import common_pb2, snapshot_pb2, workflow_pb2

NEXT = workflow_pb2.EDGE_BRANCH_NEXT
MATCH = workflow_pb2.EDGE_BRANCH_MATCH
NO_MATCH = workflow_pb2.EDGE_BRANCH_NO_MATCH

# --- building graphs ---------------------------------------------------------------------------


def model(step_id: str) -> workflow_pb2.Step:
    return workflow_pb2.Step(step_id=step_id, model=workflow_pb2.ModelStep(model_name=step_id))


def rule(
    step_id: str,
    classes: Sequence[str] = (),
    min_score: float = 0.0,
    motion: float | None = None,
) -> workflow_pb2.Step:
    step = workflow_pb2.Step(
        step_id=step_id, rule=workflow_pb2.RuleStep(class_names=list(classes), min_score=min_score)
    )
    if motion is not None:
        step.rule.motion.min_displacement = motion
    return step


def output(step_id: str) -> workflow_pb2.Step:
    return workflow_pb2.Step(step_id=step_id, output=workflow_pb2.OutputStep(bucket_id="yard"))


def drop(step_id: str) -> workflow_pb2.Step:
    return workflow_pb2.Step(step_id=step_id, do_nothing=workflow_pb2.DoNothingStep())


def graph(
    steps: Sequence[workflow_pb2.Step],
    edges: Sequence[str],
    *,
    keep_by_change: float | None = None,
) -> workflow_pb2.WorkflowSpec:
    """input "in" → sample "sample", then `steps` and `edges`.

    An edge is "from to" (NEXT) or "from match to" / "from no_match to".
    """
    sample = workflow_pb2.SampleStep(interval_seconds=60)
    if keep_by_change is not None:
        sample.keep_by_change.min_displacement = keep_by_change
    all_steps = [
        workflow_pb2.Step(
            step_id="in",
            input=workflow_pb2.InputStep(
                camera_ids=["cam-a"],
                day=workflow_pb2.INPUT_DAY_RUN_DAY,
                window_start=common_pb2.TimeOfDay(hours=8),
                window_end=common_pb2.TimeOfDay(hours=18),
            ),
        ),
        workflow_pb2.Step(step_id="sample", sample=sample),
        *steps,
    ]
    all_edges = [workflow_pb2.Edge(from_step_id="in", to_step_id="sample", branch=NEXT)]
    branches = {"match": MATCH, "no_match": NO_MATCH}
    for edge in edges:
        words = edge.split()
        source, target = words[0], words[-1]
        branch = branches[words[1]] if len(words) == 3 else NEXT
        all_edges.append(workflow_pb2.Edge(from_step_id=source, to_step_id=target, branch=branch))
    return workflow_pb2.WorkflowSpec(
        name="test", graph=workflow_pb2.WorkflowGraph(steps=all_steps, edges=all_edges)
    )


def pins(spec: workflow_pb2.WorkflowSpec) -> list[snapshot_pb2.PinnedModel]:
    return [
        snapshot_pb2.PinnedModel(step_id=step.step_id, name=step.model.model_name, version=1)
        for step in spec.graph.steps
        if step.HasField("model")
    ]


CLASSES = ("person", "car", "dog", "cat")


def router(spec: workflow_pb2.WorkflowSpec, *, valid: bool = True) -> Router:
    """The spec's router; by default the coordinator must accept the spec first."""
    if valid:
        models = {
            step.model.model_name: {1: CLASSES}
            for step in spec.graph.steps
            if step.HasField("model")
        }
        catalog = Catalog(
            camera_ids=frozenset({"cam-a"}), bucket_ids=frozenset({"yard"}), models=models
        )
        assert validate_workflow(spec, catalog).problems == ()
    return Router(spec, pins(spec))


def simple(
    classes: Sequence[str] = (), min_score: float = 0.0, motion: float | None = None
) -> workflow_pb2.WorkflowSpec:
    """sample → detect → rule → (match) save / (no match) drop."""
    return graph(
        [model("detect"), rule("rule", classes, min_score, motion), output("save"), drop("drop")],
        ["sample detect", "detect rule", "rule match save", "rule no_match drop"],
    )


def box(cls: str = "person", score: float = 0.9, x: float = 0.1, y: float = 0.1) -> Box:
    return Box(class_name=cls, score=score, x=x, y=y, w=0.2, h=0.2)


def outputs(routed: Routed) -> dict[str, list[str]]:
    return {step_id: [b.class_name for b in boxes] for step_id, boxes in routed.outputs}


# --- rules -------------------------------------------------------------------------------------


def test_class_filter_keeps_only_matching_boxes() -> None:
    person, car = box("person"), box("car")
    routed = router(simple(["person"])).route({"detect": [car, person]})
    assert routed.outcome == "frame"
    assert routed.outputs == (("save", (person,)),)
    assert routed.boxes == (car, person)
    assert routed.reason == ""


def test_no_passing_box_goes_to_do_nothing() -> None:
    routed = router(simple(["person"])).route({"detect": [box("car")]})
    assert routed == Routed(outcome="dropped", outputs=(), boxes=(box("car"),), reason="do_nothing")


def test_frame_without_boxes_does_not_match() -> None:
    routed = router(simple()).route({"detect": []})
    assert routed.outcome == "dropped"
    assert routed.boxes == ()


def test_empty_class_list_means_every_class() -> None:
    routed = router(simple()).route({"detect": [box("car"), box("dog")]})
    assert outputs(routed) == {"save": ["car", "dog"]}


def test_min_score() -> None:
    r = router(simple(min_score=0.5))
    assert outputs(r.route({"detect": [box(score=0.4), box("car", score=0.5)]})) == {
        "save": ["car"]
    }
    assert r.route({"detect": [box(score=0.49)]}).outcome == "dropped"
    # The threshold is a proto float: 0.3 as float32 still lets a 0.3 score pass.
    assert router(simple(min_score=0.3)).route({"detect": [box(score=0.3)]}).outcome == "frame"


def test_no_match_can_reach_an_output_with_boxes_unchanged() -> None:
    spec = graph(
        [model("detect"), rule("rule", ["person"]), output("people"), output("rest")],
        ["sample detect", "detect rule", "rule match people", "rule no_match rest"],
    )
    routed = router(spec).route({"detect": [box("car", score=0.1), box("dog")]})
    assert routed.outcome == "frame"
    assert outputs(routed) == {"rest": ["car", "dog"]}


def test_two_outputs_from_one_step() -> None:
    spec = graph(
        [model("detect"), output("a"), output("b")],
        ["sample detect", "detect a", "detect b"],
    )
    routed = router(spec).route({"detect": [box()]})
    assert outputs(routed) == {"a": ["person"], "b": ["person"]}


def test_output_and_do_nothing_together_is_a_frame() -> None:
    spec = graph(
        [model("detect"), rule("cars", ["car"]), output("save"), drop("drop")],
        ["sample detect", "detect save", "detect cars", "cars match drop", "cars no_match drop"],
    )
    assert outputs(router(spec).route({"detect": [box("car")]})) == {"save": ["car"]}


def test_chained_rules_carry_the_last_rules_boxes() -> None:
    spec = graph(
        [
            model("detect"),
            rule("animals", ["dog", "cat"]),
            rule("sure", min_score=0.8),
            output("save"),
            drop("drop"),
        ],
        [
            "sample detect",
            "detect animals",
            "animals match sure",
            "animals no_match drop",
            "sure match save",
            "sure no_match drop",
        ],
    )
    r = router(spec)
    routed = r.route({"detect": [box("dog", 0.9), box("cat", 0.6), box("person", 0.99)]})
    assert outputs(routed) == {"save": ["dog"]}
    assert r.route({"detect": [box("cat", 0.6), box("person", 0.99)]}).outcome == "dropped"


def test_two_models_add_their_boxes_along_the_path() -> None:
    spec = graph(
        [model("people"), model("cars"), output("save")],
        ["sample people", "people cars", "cars save"],
    )
    r = router(spec)
    routed = r.route({"cars": [box("car")], "people": [box("person")]})
    assert outputs(routed) == {"save": ["person", "car"]}
    assert [b.class_name for b in routed.boxes] == ["person", "car"]  # graph order


def test_output_reached_twice_gets_the_union_once() -> None:
    spec = graph(
        [
            model("detect"),
            rule("people", ["person"]),
            rule("cars", ["car"]),
            output("save"),
            drop("drop"),
        ],
        [
            "sample detect",
            "detect people",
            "detect cars",
            "people match save",
            "people no_match drop",
            "cars match save",
            "cars no_match drop",
        ],
    )
    routed = router(spec).route({"detect": [box("car"), box("dog"), box("person")]})
    assert outputs(routed) == {"save": ["car", "person"]}


def test_photo_graph_without_models() -> None:
    spec = graph([output("photo")], ["sample photo"])
    r = router(spec)
    assert r.models == ()
    assert r.route({}) == Routed(outcome="frame", outputs=(("photo", ()),), boxes=())


# --- invalid input -----------------------------------------------------------------------------


def test_branch_without_edge_raises() -> None:
    spec = graph(
        [model("detect"), rule("rule", ["person"]), output("save")],
        ["sample detect", "detect rule", "rule match save"],
    )
    r = router(spec, valid=False)
    assert r.route({"detect": [box()]}).outcome == "frame"
    with pytest.raises(RoutingError, match="NO_MATCH"):
        r.route({"detect": [box("car")]})


def test_detections_must_name_the_model_steps() -> None:
    r = router(simple())
    with pytest.raises(RoutingError):
        r.route({})
    with pytest.raises(RoutingError):
        r.route({"detect": [], "other": []})


def test_model_step_needs_a_pinned_model() -> None:
    with pytest.raises(RoutingError, match="pinned"):
        Router(simple(), [])


def test_unknown_edge_target_raises() -> None:
    with pytest.raises(RoutingError, match="unknown"):
        router(graph([output("save")], ["sample missing"]), valid=False)


def test_motion_rule_needs_tracked_boxes() -> None:
    with pytest.raises(RoutingError, match="motion"):
        router(simple(motion=0.05)).route({"detect": [box()]})
    with pytest.raises(RoutingError, match="needs tracking"):
        JobRouter(router(simple(motion=0.05)), track=False)


# --- tracking: motion route and keep-by-change -------------------------------------------------


def test_needs_tracking() -> None:
    assert not needs_tracking(simple())
    assert needs_tracking(simple(motion=0.0))
    assert needs_tracking(graph([output("save")], ["sample save"], keep_by_change=0.0))
    assert not JobRouter(router(simple())).route({"detect": [box()]}).boxes[0].track_id


def test_motion_route_standing_still_then_moving() -> None:
    job = JobRouter(router(simple(motion=0.05)))
    first = job.route({"detect": [box(x=0.1)]})
    assert first.outcome == "frame"  # it first appears
    assert first.outputs[0][1][0].track_id == 1
    assert job.route({"detect": [box(x=0.1)]}).outcome == "dropped"  # standing still
    assert job.route({"detect": [box(x=0.12)]}).outcome == "dropped"  # 0.02 < 0.05
    moved = job.route({"detect": [box(x=0.17)]})  # 0.05 since the previous sampled frame
    assert moved.outcome == "frame"
    assert moved.outputs[0][1][0].track_id == 1


def test_motion_route_passes_only_moving_boxes() -> None:
    job = JobRouter(router(simple(motion=0.0)))  # default 0.02
    job.route({"detect": [box(x=0.1), box("car", x=0.6)]})
    routed = job.route({"detect": [box(x=0.1), box("car", x=0.63)]})
    assert outputs(routed) == {"save": ["car"]}
    assert [b.track_id for b in routed.boxes] == [1, 2]


def keep_by_change_spec() -> workflow_pb2.WorkflowSpec:
    spec = simple()
    spec.graph.steps[1].sample.keep_by_change.min_displacement = 0.05
    return spec


def test_keep_by_change_drops_a_static_scene() -> None:
    job = JobRouter(router(keep_by_change_spec()))
    assert job.route({"detect": [box()]}).outcome == "frame"
    unchanged = job.route({"detect": [box(x=0.11)]})
    assert unchanged.outcome == "dropped"
    assert unchanged.reason == "unchanged"
    assert unchanged.outputs == ()
    assert [b.track_id for b in unchanged.boxes] == [1]  # still reported


def test_keep_by_change_keeps_moving_and_appearing_objects() -> None:
    job = JobRouter(router(keep_by_change_spec()))
    job.route({"detect": [box(x=0.1)]})
    assert job.route({"detect": [box(x=0.16)]}).outcome == "frame"  # moved 0.06
    appeared = job.route({"detect": [box(x=0.16), box("car", x=0.6)]})
    assert appeared.outcome == "frame"
    assert outputs(appeared) == {"save": ["person", "car"]}
    gone = job.route({"detect": [box(x=0.16)]})  # the car disappeared: a change
    assert gone.outcome == "frame"


def test_keep_by_change_then_rule_can_still_drop() -> None:
    spec = keep_by_change_spec()
    spec.graph.steps[3].rule.class_names.append("car")
    job = JobRouter(router(spec))
    routed = job.route({"detect": [box("person")]})
    assert routed.outcome == "dropped"
    assert routed.reason == "do_nothing"


# --- SlotResult --------------------------------------------------------------------------------


def test_to_slot_result() -> None:
    job = JobRouter(router(keep_by_change_spec()))
    when = datetime.datetime(2026, 11, 29, 8, 0, 5, tzinfo=datetime.UTC)
    frame = to_slot_result(
        3, when, job.route({"detect": [box()]}), upload_key="k", upload_sha256="a" * 64
    )
    assert frame.slot_index == 3
    assert frame.outcome == common_pb2.SLOT_OUTCOME_FRAME
    assert frame.frame_time.ToDatetime(tzinfo=datetime.UTC) == when
    assert [o.step_id for o in frame.outputs] == ["save"]
    assert frame.outputs[0].boxes[0].track_id == 1
    assert frame.boxes[0].class_name == "person"
    assert (frame.upload_key, frame.upload_sha256) == ("k", "a" * 64)

    dropped = to_slot_result(4, when, job.route({"detect": [box()]}))
    assert dropped.outcome == common_pb2.SLOT_OUTCOME_DROPPED
    assert len(dropped.boxes) == 1
    assert not dropped.outputs
    assert dropped.upload_key == ""
    assert dropped.HasField("frame_time")

    empty = empty_slot_result(5)
    assert empty.outcome == common_pb2.SLOT_OUTCOME_EMPTY
    assert not empty.HasField("frame_time")


def test_to_slot_result_refuses_incomplete_uploads() -> None:
    routed = router(simple()).route({"detect": [box()]})
    when = datetime.datetime(2026, 11, 29, 8, 0, 5, tzinfo=datetime.UTC)
    test_run_frame = to_slot_result(0, when, routed)  # test runs upload nothing
    assert (test_run_frame.upload_key, test_run_frame.upload_sha256) == ("", "")
    with pytest.raises(ValueError, match="upload"):
        to_slot_result(0, when, routed, upload_key="k")
    with pytest.raises(ValueError, match="timezone"):
        to_slot_result(0, when.replace(tzinfo=None), routed, upload_key="k", upload_sha256="x")


def test_to_slot_result_leaves_recorded_boxes_to_the_record() -> None:
    """With boxes_recorded, a one-output frame carries no box: its preview's record holds
    them (RoutedOutput.boxes_recorded); only an uploaded one-output frame may say so."""
    routed = router(simple()).route({"detect": [box()]})
    when = datetime.datetime(2026, 11, 29, 8, 0, 5, tzinfo=datetime.UTC)
    frame = to_slot_result(
        0, when, routed, upload_key="k", upload_sha256="a" * 64, boxes_recorded=True
    )
    assert [(o.step_id, o.boxes_recorded, len(o.boxes)) for o in frame.outputs] == [
        ("save", True, 0)
    ]
    assert not frame.boxes
    assert (frame.upload_key, frame.upload_sha256) == ("k", "a" * 64)
    with pytest.raises(ValueError, match="recorded boxes"):
        to_slot_result(0, when, routed, boxes_recorded=True)  # nothing uploaded
