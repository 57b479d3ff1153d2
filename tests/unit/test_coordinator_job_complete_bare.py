"""`jobs.job_complete_bare` is `jobs.job_complete` for a result that saves nothing: the same
call of the same function, with every array parameter (and the grouping's camera) written
empty in the statement instead of sent. The two are separate texts, so this keeps them from
drifting apart when the commit's function gets a new version or a parameter."""

from __future__ import annotations

import re

from services.coordinator.platform import queries

_ARRAY_PARAM = re.compile(r":[a-z0-9_]+::([a-z ]+\[\])")


def _call(body: str) -> str:
    """A statement's SQL without its comment lines, its whitespace made single spaces (none
    inside parentheses' edges)."""
    code = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))
    return " ".join(code.split()).replace("( ", "(").replace(" )", ")")


def test_the_bare_commit_is_the_commit_with_its_arrays_written_empty() -> None:
    named = queries.parse_queries(queries.sql_file("jobs").read_text(encoding="utf-8"))
    full, bare = _call(named["job_complete"]), _call(named["job_complete_bare"])
    emptied = _ARRAY_PARAM.sub(r"'{}'::\1", full).replace(
        "p_camera => :camera_id::text", "p_camera => ''"
    )
    assert emptied != full
    assert bare == emptied
    # what is still sent: the lease, the reporter, the result's facts and counts, and now
    assert [p.name for p in queries.statements("jobs")["job_complete_bare"].params] == [
        "run_id", "job_index", "generation", "lease_token", "reporter", "code_sha256",
        "result_sha256", "decoder", "slot_count", "first_slot_at", "interval_ms", "frames",
        "empties", "dropped", "now",
    ]  # fmt: skip


def _function_call(statement: str, function: str) -> str:
    """`function(...)`'s call in a statement: from its name to the parenthesis closing it."""
    start = statement.index(f"{function}(")
    depth = 0
    for end in range(start, len(statement)):
        depth += {"(": 1, ")": -1}.get(statement[end], 0)
        if statement[end] == ")" and depth == 0:
            return statement[start : end + 1]
    raise AssertionError(f"{function}'s call is not closed")


def test_the_commit_then_claim_makes_the_bare_commit_and_the_claim_calls() -> None:
    """jobs.job_complete_bare_then_claim calls the commit exactly as job_complete_bare and
    the claim exactly as job_claim (their parameters named alike), and selects what each of
    them answers."""
    named = queries.parse_queries(queries.sql_file("jobs").read_text(encoding="utf-8"))
    both = _call(named["job_complete_bare_then_claim"])
    calls = (("job_complete_bare", "job_complete_v6"), ("job_claim", "job_claim_many_v2"))
    for alone, function in calls:
        call = _function_call(_call(named[alone]), function)
        assert _function_call(both, function) == call
    claim_columns = _call(named["job_claim"]).split(" FROM ")[0].removeprefix("SELECT ")
    assert claim_columns.replace("(c.job)", "(n.job)").replace("c.recording", "n.recording") in both
