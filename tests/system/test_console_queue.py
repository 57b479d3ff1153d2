"""The review queue page (#/queue/<bucket>) in a real browser (Debian's Chromium driven by
Playwright) on the real stack, keyboard only: a bucket's sightings across two runs in
the order and with the filters chosen (kept in the URL), paged on with the queue's token
as j reaches the end, decided (c, n) and undone (u) with who decided shown, a frame
opened in the item editor, and a bulk action on the filters previewed, refused silently
never (a selection changed after the preview is shown and asked again), applied and
undone; every result checked through the API. No horizontal scroll at 390 px. A
screenshot of the page is taken (docs/screenshots/ under `make screenshots`).

The world is tests/service/test_review_queue.py's (testbed/review_world.py): the runs'
frames are real JPEGs in SeaweedFS, staged through the preview service.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from playwright.async_api import Page, expect

from testbed.coordinator_leases import Setup
from testbed.harness.browser import needs_chromium
from testbed.harness.gateway import PASSWORD, GatewayHarness
from testbed.review_world import Frame, commit_images, review_world, start_run
from tests.console_checks import check_phone_and_axe
from tests.system.test_console import sign_in
from workshop.v1 import common_pb2, jobs_pb2

pytestmark = [pytest.mark.timeout(180), needs_chromium]

Json = dict[str, Any]

NO_SIDEWAYS_SCROLL = (
    "() => document.scrollingElement.scrollWidth <= document.scrollingElement.clientWidth"
)


def sbox(class_name: str, x: float, score: float) -> common_pb2.Box:
    return common_pb2.Box(class_name=class_name, score=score, x=x, y=0.35, w=0.18, h=0.4)


def scene(
    boxes: tuple[common_pb2.Box, ...], seed: int, width: int = 320, height: int = 180
) -> bytes:
    """A JPEG of a plain yard (sky over ground) with a block where each box is: something
    a screenshot can show."""
    rng = np.random.default_rng(seed)
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    horizon = height // 2
    pixels[:horizon] = (150, 190, 225)
    pixels[horizon:] = (95, 120, 80)
    pixels = np.clip(pixels + rng.integers(-12, 12, pixels.shape), 0, 255).astype(np.uint8)
    colours = {"person": (200, 70, 60), "vehicle": (60, 80, 170)}
    for box in boxes:
        x0, y0 = int(box.x * width), int(box.y * height)
        x1, y1 = int((box.x + box.w) * width), int((box.y + box.h) * height)
        pixels[y0:y1, x0:x1] = colours.get(box.class_name, (40, 40, 40))
    codec = av.CodecContext.create("mjpeg", "w")
    codec.width, codec.height = width, height
    codec.pix_fmt = "yuvj420p"
    codec.time_base = Fraction(1, 25)
    frame = av.VideoFrame.from_ndarray(pixels, format="rgb24").reformat(format="yuvj420p")
    return b"".join(bytes(p) for p in [*codec.encode(frame), *codec.encode(None)])


async def save(
    gateway: GatewayHarness, s: Setup, job: jobs_pb2.ClaimedJob, frames: list[Frame]
) -> None:
    images = {f.slot: scene(f.boxes, seed=f.slot) for f in frames}
    await commit_images(gateway.c, s, gateway.app.upstream.preview, job, frames, images)


async def bucket_world(gateway: GatewayHarness) -> Setup:
    """Two runs over cam-a and cam-b saving into bucket yard (test_review_queue.py's
    queue_world, with images): r1 has a person (0.95) and a vehicle (0.6) in cam-a's slots
    0-3, a vehicle (0.92) in cam-b's 5-6 and a person (0.3) in cam-b's 20-21; r2 a vehicle
    (0.97, 0.4) in cam-a's 2-3 and a person (0.5) in cam-b's 30: 6 sightings, 11 items.
    User ada."""
    c = gateway.c
    s = await review_world(c)
    r1 = await start_run(c, s, "r1")
    two = (sbox("person", 0.1, 0.95), sbox("vehicle", 0.6, 0.6))
    await save(gateway, s, r1[0], [Frame(n, "save", two) for n in range(4)])
    await save(
        gateway,
        s,
        r1[3],
        [Frame(n, "save", (sbox("vehicle", 0.5, 0.92),)) for n in (5, 6)]
        + [Frame(n, "save", (sbox("person", 0.2, 0.3),)) for n in (20, 21)],
    )
    for job in (r1[1], r1[2], r1[4], r1[5]):
        await save(gateway, s, job, [])
    r2 = await start_run(c, s, "r2")
    await save(
        gateway,
        s,
        r2[0],
        [
            Frame(2, "save", (sbox("vehicle", 0.3, 0.97),)),
            Frame(3, "save", (sbox("vehicle", 0.3, 0.4),)),
        ],
    )
    await save(gateway, s, r2[3], [Frame(30, "save", (sbox("person", 0.7, 0.5),))])
    await gateway.user("ada")
    return s


async def api_queue(client: Any, **params: Any) -> list[Json]:
    """The whole queue through the API, as QueuedSightings."""
    found: list[Json] = []
    token = ""
    while True:
        answer = await client.get(
            "/api/workshop/buckets/yard/queue", params={**params, "page_token": token}
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        found.extend(body.get("sightings", []))
        token = body.get("next_page_token", "")
        if not token:
            return found


async def shown(page: Page) -> list[str]:
    ids: list[str] = await page.locator("#queue li.sighting").evaluate_all(
        "rows => rows.map(r => r.dataset.sightingId)"
    )
    return ids


async def no_sideways_scroll(page: Page) -> None:
    await page.set_viewport_size({"width": 390, "height": 800})
    assert await page.evaluate(NO_SIDEWAYS_SCROLL), await page.evaluate(
        "() => [document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth]"
    )
    await page.set_viewport_size({"width": 1280, "height": 800})


async def test_the_queue_is_ordered_filtered_decided_and_bulk_decided_with_the_keyboard(
    gateway: GatewayHarness, page: Page, screenshots: Path
) -> None:
    await bucket_world(gateway)
    api = (await gateway.login("ada")).client
    everything = await api_queue(api)
    assert len(everything) == 6

    # from the header's "Review queue" to the bucket picker, to yard's queue
    await page.goto("/#/queue")
    await sign_in(page, "ada", PASSWORD)
    await expect(page.get_by_role("heading", name="Review queue", exact=True)).to_be_focused()
    await no_sideways_scroll(page)
    await page.get_by_role("link", name="Review queue of yard").focus()
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Review queue of yard")).to_be_focused()
    await expect(page.locator("#queue li.sighting")).to_have_count(6)
    assert await shown(page) == [q["sighting"]["sighting_id"] for q in everything]

    # two a page: j past the end asks for the next page (the queue's token), to the last
    await page.goto("/#/queue/yard?page_size=2")
    await expect(page.get_by_role("heading", name="Review queue of yard")).to_be_focused()
    rows = page.locator("#queue li.sighting")
    await expect(rows).to_have_count(2)
    await expect(page.locator("#queue-more")).to_be_visible()
    for expected in range(1, 7):
        await page.keyboard.press("j")
        await expect(rows.nth(expected - 1)).to_be_focused()
    await expect(rows).to_have_count(6)
    await expect(page.locator("#queue-more")).to_be_hidden()
    assert await shown(page) == [q["sighting"]["sighting_id"] for q in everything]

    # the order and a filter from the form (keyboard): lowest score first, vehicles only;
    # both land in the URL
    await page.locator("#f-order").focus()
    await page.keyboard.press("ArrowDown")  # Oldest first -> Lowest score first
    await page.locator("#f-class_name").focus()
    await page.keyboard.type("vehicle")
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(
        re.compile(r"#/queue/yard\?page_size=2&order=lowest_score&class_name=vehicle$")
    )
    await expect(page.get_by_role("heading", name="Review queue of yard")).to_be_focused()
    vehicles = await api_queue(api, order="lowest_score", class_name="vehicle")
    assert [round(q["score"], 2) for q in vehicles] == [0.6, 0.92, 0.97]
    for _ in vehicles:
        await page.keyboard.press("j")
    await expect(rows).to_have_count(len(vehicles))
    assert await shown(page) == [q["sighting"]["sighting_id"] for q in vehicles]
    await expect(rows.first.locator(".score")).to_have_text("score 0.60")
    await expect(page.locator("#f-order")).to_have_value("lowest_score")
    await expect(page.locator("#f-class_name")).to_have_value("vehicle")

    # decide the least certain vehicle: c, then n, then undo (u) back to confirmed; the
    # first decision replaced "pending", which no decision restores: said, nothing sent
    await page.keyboard.press("k")
    await page.keyboard.press("k")
    target = vehicles[0]
    sid, run_id = target["sighting"]["sighting_id"], target["run_id"]
    row = page.locator(f"#queue li.sighting[data-sighting-id='{sid}']")
    await expect(row).to_be_focused()
    state = row.locator(".state")
    await page.keyboard.press("c")
    await expect(state).to_have_text("accepted")
    await expect(row.locator(".decided-by")).to_have_text(
        re.compile(r"^by Ada, \d{4}-\d\d-\d\d \d\d:\d\d UTC$")
    )
    await expect(page.locator("#queue-status")).to_contain_text(f"(run {run_id})")

    async def stored() -> Json:
        decided = await api_queue(api, review_state=["pending", "accepted", "rejected"])
        found: Json = next(q["sighting"] for q in decided if q["sighting"]["sighting_id"] == sid)
        return found

    assert (await stored())["review_state"] == "accepted"
    assert (await stored())["decided_by"]["user_id"] == "ada"
    await page.keyboard.press("n")
    await expect(state).to_have_text("rejected")
    assert (await stored())["review_state"] == "rejected"
    await page.keyboard.press("u")
    await expect(state).to_have_text("accepted")
    await expect(page.locator("#queue-status")).to_contain_text("Undone")
    assert (await stored())["review_state"] == "accepted"
    await page.screenshot(path=str(screenshots / "queue.png"), full_page=True)
    await check_phone_and_axe(page)
    await page.keyboard.press("u")
    await expect(page.locator("#queue-error")).to_contain_text("Cannot undo")
    assert (await stored())["review_state"] == "accepted"

    # e opens the current sighting's first frame in the item editor; Escape closes it
    await page.keyboard.press("e")
    dialog = page.locator("#item-editor")
    await expect(dialog).to_be_visible()
    await expect(dialog.locator("#item-history")).to_contain_text("Detected: 2 boxes")
    await expect(dialog.locator("#history-decision")).to_contain_text("follows its sighting")
    await page.keyboard.press("Escape")
    await expect(dialog).to_be_hidden()
    await expect(
        row.locator(f"figure[data-item-id='{target['sighting']['item_ids'][0]}'] .thumb-edit")
    ).to_be_focused()

    # bulk: every pending person sighting -> confirm, previewed first
    await page.goto("/#/queue/yard?class_name=person")
    await expect(page.get_by_role("heading", name="Review queue of yard")).to_be_focused()
    people = await api_queue(api, class_name="person")
    assert len(people) == 3
    await page.locator("#bulk-decision").focus()
    await page.keyboard.press("Tab")
    await expect(page.locator("#bulk-preview")).to_be_focused()
    await page.keyboard.press("Enter")
    preview = page.locator("#bulk-preview-text")
    items = sum(len(q["sighting"]["item_ids"]) for q in people)
    await expect(preview).to_have_text(
        f'Preview: 3 sightings match (pending, class person); deciding them "confirm" changes '
        f"3 sightings and {items} items."
    )
    apply = page.locator("#bulk-apply")
    await expect(apply).to_be_focused()
    await expect(apply).to_have_text(f"Apply to 3 sightings ({items} items change)")
    dry = await api.post(
        "/api/workshop/buckets/yard/bulk-decisions",
        json={"decision": "confirm", "filter": {"class_name": "person"}, "dry_run": True},
    )
    assert (dry.json()["sightings_selected"], dry.json()["items_changed"]) == (3, items)

    # someone decides one of them meanwhile: Apply is refused, the new counts are shown
    # and asked for again; nothing was applied
    late = people[-1]
    decided = await api.post(
        f"/api/workshop/runs/{late['run_id']}/sightings/{late['sighting']['sighting_id']}/decision",
        json={"decision": "none"},
    )
    assert decided.status_code == 200, decided.text
    await page.keyboard.press("Enter")
    rest = items - len(late["sighting"]["item_ids"])
    await expect(preview).to_have_text(
        "The selection changed since the preview. Now: 2 sightings match (pending, class "
        f'person); deciding them "confirm" changes 2 sightings and {rest} items. Apply again?'
    )
    assert len(await api_queue(api, class_name="person")) == 2  # still pending
    await expect(apply).to_be_focused()
    await page.keyboard.press("Enter")
    done = page.locator("#bulk-done")
    await expect(done).to_contain_text(
        f'Applied "confirm" to 2 sightings: 2 sightings and {rest} items changed.'
    )
    action_id = await page.locator("#bulk-action-id").inner_text()
    assert action_id
    assert await api_queue(api, class_name="person") == []
    accepted = await api_queue(api, class_name="person", review_state="accepted")
    assert {q["sighting"]["sighting_id"] for q in accepted} == {
        q["sighting"]["sighting_id"] for q in people[:-1]
    }
    await expect(page.locator("#queue-empty")).to_be_visible()  # the list was read again
    await no_sideways_scroll(page)

    # one undo for the whole action: both back to pending (which no decision can do)
    undo = page.locator("#bulk-undo")
    await expect(undo).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page.locator("#bulk-undone")).to_contain_text(
        f"Undone: bulk action {action_id} by Ada"
    )
    again = await api_queue(api, class_name="person")
    assert [q["sighting"]["sighting_id"] for q in again] == [
        q["sighting"]["sighting_id"] for q in people[:-1]
    ]
    await expect(page.locator("#queue li.sighting")).to_have_count(2)
