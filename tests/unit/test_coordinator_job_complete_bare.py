"""`jobs.job_complete_bare` is `jobs.job_complete` for a result that saves nothing: the same
call of the same function, with every array parameter (and the grouping's camera) written
empty in the statement instead of sent. The two are separate texts, so this keeps them from
drifting apart when the commit's function gets a new version or a parameter."""

from __future__ import annotations

import re

from services.coordinator.platform import queries

_ARRAY_PARAM = re.compile(r":[a-z0-9_]+::([a-z ]+\[\])")


def _call(body: str) -> str:
    """A statement's SQL without its comment lines, its whitespace made single spaces."""
    code = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))
    return " ".join(code.split())


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
