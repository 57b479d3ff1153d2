"""The `workshop` command line's front door, as subprocesses against the real coordinator,
preview service and gateway: global options anywhere on the line, `--version`, `-o json`
as the HTTP API's JSON, tables that keep every value off a terminal, flags shown as plain
switches, and what an export that finds nothing says."""

from __future__ import annotations

import asyncio
import re
import tomllib
from pathlib import Path

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_world import build_world, save_workflow, workflow_spec
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.gateway import GatewayHarness
from testbed.harness.preview import PreviewHarness
from testbed.review_world import Frame, box, commit, review_world, start_run
from tests.cli_runner import admin_secret, workshop
from workshop.kit.limits import PAGE

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "yard-watch.workflow.json"


async def test_global_options_come_anywhere_on_the_line(
    coordinator: CoordinatorHarness, tmp_path: Path
) -> None:
    c = coordinator
    await build_world(c)
    key_file = tmp_path / "admin.key"
    key_file.write_text(admin_secret(c) + "\n")
    address = f"127.0.0.1:{c.port}"
    saved, no_value, joined, from_file = await asyncio.gather(
        workshop(c, "workflows", "save", "yard", str(EXAMPLE), "-o", "json"),
        # `-o` at the very end has no value
        workshop(None, "workflows", "list", "--coordinator", address, "-o"),
        # no environment: the address (and key) after the command, in each spelling
        workshop(
            None,
            "devices",
            "list",
            f"--coordinator={address}",
            "--output=json",
            f"--key={admin_secret(c)}",
        ),
        workshop(
            None, "devices", "list", "-ojson", "--key-file", str(key_file), "--coordinator", address
        ),
    )
    assert saved.code == 0, saved.err
    assert saved.json()["workflow_id"] == "yard"
    assert no_value.code == 2
    assert "'-o' requires an argument" in no_value.err, no_value.err
    assert joined.code == 0, joined.err
    assert [d["device_id"] for d in joined.json()] == ["gpu-box"]
    assert from_file.code == 0, from_file.err
    assert [d["device_id"] for d in from_file.json()] == ["gpu-box"]
    # a subcommand's own options are still its own, and unknown ones still refused
    unknown = await workshop(c, "runs", "list", "--colour", "red")
    assert unknown.code == 2
    assert "No such option: --colour" in unknown.err


async def test_version_is_the_packages() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    printed = await workshop(None, "--version")
    assert printed.code == 0, printed.err
    assert printed.out == f"workshop {version}\n"


async def test_json_is_the_http_apis_json(gateway: GatewayHarness) -> None:
    """One mapping for both: enums as lower-case words, 64-bit integers as numbers."""
    c = gateway.c
    world = await build_world(c)
    await gateway.user("ada")
    secret = await c.key(Grant(ScopeName.WORKSHOP), name="cli", user_id="ada")
    env = {"WORKSHOP_KEY": secret}
    saved = await workshop(c, "workflows", "save", "yard", str(EXAMPLE), env=env)
    assert saved.code == 0, saved.err
    created = await workshop(
        c,
        "runs",
        "create",
        "r1",
        "--workflow",
        "yard",
        "--runtime",
        world.plain_runtime,
        "--mode",
        "full",
        "-o",
        "json",
        env=env,
    )
    assert created.code == 0, created.err
    assert created.json()["run"]["status"] == "queued"
    assert created.json()["run"]["workflow_revision"] == 1
    http = gateway.client(headers={"authorization": f"Bearer {secret}"})
    got, listed, workflow = await asyncio.gather(
        workshop(c, "-o", "json", "runs", "get", "r1", env=env),
        workshop(c, "-o", "json", "runs", "list", env=env),
        workshop(c, "-o", "json", "workflows", "get", "yard", env=env),
    )
    over_http = await asyncio.gather(
        http.get("/v1/workshop/runs/r1"),
        http.get("/v1/workshop/runs"),
        http.get("/v1/workshop/workflows/yard"),
    )
    assert all(answer.status_code == 200 for answer in over_http), [a.text for a in over_http]
    assert got.json() == over_http[0].json()["detail"]
    assert got.json()["run"]["counts"]["slots_expected"] == 240
    assert listed.json() == over_http[1].json()["runs"]
    assert workflow.json() == over_http[2].json()["workflow"]


async def test_tables_off_a_terminal_print_every_value(coordinator: CoordinatorHarness) -> None:
    c = coordinator
    description = " ".join(f"word{n}" for n in range(60))  # far wider than any terminal
    registered = await workshop(c, "devices", "register", "gpu-box", "--description", description)
    assert registered.code == 0, registered.err
    for columns in ("80", ""):  # a shell's COLUMNS, or none: a pipe's output is not cut
        listed = await workshop(c, "devices", "list", env={"COLUMNS": columns})
        assert listed.code == 0, listed.err
        assert description in listed.out, listed.out
        assert "…" not in listed.out


async def test_flags_are_plain_switches_in_help() -> None:
    runs, keys, root = await asyncio.gather(
        workshop(None, "runs", "create", "--help"),
        workshop(None, "keys", "list", "--help"),
        workshop(None, "--help"),
    )
    for shown in (runs, keys, root):
        assert shown.code == 0, shown.err
        assert "<bool>" not in shown.out, shown.out
    assert re.search(r"--dry-run\s+print the jobs", runs.out), runs.out
    assert re.search(r"--include-revoked\s+--no-include-revoked\s+list revoked", keys.out)
    # the global options are in the root's help, with where they may go
    for option in ("--coordinator", "--key-file", "--preview", "--output", "--version"):
        assert option in root.out
    assert "before or after the command" in " ".join(root.out.split())


async def test_an_export_that_finds_nothing_says_why_and_what_it_takes(
    coordinator: CoordinatorHarness, preview: PreviewHarness, tmp_path: Path
) -> None:
    c = coordinator
    s = await review_world(c)
    jobs = await start_run(c, s, "r1")
    # one frame saved to bucket yard, not yet reviewed (pending)
    await commit(c, s, jobs[0], [Frame(0, "save", (box("person", 0.1, 0.1, 0.2),))])
    out = tmp_path / "yard.tar"
    preview_address = f"127.0.0.1:{preview.port}"
    pending, empty, no_preview = await asyncio.gather(
        workshop(c, "buckets", "export", "yard", "--out", str(out), "--preview", preview_address),
        workshop(
            c,
            "buckets",
            "export",
            "lot",
            "--out",
            str(tmp_path / "lot.tar"),
            "--preview",
            preview_address,
        ),
        workshop(c, "buckets", "export", "yard"),
    )
    assert pending.code == 0, pending.err
    assert out.exists()
    said = " ".join(pending.err.split())
    assert "nothing to export" in said, said
    assert "accepted items only" in said
    assert "1 pending" in said
    assert "--review pending" in said
    assert empty.code == 0, empty.err
    said = " ".join(empty.err.split())
    assert "bucket lot holds no items" in said, said
    assert "--mode full" in said
    assert no_preview.code == 2
    assert "WORKSHOP_PREVIEW" in no_preview.err
    assert "the preview service's gRPC address" in no_preview.err


async def test_list_limits_are_the_servers_own(coordinator: CoordinatorHarness) -> None:
    """`--limit` takes what the server takes (workshop.kit.limits): its default page by
    default, refused above its maximum before any call, and its help says so."""
    c = coordinator
    await build_world(c)
    for n in range(PAGE.default + 1):
        await save_workflow(c, f"w{n:03}", workflow_spec())
    listed, largest, too_many, helped = await asyncio.gather(
        workshop(c, "workflows", "list", "-o", "json"),
        workshop(c, "workflows", "list", "--limit", str(PAGE.maximum), "-o", "json"),
        workshop(c, "runs", "list", "--limit", str(PAGE.maximum + 1)),
        workshop(c, "recordings", "list", "--help"),
    )
    assert listed.code == 0, listed.err
    assert len(listed.json()) == PAGE.default
    assert largest.code == 0, largest.err
    assert len(largest.json()) == PAGE.default + 1
    assert too_many.code == 2
    refusal = " ".join(too_many.err.replace("│", " ").split())
    assert f"'--limit': Input should be less than or equal to {PAGE.maximum}" in refusal, refusal
    assert f"(1..{PAGE.maximum:,})" in " ".join(helped.out.split()), helped.out
