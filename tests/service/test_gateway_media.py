"""Review, decisions, the summary, bucket items, images and exports through the gateway, on
the real stack: a full run whose frames are real JPEGs in SeaweedFS (staged through the
preview service), read back over HTTP."""

from __future__ import annotations

import io
import tarfile
from datetime import timedelta

import pytest

from services.coordinator.identity.auth import Grant, ScopeName
from testbed.coordinator_leases import Setup
from testbed.coordinator_world import CODE, run_request
from testbed.harness.gateway import Browser, GatewayHarness
from testbed.harness.preview import jpeg_bytes, publish_request
from testbed.review_world import Frame, box, commit_images, review_world, start_run
from tests.service.test_gateway_api import assert_error
from workshop.v1 import jobs_pb2

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def saved(gateway: GatewayHarness) -> tuple[Setup, Browser, dict[int, bytes]]:
    """Run `full` of workflow `watch`: cam-a's first job saved two frames of one person."""
    c = gateway.c
    s = await review_world(c)
    jobs = await start_run(c, s, "full")
    images = {0: jpeg_bytes(seed=1), 1: jpeg_bytes(seed=2)}
    frames = [
        Frame(0, "save", (box("person", 0.2, 0.2, 0.1),)),
        Frame(1, "save", (box("person", 0.22, 0.2, 0.1),)),
    ]
    preview = gateway.app.upstream.preview
    await commit_images(c, s, preview, jobs[0], frames, images)
    await gateway.user("ada")
    return s, await gateway.login("ada"), images


async def test_review_decide_summary_and_items(
    gateway: GatewayHarness, saved: tuple[Setup, Browser, dict[int, bytes]]
) -> None:
    _, ada, _ = saved
    review = await ada.client.get("/api/workshop/runs/full/review")
    assert review.status_code == 200, review.text
    body = review.json()
    assert len(body["items"]) == 2
    assert body["has_more"] is False
    sighting = body["sightings"][0]
    assert len(sighting["item_ids"]) == 2
    assert sighting["review_state"] == "pending"

    decided = await ada.client.post(
        f"/api/workshop/runs/full/sightings/{sighting['sighting_id']}/decision",
        json={"decision": "relabel", "class_name": "vehicle", "seen_item_count": 2},
    )
    assert decided.status_code == 200, decided.text
    assert decided.json()["items_updated"] == 2

    summary = await ada.client.get("/api/workshop/summary", params={"time_zone": "Europe/Oslo"})
    assert summary.status_code == 200, summary.text
    buckets = {b["bucket_id"]: b for b in summary.json()["buckets"]}
    assert buckets["yard"]["accepted"] == 2
    bad_zone = await ada.client.get("/api/workshop/summary", params={"time_zone": "Mars/Base"})
    assert_error(bad_zone, 400, "INVALID_FIELD")

    items = await ada.client.get(
        "/api/workshop/buckets/yard/items",
        params={"review_state": "accepted", "class_name": "vehicle"},
    )
    assert items.status_code == 200, items.text
    assert len(items.json()["items"]) == 2
    assert_error(await ada.client.get("/api/workshop/buckets/nope/items"), 404, "NOT_FOUND")


async def test_item_images_have_their_type_etag_and_cache_control(
    gateway: GatewayHarness, saved: tuple[Setup, Browser, dict[int, bytes]]
) -> None:
    _, ada, images = saved
    items = (await ada.client.get("/api/workshop/buckets/yard/items")).json()["items"]
    item_id = items[0]["item_id"]
    answer = await ada.client.get(f"/api/workshop/runs/full/items/{item_id}/image")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "image/jpeg"
    assert answer.content in images.values()
    assert answer.headers["cache-control"].startswith("private, max-age=")
    etag = answer.headers["etag"]
    again = await ada.client.get(
        f"/api/workshop/runs/full/items/{item_id}/image", headers={"if-none-match": etag}
    )
    assert again.status_code == 304
    assert again.content == b""
    missing = await ada.client.get("/api/workshop/runs/full/items/nope/image")
    assert missing.status_code == 404
    # an Agent key of another camera may not read it
    other = await gateway.agent(Grant(ScopeName.FOOTAGE_READ, camera_ids=("cam-b",)))
    async with other:
        refused = await other.get(f"/v1/workshop/runs/full/items/{item_id}/image")
        assert refused.status_code in (403, 404), refused.text


async def test_a_bucket_exports_as_a_streamed_tar(
    gateway: GatewayHarness, saved: tuple[Setup, Browser, dict[int, bytes]]
) -> None:
    _, ada, _ = saved
    async with ada.client.stream(
        "GET",
        "/api/workshop/buckets/yard/export",
        params={"format": "coco", "review_state": "pending"},
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "application/x-tar"
        assert "attachment" in answer.headers["content-disposition"]
        data = b"".join([chunk async for chunk in answer.aiter_bytes()])
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        names = archive.getnames()
    assert "annotations.json" in names
    assert sum(n.startswith("images/") for n in names) == 2
    unset = await ada.client.get("/api/workshop/buckets/yard/export")
    assert_error(unset, 400, "INVALID_FIELD")
    unknown = await ada.client.get("/api/workshop/buckets/nope/export", params={"format": "yolo"})
    assert_error(unknown, 404, "NOT_FOUND")


async def test_a_preview_image_is_404_once_expired(gateway: GatewayHarness) -> None:
    c = gateway.c
    s = await review_world(c)
    request = run_request("t", "watch", s.world.tracking_runtime, image_limit=5)
    await c.workshop.CreateRun(request, metadata=c.admin)
    claimed = await c.jobs.Claim(
        jobs_pb2.ClaimRequest(runtime_id=s.world.tracking_runtime, code_sha256=CODE),
        metadata=s.processor,
    )
    published = await gateway.app.upstream.preview.PublishPreview(
        publish_request(claimed.job, 0), metadata=s.processor
    )
    await gateway.user("ada")
    ada = await gateway.login("ada")
    path = f"/api/workshop/runs/t/previews/{published.item_id}/image"
    fresh = await ada.client.get(path)
    assert fresh.status_code == 200, fresh.text
    # the harness's clock stands in the past: the preview's hour is already over by the
    # wall clock, so it may not be cached at all
    assert fresh.headers["cache-control"] == "private, max-age=0"
    c.clock.advance(timedelta(hours=2))
    assert_error(await ada.client.get(path), 404, "EXPIRED")


# An earlier release stored a detector's NaN and infinities as protobuf's JSON writes them;
# requests refuse them now (workshop.kit.box_values), but such rows may remain.
EARLIER_RELEASES_BOXES = """
UPDATE bucket_items
   SET boxes = jsonb_set(jsonb_set(boxes, '{0,score}', '"NaN"'), '{0,x}', '"Infinity"')
"""


async def test_boxes_an_earlier_release_stored_not_finite_read_as_null(
    gateway: GatewayHarness, saved: tuple[Setup, Browser, dict[int, bytes]]
) -> None:
    """Every page holding such a number answers 200 with null for it (it answered 500):
    the review page, the queue, the bucket's items, one item, the run's recent images and
    an item's image (whose labels the coordinator reads)."""
    _, ada, _ = saved
    async with gateway.c.db.connection() as connection:
        await connection.execute(EARLIER_RELEASES_BOXES)
        await connection.execute("UPDATE sightings SET score = 'NaN'")
    review = await ada.client.get("/api/workshop/runs/full/review")
    assert review.status_code == 200, review.text
    boxes = [box for entry in review.json()["items"] for box in entry["item"]["boxes"]]
    assert [(box["score"], box["x"], round(box["y"], 6)) for box in boxes] == [
        (None, None, 0.2)
    ] * 2
    queue = await ada.client.get("/api/workshop/buckets/yard/queue")
    assert queue.status_code == 200, queue.text
    assert [entry["score"] for entry in queue.json()["sightings"]] == [None]
    items = await ada.client.get("/api/workshop/buckets/yard/items")
    assert items.status_code == 200, items.text
    listed = items.json()["items"]
    assert [item["boxes"][0]["score"] for item in listed] == [None, None]
    one = await ada.client.get(f"/api/workshop/items/{listed[0]['item_id']}")
    assert one.status_code == 200, one.text
    assert one.json()["item"]["boxes"][0]["x"] is None
    run = await ada.client.get("/api/workshop/runs/full")
    assert run.status_code == 200, run.text
    shown = run.json()["detail"]["recent_images"]
    assert [image["boxes"][0]["score"] for image in shown] == [None, None]
    image = await ada.client.get(f"/api/workshop/runs/full/items/{listed[0]['item_id']}/image")
    assert image.status_code == 200
