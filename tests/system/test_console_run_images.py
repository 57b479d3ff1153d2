"""The run page's images in a real browser (Debian's Chromium driven by Playwright) on the
real stack: coordinator on Postgres, preview service on SeaweedFS, the gateway on uvicorn.
The test plays the processor through the real RPCs (claim, PublishPreview, Complete), so
it chooses each frame's boxes and when the job commits; nothing is mocked. The one
interception holds preview image requests on their way to the gateway (then lets them
go), to have them still out when the job commits, as a slow connection would.

What it checks: the newest images are shown by frame time; box labels never overlap and
a click opens the image full size with its boxes; a page never asks for a preview the
detail already shows as expired (a full run's page shows the saved item instead, a test
run's page a placeholder), and no console error or failed answer shows up on the way.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from datetime import UTC, timedelta
from typing import Any

import pytest
from playwright.async_api import Page, Request, Route, expect

from testbed.coordinator_leases import Setup, claimed, complete_request, empty_result, setup
from testbed.coordinator_leases import create_run as create_coordinator_run
from testbed.coordinator_world import CODE
from testbed.harness.browser import needs_chromium, troubles
from testbed.harness.gateway import PASSWORD, GatewayHarness
from testbed.harness.preview import PreviewHarness, jpeg_bytes
from tests.system.test_console import sign_in
from workshop.v1 import common_pb2, jobs_pb2
from workshop.v1 import preview_pb2 as pb

pytestmark = [pytest.mark.timeout(120), needs_chromium]

Box = tuple[str, float, float, float, float, float]  # class, score, x, y, w, h (fractions)
# Per slot, its boxes: slot 2's three boxes lie side by side, so their labels (each above
# its box) would be drawn over each other; slot 4's first box touches the frame's top
# edge and its second one the right edge.
FRAMES: dict[int, list[Box]] = {
    0: [("person", 0.91, 0.40, 0.40, 0.20, 0.30)],
    1: [("vehicle", 0.88, 0.05, 0.50, 0.30, 0.25)],
    2: [
        ("person", 0.97, 0.30, 0.40, 0.08, 0.30),
        ("person", 0.93, 0.34, 0.42, 0.08, 0.30),
        ("vehicle", 0.81, 0.38, 0.44, 0.20, 0.30),
    ],
    3: [],
    4: [
        ("person", 0.77, 0.20, 0.00, 0.10, 0.30),
        ("vehicle", 0.66, 0.85, 0.30, 0.15, 0.20),
        ("person", 0.62, 0.86, 0.33, 0.12, 0.20),
    ],
}
RUN = "r1"


def boxes(slot: int) -> list[common_pb2.Box]:
    return [
        common_pb2.Box(class_name=name, score=score, x=x, y=y, w=w, h=h)
        for name, score, x, y, w, h in FRAMES[slot]
    ]


async def publish(
    preview: PreviewHarness, s: Setup, job: jobs_pb2.ClaimedJob
) -> list[pb.PublishPreviewResponse]:
    """Each slot of FRAMES published as the processor does: in slot order, a 640x360 JPEG."""
    published = []
    for slot in sorted(FRAMES):
        request = pb.PublishPreviewRequest(
            lease=job.lease,
            code_sha256=CODE,
            slot_index=slot,
            frame_time=job.input.slots[slot].start,
            image=jpeg_bytes(640, 360, seed=slot),
            content_type="image/jpeg",
            boxes=boxes(slot),
        )
        published.append(await preview.stub.PublishPreview(request, metadata=s.processor))
    return published


async def commit(
    gateway: GatewayHarness,
    s: Setup,
    job: jobs_pb2.ClaimedJob,
    published: Sequence[pb.PublishPreviewResponse],
) -> None:
    """Completes the job with each published frame saved into `yard` (its preview named
    as the upload, as the bundled processor does)."""
    result = empty_result(job)
    for slot, preview in zip(sorted(FRAMES), published, strict=True):
        entry = result.slots[slot]
        entry.outcome = common_pb2.SLOT_OUTCOME_FRAME
        entry.frame_time.CopyFrom(job.input.slots[slot].start)
        entry.boxes.extend(boxes(slot))
        entry.outputs.add(step_id="save", boxes=boxes(slot))
        entry.upload_key, entry.upload_sha256 = preview.object_key, preview.sha256
    await gateway.c.jobs.Complete(complete_request(job, result), metadata=s.processor)


async def leased_run(gateway: GatewayHarness, *, full: bool) -> tuple[Setup, jobs_pb2.ClaimedJob]:
    """Run r1 of `yard` over cam-a 08:00-09:00 (one job), its job leased; user ada."""
    s = await setup(gateway.c, spec_kwargs={"window": (8, 9)})
    await create_coordinator_run(gateway.c, s, RUN, full=full)
    await gateway.user("ada")
    return s, await claimed(gateway.c, s)


async def signed_in(page: Page) -> list[str]:
    """Ada signed in (on the runs page); the page's troubles from its first load on."""
    seen = troubles(page)
    await page.goto("/")
    await sign_in(page, "ada", PASSWORD)
    await expect(page.get_by_role("heading", name="Runs")).to_be_focused()
    return seen


async def open_run_page(page: Page) -> None:
    await page.goto(f"/#/run/{RUN}")
    await expect(page.get_by_role("heading", name=f"Run {RUN}")).to_be_focused()


async def shown(page: Page) -> list[dict[str, Any]]:
    """Each figure in page order: its item, slot (from the caption), image URL, and the
    on-page rectangles of its image, boxes and labels."""
    found: list[dict[str, Any]] = await page.evaluate(
        """() => [...document.querySelectorAll('#images figure')].map((figure) => {
          const rect = (node) => { const r = node.getBoundingClientRect();
            return { x: r.x, y: r.y, w: r.width, h: r.height }; };
          const img = figure.querySelector('img');
          return {
            item_id: figure.dataset.itemId,
            slot: Number(/slot (\\d+)/.exec(figure.querySelector('figcaption').textContent)[1]) - 1,
            src: img ? img.getAttribute('src') : null,
            frame: rect(figure.querySelector('.frame')),
            boxes: [...figure.querySelectorAll('.box')].map(rect),
            labels: [...figure.querySelectorAll('.box-label')].map((label) => (
              { ...rect(label), text: label.textContent })),
          };
        })"""
    )
    return found


def overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["x"] < b["x"] + b["w"]
        and b["x"] < a["x"] + a["w"]
        and a["y"] < b["y"] + b["h"]
        and b["y"] < a["y"] + a["h"]
    )


def inside(inner: dict[str, float], outer: dict[str, float]) -> bool:
    return (
        inner["x"] >= outer["x"] - 0.5
        and inner["y"] >= outer["y"] - 0.5
        and inner["x"] + inner["w"] <= outer["x"] + outer["w"] + 0.5
        and inner["y"] + inner["h"] <= outer["y"] + outer["h"] + 0.5
    )


def assert_labels_apart(frame: dict[str, float], labels: list[dict[str, Any]], where: str) -> None:
    for index, label in enumerate(labels):
        assert inside(label, frame), (where, label, frame)
        for other in labels[index + 1 :]:
            assert not overlap(label, other), (where, label, other)


async def all_images_loaded(page: Page, selector: str) -> None:
    await page.wait_for_function(
        "(selector) => [...document.querySelectorAll(selector)]"
        ".every((i) => i.complete && i.naturalWidth > 0)",
        arg=selector,
    )


async def test_the_newest_images_are_shown_by_frame_time_newest_first(
    gateway: GatewayHarness, preview: PreviewHarness, page: Page
) -> None:
    """A full run's items, all saved at one instant (the job's commit), come from the API
    in item id order; the page shows them by frame time."""
    s, job = await leased_run(gateway, full=True)
    await commit(gateway, s, job, await publish(preview, s, job))
    await page.clock.set_fixed_time(gateway.c.clock.now())
    seen = await signed_in(page)
    await open_run_page(page)
    figures = page.locator("#images figure")
    await expect(figures).to_have_count(len(FRAMES))
    detail = (await (await gateway.login("ada")).client.get(f"/api/workshop/runs/{RUN}")).json()
    api_order = [image["slot_index"] for image in detail["detail"]["recent_images"]]
    assert sorted(api_order) == sorted(FRAMES)
    assert api_order != sorted(FRAMES, reverse=True)  # what the test is about: not in time order
    assert [figure["slot"] for figure in await shown(page)] == sorted(FRAMES, reverse=True)
    await expect(page.locator("#images-note")).to_have_text(
        f"The {len(FRAMES)} newest images, by frame time, latest first."
    )
    await all_images_loaded(page, "#images img")
    assert seen == [], seen


async def test_box_labels_never_overlap_and_a_click_shows_the_image_full_size(
    gateway: GatewayHarness, preview: PreviewHarness, page: Page
) -> None:
    s, job = await leased_run(gateway, full=False)
    await publish(preview, s, job)
    await page.clock.set_fixed_time(gateway.c.clock.now())
    seen = await signed_in(page)
    await open_run_page(page)
    await expect(page.locator("#images figure")).to_have_count(len(FRAMES))
    await all_images_loaded(page, "#images img")
    figures = {figure["slot"]: figure for figure in await shown(page)}
    for slot, figure in figures.items():
        assert [label["text"] for label in figure["labels"]] == [
            f"{name} {score:.2f}" for name, score, *_ in FRAMES[slot]
        ]
        assert_labels_apart(figure["frame"], figure["labels"], f"slot {slot}")
        # each box is still where its detection says
        for box, (*_, x, y, w, _h) in zip(figure["boxes"], FRAMES[slot], strict=True):
            frame = figure["frame"]
            assert abs(box["x"] - (frame["x"] + x * frame["w"])) <= 1.5
            assert abs(box["y"] - (frame["y"] + y * frame["h"])) <= 1.5
            assert abs(box["w"] - w * frame["w"]) <= 1.5

    # A click on slot 2's image (captioned slot 3) opens it full size, its boxes drawn and
    # labelled the same way; Escape closes it and gives the focus back.
    crowded = page.locator("#images figure").filter(has_text="slot 3 ·")
    opener = crowded.get_by_role("button", name=re.compile("full size"))
    await opener.click()
    dialog = page.get_by_role("dialog")
    await expect(dialog).to_be_visible()
    await expect(dialog.locator(".box")).to_have_count(len(FRAMES[2]))
    await all_images_loaded(page, "dialog img")
    big = await dialog.evaluate(
        """(dialog) => {
          const rect = (node) => { const r = node.getBoundingClientRect();
            return { x: r.x, y: r.y, w: r.width, h: r.height }; };
          return { frame: rect(dialog.querySelector('.frame')),
                   labels: [...dialog.querySelectorAll('.box-label')].map(rect) };
        }"""
    )
    assert big["frame"]["w"] > 2 * figures[2]["frame"]["w"]
    assert_labels_apart(big["frame"], big["labels"], "full size")
    await page.keyboard.press("Escape")
    await expect(dialog).to_be_hidden()
    await expect(opener).to_be_focused()
    assert seen == [], seen


async def test_a_full_runs_live_page_shows_saved_items_and_never_asks_for_an_expired_preview(
    gateway: GatewayHarness, preview: PreviewHarness, page: Page
) -> None:
    s, job = await leased_run(gateway, full=True)
    published = await publish(preview, s, job)
    asked: list[str] = []
    held: list[Route] = []

    def request(sent: Request) -> None:
        if "/image" in sent.url:
            asked.append(sent.url)

    async def hold(route: Route) -> None:
        held.append(route)

    page.on("request", request)
    # Preview images are held on their way, as on a slow connection: still out when the
    # job commits and its previews expire.
    await page.route(f"**/api/workshop/runs/{RUN}/previews/*/image", hold)
    await page.clock.set_fixed_time(gateway.c.clock.now())
    seen = await signed_in(page)
    await open_run_page(page)
    await expect(page.locator("#live-note")).to_have_attribute("data-mode", "live")
    await expect(page.locator("#images figure")).to_have_count(len(FRAMES))
    for _ in range(100):
        if len(held) == len(FRAMES):
            break
        await asyncio.sleep(0.05)
    assert len(held) == len(FRAMES)

    await commit(gateway, s, job, published)
    # Live: the job's previews expired with its commit; each frame now shows its saved item.
    await expect(page.locator("#run-status")).to_have_text("completed")
    items = page.locator("#images figure img[src*='/items/']")
    await expect(items).to_have_count(len(FRAMES))
    for route in held:  # what the page still wants of the held requests goes on now
        try:
            await route.continue_()
        except Exception as error:
            print(f"held request not continued: {error}")
    await all_images_loaded(page, "#images img")
    await page.wait_for_timeout(500)  # any late answer to a continued request is in
    assert seen == [], seen
    previews = [url for url in asked if "/previews/" in url]
    assert len(previews) == len(FRAMES), asked  # each asked once, while it was readable


async def test_a_test_runs_page_does_not_ask_for_previews_past_their_expiry(
    gateway: GatewayHarness, preview: PreviewHarness, page: Page
) -> None:
    s, job = await leased_run(gateway, full=False)
    published = await publish(preview, s, job)
    expires_at = published[0].expires_at.ToDatetime(tzinfo=UTC)
    asked: list[str] = []
    page.on("request", lambda sent: asked.append(sent.url) if "/image" in sent.url else None)
    # The page's clock is a minute past the previews' expiry (the coordinator's is not,
    # so the detail still lists them, each with its expires_at).
    await page.clock.set_fixed_time(expires_at + timedelta(minutes=1))
    seen = await signed_in(page)
    await open_run_page(page)
    figures = page.locator("#images figure")
    await expect(figures).to_have_count(len(FRAMES))
    await expect(figures.locator(".placeholder")).to_have_count(len(FRAMES))
    await expect(figures.first.locator(".placeholder")).to_have_text("Preview expired")
    await expect(figures.locator("img")).to_have_count(0)
    await page.wait_for_timeout(300)
    assert asked == []
    assert seen == [], seen
