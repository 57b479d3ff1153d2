"""The models, runtimes and Agent keys pages in a real browser (Debian's Chromium driven
by Playwright) on the real stack (gateway, coordinator on Postgres, preview service on
SeaweedFS): each shows what the API answers; a key created on the page works over `/v1`
with its secret (shown once) and is refused once revoked on the page; each page passes
at 390 px without sideways scrolling and with no serious or critical axe-core violation.

Takes the screenshots cameras.png and keys.png (into docs/screenshots/ under `make
screenshots`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.async_api import Dialog, Page, expect

from testbed.coordinator_world import World
from testbed.harness.browser import needs_chromium
from testbed.harness.gateway import PASSWORD, GatewayHarness
from tests.console_checks import check_phone_and_axe

pytestmark = [pytest.mark.timeout(120), needs_chromium]
AGO = re.compile(r"^(just now|\d+ (min|h|d) ago)$")  # by the harness's clock


async def test_models_runtimes_and_keys_pages(
    gateway: GatewayHarness, gateway_world: World, page: Page, screenshots: Path
) -> None:
    async def accept(dialog: Dialog) -> None:
        assert dialog.type == "confirm"
        await dialog.accept()

    page.on("dialog", accept)
    await page.goto("/#/runtimes")
    await page.get_by_label("User id").fill("ada")
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Runtimes")).to_be_focused()
    tracking = page.locator(f"tr[data-runtime-id='{gateway_world.tracking_runtime}']")
    await expect(tracking.locator("td")).to_have_text(
        ["gpu-box", "workshop-processor", "workshop-v3", "never", AGO, "c0dec0dec0de…"]
    )
    await expect(page.locator("tbody tr")).to_have_count(2)
    await check_phone_and_axe(page)

    await page.get_by_role("link", name="Models").click()
    model = page.locator("section[data-model='detector']")
    await expect(model.locator("tr[data-version='1'] td")).to_have_text(
        ["person, vehicle", "3 \u00d7 360 \u00d7 640", "ab" * 32, "efficient-nms contract", AGO]
    )
    # Workflow `night` names the detector without a version: it uses "latest".
    await expect(model.get_by_text('Uses "latest"')).to_contain_text("yard watch")
    await check_phone_and_axe(page)

    # Cameras: cam-a's two recordings (08:00-09:00, 09:00-10:00 on 2026-11-29) as one span.
    await page.get_by_role("link", name="Cameras").click()
    await expect(page.get_by_role("heading", name="cam-a on 2026-11-29 (UTC)")).to_be_visible()
    await expect(page.locator("#coverage-covered")).to_have_text(
        "Covered: 08:00:00 to 10:00:00 (cam-a-0, cam-a-1)"
    )
    await expect(page.locator("#coverage-gaps")).to_have_text(
        "Gaps: 00:00:00 to 08:00:00; 10:00:00 to 24:00:00"
    )
    covered = page.locator(".timeline-covered")
    await expect(covered).to_have_count(1)
    assert (await covered.get_attribute("x"), await covered.get_attribute("width")) == (
        "480",
        "120",
    )
    await page.screenshot(path=str(screenshots / "cameras.png"), full_page=True)
    await page.get_by_label("Camera", exact=True).select_option("cam-b")
    await page.get_by_label("Day (UTC)").fill("2026-11-28")
    await page.get_by_role("button", name="Show").click()
    await expect(page.locator("#coverage-covered")).to_have_text("Covered: nothing")
    await expect(page.get_by_role("link", name="2026-11-29")).to_be_visible()
    await check_phone_and_axe(page)
    # No processor ever checked in here: the photo is refused with the API's reason.
    await page.get_by_role("link", name="2026-11-29").click()
    # the day's page is drawn anew: click its form's button, not the one it replaces
    await expect(page.get_by_label("Time on 2026-11-29 (UTC)")).to_be_visible()
    await page.get_by_role("button", name="Take a photo").click()
    await expect(page.locator("#photo-error")).not_to_be_empty()

    await page.get_by_role("link", name="Keys").click()
    await expect(page.locator("#keys-empty")).to_have_text("You have no Agent keys yet.")
    await page.get_by_label("Name").fill("laptop agent")
    await page.get_by_label("cam-a").check()
    await page.get_by_role("button", name="Create key").click()
    secret_box = page.get_by_label("Secret (send it as Authorization: Bearer …)")
    await expect(secret_box).to_be_focused()
    secret = await secret_box.input_value()
    assert secret.startswith("wk_")
    row = page.locator("#keys tbody tr")
    await expect(row.locator("th, td")).to_have_text(
        [
            "laptop agent",
            secret.split(".")[0],
            "workshop (cam-a)",
            re.compile(r"^active, expires \d{4}-\d\d-\d\d$"),
            "never",
            "Revoke",
        ],
        use_inner_text=True,
    )
    await page.screenshot(path=str(screenshots / "keys.png"), full_page=True)
    async with gateway.client(headers={"authorization": f"Bearer {secret}"}) as agent:
        assert (await agent.get("/v1/workshop/me")).status_code == 200
        await check_phone_and_axe(page)
        await page.get_by_role("button", name="Revoke key laptop agent").click()
        await expect(page.locator("#keys-notice")).to_have_text('Key "laptop agent" is revoked.')
        await expect(row.locator("td").nth(2)).to_contain_text("revoked")
        refused = await agent.get("/v1/workshop/me")
        assert refused.status_code == 401, refused.text
    # The secret is never shown again: a reload lists the key without it.
    await page.reload()
    await expect(page.locator("#keys tbody tr")).to_have_count(1)
    assert secret not in await page.content()
