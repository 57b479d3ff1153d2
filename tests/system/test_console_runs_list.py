"""The runs list in a real browser (Debian's Chromium driven by Playwright) on the real
stack (gateway, coordinator on Postgres, preview service on SeaweedFS): it keeps up with
runs created elsewhere without a reload, filters by workflow (a picker), status and
mode, links a full run's review counts to its review page, and passes at 390 px and
axe-core. Runs are created and cancelled through the gateway's API, as another person
would."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import Page, expect

from testbed.coordinator_world import World
from testbed.harness.browser import needs_chromium
from testbed.harness.gateway import PASSWORD, GatewayHarness
from tests.console_checks import DESKTOP, PHONE, axe_violations, sideways_overflow

pytestmark = [pytest.mark.timeout(120), needs_chromium]


def body(run_id: str, runtime_id: str, mode: str) -> dict[str, Any]:
    return {
        "id": run_id,
        "workflow_id": "night",
        "runtime_id": runtime_id,
        "revision": 1,
        "mode": mode,
        "image_limit": 20 if mode == "test" else None,
    }


async def test_the_runs_list_keeps_up_filters_and_links_to_review(
    gateway: GatewayHarness, gateway_world: World, page: Page
) -> None:
    ada = await gateway.login("ada")
    runtime = gateway_world.tracking_runtime
    first = await ada.client.post("/api/workshop/runs", json=body("r-test", runtime, "test"))
    assert first.status_code == 200, first.text
    await page.goto("/#/runs")
    await page.get_by_label("User id").fill("ada")
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("tr[data-run-id='r-test']")).to_be_visible()
    await page.locator("tr[data-run-id='r-test'] a").focus()

    # A run created elsewhere shows up without a reload; the focus stays where it was.
    full = await ada.client.post("/api/workshop/runs", json=body("r-full", runtime, "full"))
    assert full.status_code == 200, full.text
    row = page.locator("tr[data-run-id='r-full']")
    await expect(row).to_be_visible(timeout=15_000)
    await expect(page.locator("tr[data-run-id='r-test'] a")).to_be_focused()
    await expect(page.locator("#runs-updated")).to_contain_text("last read")
    review = row.get_by_role("link", name="0 pending, 0 accepted, 0 rejected")
    await expect(review).to_have_attribute("href", "#/review/r-full")

    # Status and mode are filters of the API (ListRuns); the workflow is a picker.
    await page.get_by_label("Status").select_option("queued")
    await page.get_by_label("Mode").select_option("full")
    await page.get_by_role("button", name="Filter").click()
    assert page.url.endswith("#/runs?status=queued&mode=full")
    await expect(page.locator("#runs caption")).to_have_text(
        "Recent runs of every workflow (status queued, mode full), newest first"
    )
    await expect(page.locator("tr[data-run-id='r-test']")).to_have_count(0)
    # Cancelled elsewhere: the refreshed list drops it from "queued".
    cancelled = await ada.client.post("/api/workshop/runs/r-full/cancel")
    assert cancelled.status_code == 200, cancelled.text
    await expect(page.locator("#runs-empty")).to_have_text("No queued full runs.", timeout=15_000)
    await page.get_by_label("Status").select_option("cancelled")
    await page.get_by_label("Workflow", exact=True).select_option("night")
    await page.get_by_role("button", name="Filter").click()
    assert page.url.endswith("#/runs?workflow=night&status=cancelled&mode=full")
    await expect(page.locator("tr[data-run-id='r-full'] td").nth(1)).to_have_text("cancelled")

    assert await axe_violations(page) == []
    await page.set_viewport_size(PHONE)
    assert await sideways_overflow(page) == 0
    assert await axe_violations(page) == []
    await page.set_viewport_size(DESKTOP)
    await page.locator("tr[data-run-id='r-full'] a").first.click()
    await expect(page.get_by_role("heading", name="Run r-full")).to_be_visible()
