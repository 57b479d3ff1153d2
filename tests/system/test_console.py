"""The web console in a real browser: Chromium (Debian's, /usr/bin/chromium) driven by
Playwright, on the real stack (the `gateway` fixture: a gateway on uvicorn in front of
a coordinator on Postgres and a preview service on SeaweedFS). Nothing is mocked: the
pages call the gateway's API as they do in production.

Screenshots of the login and runs pages are taken (into docs/screenshots/ under `make
screenshots`, testbed/harness/browser.py). Without
Chromium (scripts/system-deps.sh installs it) the tests skip, saying why; Playwright
is in the dev lock, and is used only with that browser (it downloads none).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from playwright.async_api import Page, expect

from services.gateway.dispatch import SESSION_COOKIE
from testbed.coordinator_world import World
from testbed.harness.browser import needs_chromium
from testbed.harness.gateway import PASSWORD, GatewayHarness
from tests.console_checks import check_phone_and_axe

ENDED = "Your session has ended; sign in again."

pytestmark = [pytest.mark.timeout(120), needs_chromium]


async def create_run(gateway: GatewayHarness, gateway_world: World, run_id: str) -> datetime:
    """A test run of `night`, created through the API; its created_at (by the
    coordinator's clock, which the harness sets)."""
    session = await gateway.login("ada")
    body = {
        "id": run_id,
        "workflow_id": "night",
        "runtime_id": gateway_world.tracking_runtime,
        "revision": 1,
        "mode": "test",
        "image_limit": 20,
    }
    created = await session.client.post("/api/workshop/runs", json=body)
    assert created.status_code == 200, created.text
    return datetime.fromisoformat(created.json()["run"]["created_at"])


async def sign_in(page: Page, user_id: str, password: str) -> None:
    await page.get_by_label("User id").fill(user_id)
    await page.get_by_label("Password").fill(password)
    await page.get_by_role("button", name="Sign in").click()


async def test_signing_in_lands_on_the_runs_page_listing_a_run(
    gateway: GatewayHarness, gateway_world: World, page: Page, screenshots: Path
) -> None:
    created_at = await create_run(gateway, gateway_world, "r-console")
    # the page's clock, 5 minutes after the run (the coordinator's clock is the harness's)
    await page.clock.set_fixed_time(created_at + timedelta(minutes=5))
    await page.goto("/")
    await expect(page.get_by_role("heading", name="Sign in to Workshop")).to_be_visible()
    await expect(page.get_by_label("User id")).to_be_focused()
    await page.screenshot(path=str(screenshots / "login.png"))
    await check_phone_and_axe(page)

    await sign_in(page, "ada", PASSWORD)
    await expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    assert page.url.endswith("#/runs")
    row = page.locator("tr[data-run-id='r-console']")
    await expect(row).to_be_visible()
    cells = [text.strip() for text in await row.locator("th, td").all_inner_texts()]
    assert cells == [
        "r-console",
        "night",
        "queued",
        "test",
        "0 of 1 done (1 queued)",
        "0 of 20: 0 frames, 0 empty, 0 dropped",
        "test run: not saved",
        "5 min ago",
    ]
    await expect(page.get_by_text("Signed in as Ada")).to_be_visible()
    await page.screenshot(path=str(screenshots / "runs.png"), full_page=True)
    await check_phone_and_axe(page)

    # the workflow filter (a picker of the saved workflows) asks the API for its runs only
    await page.get_by_label("Workflow", exact=True).select_option("night")
    await page.get_by_role("button", name="Filter").click()
    await expect(page.locator("#runs caption")).to_have_text(
        "Recent runs of workflow night, newest first"
    )
    assert page.url.endswith("#/runs?workflow=night")
    await page.get_by_role("button", name="Show all").click()
    await expect(page.locator("tr[data-run-id='r-console']")).to_be_visible()
    assert page.url.endswith("#/runs")


async def test_a_wrong_password_shows_the_apis_message(
    gateway: GatewayHarness, gateway_world: World, page: Page
) -> None:
    await page.goto("/#/login")
    await sign_in(page, "ada", "not the password")
    alert = page.get_by_role("alert")
    await expect(alert).to_have_text("Wrong user id or password.")
    await expect(page.get_by_label("Password")).to_have_attribute("aria-invalid", "true")
    await expect(page.get_by_label("Password")).to_be_focused()
    assert page.url.endswith("#/login")
    assert await page.context.cookies() == []


async def test_throttled_logins_show_when_to_try_again(
    gateway: GatewayHarness, gateway_world: World, page: Page
) -> None:
    await page.goto("/#/login")
    for _ in range(5):  # the per-user limit (docs/http-api.md)
        await sign_in(page, "ada", "not the password")
        await expect(page.get_by_role("alert")).to_have_text("Wrong user id or password.")
    await sign_in(page, "ada", PASSWORD)
    await expect(page.get_by_role("alert")).to_contain_text("Try again in ")
    assert page.url.endswith("#/login")


async def test_the_runs_page_without_a_session_shows_the_login_page(
    gateway: GatewayHarness, gateway_world: World, page: Page
) -> None:
    await page.goto("/#/runs?workflow=night")
    await expect(page.get_by_role("heading", name="Sign in to Workshop")).to_be_visible()
    # never signed in: no "session has ended" (tests/system/test_console_first_visit.py)
    await expect(page.get_by_role("status")).to_have_count(0)
    # after signing in, back to the page the user asked for
    await sign_in(page, "ada", PASSWORD)
    await expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    assert page.url.endswith("#/runs?workflow=night")
    await expect(page.get_by_label("Workflow", exact=True)).to_have_value("night")


async def test_signing_out_ends_the_session_at_the_api(
    gateway: GatewayHarness, gateway_world: World, page: Page
) -> None:
    await page.goto("/")
    await sign_in(page, "ada", PASSWORD)
    await expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    [cookie] = [c for c in await page.context.cookies() if c["name"] == SESSION_COOKIE]
    assert cookie["httpOnly"]

    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_role("status")).to_have_text("You have signed out.")
    assert [c for c in await page.context.cookies() if c["name"] == SESSION_COOKIE] == []
    async with gateway.client(cookies={SESSION_COOKIE: cookie["value"]}) as client:
        ended = await client.get("/api/session")
    assert ended.json() == {"signed_in": False, "ended": True}, ended.text

    # the runs page now sends the user back to sign in
    await page.goto("/#/runs")
    await expect(page.get_by_role("status")).to_have_text(ENDED)


async def test_a_session_revoked_elsewhere_sends_the_page_to_the_login(
    gateway: GatewayHarness, gateway_world: World, page: Page
) -> None:
    await page.goto("/")
    await sign_in(page, "ada", PASSWORD)
    await expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    [cookie] = [c for c in await page.context.cookies() if c["name"] == SESSION_COOKIE]
    async with gateway.client(cookies={SESSION_COOKIE: cookie["value"]}) as client:
        token = (await client.get("/api/session")).json()["csrf_token"]
        out = await client.delete("/api/session", headers={"x-csrf-token": token})
        assert out.status_code == 204, out.text
    await page.get_by_role("button", name="Filter").click()
    await expect(page.get_by_role("status")).to_have_text(ENDED)


async def test_the_console_files_are_served_without_a_credential(
    gateway: GatewayHarness,
) -> None:
    async with gateway.client() as client:
        entry = await client.get("/")
        assert entry.status_code == 200
        assert entry.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in entry.headers["content-security-policy"]
        script = await client.get("/console/app.js")
        assert script.status_code == 200
        assert script.headers["content-type"].startswith("text/javascript")
        missing = await client.get("/console/nope.js")
        assert missing.status_code == 404
        assert missing.json()["reason"] == "ROUTE_NOT_FOUND"
        wrong = await client.post("/console/app.js")
        assert wrong.status_code == 405
        assert wrong.headers["allow"] == "GET, HEAD"
