"""The `workshop` command line as subprocesses against a real coordinator (Postgres, gRPC):
workflows from files, runs (dry run, create, list, get, explain, watch's exit codes and
JSON lines, cancel), and refusals as catalog reasons on stderr, never a traceback."""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import timedelta
from pathlib import Path

from google.protobuf import json_format

from testbed.coordinator_leases import claimed, complete_request, empty_result, setup
from testbed.coordinator_world import build_world
from testbed.harness.coordinator import CoordinatorHarness
from tests.cli_runner import admin_secret, start, workshop
from workshop.v1 import workflow_pb2

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "yard-watch.workflow.json"
TABLES = ("runs", "jobs", "run_snapshots")


async def _counts(c: CoordinatorHarness) -> dict[str, int]:
    return {table: await c.count(table) for table in TABLES}


async def test_workflows_from_and_to_files(coordinator: CoordinatorHarness, tmp_path: Path) -> None:
    c = coordinator
    await build_world(c)
    valid, saved = await asyncio.gather(
        workshop(c, "workflows", "validate", str(EXAMPLE)),
        workshop(c, "-o", "json", "workflows", "save", "yard", str(EXAMPLE)),
    )
    assert valid.code == 0, valid.err
    assert "valid" in valid.out
    assert saved.code == 0, saved.err
    assert (saved.json()["workflow_id"], saved.json()["revision"]) == ("yard", 1)

    # get writes the document back; saving it again is revision 2 (its current one by default)
    copy = tmp_path / "yard.json"
    got = await workshop(c, "workflows", "get", "yard", "--file", str(copy))
    assert got.code == 0, got.err
    expected = json_format.Parse(EXAMPLE.read_text(), workflow_pb2.WorkflowSpec())
    assert json_format.Parse(copy.read_text(), workflow_pb2.WorkflowSpec()) == expected
    again = await workshop(c, "-o", "json", "workflows", "save", "yard", str(copy))
    assert again.json()["revision"] == 2

    # a stale revision, a document that does not validate, a file that is not one
    bad = json.loads(EXAMPLE.read_text())
    bad["graph"]["steps"][3]["rule"]["class_names"] = ["truck"]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    (tmp_path / "junk.json").write_text("{not json")
    stale, problems, junk, missing = await asyncio.gather(
        workshop(c, "workflows", "save", "yard", str(copy), "--expected-revision", "1"),
        workshop(c, "-o", "json", "workflows", "validate", str(tmp_path / "bad.json")),
        workshop(c, "workflows", "validate", str(tmp_path / "junk.json")),
        workshop(c, "workflows", "get", "nope"),
    )
    assert stale.code == 1
    assert stale.err.startswith("workshop: STALE_REVISION: ")
    assert "current_revision: 2" in stale.err
    assert problems.code == 1
    assert "VALIDATION_FAILED" in problems.err
    assert "truck" in json.dumps(problems.json()["problems"])
    assert (junk.code, junk.err.split(":")[1].strip()) == (1, "INVALID_FIELD")
    assert missing.code == 1
    assert missing.err.startswith("workshop: NOT_FOUND: ")


async def test_runs_dry_run_create_list_get_explain_cancel(
    coordinator: CoordinatorHarness, tmp_path: Path
) -> None:
    c = coordinator
    world = await build_world(c)
    saved = await workshop(c, "workflows", "save", "yard", str(EXAMPLE))
    assert saved.code == 0, saved.err
    create = ("runs", "create", "--workflow", "yard", "--runtime", world.plain_runtime)

    before = await _counts(c)
    plan = await workshop(c, "-o", "json", *create, "r1", "--mode", "full", "--dry-run")
    assert plan.code == 0, plan.err
    assert await _counts(c) == before
    planned = plan.json()
    assert [(j["job"], j["recording"], j["slots"]) for j in planned["jobs"]] == [
        ("j0", "cam-a-0", 60),
        ("j1", "cam-b-0", 60),
        ("j2", "cam-a-1", 60),
        ("j3", "cam-b-1", 60),
    ]
    assert planned["slots"] == 240
    assert [(m["model"], m["version"], m["from latest"]) for m in planned["models"]] == [
        ("detector", 1, True)
    ]
    table = await workshop(c, *create, "r1", "--mode", "full", "--dry-run")
    assert "4 jobs, 240 slots (nothing was created)" in table.out
    assert "detector" in table.out

    first = await workshop(c, "-o", "json", *create, "r1", "--mode", "full")
    assert first.code == 0, first.err
    assert first.json()["created"] is True
    assert first.json()["run"]["status"] == "queued"
    retry, conflict, second = await asyncio.gather(
        workshop(c, "-o", "json", *create, "r1", "--mode", "full"),
        workshop(c, *create, "r1", "--mode", "test"),
        workshop(
            c,
            "-o",
            "json",
            "runs",
            "create",
            "r2",
            "--workflow",
            "yard",
            "--mode",
            "full",
            "--runtime",
            world.plain_runtime,
        ),
    )
    assert retry.json()["created"] is False
    assert conflict.code == 1
    assert conflict.err.startswith("workshop: ID_CONFLICT: ")
    assert second.code == 0, second.err

    listed, got, explained, explained_table = await asyncio.gather(
        workshop(c, "-o", "json", "runs", "list"),
        workshop(c, "-o", "json", "runs", "get", "r1"),
        workshop(c, "-o", "json", "runs", "explain", "r2"),
        workshop(c, "runs", "explain", "r2"),
    )
    assert [entry["run"]["run_id"] for entry in listed.json()] == ["r2", "r1"]
    assert [job["job_id"] for job in got.json()["jobs"]] == ["j0", "j1", "j2", "j3"]
    assert explained.json()["waiting_behind"] == ["r1"]
    assert "waits behind 1 older run(s)" in explained.json()["verdict"]
    assert "ahead: r1" in explained_table.out

    cancelled = await workshop(c, "-o", "json", "runs", "cancel", "r2")
    assert cancelled.json()["jobs_cancelled"] == 4
    watched = await workshop(c, "-o", "jsonl", "runs", "watch", "r2")
    assert watched.code == 4  # cancelled
    [last] = watched.lines()
    assert last["final"] is True
    assert last["detail"]["run"]["status"] == "cancelled"

    key_file = tmp_path / "admin.key"
    key_file.write_text(admin_secret(c) + "\n")
    unknown, no_key, bad_mode, from_file, last, completion = await asyncio.gather(
        workshop(c, "runs", "get", "nope"),
        workshop(c, "runs", "list", env={"WORKSHOP_KEY": ""}),
        workshop(c, *create, "r3", "--mode", "sometimes"),
        workshop(
            c,
            "--key-file",
            str(key_file),
            "-o",
            "json",
            "runs",
            "get",
            "r1",
            env={"WORKSHOP_KEY": ""},
        ),
        workshop(c, "-o", "json", "runs", "watch", "r2"),
        # --show-completion finds the shell from the process tree, which a test has not
        # got; the variable names it (docs/cli.md)
        workshop(None, env={"_WORKSHOP_COMPLETE": "source_bash"}),
    )
    assert from_file.json()["run"]["run_id"] == "r1"
    assert (last.code, last.json()["run"]["status"]) == (4, "cancelled")
    assert completion.code == 0
    assert "_workshop_completion" in completion.out
    assert unknown.code == 1
    assert unknown.err.startswith("workshop: NOT_FOUND: ")
    assert no_key.code == 2
    assert no_key.err.startswith("workshop: CREDENTIAL_MISSING: ")
    assert bad_mode.code == 2
    assert "--mode" in bad_mode.err


async def test_watch_exit_codes_and_explain_names_the_fence(
    coordinator: CoordinatorHarness,
) -> None:
    """Completed 0, failed 3 (a recording deleted after admission: fence 2), cancelled 4 (above),
    expired 5, interrupted 6; the jobs are claimed and completed here as a processor would."""
    c = coordinator
    s = await setup(c)  # workflow yard over cam-a's two recordings, a workshop:run key
    create = ("runs", "create", "--workflow", "yard", "--runtime", s.world.tracking_runtime)
    assert (await workshop(c, *create, "r1", "--mode", "full")).code == 0

    # interrupted: a watch of a run that waits, stopped with Ctrl-C after its first update
    process = await start(c, "-o", "jsonl", "runs", "watch", "r1")
    assert process.stdout is not None
    first = json.loads(await asyncio.wait_for(process.stdout.readline(), 30))
    assert first["final"] is False
    process.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(process.wait(), 30) == 6

    # a live watch sees the jobs complete, one update at a time, and exits 0
    watcher = await start(c, "-o", "jsonl", "runs", "watch", "r1")
    assert watcher.stdout is not None
    await asyncio.wait_for(watcher.stdout.readline(), 30)
    for _ in range(2):
        job = await claimed(c, s)
        await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
    rest, _ = await asyncio.wait_for(watcher.communicate(), 30)
    assert watcher.returncode == 0
    updates = [json.loads(line) for line in rest.decode().splitlines()]
    assert updates[-1]["final"] is True
    assert updates[-1]["detail"]["run"]["status"] == "completed"
    table = await workshop(c, "runs", "watch", "r1")
    assert table.code == 0
    assert "run r1 completed" in table.out

    # failed: cam-a-0 deleted after r2 was admitted; the claim ends its job (fence 2)
    assert (await workshop(c, *create, "r2", "--mode", "full")).code == 0
    deleted = await workshop(c, "-o", "json", "recordings", "delete", "cam-a-0")
    assert deleted.code == 0, deleted.err
    assert deleted.json()["deleted_at"]
    job = await claimed(c, s)  # j0 fails at the claim; j1 is leased
    await c.jobs.Complete(complete_request(job, empty_result(job)), metadata=s.processor)
    watched, explained, explained_table = await asyncio.gather(
        workshop(c, "-o", "jsonl", "runs", "watch", "r2"),
        workshop(c, "-o", "json", "runs", "explain", "r2"),
        workshop(c, "runs", "explain", "r2"),
    )
    assert watched.code == 3
    assert watched.lines()[-1]["detail"]["run"]["status"] == "failed"
    [failed] = explained.json()["failed_jobs"]
    assert (failed["job_id"], failed["reason"]) == ("j0", "source_changed")
    assert "cam-a-0 was deleted" in failed["message"]
    assert failed["fence"].startswith("fence 2, the source")
    assert "refused by fence 2" in explained_table.out

    # expired: a test run whose hour passed before it ran
    assert (await workshop(c, *create, "r3", "--mode", "test")).code == 0
    c.clock.advance(timedelta(hours=2))
    expired = await workshop(c, "-o", "jsonl", "runs", "watch", "r3")
    assert expired.code == 5
    assert expired.lines()[-1]["detail"]["run"]["status"] == "expired"
