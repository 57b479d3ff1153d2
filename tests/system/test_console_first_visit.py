"""The web console's first visit, in a real browser (Debian's Chromium driven by
Playwright, as in tests/system/test_console.py) on the real stack: a visitor who never signed in
gets the sign-in page plainly, with no console error and no failed request; "Your
session has ended" is said only after a session really ended. And on the HTTP side: `GET
/api/session` tells a signed-out page so without failing, and a 401 on the cookie
routes speaks of signing in.
"""

from __future__ import annotations

import pytest
from playwright.async_api import Page, expect

from services.gateway.dispatch import SESSION_COOKIE
from services.gateway.guard import csrf_token
from testbed.coordinator_world import World
from testbed.harness.browser import needs_chromium, troubles
from testbed.harness.gateway import PASSWORD, GatewayHarness

pytestmark = pytest.mark.timeout(120)

ENDED = "Your session has ended; sign in again."


async def sign_in(page: Page) -> None:
    await page.get_by_label("User id").fill("ada")
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Sign in").click()


@needs_chromium
async def test_a_first_visit_shows_the_sign_in_page_plainly_without_errors(
    gateway: GatewayHarness, gateway_world: World, page: Page
) -> None:
    found = troubles(page)
    await page.goto("/")
    await expect(page.get_by_role("heading", name="Sign in to Workshop")).to_be_visible()
    await expect(page.get_by_label("User id")).to_be_focused()
    await page.wait_for_load_state("networkidle")
    await expect(page.get_by_role("status")).to_have_count(0)
    await expect(page.get_by_text(ENDED)).to_have_count(0)
    assert found == []
    # the page's icon is the console's own (Chromium asked for a /favicon.ico that was not
    # there, a console error)
    icon = await page.locator("link[rel='icon']").get_attribute("href")
    assert icon is not None
    async with gateway.client() as client:
        served = await client.get(icon)
    assert served.status_code == 200, served.text
    assert served.headers["content-type"].startswith("image/svg+xml")


@needs_chromium
async def test_a_first_visit_to_a_view_signs_in_plainly_and_goes_there(
    gateway: GatewayHarness, gateway_world: World, page: Page
) -> None:
    found = troubles(page)
    await page.goto("/#/runs?workflow=night")
    await expect(page.get_by_role("heading", name="Sign in to Workshop")).to_be_visible()
    await page.wait_for_load_state("networkidle")
    await expect(page.get_by_role("status")).to_have_count(0)
    assert found == []
    await sign_in(page)
    await expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    assert page.url.endswith("#/runs?workflow=night")
    await expect(page.get_by_label("Workflow", exact=True)).to_have_value("night")


@needs_chromium
async def test_a_session_that_ended_says_so_without_errors(
    gateway: GatewayHarness, gateway_world: World, page: Page
) -> None:
    await page.goto("/")
    await sign_in(page)
    await expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    [cookie] = [c for c in await page.context.cookies() if c["name"] == SESSION_COOKIE]
    async with gateway.client(cookies={SESSION_COOKIE: cookie["value"]}) as client:
        out = await client.delete(
            "/api/session", headers={"x-csrf-token": csrf_token(cookie["value"])}
        )
        assert out.status_code == 204, out.text
    found = troubles(page)
    await page.reload()
    await expect(page.get_by_role("heading", name="Sign in to Workshop")).to_be_visible()
    await expect(page.get_by_role("status")).to_have_text(ENDED)
    await page.wait_for_load_state("networkidle")
    assert found == []


# the HTTP side -------------------------------------------------------------------------------


async def test_get_session_tells_a_signed_out_page_without_failing(
    gateway: GatewayHarness, gateway_world: World
) -> None:
    async with gateway.client() as client:
        never = await client.get("/api/session")
        assert never.status_code == 200, never.text
        assert never.json() == {"signed_in": False, "ended": False}
        assert never.headers["cache-control"] == "no-store"

        signed = await client.post("/api/session", json={"user_id": "ada", "password": PASSWORD})
        assert signed.status_code == 200, signed.text
        assert signed.json()["signed_in"] is True
        me = await client.get("/api/session")
        assert me.json()["signed_in"] is True
        assert me.json()["user_id"] == "ada"
        token = me.json()["csrf_token"]
        secret = client.cookies[SESSION_COOKIE]
        out = await client.delete("/api/session", headers={"x-csrf-token": token})
        assert out.status_code == 204, out.text

        client.cookies.set(SESSION_COOKIE, secret)  # the revoked session's cookie
        ended = await client.get("/api/session")
        assert ended.status_code == 200, ended.text
        assert ended.json() == {"signed_in": False, "ended": True}


async def test_a_401_on_the_cookie_routes_speaks_of_signing_in(
    gateway: GatewayHarness, gateway_world: World
) -> None:
    async with gateway.client() as client:
        for path in ("/api/workshop/runs", "/api/workshop/me"):
            answer = await client.get(path)
            assert answer.status_code == 401, answer.text
            body = answer.json()
            assert body["reason"] == "CREDENTIAL_MISSING"
            assert "sign in" in body["message"].lower(), body
            assert "metadata" not in body["message"], body
        # /v1 is told of its header, not of gRPC metadata either
        bearer = await client.get("/v1/workshop/runs")
        assert bearer.status_code == 401, bearer.text
        assert "Authorization: Bearer" in bearer.json()["message"], bearer.text
        assert "metadata" not in bearer.json()["message"], bearer.text
