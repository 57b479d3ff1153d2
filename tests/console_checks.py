"""Checks the console's browser tests make on any page: nothing scrolls sideways at a
phone's width, and axe-core (vendored in tests/assets/axe-core/, see its README) finds no
serious or critical accessibility violation."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from playwright.async_api import Page, ViewportSize

AXE = Path(__file__).resolve().parent / "assets" / "axe-core" / "axe.min.js"
PHONE: ViewportSize = {"width": 390, "height": 844}
DESKTOP: ViewportSize = {"width": 1280, "height": 800}
SERIOUS = ("serious", "critical")


@cache
def axe_source() -> str:
    return AXE.read_text()


async def sideways_overflow(page: Page) -> int:
    """How many CSS pixels the page is wider than its viewport (0: no sideways scroll)."""
    overflow: int = await page.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    return overflow


async def axe_violations(page: Page, impacts: tuple[str, ...] = SERIOUS) -> list[dict[str, Any]]:
    """axe-core's violations of `impacts` on the page as it is now, each with its rule id,
    impact, help and the first targets (empty: none). The script is evaluated through the
    DevTools protocol, so the console's Content-Security-Policy (which allows no inline
    script) is left as it is."""
    if not await page.evaluate("() => typeof window.axe === 'object'"):
        await page.evaluate(axe_source())
    results: dict[str, Any] = await page.evaluate(
        "async () => await window.axe.run(document, {resultTypes: ['violations']})"
    )
    return [
        {
            "id": v["id"],
            "impact": v["impact"],
            "help": v["help"],
            "targets": [node["target"] for node in v["nodes"][:5]],
        }
        for v in results["violations"]
        if v["impact"] in impacts
    ]


async def check_phone_and_axe(page: Page) -> None:
    """The page as it is now, at the desktop's width and then a phone's: no serious or
    critical axe violation, and no sideways scroll at 390 px; back at the desktop's width."""
    found = await axe_violations(page)
    assert found == [], found
    await page.set_viewport_size(PHONE)
    overflow = await sideways_overflow(page)
    assert overflow == 0, f"{overflow} px wider than a phone at {page.url}: {await widest(page)}"
    found = await axe_violations(page)
    assert found == [], found
    await page.set_viewport_size(DESKTOP)


async def widest(page: Page) -> list[str]:
    """The elements that reach past the viewport's right edge, innermost first (what makes
    a page scroll sideways), as tag.class and their right edge."""
    found: list[str] = await page.evaluate(
        """() => {
            const width = document.documentElement.clientWidth;
            const past = [...document.querySelectorAll("body *")].filter(
                (e) => e.getBoundingClientRect().right > width + 0.5);
            const innermost = past.filter((e) => !past.some((o) => o !== e && e.contains(o)));
            return innermost.slice(0, 8).map((e) =>
                `${e.tagName.toLowerCase()}.${[...e.classList].join(".")}#${e.id} ` +
                `right=${Math.round(e.getBoundingClientRect().right)}`);
        }"""
    )
    return found
