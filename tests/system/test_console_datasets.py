"""The datasets pages of the console (docs/console.md, docs/datasets.md) in a real browser
(Debian's Chromium driven by Playwright) on the real stack: a real processor labels a full
run with the demo detector in Triton, filling a bucket; a version is frozen from the page
and listed, frozen again (the same content: the existing version), exported as a download
whose bytes are the API's export, and compared with a second version frozen after a
relabel. Keyboard only, and no horizontal scroll at 390 px. A screenshot of a version's
page is taken (docs/screenshots/ under `make screenshots`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect

from testbed.harness.browser import needs_chromium, troubles
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.gateway import PASSWORD, GatewayHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.console_checks import check_phone_and_axe
from tests.system.test_console import sign_in
from tests.system.test_console_review import review, reviewed_run

pytestmark = [pytest.mark.triton, pytest.mark.timeout(240), needs_chromium]

Json = dict[str, Any]


async def no_horizontal_scroll(page: Page) -> None:
    widths: list[int] = await page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    wide: list[str] = await page.evaluate(
        """() => [...document.querySelectorAll("body *")]
            .filter((e) => e.getBoundingClientRect().right > document.documentElement.clientWidth)
            .map((e) => `${e.tagName}#${e.id}.${e.className}: ${e.getBoundingClientRect().right}`)
        """
    )
    assert widths[0] <= widths[1], f"scrolls sideways: {widths}, {wide}"


async def freeze_from_the_page(page: Page, name: str, states: list[str]) -> None:
    """Fills the freeze form by keyboard (tab order) and submits it."""
    await page.locator("#freeze-name").focus()
    await page.keyboard.type(name)
    for state in ("pending", "accepted", "rejected"):
        await page.keyboard.press("Tab")
        box = page.locator(f"#freeze-form input[value='{state}']")
        await expect(box).to_be_focused()
        if (state in states) != await box.is_checked():
            await page.keyboard.press("Space")
    await page.locator("#freeze-seed").focus()
    await page.keyboard.press("Control+a")
    await page.keyboard.type("7")
    await page.keyboard.press("Tab")
    await expect(page.locator("#freeze-fraction")).to_be_focused()
    await page.keyboard.press("Control+a")
    await page.keyboard.type("0.25")
    await page.keyboard.press("Enter")


async def test_versions_are_frozen_exported_and_compared_from_the_console(
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
    summary = await api.get("/api/workshop/summary", params={"time_zone": "UTC"})
    (bucket,) = [b["bucket_id"] for b in summary.json()["buckets"]]
    problems = troubles(page)

    await page.goto("/#/datasets")
    await sign_in(page, "ada", PASSWORD)
    await expect(page.get_by_role("heading", name="Datasets")).to_be_focused()
    await page.locator("#bucket-picker").focus()
    await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")  # "Show its versions"
    await expect(page.get_by_role("heading", name=f"Datasets of bucket {bucket}")).to_be_focused()
    await expect(page.locator("#versions-empty")).to_be_visible()

    # freeze every pending item (the run is not reviewed yet): a new version, listed
    await freeze_from_the_page(page, "first cut", ["pending"])
    status = page.locator("#freeze-status")
    await expect(status).to_contain_text("Froze a new version")
    first_id = await status.get_attribute("data-version-id")
    assert first_id
    row = page.locator(f"#versions tr[data-version-id='{first_id}']")
    await expect(row).to_contain_text("first cut")
    listed = (await api.get(f"/api/workshop/buckets/{bucket}/versions")).json()["versions"]
    (first,) = listed
    assert first["version_id"] == first_id
    assert first["seed"] in (7, "7")
    assert first["val_fraction"] == 0.25
    assert first["filter"]["review_states"] == ["pending"]
    await expect(row.locator(".items")).to_have_text(str(first["item_count"]))
    assert int(first["item_count"]) > 0

    # the same content again: the existing version is the answer
    await page.locator("#freeze-name").fill("")
    await freeze_from_the_page(page, "again", ["pending"])
    await expect(status).to_contain_text("The same content is frozen already")
    await expect(status).to_have_attribute("data-created", "false")
    await expect(page.locator("#versions tbody tr")).to_have_count(1)

    # relabel one sighting, freeze pending + accepted: a second version
    body = await review(gateway, api)
    sighting = body["sightings"][0]
    decided = await api.post(
        f"/api/workshop/runs/r1/sightings/{sighting['sighting_id']}/decision",
        json={"decision": "relabel", "class_name": "forklift"},
    )
    assert decided.status_code == 200, decided.text
    await page.locator("#freeze-name").fill("")
    await freeze_from_the_page(page, "relabelled", ["pending", "accepted"])
    await expect(status).to_contain_text("Froze a new version")
    second_id = await status.get_attribute("data-version-id")
    assert second_id
    assert second_id != first_id
    await expect(page.locator("#versions tbody tr")).to_have_count(2)

    # the second version's page: facts, the export downloaded with progress
    await page.locator(f"#versions tr[data-version-id='{second_id}'] a").focus()
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Version “relabelled”")).to_be_focused()
    second = (await api.get(f"/api/workshop/versions/{second_id}")).json()["version"]
    await expect(page.locator("#version-items")).to_have_text(str(second["item_count"]))
    await expect(page.locator("#version-classes")).to_contain_text("forklift")
    await page.locator("#export-format").focus()
    await page.keyboard.press("Tab")
    await expect(page.locator("#export-button")).to_be_focused()
    async with page.expect_download() as downloading:
        await page.keyboard.press("Enter")
    download = await downloading.value
    saved = await asyncio.to_thread(Path(await download.path()).read_bytes)
    expected = await api.get(
        f"/api/workshop/versions/{second_id}/export", params={"format": "yolo"}
    )
    assert expected.status_code == 200
    assert saved == expected.content
    assert download.suggested_filename.endswith("-yolo.tar")
    await expect(page.locator("#export-status")).to_contain_text(f"{len(expected.content):,} bytes")
    await expect(page.locator("#export-progress")).to_have_attribute(
        "value", str(len(expected.content))
    )

    # the diff against the first version: the page's counts are the API's, every change listed
    await page.locator("#diff-from").focus()
    await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")
    diff = (
        await api.get(
            f"/api/workshop/versions/{second_id}/diff",
            params={"from": first_id, "page_size": 1000},
        )
    ).json()
    counts = diff["counts"]
    for key in ("added", "removed", "relabelled", "boxes_changed", "unchanged"):
        await expect(page.locator(f"#diff-counts tr[data-count='{key}'] td")).to_have_text(
            str(counts.get(key, 0))
        )
    assert int(counts.get("relabelled", 0)) + int(counts.get("boxes_changed", 0)) > 0
    changes = page.locator("#diff-changes li[data-item-id]")
    await expect(changes).to_have_count(min(len(diff["changes"]), 50))
    await page.locator("#diff-section").screenshot(path=str(screenshots / "datasets-diff.png"))
    await page.screenshot(path=str(screenshots / "datasets.png"), full_page=True)
    await check_phone_and_axe(page)

    # 390 px wide: nothing scrolls sideways, on either page
    await page.set_viewport_size({"width": 390, "height": 800})
    await no_horizontal_scroll(page)
    await page.goto(f"/#/datasets/{bucket}")
    await expect(page.locator("#versions tbody tr")).to_have_count(2)
    await no_horizontal_scroll(page)
    assert problems == []
