"""The workflows page and the workflow editor in a real browser (Debian's Chromium driven
by Playwright) on the real stack: the gateway on uvicorn in front of the coordinator on
Postgres and the preview service on SeaweedFS; the run from the editor also with a real
processor and the demo detector in the bundled Triton. Nothing is mocked: what the pages
show is compared with what the gateway's API answers.

The demo's workflow (input → sample → model → rule → output, the rule's NO_MATCH branch
to do nothing) is built from nothing with the mouse and the keyboard; a validation
message lands on the step it concerns; saving, a stale save from a second page (see what
changed, reload, save as a copy), the schedule, a test run from the editor followed
to completion on its live page, and then a still of a camera taken from the cameras page
(a photo the processor takes). Both pages pass at 390 px without sideways scrolling and
with no serious or critical axe-core violation.

Takes the screenshots workflows.png, editor.png and editor-conflict.png (into
docs/screenshots/ under `make screenshots`, testbed/harness/browser.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Dialog, Page, expect

from testbed.coordinator_world import World
from testbed.harness.browser import needs_chromium
from testbed.harness.gateway import PASSWORD, GatewayHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.console_checks import DESKTOP, check_phone_and_axe
from tests.processor_world import build_world, running_processor

pytestmark = [pytest.mark.timeout(180), needs_chromium]

# The demo's graph (tools/demo/script.py), as the editor names its steps.
DEMO_EDGES = [
    {"from_step_id": "input", "to_step_id": "sample", "branch": "next"},
    {"from_step_id": "sample", "to_step_id": "model", "branch": "next"},
    {"from_step_id": "model", "to_step_id": "rule", "branch": "next"},
    {"from_step_id": "rule", "to_step_id": "output", "branch": "match"},
    {"from_step_id": "rule", "to_step_id": "do-nothing", "branch": "no_match"},
]


async def sign_in(page: Page, user_id: str = "ada") -> None:
    await page.get_by_label("User id").fill(user_id)
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Sign in").click()


def node(page: Page, step_id: str) -> Any:
    return page.locator(f".node[data-step-id='{step_id}']")


async def add(page: Page, kind: str) -> None:
    await page.get_by_role("button", name=f"Add a {kind} step").click()


async def build_demo_workflow(
    page: Page, workflow_id: str, cameras: list[str], classes: list[str], interval: str
) -> None:
    """The demo's workflow, built from an empty editor: steps added with the toolbar
    (each follows the selected one), fields set in the side panel, the rule's NO_MATCH
    edge drawn from the keyboard with the panel's Connect."""
    await page.get_by_role("link", name="New workflow").click()
    await expect(page.get_by_role("heading", name="New workflow")).to_be_focused()
    await page.get_by_label("Id", exact=True).fill(workflow_id)
    await page.get_by_label("Name", exact=True).fill("Yard watch")

    await add(page, "input")
    # The new input names no camera: the server's message lands on that step.
    await expect(node(page, "input").locator(".node-problem")).to_contain_text(
        ["Input step 'input' names no camera; choose at least one."]
    )
    await expect(page.locator("#step-panel .panel-problems")).to_contain_text("names no camera")
    for camera in cameras:
        await page.get_by_label(camera, exact=True).check()
    await expect(node(page, "input").locator(".node-problem", has_text="camera")).to_have_count(0)
    await add(page, "sample")
    await page.get_by_label("Sampling interval (seconds)").fill(interval)
    await add(page, "model")
    await add(page, "rule")
    for name in classes:
        await page.get_by_label(name, exact=True).check()
    await add(page, "output")
    await page.get_by_label("Bucket").select_option("yard")
    # A do-nothing step, then the rule's NO_MATCH edge to it from the keyboard.
    await add(page, "do nothing")
    await expect(node(page, "rule").locator(".node-problem")).to_contain_text(
        [re.compile("no edge on its no.match branch", re.IGNORECASE)]
    )
    await node(page, "rule").focus()
    await page.keyboard.press("Enter")
    await expect(page.locator("#panel-title")).to_be_focused()
    await page.get_by_label("Branch").select_option("no_match")
    await page.get_by_label("Connect to").select_option("do-nothing")
    await page.get_by_role("button", name="Connect", exact=True).click()
    await expect(page.locator("#validation")).to_have_text("No problems: the workflow is valid.")


async def test_build_save_conflict_and_schedule_in_the_editor(
    gateway: GatewayHarness, gateway_world: World, page: Page, screenshots: Path
) -> None:
    await page.goto("/#/workflows")
    await sign_in(page)
    await expect(page.get_by_role("heading", name="Workflows")).to_be_focused()
    await expect(page.locator("tr[data-workflow-id='night']")).to_contain_text("never run")

    await build_demo_workflow(page, "yard-watch", ["cam-a", "cam-b"], ["person", "vehicle"], "3")
    await page.get_by_role("button", name="Save", exact=True).click()
    await expect(page.locator("#save-state")).to_have_text("All changes saved")
    await expect(page.locator("#editor-state")).to_contain_text("Revision 1")
    assert page.url.endswith("#/workflow/yard-watch")
    ada = await gateway.login("ada")
    saved = (await ada.client.get("/api/workshop/workflows/yard-watch")).json()["workflow"]
    assert saved["revision"] == 1
    steps = {s["step_id"]: s for s in saved["spec"]["graph"]["steps"]}
    assert steps["input"]["input"]["camera_ids"] == ["cam-a", "cam-b"]
    assert steps["input"]["input"]["day"] == "previous_day"
    assert steps["sample"]["sample"]["interval_seconds"] == 3
    assert steps["model"]["model"] == {"model_name": "detector"}
    assert steps["rule"]["rule"]["class_names"] == ["person", "vehicle"]
    assert steps["output"]["output"] == {"bucket_id": "yard"}
    assert saved["spec"]["graph"]["edges"] == DEMO_EDGES
    await page.get_by_role("button", name="Arrange the steps by depth").click()
    await node(page, "input").click()
    await page.set_viewport_size({"width": 1680, "height": 1000})  # the whole graph in view
    await page.screenshot(path=str(screenshots / "editor.png"), full_page=True)
    await page.set_viewport_size(DESKTOP)

    # Keyboard: a step moves with the arrow keys, and Delete removes it with its edges.
    await add(page, "model")  # after the selected step, the rule (on its MATCH branch)
    extra = node(page, "model-2")
    await expect(extra).to_be_focused()
    # Its place on the canvas (style left/top), not on the screen: the canvas may still be
    # scrolling the new step into view while the keys are pressed.
    place = "(node) => [parseFloat(node.style.left), parseFloat(node.style.top)]"
    before = await extra.evaluate(place)
    await page.keyboard.press("ArrowDown")
    await page.keyboard.press("Shift+ArrowRight")
    after = await extra.evaluate(place)
    assert (after[0] - before[0], after[1] - before[1]) == (50, 10)
    await expect(extra.locator(".node-problem")).to_contain_text(["has no outgoing edge"])
    await page.keyboard.press("Delete")
    await expect(extra).to_have_count(0)
    await expect(page.locator("#save-state")).to_have_text("All changes saved")

    # A stale save: a second page saves first; this one is offered a choice.
    other = await page.context.new_page()
    await other.goto("/#/workflow/yard-watch")
    await other.get_by_label("Name", exact=True).fill("Yard watch (theirs)")
    await other.get_by_role("button", name="Save", exact=True).click()
    await expect(other.locator("#editor-state")).to_contain_text("Revision 2")
    await node(page, "rule").click()
    await page.get_by_label("Minimum score").fill("0.7")
    await page.get_by_role("button", name="Save", exact=True).click()
    dialog = page.get_by_role("dialog", name="This workflow was saved meanwhile")
    await expect(dialog).to_be_visible()
    await expect(dialog).to_contain_text("You are editing revision 1; revision 2 was saved since.")
    await dialog.get_by_role("button", name="See what changed").click()
    await expect(dialog.locator("#conflict-list li")).to_contain_text(
        ['Name: theirs "Yard watch (theirs)", yours "Yard watch".', 'Rule "rule": changed']
    )
    await page.screenshot(path=str(screenshots / "editor-conflict.png"))
    assert (await ada.client.get("/api/workshop/workflows/yard-watch")).json()["workflow"][
        "revision"
    ] == 2  # nothing was overwritten
    await dialog.get_by_role("button", name="Reload revision 2 (drop my changes)").click()
    await expect(dialog).to_be_hidden()
    await expect(page.get_by_label("Name", exact=True)).to_have_value("Yard watch (theirs)")
    await expect(page.locator("#editor-state")).to_contain_text("Revision 2")

    # The schedule, in a time zone; a zone that is not one is refused where it is typed.
    await page.get_by_label("Time zone").fill("Mars/Olympus")
    await expect(page.locator("#document-problems")).to_contain_text("Mars/Olympus")
    await expect(page.get_by_label("Time zone")).to_have_attribute("aria-invalid", "true")
    await page.get_by_label("Time zone").fill("Europe/Berlin")
    await page.get_by_label("A full run every day at").check()
    await page.get_by_label("Time of the daily run").fill("06:30")
    await expect(page.locator("#validation")).to_have_text("No problems: the workflow is valid.")
    await page.get_by_role("button", name="Save", exact=True).click()
    await expect(page.locator("#editor-state")).to_contain_text("Revision 3")
    saved = (await ada.client.get("/api/workshop/workflows/yard-watch")).json()["workflow"]
    assert saved["spec"]["time_zone"] == "Europe/Berlin"
    assert saved["spec"]["schedule"] == {"time_of_day": {"hours": 6, "minutes": 30, "seconds": 0}}

    # Stale again (the second page still holds revision 2): this time saved as a copy.
    await other.get_by_label("Name", exact=True).fill("Yard watch (mine)")
    await other.get_by_role("button", name="Save", exact=True).click()
    stale = other.get_by_role("dialog", name="This workflow was saved meanwhile")
    await stale.get_by_role("button", name="Save mine as a copy").click()
    await expect(stale.get_by_label("Id of the copy")).to_have_value("yard-watch-copy")
    await stale.get_by_role("button", name="Save the copy").click()
    await expect(stale).to_be_hidden()
    assert other.url.endswith("#/workflow/yard-watch-copy")
    copy = (await ada.client.get("/api/workshop/workflows/yard-watch-copy")).json()["workflow"]
    assert (copy["revision"], copy["spec"]["name"]) == (1, "Yard watch (mine) (copy)")
    original = (await ada.client.get("/api/workshop/workflows/yard-watch")).json()["workflow"]
    assert original["revision"] == 3
    await other.close()

    # The workflows page lists both, with revision and schedule.
    await page.get_by_role("link", name="Workflows").click()
    row = page.locator("tr[data-workflow-id='yard-watch']")
    await expect(row).to_contain_text("daily at 06:30 Europe/Berlin")
    await expect(row.locator("td").nth(1)).to_have_text("3")
    await page.screenshot(path=str(screenshots / "workflows.png"), full_page=True)


async def test_the_workflows_page_and_the_editor_at_phone_width_and_by_axe(
    gateway: GatewayHarness, gateway_world: World, page: Page
) -> None:
    await page.goto("/#/workflows")
    await sign_in(page)
    await expect(page.locator("tr[data-workflow-id='night']")).to_be_visible()
    await check_phone_and_axe(page)
    await page.get_by_role("link", name="yard watch").click()
    await expect(page.get_by_role("heading", name="Workflow yard watch")).to_be_focused()
    await expect(page.locator("#validation")).to_have_text("No problems: the workflow is valid.")
    await node(page, "rule").click()
    await check_phone_and_axe(page)

    # The mouse: a step dragged moves; a drag from a branch handle onto a step draws an edge
    # (in a viewport tall enough for both ends: a mouse drag does not scroll).
    await page.set_viewport_size({"width": 1280, "height": 1400})
    await add(page, "do nothing")  # after the rule: its first branch, MATCH
    extra = node(page, "do-nothing")
    before = await extra.bounding_box()
    assert before is not None
    await page.mouse.move(before["x"] + 20, before["y"] + 10)
    await page.mouse.down()
    await page.mouse.move(before["x"] + 60, before["y"] + 90, steps=5)
    await page.mouse.up()
    after = await extra.bounding_box()
    assert after is not None
    assert (round(after["x"] - before["x"]), round(after["y"] - before["y"])) == (40, 80)
    handle = node(page, "rule").locator(".port-no_match")
    await handle.hover()
    await page.mouse.down()
    target = await extra.bounding_box()
    assert target is not None
    await page.mouse.move(target["x"] + 30, target["y"] + 20, steps=5)
    await page.mouse.up()
    await node(page, "rule").click()
    await expect(page.locator("#step-panel .edge-list li")).to_contain_text(
        ["rule → do-nothing (match)", "rule → do-nothing (no match)"]
    )
    await expect(page.locator("#validation")).to_have_text("No problems: the workflow is valid.")
    await node(page, "do-nothing").focus()
    await page.keyboard.press("Delete")
    await expect(node(page, "do-nothing")).to_have_count(0)
    await page.set_viewport_size(DESKTOP)
    await node(page, "rule").click()

    # With problems on a step and on an edge: a cycle's message is written on its edge.
    await page.get_by_label("Minimum score").fill("2")
    await expect(node(page, "rule").locator(".node-problem")).to_contain_text(
        ["has minimum score 2; use a value from 0 to 1."]
    )
    await page.get_by_label("Branch").select_option("match")
    await page.get_by_label("Connect to").select_option("detect")
    await page.get_by_role("button", name="Connect", exact=True).click()
    note = page.locator(".edge-note")
    await expect(note).to_contain_text("cycle")
    await note.click()
    await expect(page.locator("#panel-title")).to_have_text(
        re.compile(r"^Edge (detect → rule|rule → detect \(match\))$")
    )
    await expect(page.locator("#step-panel .panel-problems")).to_contain_text("cycle")
    await check_phone_and_axe(page)


@pytest.mark.triton
async def test_a_test_run_from_the_editor_completes_on_its_live_page(
    gateway: GatewayHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    tmp_path: Path,
    page: Page,
) -> None:
    c = gateway.c
    world = await build_world(c, preview, triton_server, tmp_path)
    await gateway.user("ada")
    ada = await gateway.login("ada")
    dialogs: list[str] = []

    async def answer(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        await dialog.dismiss()  # Run full is asked for, then declined

    page.on("dialog", answer)
    await page.goto("/#/workflows")
    await sign_in(page)
    await expect(page.locator("#workflows-empty")).to_be_visible()
    await build_demo_workflow(page, "yard-watch", ["cam-a", "cam-b"], ["person", "vehicle"], "2")
    await node(page, "model").click()
    await expect(page.get_by_label("Model", exact=True)).to_have_value(world.model)
    # Not saved yet: the page cannot choose a runtime before the workflow exists.
    await expect(page.locator("#editor-runtime")).to_have_text(
        "Runtime: chosen once the workflow is saved."
    )

    # Run full asks first, naming the bucket; declined, nothing is saved or created.
    async with page.expect_event("dialog"):
        await page.get_by_role("button", name="Run full…").click()
    assert "saved into bucket yard" in dialogs[0], dialogs
    assert "Your changes are saved first." in dialogs[0], dialogs
    missing = await ada.client.get("/api/workshop/workflows/yard-watch")
    assert missing.status_code == 404, missing.text

    async with running_processor(c, preview, triton_server, world.runtime_id):
        await page.get_by_label("Test images").fill("4")
        await page.get_by_role("button", name="Run test").click()  # saves first
        await expect(page).to_have_url(re.compile(r"#/run/yard-watch-"))
        run_id = page.url.split("#/run/")[1]
        await expect(page.locator("#run-status")).to_have_text("completed", timeout=60_000)
        # A still of cam-a 5 s into its recording, from the cameras page: a photo the
        # processor takes.
        await page.goto("/#/cameras/cam-a")
        await expect(page.locator("#coverage-covered")).to_have_text(
            "Covered: 08:00:00 to 08:00:20 (cam-a-0)"
        )
        await page.get_by_label("Time on 2026-11-29 (UTC)").fill("08:00:05")
        await page.get_by_role("button", name="Take a photo").click()
        photo = page.get_by_role("img", name="cam-a at 2026-11-29T08:00:05")
        await expect(photo).to_be_visible(timeout=60_000)
        await expect(photo).to_have_js_property("naturalWidth", 640)  # the frame, loaded
    saved = (await ada.client.get("/api/workshop/workflows/yard-watch")).json()["workflow"]
    assert saved["revision"] == 1
    detail = (await ada.client.get(f"/api/workshop/runs/{run_id}")).json()["detail"]
    run = detail["run"]
    assert (run["mode"], run["workflow_revision"], run["runtime_id"], run["image_limit"]) == (
        "test",
        1,
        world.runtime_id,
        4,
    )

    # Back in the editor, the runtime the website's rule picks is named.
    await page.goto("/#/workflow/yard-watch")
    await expect(page.locator("#editor-runtime")).to_contain_text(f"Runtime: {world.runtime_id} (")
