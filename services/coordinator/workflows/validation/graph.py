"""Checks of the graph's edges and structure: which steps an edge joins and on which
branch, cycles, steps no input reaches, steps no edge leaves, an output no frame reaches."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from services.coordinator.workflows.validation.problems import (
    BRANCH_LABELS,
    Found,
    K,
    edges_path,
    listed,
    quoted,
    step_name,
    steps_path,
)
from workshop.v1 import workflow_pb2

_FLOW = frozenset({"model", "rule", "output", "do_nothing"})
_ALLOWED_TARGETS: Mapping[str, frozenset[str]] = {
    "input": frozenset({"sample"}),
    "sample": _FLOW,
    "model": _FLOW,
    "rule": _FLOW,
    "output": frozenset(),
    "do_nothing": frozenset(),
}
TERMINAL_KINDS = frozenset({"output", "do_nothing"})
RULE_BRANCHES = (workflow_pb2.EDGE_BRANCH_MATCH, workflow_pb2.EDGE_BRANCH_NO_MATCH)


@dataclass(frozen=True)
class _Link:
    """An edge whose endpoints are both addressable steps."""

    edge_index: int
    source: int
    target: int
    branch: int


@dataclass
class Graph:
    steps: Sequence[workflow_pb2.Step]
    kinds: Sequence[str | None]
    addressable: list[int]  # step indexes edges can name, in document order
    links: list[_Link]
    # Links whose step kinds may follow each other. Only these can close a reportable cycle:
    # an edge back into the input or sample step is already a BAD_CONNECTION.
    flow_links: list[_Link]
    successors: dict[int, list[int]]
    predecessors: dict[int, list[int]]

    def name(self, index: int) -> str:
        return step_name(self.steps[index], index)


def build_graph(graph: workflow_pb2.WorkflowGraph, found: Found) -> Graph:
    steps = graph.steps
    index_of: dict[str, int] = {}
    for index, step in enumerate(steps):
        if step.step_id:
            index_of.setdefault(step.step_id, index)
    kinds = [step.WhichOneof("kind") for step in steps]
    links: list[_Link] = []
    flow_links: list[_Link] = []
    seen: dict[tuple[int, int, int], int] = {}
    for edge_index, edge in enumerate(graph.edges):
        link = _resolve_edge(edge, edge_index, index_of, found)
        if link is None:
            continue
        key = (link.source, link.target, link.branch)
        if key in seen:
            found.add(
                K.VALIDATION_PROBLEM_KIND_BAD_CONNECTION,
                edges_path(edge_index),
                f"Edge from {quoted(edge.from_step_id)} to {quoted(edge.to_step_id)} repeats "
                f"graph.edges[{seen[key]}]; remove one of them.",
            )
            continue  # the first copy is judged (and carries frames) already
        seen[key] = edge_index
        if _check_connection(link, steps, kinds, found):
            flow_links.append(link)
        links.append(link)
    addressable = sorted(index_of.values())
    successors: dict[int, list[int]] = {index: [] for index in addressable}
    predecessors: dict[int, list[int]] = {index: [] for index in addressable}
    for link in links:
        successors[link.source].append(link.target)
        predecessors[link.target].append(link.source)
    return Graph(steps, kinds, addressable, links, flow_links, successors, predecessors)


def _resolve_edge(
    edge: workflow_pb2.Edge, edge_index: int, index_of: Mapping[str, int], found: Found
) -> _Link | None:
    source = index_of.get(edge.from_step_id)
    target = index_of.get(edge.to_step_id)
    for end, step_id, resolved in (
        ("from_step_id", edge.from_step_id, source),
        ("to_step_id", edge.to_step_id, target),
    ):
        if resolved is None:
            what = "starts" if end == "from_step_id" else "ends"
            text = (
                f"Edge {edge_index} {what} at no step; name a step id."
                if not step_id
                else f"Edge {edge_index} {what} at {quoted(step_id)}, which is not in the graph."
            )
            found.add(
                K.VALIDATION_PROBLEM_KIND_UNKNOWN_STEP, f"{edges_path(edge_index)}.{end}", text
            )
    if source is None or target is None:
        return None
    return _Link(edge_index, source, target, edge.branch)


def _check_connection(
    link: _Link, steps: Sequence[workflow_pb2.Step], kinds: Sequence[str | None], found: Found
) -> bool:
    """Report what is wrong with one edge; True when its step kinds may follow each other."""
    source_kind, target_kind = kinds[link.source], kinds[link.target]
    path = edges_path(link.edge_index)
    source, target = steps[link.source], steps[link.target]
    source_name = step_name(source, link.source)
    target_name = step_name(target, link.target)
    if source_kind in TERMINAL_KINDS:
        found.add(
            K.VALIDATION_PROBLEM_KIND_BAD_CONNECTION,
            f"{path}.from_step_id",
            f"{source_name} ends the flow of frames; no edge may leave it (edge to {target_name}).",
            source.step_id,
        )
        return False
    if source_kind is not None:
        _check_branch(link, source_kind, source, source_name, found)
    if source_kind is None or target_kind is None:
        return True
    if target_kind not in _ALLOWED_TARGETS[source_kind]:
        found.add(
            K.VALIDATION_PROBLEM_KIND_BAD_CONNECTION,
            f"{path}.to_step_id",
            f"{target_name} cannot follow {source_name}; {_allowed_after(source_kind)}",
            target.step_id,
        )
        return False
    return True


def _allowed_after(source_kind: str) -> str:
    if source_kind == "input":
        return "the input step is followed only by the sample step."
    return "it may be followed by model, rule, output or do-nothing steps."


def _check_branch(
    link: _Link, source_kind: str, source: workflow_pb2.Step, source_name: str, found: Found
) -> None:
    if source_kind == "rule":
        if link.branch in RULE_BRANCHES:
            return
        expected = "MATCH or NO_MATCH"
    else:
        if link.branch == workflow_pb2.EDGE_BRANCH_NEXT:
            return
        expected = "NEXT"
    found.add(
        K.VALIDATION_PROBLEM_KIND_BAD_CONNECTION,
        f"{edges_path(link.edge_index)}.branch",
        f"Edge {link.edge_index} leaves {source_name} on "
        f"{BRANCH_LABELS.get(link.branch, str(link.branch))}; it must leave on {expected}.",
        source.step_id,
    )


def check_cycles(graph: Graph, found: Found) -> None:
    flow: dict[int, list[int]] = {index: [] for index in graph.addressable}
    for link in graph.flow_links:
        flow[link.source].append(link.target)
    for component in _strongly_connected(graph.addressable, flow):
        members = set(component)
        closing = [
            link for link in graph.flow_links if link.source in members and link.target in members
        ]
        if not closing:  # a single step without an edge to itself
            continue
        first_edge = min(link.edge_index for link in closing)
        ordered = sorted(members)
        if len(ordered) == 1:
            text = f"{graph.name(ordered[0])} has an edge to itself, which makes a cycle."
        else:
            ids = [graph.steps[index].step_id for index in ordered]
            text = f"Steps {listed(ids)} form a cycle; frames must flow one way."
        found.add(K.VALIDATION_PROBLEM_KIND_CYCLE, edges_path(first_edge), text)


def _strongly_connected(
    nodes: Iterable[int], successors: Mapping[int, Sequence[int]]
) -> list[list[int]]:
    """Tarjan's components, iteratively (a long chain must not hit the recursion limit)."""
    order: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    components: list[list[int]] = []

    def visit(node: int) -> Iterator[int]:
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        return iter(successors[node])

    for root in nodes:
        if root in order:
            continue
        work = [(root, visit(root))]
        while work:
            node, pending = work[-1]
            descended = False
            for successor in pending:
                if successor not in order:
                    work.append((successor, visit(successor)))
                    descended = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], order[successor])
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == order[node]:
                components.append(_pop_component(stack, on_stack, node))
    return components


def _pop_component(stack: list[int], on_stack: set[int], root: int) -> list[int]:
    component: list[int] = []
    while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == root:
            return component


def walk(starts: Iterable[int], neighbours: Callable[[int], Iterable[int]]) -> set[int]:
    seen = set(starts)
    frontier = list(seen)
    while frontier:
        for neighbour in neighbours(frontier.pop()):
            if neighbour not in seen:
                seen.add(neighbour)
                frontier.append(neighbour)
    return seen


def check_reachability(graph: Graph, found: Found) -> set[int] | None:
    """Steps reached from an input step; None when the graph has no (addressable) input step."""
    inputs = [index for index in graph.addressable if graph.kinds[index] == "input"]
    if not inputs:
        return None
    reachable = walk(inputs, graph.successors.__getitem__)
    for index in graph.addressable:
        if index not in reachable and graph.kinds[index] is not None:
            found.add(
                K.VALIDATION_PROBLEM_KIND_UNREACHABLE_STEP,
                steps_path(index),
                f"{graph.name(index)} cannot be reached from the input step; "
                "connect it or remove it.",
                graph.steps[index].step_id,
            )
    return reachable


def check_dangling(graph: Graph, found: Found) -> None:
    branches_leaving: dict[int, set[int]] = {index: set() for index in graph.addressable}
    for link in graph.links:
        branches_leaving[link.source].add(link.branch)
    for index in graph.addressable:
        kind = graph.kinds[index]
        if kind is None or kind in TERMINAL_KINDS:
            continue
        leaving = branches_leaving[index]
        if kind == "rule":
            _check_rule_branches(graph, index, leaving, found)
        elif not leaving:
            found.add(
                K.VALIDATION_PROBLEM_KIND_DANGLING_STEP,
                steps_path(index),
                f"{graph.name(index)} has no outgoing edge; connect it to the next step.",
                graph.steps[index].step_id,
            )


def _check_rule_branches(graph: Graph, index: int, leaving: set[int], found: Found) -> None:
    for branch in RULE_BRANCHES:
        if branch not in leaving:
            label = BRANCH_LABELS[branch]
            found.add(
                K.VALIDATION_PROBLEM_KIND_DANGLING_STEP,
                steps_path(index),
                f"{graph.name(index)} has no edge on its {label} branch; connect it "
                "(use a do-nothing step to drop those frames).",
                graph.steps[index].step_id,
            )


def check_output_reached(graph: Graph, reachable: set[int] | None, found: Found) -> None:
    outputs = [index for index, kind in enumerate(graph.kinds) if kind == "output"]
    if not outputs:
        found.add(
            K.VALIDATION_PROBLEM_KIND_NO_OUTPUT,
            "graph.steps",
            "The graph has no output step; add one that saves frames into a bucket.",
        )
    elif reachable is not None and reachable.isdisjoint(outputs):
        found.add(
            K.VALIDATION_PROBLEM_KIND_NO_OUTPUT,
            "graph.steps",
            "No output step can be reached from the input step, so no frame would be saved.",
        )
