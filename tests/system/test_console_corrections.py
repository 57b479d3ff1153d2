"""Correcting an item's boxes and deciding one frame alone from the review page, by keyboard
(and one drag by mouse), in a real browser (Debian's Chromium driven by Playwright) on the
real stack: a real processor labels a full run with the demo detector in Triton, the gateway
serves the page, and every check of what was stored goes through the API (docs/review.md,
"Corrections" and "Item decisions"). A screenshot of the editor is taken (docs/screenshots/
under `make screenshots`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect

from testbed.harness.browser import needs_chromium
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.gateway import PASSWORD, GatewayHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.console_checks import check_phone_and_axe
from tests.system.test_console import sign_in
from tests.system.test_console_review import review, reviewed_run

pytestmark = [pytest.mark.triton, pytest.mark.timeout(180), needs_chromium]

Json = dict[str, Any]


def item_of(body: Json, item_id: str) -> Json:
    item: Json = next(e["item"] for e in body["items"] if e["item"]["item_id"] == item_id)
    return item


async def test_boxes_are_corrected_and_a_frame_decided_alone_with_the_keyboard(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    gateway: GatewayHarness,
    page: Page,
    tmp_path: Path,
    screenshots: Path,
) -> None:
    await reviewed_run(coordinator, preview, triton_server, tmp_path)
    await gateway.user("ada")
    api = (await gateway.login("ada")).client
    before = await review(gateway, api)
    first = before["sightings"][0]
    item_id = first["item_ids"][0]
    detected = item_of(before, item_id)["boxes"]
    assert detected, "the demo detector finds boxes on every frame of the yard scene"

    await page.clock.set_fixed_time(coordinator.clock.now())
    await page.goto("/#/review/r1")
    await sign_in(page, "ada", PASSWORD)
    await expect(page.get_by_role("heading", name="Review of run r1")).to_be_focused()

    # j selects the first sighting, e opens its first frame in the editor, its first box
    # focused
    await page.keyboard.press("j")
    await page.keyboard.press("e")
    dialog = page.locator("#item-editor")
    await expect(dialog).to_be_visible()
    boxes = dialog.locator(".edit-box")
    await expect(boxes).to_have_count(len(detected))
    await expect(boxes.first).to_be_focused()
    await expect(dialog.locator("#history-decision")).to_contain_text("follows its sighting")
    await expect(dialog.locator("#save-correction")).to_be_disabled()

    # move the first box 3% right, make it 2% taller, add a box and move it, delete nothing
    for _ in range(3):
        await page.keyboard.press("ArrowRight")
    for _ in range(2):
        await page.keyboard.press("Shift+ArrowDown")
    await expect(boxes.first).to_be_focused()
    await page.keyboard.press("a")
    await expect(boxes).to_have_count(len(detected) + 1)
    await expect(boxes.last).to_be_focused()
    await expect(boxes.last).to_have_attribute("aria-label", re.compile(r"\(added\)"))
    await page.keyboard.press("Alt+ArrowLeft")
    await screenshots_of(page, screenshots)
    await check_phone_and_axe(page)
    await page.keyboard.press("s")
    status = dialog.locator("#item-editor-status")
    await expect(status).to_contain_text(f"Saved {len(detected) + 1} boxes as a correction")
    await expect(dialog.locator("#history-correction")).to_contain_text("by Ada")

    stored = item_of(await review(gateway, api), item_id)
    assert stored["boxes"] == detected  # the detections are kept for provenance
    corrected = stored["correction"]["boxes"]
    assert [b.get("source_box_index", 0) for b in corrected] == [
        *range(len(detected)),
        -1,
    ]
    moved, original = corrected[0]["box"], detected[0]
    assert moved["x"] == pytest.approx(min(original["x"] + 0.03, 1 - original["w"]), abs=1e-4)
    assert moved["h"] == pytest.approx(min(original["h"] + 0.02, 1 - original["y"]), abs=1e-4)
    added = corrected[-1]["box"]
    assert added["x"] == pytest.approx(0.3, abs=1e-4)  # centred (0.4), then 10% left
    assert (added["w"], added["h"]) == (pytest.approx(0.2), pytest.approx(0.2))
    assert stored["revision"] == 1

    # Delete removes the focused (first) box; u undoes that correction again
    await boxes.first.focus()
    await page.keyboard.press("Delete")
    await expect(boxes).to_have_count(len(detected))
    await page.keyboard.press("s")
    await expect(status).to_contain_text(f"Saved {len(detected)} box")
    stored = item_of(await review(gateway, api), item_id)
    assert len(stored["correction"]["boxes"]) == len(detected)
    await page.keyboard.press("u")
    await expect(status).to_contain_text("Undone")
    await expect(boxes).to_have_count(len(detected) + 1)
    stored = item_of(await review(gateway, api), item_id)
    assert len(stored["correction"]["boxes"]) == len(detected) + 1

    # n decides this frame alone (its sighting stays pending); f follows the sighting again
    await page.keyboard.press("n")
    await expect(dialog.locator("#history-decision")).to_contain_text("rejected (none) by Ada")
    stored = item_of(await review(gateway, api), item_id)
    assert stored["item_decision"]["review_state"] == "rejected"
    assert stored["review_state"] == "rejected"
    others = [
        item_of(await review(gateway, api), other)["review_state"]
        for other in first["item_ids"][1:]
    ]
    assert set(others) <= {"pending"}
    await page.keyboard.press("f")
    await expect(dialog.locator("#history-decision")).to_contain_text("follows its sighting")
    stored = item_of(await review(gateway, api), item_id)
    assert "item_decision" not in stored

    # by mouse: the first box dragged 10% of the frame to the right, saved
    layer = await dialog.locator(".edit-layer").bounding_box()
    box = await boxes.first.bounding_box()
    assert layer is not None
    assert box is not None
    x0 = stored["correction"]["boxes"][0]["box"]["x"]
    centre = (box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    await page.mouse.move(*centre)
    await page.mouse.down()
    await page.mouse.move(centre[0] + layer["width"] * 0.05, centre[1], steps=4)
    await page.mouse.move(centre[0] + layer["width"] * 0.1, centre[1], steps=4)
    await page.mouse.up()
    await page.keyboard.press("s")
    await expect(status).to_contain_text("as a correction")
    stored = item_of(await review(gateway, api), item_id)
    dragged = stored["correction"]["boxes"][0]["box"]["x"]
    assert dragged == pytest.approx(
        min(x0 + 0.1, 1 - stored["correction"]["boxes"][0]["box"]["w"]), abs=0.01
    )

    # Escape closes the editor; the focus is back on the frame that opened it, which now
    # says it was corrected
    await page.keyboard.press("Escape")
    await expect(dialog).to_be_hidden()
    row = page.locator(f"li.sighting[data-sighting-id='{first['sighting_id']}']")
    frame = row.locator(f"figure[data-item-id='{item_id}'] .thumb-edit")
    await expect(frame).to_be_focused()
    await expect(frame).to_have_attribute("aria-label", re.compile(r"\(corrected\)"))


async def screenshots_of(page: Page, screenshots: Path) -> None:
    await page.locator("#item-editor").screenshot(path=str(screenshots / "item-editor.png"))
