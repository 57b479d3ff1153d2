"""A workflow's validation problems: each one's kind, path, step and message, collected
for the whole document and sorted into document order, and the wording messages share."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from workshop.v1 import common_pb2, workflow_pb2

K = workflow_pb2.ValidationProblemKind
_SHOWN_VALUE_LENGTH = 80
KIND_LABELS: Mapping[str | None, str] = {
    "input": "Input step",
    "sample": "Sample step",
    "model": "Model step",
    "rule": "Rule",
    "output": "Output step",
    "do_nothing": "Do-nothing step",
    None: "Step",
}
BRANCH_LABELS: Mapping[int, str] = {
    workflow_pb2.EDGE_BRANCH_UNSPECIFIED: "no branch",
    workflow_pb2.EDGE_BRANCH_NEXT: "NEXT",
    workflow_pb2.EDGE_BRANCH_MATCH: "MATCH",
    workflow_pb2.EDGE_BRANCH_NO_MATCH: "NO_MATCH",
}


@dataclass(frozen=True)
class Problem:
    """One problem: `kind` is a `workflow_pb2.ValidationProblemKind` value."""

    kind: int
    path: str
    step_id: str
    message: str

    def to_proto(self) -> workflow_pb2.ValidationProblem:
        return workflow_pb2.ValidationProblem(
            kind=workflow_pb2.ValidationProblemKind.ValueType(self.kind),
            path=self.path,
            step_id=self.step_id,
            message=self.message,
        )


@dataclass(frozen=True)
class Validation:
    problems: tuple[Problem, ...]
    required_capabilities: tuple[str, ...]

    @property
    def valid(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """Every problem's message, one per line (for the error message a person reads)."""
        return "\n".join(problem.message for problem in self.problems)


@dataclass
class Found:
    problems: list[Problem] = field(default_factory=list)

    def add(self, kind: int, path: str, message: str, step_id: str = "") -> None:
        self.problems.append(Problem(kind=kind, path=path, step_id=step_id, message=message))


_TOP_LEVEL_ORDER = {"name": 0, "time_zone": 1, "graph": 2, "schedule": 3}
_GRAPH_ORDER = {"steps": 0, "edges": 1}
_PATH_HEAD = re.compile(r"(?P<top>\w+)(?:\.(?P<list>steps|edges)(?:\[(?P<index>\d+)\])?)?")


def document_position(path: str) -> tuple[int, int, int]:
    """Where a path sits in the document; a bare list ("graph.steps") comes before its items."""
    head = _PATH_HEAD.match(path)
    if head is None:  # pragma: no cover - every path this module builds matches
        return (len(_TOP_LEVEL_ORDER), 0, 0)
    top = _TOP_LEVEL_ORDER.get(head["top"], len(_TOP_LEVEL_ORDER))
    within = _GRAPH_ORDER.get(head["list"] or "", -1)
    index = int(head["index"]) if head["index"] is not None else -1
    return (top, within, index)


def quoted(value: str) -> str:
    """A user value quoted for a message, shortened so one bad value cannot flood the list."""
    if len(value) > _SHOWN_VALUE_LENGTH:
        value = value[: _SHOWN_VALUE_LENGTH - 1] + "…"
    return f"'{value}'"


def step_name(step: workflow_pb2.Step, index: int) -> str:
    label = KIND_LABELS[step.WhichOneof("kind")]
    if step.step_id:
        return f"{label} {quoted(step.step_id)}"
    return f"{label} at graph.steps[{index}]"


def steps_path(index: int) -> str:
    return f"graph.steps[{index}]"


def edges_path(index: int) -> str:
    return f"graph.edges[{index}]"


def time_text(value: common_pb2.TimeOfDay) -> str:
    return f"{value.hours:02d}:{value.minutes:02d}:{value.seconds:02d}"


def listed(names: Sequence[str]) -> str:
    shown = [quoted(name) for name in names]
    if len(shown) <= 1:
        return "".join(shown)
    return ", ".join(shown[:-1]) + " and " + shown[-1]
