"""The console's review and summary pages in a real browser (Debian's Chromium driven by
Playwright) on the real stack: a real processor labels a full run's frames with the demo
detector in Triton, the gateway serves the pages, and every check of what was stored goes
through the API. Nothing is mocked; the one interception (holding a decision's POST on
its way to the gateway) only delays the real request, to see the page wait for it.

Screenshots of the review and summary pages are taken (into docs/screenshots/ under `make
screenshots`, testbed/harness/browser.py).
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from playwright.async_api import Page, Route, expect

from testbed.harness.browser import needs_chromium
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.gateway import PASSWORD, GatewayHarness
from testbed.harness.preview import PreviewHarness
from testbed.harness.triton import TritonServer
from tests.console_checks import check_phone_and_axe
from tests.processor_world import finished, one_camera_run, running_processor
from tests.system.test_console import sign_in
from workshop.v1 import common_pb2
from workshop.v1 import operator_pb2 as op

pytestmark = [pytest.mark.triton, pytest.mark.timeout(180), needs_chromium]

Json = dict[str, Any]


async def reviewed_run(
    c: CoordinatorHarness, preview: PreviewHarness, triton: TritonServer, tmp: Path
) -> None:
    """Full run r1 of workflow `yard` over cam-a, labelled by a real processor."""
    world = await one_camera_run(c, preview, triton, tmp)
    async with running_processor(c, preview, triton, world.runtime_id):
        detail = await finished(c, "r1")
    assert detail.run.status == common_pb2.RUN_STATUS_COMPLETED, detail
    assert detail.run.counts.items_saved > 0


async def review(gateway: GatewayHarness, client: Any) -> Json:
    answer = await client.get("/api/workshop/runs/r1/review")
    assert answer.status_code == 200, answer.text
    body: Json = answer.json()
    return body


async def dates(page: Page) -> list[str]:
    """The dates of the yard workflow's bars on the summary page."""
    bars = page.locator("section[data-workflow-id='yard'] rect.chart-bar")
    found: list[str] = await bars.evaluate_all("bars => bars.map(b => b.dataset.date)")
    return found


def box_states(body: Json, sighting_id: str) -> list[tuple[str, str | None]]:
    """Per item of the sighting (as the API answers it): its box's review state and relabel."""
    sighting = next(s for s in body["sightings"] if s["sighting_id"] == sighting_id)
    items = {entry["item"]["item_id"]: entry["item"] for entry in body["items"]}
    states = []
    for item_id in sighting["item_ids"]:
        item = items[item_id]
        (box,) = [r for r in item["box_reviews"] if r["sighting_id"] == sighting_id]
        states.append((box["review_state"], box.get("relabel_class")))
        # the item's own state follows its boxes (docs/review.md)
        others = {r["review_state"] for r in item["box_reviews"]}
        expected = (
            "pending" if "pending" in others else "accepted" if "accepted" in others else "rejected"
        )
        assert item["review_state"] == expected, item
    return states


async def test_a_sighting_is_reviewed_with_the_keyboard_and_the_summary_shows_it(
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
    sightings = before["sightings"]
    classes = before["models"][0]["classes"]
    # the sighting with the most items (ties: the first), the one the keyboard decides
    index, target = max(enumerate(sightings), key=lambda pair: (len(pair[1]["item_ids"]), -pair[0]))
    sid = target["sighting_id"]
    count = len(target["item_ids"])
    assert count >= 2, target
    assert target["class_name"], target
    relabel = next(name for name in classes[:9] if name != target["class_name"])
    digit = str(classes.index(relabel) + 1)

    # the page's clock is the coordinator's (frozen by the harness), so ages read as they would
    await page.clock.set_fixed_time(coordinator.clock.now())
    await page.goto("/#/review/r1")
    await sign_in(page, "ada", PASSWORD)
    await expect(page.get_by_role("heading", name="Review of run r1")).to_be_focused()
    rows = page.locator("li.sighting")
    await expect(rows).to_have_count(len(sightings))
    progress = page.locator("#review-progress")
    items = len(before["items"])
    await expect(progress).to_have_text(
        f"Decided: 0 of {len(sightings)} sightings, 0 of {items} items."
    )
    await expect(page.locator("#relabel-classes li")).to_have_count(min(9, len(classes)))
    # every thumbnail is lazy, of a fixed size, from the item image route
    thumbs = page.locator("li.sighting img")
    assert await thumbs.count() == sum(len(s["item_ids"]) for s in sightings)
    first_img = thumbs.first
    assert await first_img.get_attribute("loading") == "lazy"
    assert (await first_img.get_attribute("width"), await first_img.get_attribute("height")) == (
        "160",
        "90",
    )
    assert re.fullmatch(
        r"/api/workshop/runs/r1/items/[^/]+/image", await first_img.get_attribute("src") or ""
    )

    # j/k move: j selects the first sighting, then down to the target and back and forth
    row = page.locator(f"li.sighting[data-sighting-id='{sid}']")
    for _ in range(index + 1):
        await page.keyboard.press("j")
    await page.keyboard.press("j")
    await page.keyboard.press("k")
    if index + 1 == len(sightings):  # j on the last stays there, so k went one up
        await page.keyboard.press("j")
    await expect(row).to_be_focused()
    await expect(row).to_have_attribute("aria-current", "true")
    await expect(row).to_have_class(re.compile(r"\bcurrent\b"))
    state = row.locator(".state")
    await expect(state).to_have_text("pending")

    # c, with the POST held on its way: the page shows it saving, not decided
    release, arrived = asyncio.Event(), asyncio.Event()
    held: list[str] = []

    async def hold(route: Route) -> None:
        held.append(route.request.url)
        arrived.set()
        await release.wait()
        await route.continue_()

    await page.route("**/api/workshop/runs/r1/sightings/*/decision", hold)
    await page.keyboard.press("c")
    await expect(row.locator(".saving")).to_have_text("saving…")
    await expect(row).to_have_attribute("aria-busy", "true")
    await expect(state).to_have_text("pending")
    # the page shows "saving" when it sends; the route sees the request a moment later, or,
    # on a loaded machine, once one of the browser's six connections to the gateway is free
    # of the thumbnails it is still loading (HTTP/1.1): seen to take over 10 s in CI
    await asyncio.wait_for(arrived.wait(), timeout=45)
    assert held
    assert held[0].endswith(f"/sightings/{sid}/decision")
    assert set(box_states(await review(gateway, api), sid)) == {("pending", None)}
    release.set()
    await expect(state).to_have_text("accepted")
    await expect(row.locator(".decided-by")).to_have_text(
        re.compile(r"^by Ada, \d{4}-\d\d-\d\d \d\d:\d\d UTC$")
    )
    await expect(row.locator(".saving")).to_have_count(0)
    status = page.locator("#review-status")
    await expect(status).to_contain_text(f"{count} items updated")
    assert box_states(await review(gateway, api), sid) == [("accepted", None)] * count
    await page.unroute("**/api/workshop/runs/r1/sightings/*/decision")
    await expect(progress).to_contain_text(f"Decided: 1 of {len(sightings)} sightings")

    # n: rejected; a digit: relabelled to that class
    await page.keyboard.press("n")
    await expect(state).to_have_text("rejected")
    assert box_states(await review(gateway, api), sid) == [("rejected", None)] * count
    await page.keyboard.press(digit)
    await expect(state).to_have_text(f"accepted as {relabel}")
    await expect(status).to_contain_text(f"now {relabel}")
    assert box_states(await review(gateway, api), sid) == [("accepted", relabel)] * count
    await page.screenshot(path=str(screenshots / "review.png"), full_page=True)
    await check_phone_and_axe(page)

    # u: back to what each decision replaced, newest first
    await page.keyboard.press("u")
    await expect(state).to_have_text("rejected")
    await expect(status).to_contain_text("Undone")
    assert box_states(await review(gateway, api), sid) == [("rejected", None)] * count
    await page.keyboard.press("u")
    await expect(state).to_have_text("accepted")
    assert box_states(await review(gateway, api), sid) == [("accepted", None)] * count
    # the first decision replaced "pending", which no decision restores: said, nothing sent
    await page.keyboard.press("u")
    await expect(page.get_by_role("alert")).to_contain_text("Cannot undo")
    await expect(state).to_have_text("accepted")
    assert box_states(await review(gateway, api), sid) == [("accepted", None)] * count

    # an item is accepted once all its boxes are decided: decide the other sightings too
    # (c on each, n on the last one), walking the list with j from the top
    for _ in range(index):
        await page.keyboard.press("k")
    await expect(rows.first).to_be_focused()
    for position in range(len(sightings)):
        other = rows.nth(position)
        if position != index:
            await page.keyboard.press("n" if position == len(sightings) - 1 else "c")
            await expect(other.locator(".state")).not_to_have_text("pending")
        await page.keyboard.press("j")
    await expect(progress).to_have_text(
        f"Decided: {len(sightings)} of {len(sightings)} sightings, {items} of {items} items."
    )

    # the summary, reached from the header, counts the decisions
    after = await review(gateway, api)
    states = [e["item"]["review_state"] for e in after["items"]]
    accepted, rejected, pending = (states.count(s) for s in ("accepted", "rejected", "pending"))
    assert accepted >= 1
    assert pending == 0
    async with page.expect_request(re.compile(r"/api/workshop/summary\?")) as asked:
        await page.get_by_role("link", name="Summary").click()
    await expect(page.get_by_role("heading", name="Summary", exact=True)).to_be_focused()
    zone = await page.evaluate("Intl.DateTimeFormat().resolvedOptions().timeZone")
    assert f"time_zone={zone.replace('/', '%2F')}" in (await asked.value).url
    bucket = page.locator("#buckets tr[data-bucket-id='yard'] td")
    cells = [text.strip() for text in await bucket.all_inner_texts()]
    assert cells[:5] == [str(items), str(accepted), str(rejected), "0", str(items)], cells
    workflow = page.locator("section.workflow-summary[data-workflow-id='yard']")
    await expect(workflow.locator(".runs-count")).to_have_text("1")
    await expect(workflow.get_by_role("link", name="r1")).to_have_attribute("href", "#/review/r1")
    relabelled = workflow.locator(f"table.classes tr[data-class='{target['class_name']}'] td")
    summary = (await api.get("/api/workshop/summary", params={"time_zone": zone})).json()
    (yard,) = [w for w in summary["workflows"] if w["workflow_id"] == "yard"]
    detected = {entry["class_name"]: entry for entry in yard["classes"]}
    expected = detected[target["class_name"]]
    assert [t.strip() for t in await relabelled.all_inner_texts()] == [
        str(expected["detections"]),
        str(expected["confirmations"]),
    ]
    assert expected["confirmations"] >= count
    chart = workflow.get_by_role("img", name=re.compile(r"^Images saved per day"))
    await expect(chart).to_be_visible()
    bars = chart.locator("rect.chart-bar")
    await expect(bars).to_have_count(30)
    per_day = [
        int(v or 0) for v in await bars.evaluate_all("bars => bars.map(b => b.dataset.images)")
    ]
    assert sum(per_day) == items
    hidden_rows = workflow.locator(".visually-hidden table tbody tr")
    await expect(hidden_rows).to_have_count(30)
    await page.screenshot(path=str(screenshots / "summary.png"), full_page=True)
    await check_phone_and_axe(page)

    # a reader 14 hours ahead of UTC gets the days of their own zone
    assert page.context.browser is not None
    ahead = await page.context.browser.new_context(
        base_url=gateway.url, timezone_id="Pacific/Kiritimati"
    )
    far = await ahead.new_page()
    await far.clock.set_fixed_time(coordinator.clock.now())
    await far.goto("/#/summary")
    await sign_in(far, "ada", PASSWORD)
    await expect(far.get_by_text("your time zone, Pacific/Kiritimati")).to_be_visible()
    local = (
        await api.get("/api/workshop/summary", params={"time_zone": "Pacific/Kiritimati"})
    ).json()
    (yard_there,) = [w for w in local["workflows"] if w["workflow_id"] == "yard"]
    days = {
        f"{d['date']['year']}-{d['date']['month']:02}-{d['date']['day']:02}": d["images"]
        for d in yard_there["images_per_day"]
    }
    bars_there = far.locator("section[data-workflow-id='yard'] rect.chart-bar")
    shown = await bars_there.evaluate_all(
        "bars => bars.map(b => [b.dataset.date, Number(b.dataset.images)])"
    )
    assert dict(shown) == days
    # the items were saved at the coordinator's noon UTC: 02:00 of the next day there
    now = coordinator.clock.now()
    there = now.astimezone(ZoneInfo("Pacific/Kiritimati")).date().isoformat()
    assert shown[-1] == [there, items]
    assert (await dates(page))[-1] == now.astimezone(UTC).date().isoformat() != there
    await ahead.close()


async def test_the_review_pages_through_has_more(
    coordinator: CoordinatorHarness,
    preview: PreviewHarness,
    triton_server: TritonServer,
    gateway: GatewayHarness,
    page: Page,
    tmp_path: Path,
) -> None:
    """With 3 items a page, the page loads the rest with "Load more items" and by j at the
    end, until the last page; every sighting shows once."""
    await reviewed_run(coordinator, preview, triton_server, tmp_path)
    await gateway.user("ada")
    api = (await gateway.login("ada")).client
    whole = await review(gateway, api)
    assert len(whole["items"]) > 6
    await page.goto("/#/review/r1?page_size=3")
    await sign_in(page, "ada", PASSWORD)
    await expect(page.get_by_role("heading", name="Review of run r1")).to_be_focused()
    more = page.get_by_role("button", name="Load more items")
    await expect(more).to_be_visible()
    await expect(page.locator("#review-progress")).to_contain_text("of the 3 loaded")
    await more.click()
    await expect(page.locator("#review-progress")).to_contain_text("of the 6 loaded")
    progress = page.locator("#review-progress")
    while await more.is_visible():  # j past the last sighting loads the next page
        said = await progress.inner_text()
        for _ in range(await page.locator("li.sighting").count() + 1):
            await page.keyboard.press("j")
        await expect(progress).not_to_have_text(said)
    ids = await page.locator("li.sighting").evaluate_all(
        "rows => rows.map(r => r.dataset.sightingId)"
    )
    assert len(ids) == len(set(ids))
    assert set(ids) == {s["sighting_id"] for s in whole["sightings"]}
    total = len(whole["items"])
    await expect(page.locator("#review-progress")).to_have_text(
        f"Decided: 0 of {len(ids)} sightings, 0 of {total} items."
    )

    # a refused decision shows the API's message as an alert and changes nothing shown
    await coordinator.operator.DeleteBucket(
        op.DeleteBucketRequest(bucket_id="yard"), metadata=coordinator.admin
    )
    current = page.locator("li.sighting[aria-current='true']")
    sid = await current.get_attribute("data-sighting-id")
    refused = await api.post(
        f"/api/workshop/runs/r1/sightings/{sid}/decision", json={"decision": "confirm"}
    )
    assert refused.status_code == 404, refused.text
    await page.get_by_role("button", name="Confirm").click()  # the buttons act as the keys
    await expect(page.get_by_role("alert")).to_have_text(f"Not saved: {refused.json()['message']}")
    await expect(current.locator(".state")).to_have_text("pending")
    await expect(current.locator(".saving")).to_have_count(0)
