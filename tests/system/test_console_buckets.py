"""The buckets page (#/buckets) and a bucket's browser (#/buckets/<bucket>) in a real
browser (Debian's Chromium driven by Playwright) on the real stack, keyboard only: the
bucket picked from the list, its items a page at a time by the listing's keyset token
(Next, Previous and First page, each page exactly the API's), the grid walked with the
arrows, an item opened full size with its history, a filter from the form kept in the
URL (the run and score filters too), the item's history of changes in its full-size view,
the boxes after review drawn on every thumbnail; no horizontal scroll at 390 px. A
screenshot of the browser is taken (docs/screenshots/ under `make screenshots`).

The world is test_console_queue.py's: 11 items of two runs in bucket yard, real JPEGs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect

from testbed.harness.browser import needs_chromium, troubles
from testbed.harness.gateway import PASSWORD, GatewayHarness
from tests.console_checks import check_phone_and_axe
from tests.system.test_console import sign_in
from tests.system.test_console_queue import bucket_world, no_sideways_scroll

pytestmark = [pytest.mark.timeout(180), needs_chromium]

Json = dict[str, Any]


async def api_items(client: Any, page_size: int, **params: Any) -> list[list[Json]]:
    """The bucket's items through the API, page by page."""
    pages: list[list[Json]] = []
    token = ""
    while True:
        answer = await client.get(
            "/api/workshop/buckets/yard/items",
            params={**params, "page_size": page_size, "page_token": token},
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        pages.append(body.get("items", []))
        token = body.get("next_page_token", "")
        if not token:
            return pages


async def grid_ids(page: Page) -> list[str]:
    ids: list[str] = await page.locator("#item-grid li.item-cell").evaluate_all(
        "cells => cells.map(c => c.dataset.itemId)"
    )
    return ids


async def test_a_bucket_is_browsed_page_by_page_and_an_item_opened_with_the_keyboard(
    gateway: GatewayHarness, page: Page, screenshots: Path
) -> None:
    await bucket_world(gateway)
    api = (await gateway.login("ada")).client
    pages = await api_items(api, 3)
    assert [len(p) for p in pages] == [3, 3, 3, 2]
    problems = troubles(page)

    # the header's Buckets link lists them; Browse items of yard opens its browser
    await page.goto("/#/buckets")
    await sign_in(page, "ada", PASSWORD)
    await expect(page.get_by_role("heading", name="Buckets", exact=True)).to_be_focused()
    await expect(page.locator("#bucket-list li[data-bucket-id='yard']")).to_contain_text(
        "11 items, 11 pending"
    )
    await no_sideways_scroll(page)
    await page.get_by_role("link", name="Browse items of yard").focus()
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Bucket yard")).to_be_focused()
    await expect(page.locator("#item-grid li.item-cell")).to_have_count(11)
    assert await grid_ids(page) == [i["item_id"] for p in pages for i in p]
    # every thumbnail has its boxes after review drawn (both detected boxes of cam-a's r1
    # frames) and their classes in its caption, from the item image route
    first = page.locator("#item-grid li.item-cell").first
    await expect(first.locator(".box")).to_have_count(len(pages[0][0]["reviewed_boxes"]))
    await expect(first.locator(".item-classes")).to_have_text("person, vehicle")
    # (asked for once its cell is near the view: all of these are in it)
    await expect(first.locator("img")).to_have_attribute(
        "src", re.compile(r"^/api/workshop/runs/r[12]/items/[^/]+/image$")
    )
    await page.wait_for_function(  # every thumbnail (all in view) loaded, for the picture
        "() => [...document.querySelectorAll('#item-grid img')]"
        ".every((img) => img.complete && img.naturalWidth > 0)"
    )
    await page.screenshot(path=str(screenshots / "buckets.png"), full_page=True)
    await check_phone_and_axe(page)
    await no_sideways_scroll(page)

    # a thumbnail is asked for only once its cell is near the view: in a short window the
    # cells far below have none until the grid is scrolled to them
    size = page.viewport_size
    await page.set_viewport_size({"width": 390, "height": 300})
    await page.goto("/#/buckets/yard")
    await page.reload()  # (a view opened from a page scrolled down draws a frame there first)
    await expect(page.locator("#item-grid li.item-cell")).to_have_count(11)
    far = await page.evaluate(
        """() => [...document.querySelectorAll('#item-grid img')]
          .filter((img) => img.getBoundingClientRect().top > innerHeight + 600)
          .map((img) => img.hasAttribute("src"))"""
    )
    assert far, "no cell is far below the view"
    assert not any(far), far  # none of those asks for its image
    last = page.locator("#item-grid li.item-cell").last
    await last.scroll_into_view_if_needed()
    await expect(last.locator("img")).to_have_attribute(
        "src", re.compile(r"^/api/workshop/runs/r[12]/items/[^/]+/image$")
    )
    assert size is not None
    await page.set_viewport_size(size)

    # three a page: Next page to the end, Previous page back, First page
    await page.goto("/#/buckets/yard?page_size=3")
    await expect(page.get_by_role("heading", name="Bucket yard")).to_be_focused()
    where = page.locator("#browser-page")
    await expect(where).to_have_text("Page 1: items 1 to 3.")
    assert await grid_ids(page) == [i["item_id"] for i in pages[0]]
    await expect(page.locator("#previous-page")).to_be_disabled()
    for number, expected in enumerate(pages[1:], start=2):
        await page.locator("#next-page").focus()
        await page.keyboard.press("Enter")
        await expect(where).to_contain_text(f"Page {number}:")
        assert await grid_ids(page) == [i["item_id"] for i in expected]
        # the focus moves to the page's first item
        await expect(page.locator("#item-grid .item-open").first).to_be_focused()
    await expect(where).to_have_text("Page 4: items 10 to 11 (the last page).")
    await expect(page.locator("#next-page")).to_be_disabled()
    await page.locator("#previous-page").focus()
    await page.keyboard.press("Enter")
    await expect(where).to_have_text("Page 3: items 7 to 9.")
    assert await grid_ids(page) == [i["item_id"] for i in pages[2]]
    await page.locator("#first-page").focus()
    await page.keyboard.press("Enter")
    await expect(where).to_have_text("Page 1: items 1 to 3.")
    assert await grid_ids(page) == [i["item_id"] for i in pages[0]]

    # the grid: one tab stop, arrows move in it, End to its last item; Enter opens it
    # full size in the item editor with its history; Escape gives the focus back
    cells = page.locator("#item-grid .item-open")
    await expect(cells.first).to_be_focused()
    await expect(cells.nth(1)).to_have_attribute("tabindex", "-1")
    await page.keyboard.press("ArrowRight")
    await expect(cells.nth(1)).to_be_focused()
    await page.keyboard.press("End")
    await expect(cells.nth(2)).to_be_focused()
    await page.keyboard.press("ArrowLeft")
    await expect(cells.nth(1)).to_be_focused()
    await page.keyboard.press("Enter")
    dialog = page.locator("#item-editor")
    await expect(dialog).to_be_visible()
    item = pages[0][1]
    await expect(dialog.locator("#item-editor-title")).to_have_text(
        f"Frame {item['item_id']} · {item['camera_id']}"
    )
    history = dialog.locator("#item-history")
    await expect(history).to_contain_text(f"Detected: {len(item['boxes'])} box")
    await expect(history).to_contain_text("follows its sighting: pending")
    # deciding the frame alone from here shows in its history and in the grid
    await page.keyboard.press("n")
    await expect(dialog.locator("#history-decision")).to_contain_text("rejected (none) by Ada")
    # every change, oldest first (GetBucketItem), and the versions holding it
    log = dialog.locator("#history-log li")
    await expect(log.first).to_have_text(f"Saved with {len(item['boxes'])} boxes detected.")
    await expect(log.nth(1)).to_contain_text("Revision 1: this frame rejected (none) by Ada")
    await expect(log.filter(has_text="sighting")).to_have_count(len(item["boxes"]))
    await expect(log.filter(has_text="not decided yet")).to_have_count(len(item["boxes"]))
    await expect(dialog.locator("#history-versions")).to_have_text("In no dataset version.")
    await page.keyboard.press("Escape")
    await expect(dialog).to_be_hidden()
    await expect(cells.nth(1)).to_be_focused()
    await expect(page.locator("#item-grid li.item-cell").nth(1).locator(".state")).to_have_text(
        "rejected"
    )
    stored = (await api_items(api, 3))[0][1]
    assert stored["item_decision"]["review_state"] == "rejected"

    # a filter from the form (keyboard), kept in the URL: cam-b's pending items
    await page.locator("#f-camera_id").focus()
    await page.keyboard.type("cam-b")
    await page.locator("#f-state").focus()
    await page.keyboard.press("ArrowDown")  # Any state -> Pending
    await page.locator("#f-camera_id").focus()
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(
        re.compile(r"#/buckets/yard\?page_size=3&state=pending&camera_id=cam-b$")
    )
    await expect(page.get_by_role("heading", name="Bucket yard")).to_be_focused()
    filtered = await api_items(api, 3, review_state="pending", camera_id="cam-b")
    assert sum(len(p) for p in filtered) == 5
    assert await grid_ids(page) == [i["item_id"] for i in filtered[0]]
    assert {i["camera_id"] for p in filtered for i in p} == {"cam-b"}
    await expect(page.locator("#export-coco")).to_have_attribute(
        "href", "/api/workshop/buckets/yard/export?review_state=pending&camera_id=cam-b&format=coco"
    )

    # the run and score filters (as the queue's): r2's pending items scoring 0.45 or more
    await page.locator("#f-camera_id").focus()
    await page.keyboard.press("Control+A")
    await page.keyboard.press("Backspace")
    await page.locator("#f-run_id").focus()
    await page.keyboard.type("r2")
    await page.locator("#f-min_score").focus()
    await page.keyboard.type("0.45")
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(
        re.compile(r"#/buckets/yard\?page_size=3&state=pending&run_id=r2&min_score=0\.45$")
    )
    await expect(page.get_by_role("heading", name="Bucket yard")).to_be_focused()
    scored = await api_items(api, 3, review_state="pending", run_id="r2", min_score=0.45)
    assert [len(p) for p in scored] == [2]  # r2's vehicle of 0.97 and its person of 0.5
    assert await grid_ids(page) == [i["item_id"] for i in scored[0]]
    await expect(page.locator("#f-run_id")).to_have_value("r2")
    await no_sideways_scroll(page)
    assert problems == []
