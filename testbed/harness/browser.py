"""Chromium (Debian's, /usr/bin/chromium) driven by Playwright, for the web console's
browser tests: the `page` fixture is a page of a fresh browser profile on the `gateway`
fixture's base URL. Playwright is used only with that browser (it downloads none);
without it the tests that use `page` skip, saying why (scripts/system-deps.sh installs
it). Screenshots go to docs/screenshots/ only under `make screenshots`
(`screenshots` fixture)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from playwright.async_api import ConsoleMessage, Page, Response, async_playwright

from testbed.harness.gateway import GatewayHarness

CHROMIUM = "/usr/bin/chromium"
# As root Chromium needs --no-sandbox; without the background-networking flags it keeps
# trying hosts this machine cannot reach.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# The README shows the pages through these screenshots. The console tests write them
# there only when `make screenshots` sets WORKSHOP_WRITE_SCREENSHOTS=1: a plain run never
# changes a tracked file.
DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
WRITE_SCREENSHOTS = "WORKSHOP_WRITE_SCREENSHOTS"

needs_chromium = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None,
    reason=f"no Chromium at {CHROMIUM} (scripts/system-deps.sh installs Debian's chromium)",
)


def screenshot_folder(environ: Mapping[str, str], tmp_path: Path) -> Path:
    """docs/screenshots/ when the environment asks for the README's screenshots, else a
    folder of the test's own (the screenshots are still taken, so their code runs)."""
    if environ.get(WRITE_SCREENSHOTS) == "1":
        return DOCS_SCREENSHOTS
    return tmp_path / "screenshots"


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where a browser test writes its screenshots (see `screenshot_folder`), created."""
    folder = screenshot_folder(os.environ, tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def troubles(page: Page) -> list[str]:
    """From now on, what would show a person or a developer that something went wrong on
    `page`: console errors (Chromium logs every failed image load there) and answers of
    400 or more. The list grows as they happen; a test asserts it stays empty."""
    found: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            found.append(f"console error: {message.text}")

    def response(answer: Response) -> None:
        if answer.status >= 400:
            found.append(f"{answer.status} {answer.request.method} {answer.url}")

    page.on("console", console)
    page.on("response", response)
    return found


@pytest.fixture
async def page(gateway: GatewayHarness) -> AsyncIterator[Page]:
    """A page of a fresh browser profile on the gateway; fails the test on any script
    error of the console."""
    errors: list[str] = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(
                base_url=gateway.url, viewport={"width": 1280, "height": 800}
            )
            page = await context.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.set_default_timeout(15_000)
            yield page
        finally:
            await browser.close()
    assert errors == [], errors
