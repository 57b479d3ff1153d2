"""The bucket browser (#/buckets/<bucket>) in Chromium: one page of 200 items, asked for
and drawn, at the start, the middle and the end of a large bucket.

    .venv/bin/python -m bench.bucket_browser [--samples 50] [--quick] [--million]

Set-up (timed, not measured), bench/review.py's world: a throwaway Postgres cluster, a
full run over 10 cameras whose 100,000 items (one box each, 2,000 sightings) are inserted
straight into bucket b00 and grouped with the commit path's code; `--million` adds
bench/review.py's 90 more runs (1,000,000 items in 20 buckets); `--quick` a tenth of b00.
Every service runs as its own process, as a deployment runs them: the coordinator, the
preview service on a real S3 (SeaweedFS, the test harness's) holding the one JPEG that
every item of b00 names (their rows are pointed at it), and the gateway in front of
both. Chromium (Debian's /usr/bin/chromium, driven by Playwright) signs in with the login
form; its thumbnails come the way a user's do (GET .../items/<id>/image: the gateway,
ReadImage, the coordinator's AuthorizeImageRead, S3), lazily, for the cells in view. So
this process only drives the browser: it serves nothing that a page waits for.

Then two sightings of the review run are relabelled "bicycle" (DecideSighting: about 90
items of b00 accepted, the rest pending), and with `--million` the other runs' items are
grouped as their commits would have grouped them (`reviews.group_backlog`, timed).

Measured, `--samples` times each: the browser opened at a position (`#/buckets/b00?page=
TOKEN`, the token of the item at 0 %, 50 % and 100 % - 200 of the bucket, made as the
coordinator makes them), and Next page pressed from the middle (with `--quick`, from the
middle again each time the bucket's end is near). A figure is the page's own measure from
asking for the page (GET .../items?page_size=200) to the task after the
next frame once its 200 items are in the DOM (`bucket-page-painted`, buckets.js): API call,
DOM, style, layout and paint. Then the same with a filter of the browser's
(FILTERS: a rare class, few decided items, a score no item reaches, a camera, a run),
opened at its first page and at the bucket's item at 90 % (its token for that filter):
the pages that read the items that may match instead of the bucket
(services/coordinator/review/listing.py).

Between two pages the bench waits until the page's image requests are over and none
began or ended for SETTLED_S (0.25 s): a user looks at a page before turning it, and a
figure is one page's work, not the previous page's thumbnails still being served.
`--trace FILE` writes a Chromium trace of the timed pages (Perfetto opens it).

Target (2-core machine): p99 <= 100 ms at any depth, filtered or not. The last line is
`RESULT bucket_page_p99_ms=<x> bucket_mid_page_p99_ms=<y> bucket_deep_page_p99_ms=<z>
bucket_next_page_p99_ms=<w> bucket_filtered_page_p99_ms=<f>
bucket_filtered_deep_page_p99_ms=<d>` (the filtered figures: the worst filter's).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import io
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import quote

import httpx
from playwright.async_api import Page, Request, async_playwright
from prometheus_client.parser import text_string_to_metric_families

from bench.results import result_line
from bench.review import (
    COORDINATOR_ENV,
    FULL,
    QUICK,
    Scale,
    _exit_on_sigterm,
    _group,
    _review_run,
    _summary_runs,
    _world,
)
from bench.services import separate_services
from bench.stats import median, percentile
from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.review.reviews import ItemFilter, PageKey
from services.coordinator.servicers.views import item_filter, page_token
from testbed.harness.browser import CHROMIUM, CHROMIUM_ARGS
from testbed.harness.coordinator import CoordinatorHarness
from testbed.harness.postgres import PostgresUnavailable, create_migrated_database, postgres_cluster
from testbed.harness.preview import jpeg_bytes
from testbed.harness.s3 import S3HarnessError, S3Server, running_s3_server
from tools.localstack.processes import running_service
from workshop.v1 import common_pb2, run_pb2
from workshop.v1 import operator_pb2 as op
from workshop.v1 import workshop_pb2 as ws

DATABASE = "bench_bucket_browser"
BUCKET = "b00"
PAGE = 200
TARGET_MS = 100.0
PAINTED = "bucket-page-painted"
THUMB = jpeg_bytes(160, 90, seed=3)
S3_BUCKET, THUMB_KEY = "bench-browser", "thumbs/one.jpg"
USER, PASSWORD = "bench", "correct horse battery staple"
ITEMS_ROUTE = "/workshop/buckets/{bucket_id}/items"
IMAGE_ROUTE = "/workshop/runs/{run_id}/items/{item_id}/image"
SETTLED_S = 0.25  # between pages: no image request for this long after the last one ended
# per position, per page: the API call, and until the items are in the DOM; items shown
PARTS: dict[str, list[list[float]]] = collections.defaultdict(list)
SHOWN: dict[str, int] = {}
RARE_CLASS = "bicycle"  # two relabelled sightings' items
# The browser's filters measured (its URL's query, and the listing's filter it asks for).
FILTERS = {
    f"class_name={RARE_CLASS}": run_pb2.BucketItemFilter(class_name=RARE_CLASS),
    "state=accepted": run_pb2.BucketItemFilter(review_states=[common_pb2.REVIEW_STATE_ACCEPTED]),
    "min_score=0.95": run_pb2.BucketItemFilter(min_score=0.95),
    "camera_id=cam-03": run_pb2.BucketItemFilter(camera_id="cam-03"),
    "run_id=review": run_pb2.BucketItemFilter(run_id="review"),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bucket_browser",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--samples", type=int, default=50, help="pages timed per figure")
    parser.add_argument("--quick", action="store_true", help="10,000 items in the bucket")
    parser.add_argument("--million", action="store_true", help="1,000,000 items in 20 buckets")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--trace",
        type=Path,
        help="write a Chromium trace of the timed pages here (chrome://tracing, Perfetto)",
    )
    args = parser.parse_args(argv)
    if shutil.which(CHROMIUM) is None:
        print(f"no Chromium at {CHROMIUM} (scripts/system-deps.sh installs it)")
        return 2
    scale = QUICK if args.quick else FULL
    if not args.million:
        scale = dataclasses.replace(scale, extra_runs=0)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with (
            postgres_cluster() as cluster,
            tempfile.TemporaryDirectory(prefix="bench-browser-") as scratch,
            running_s3_server(Path(scratch)) as s3,
        ):
            dsn = create_migrated_database(cluster, DATABASE)
            s3.client().make_bucket(S3_BUCKET)
            figures = asyncio.run(_bench(dsn, s3, Path(scratch), scale, args.samples, args.trace))
    except PostgresUnavailable as unavailable:
        print(f"cannot start a private Postgres cluster: {unavailable}")
        return 2
    except S3HarnessError as problem:
        print(f"cannot start SeaweedFS: {problem}")
        return 2
    print(
        result_line(
            {
                "bucket_page_p99_ms": f"{figures['start']:.1f}",
                "bucket_mid_page_p99_ms": f"{figures['middle']:.1f}",
                "bucket_deep_page_p99_ms": f"{figures['end']:.1f}",
                "bucket_next_page_p99_ms": f"{figures['next']:.1f}",
                "bucket_filtered_page_p99_ms": f"{figures['filtered']:.1f}",
                "bucket_filtered_deep_page_p99_ms": f"{figures['filtered_deep']:.1f}",
            }
        ),
        flush=True,
    )
    return 1 if args.check and max(figures.values()) > TARGET_MS else 0


async def _bench(
    dsn: str, s3: S3Server, scratch: Path, scale: Scale, samples: int, trace: Path | None
) -> dict[str, float]:
    async with separate_services(
        dsn, s3, scratch, bucket=S3_BUCKET, coordinator_settings=COORDINATOR_ENV
    ) as services:
        c = services.coordinator
        tokens, full_pages = await _setup(c, scale)
        await _thumbnails(c, s3)
        with _gateway(
            scratch, c.port, services.preview_port, await c.key(Grant(ScopeName.GATEWAY))
        ) as url:
            await c.operator.CreateUser(
                op.CreateUserRequest(user_id=USER, display_name="Bench"), metadata=c.admin
            )
            await c.operator.SetUserPassword(
                op.SetUserPasswordRequest(user_id=USER, password=PASSWORD), metadata=c.admin
            )
            figures = await _measure(url, tokens, full_pages, samples, trace)
            await _gateway_share(url)
            return figures


async def _thumbnails(c: CoordinatorHarness, s3: S3Server) -> None:
    """Every item of the bucket shows THUMB: one object in S3 that their rows name (the
    set-up's rows name objects that were never stored)."""
    s3.client().put_object(S3_BUCKET, THUMB_KEY, io.BytesIO(THUMB), len(THUMB), "image/jpeg")
    began = time.perf_counter()
    async with c.db.connection() as connection:
        await connection.execute(
            "UPDATE bucket_items SET object_key = $2, sha256 = $3 WHERE bucket_id = $1",
            BUCKET,
            THUMB_KEY,
            hashlib.sha256(THUMB).hexdigest(),
        )
        await connection.execute("VACUUM ANALYZE bucket_items")
    print(f"setup: the items' image in S3 ({time.perf_counter() - began:.1f} s)", flush=True)


async def _gateway_share(url: str) -> None:
    """What the gateway itself took per request (its /metrics histogram, every page of the
    run): its answer's start after the request's arrival, the coordinator's call included."""
    async with httpx.AsyncClient(base_url=url) as client:
        text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        if family.name != "workshop_gateway_http_duration_seconds":
            continue
        for route in (f"/api{ITEMS_ROUTE}", f"/api{IMAGE_ROUTE}"):
            wanted = [s for s in family.samples if s.labels.get("route") == route]
            count = sum(s.value for s in wanted if s.name.endswith("_count"))
            total = sum(s.value for s in wanted if s.name.endswith("_sum"))
            if count:
                print(f"the gateway's own answer to {route}: {total / count * 1000:.1f} ms mean")


@contextlib.contextmanager
def _gateway(scratch: Path, coordinator_port: int, preview_port: int, key: str) -> Iterator[str]:
    """The gateway as its own process, as a deployment runs it; its URL."""
    with running_service(
        "services.gateway",
        {
            "GATEWAY_HOST": "127.0.0.1",
            "GATEWAY_PORT": "0",
            "GATEWAY_HTTP_HOST": "127.0.0.1",
            "GATEWAY_HTTP_PORT": "0",
            "GATEWAY_DRAIN_SECONDS": "0",
            "GATEWAY_GRACE_SECONDS": "1",
            "GATEWAY_COORDINATOR_TARGET": f"127.0.0.1:{coordinator_port}",
            "GATEWAY_PREVIEW_TARGET": f"127.0.0.1:{preview_port}",
            "GATEWAY_KEY": key,
            "GATEWAY_LOG_LEVEL": "WARNING",
            "GATEWAY_COOKIE_SECURE": "false",
        },
        scratch / "gateway.log",
    ) as (gateway, _):
        yield f"http://127.0.0.1:{gateway.wait_event('http')['port']}"


async def _setup(c: CoordinatorHarness, scale: Scale) -> tuple[dict[str, str], int]:
    began = time.perf_counter()
    runtime = await _world(c, scale)
    await _review_run(c, runtime, scale)
    await _group(c)
    print(f"setup: bucket {BUCKET} ({time.perf_counter() - began:.1f} s)", flush=True)
    await _relabel_rare(c)
    if scale.extra_runs:
        began = time.perf_counter()
        extra = await _summary_runs(c, runtime, scale)
        print(f"setup: {extra:,} more items in other buckets ({time.perf_counter() - began:.1f} s)")
        began = time.perf_counter()
        await _group(c)  # as their commits would have (bench.review leaves them ungrouped)
        print(f"setup: grouped ({time.perf_counter() - began:.1f} s)", flush=True)
    async with c.db.connection() as connection:
        await connection.execute("VACUUM ANALYZE")
        total = await connection.fetchval("SELECT count(*) FROM bucket_items")
        size = await connection.fetchval(
            "SELECT count(*) FROM bucket_items_current WHERE bucket_id = $1", BUCKET
        )
        print(f"data: {total:,} items, {size:,} in bucket {BUCKET}", flush=True)
        tokens = {"start": ""}
        keys: dict[str, PageKey] = {}
        for name, depth in (
            ("middle", size // 2),
            ("end", size - PAGE - 1),
            ("deep", size * 9 // 10),
        ):
            row = await connection.fetchrow(
                "SELECT frame_time, item_id FROM bucket_items_current WHERE bucket_id = $1 "
                "ORDER BY frame_time, item_id OFFSET $2 LIMIT 1",
                BUCKET,
                depth,
            )
            keys[name] = PageKey(row["frame_time"], row["item_id"])
        scope = ItemFilter().fingerprint(BUCKET)
        tokens |= {name: page_token(scope, keys[name]) for name in ("middle", "end")}
        for query, wanted in FILTERS.items():
            filtered = item_filter(wanted).fingerprint(BUCKET)
            tokens[f"{query} start"] = ""
            tokens[f"{query} deep"] = page_token(filtered, keys["deep"])
    # the middle's page holds the 200 after item size // 2; whole pages after it
    return tokens, (size - size // 2 - 1) // PAGE - 1


async def _relabel_rare(c: CoordinatorHarness) -> None:
    """Two sightings of the review run relabelled RARE_CLASS (accepted): a class and a
    review state few of the bucket's items have."""
    async with c.db.connection() as connection:
        found = await connection.fetch(
            "SELECT sighting_id FROM sightings WHERE run_id = 'review' AND camera_id = 'cam-05' "
            "ORDER BY first_frame_time LIMIT 2"
        )
    for row in found:
        await c.workshop.DecideSighting(
            ws.DecideSightingRequest(
                run_id="review",
                sighting_id=row["sighting_id"],
                decision=ws.REVIEW_DECISION_RELABEL,
                class_name=RARE_CLASS,
            ),
            metadata=c.admin,
            timeout=60,
        )


class ImageRequests:
    """The page's image requests in flight, to let a page's thumbnails settle before the
    next page is asked for (a user looks at a page before turning it)."""

    def __init__(self, page: Page) -> None:
        self.pending: set[Request] = set()
        self.changed = asyncio.Event()  # set when one begins or ends
        page.on("request", self._began)
        page.on("requestfinished", self._ended)
        page.on("requestfailed", self._ended)

    def _began(self, request: Request) -> None:
        if request.resource_type == "image":
            self.pending.add(request)
            self.changed.set()

    def _ended(self, request: Request) -> None:
        if request in self.pending:
            self.pending.discard(request)
            self.changed.set()

    async def settled(self) -> None:
        """Returns once no image request is in flight and none began or ended for
        SETTLED_S (a page's images not settled in 30 s fail the run)."""
        async with asyncio.timeout(30):
            while True:
                self.changed.clear()
                if self.pending:
                    await self.changed.wait()
                    continue
                try:
                    await asyncio.wait_for(self.changed.wait(), SETTLED_S)
                except TimeoutError:
                    return


async def _measure(
    url: str, tokens: dict[str, str], full_pages: int, samples: int, trace: Path | None
) -> dict[str, float]:
    """`full_pages`: how many full pages follow the middle's first one."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(
                base_url=url, viewport={"width": 1280, "height": 900}
            )
            page = await context.new_page()
            page.set_default_timeout(30_000)
            images = ImageRequests(page)
            await page.goto("/#/login")
            await page.get_by_label("User id").fill("bench")
            await page.get_by_label("Password").fill(PASSWORD)
            await page.get_by_role("button", name="Sign in").click()
            await page.get_by_role("heading", name="Runs").wait_for()
            timings: dict[str, list[float]] = {name: [] for name in (*tokens, "next")}
            for _ in range(2):  # warm-up: modules parsed, connections open
                for name, token in tokens.items():
                    await _open(page, token, name)
                    await images.settled()
            PARTS.clear()
            if trace is not None:
                await browser.start_tracing(page=page, path=trace)
            for _ in range(samples):
                for name, token in tokens.items():
                    timings[name].append(await _open(page, token, name))
                    await images.settled()
            await _open(page, tokens["middle"])
            turned = 0
            for _ in range(samples):
                await images.settled()
                if turned == full_pages:  # near the end (--quick): from the middle again
                    await _open(page, tokens["start"])  # (Next leaves the URL as it was)
                    await _open(page, tokens["middle"])
                    await images.settled()
                    turned = 0
                timings["next"].append(await _next(page))
                turned += 1
            if trace is not None:
                await browser.stop_tracing()
        finally:
            await browser.close()
    every = [part for parts in PARTS.values() for part in parts]
    print(
        f"of which, p50 of every page: the API call {median([p[0] for p in every]):.1f} ms, "
        f"to the items in the DOM {median([p[1] for p in every]):.1f} ms"
    )
    print(
        f"{'position':<30}{'items':>6}{'API p50':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"   target p99 <= {TARGET_MS:.0f} ms"
    )
    figures = {}
    for name, values in timings.items():
        figures[name] = percentile(values, 0.99)
        api = median([p[0] for p in PARTS[name]])
        print(
            f"{name:<30}{SHOWN[name]:>6}{api:>9.1f}{median(values):>9.1f}"
            f"{figures[name]:>9.1f}{max(values):>9.1f}"
        )
    figures["filtered"] = max(v for n, v in figures.items() if n.endswith(" start"))
    figures["filtered_deep"] = max(v for n, v in figures.items() if n.endswith(" deep"))
    return figures


# Resolves once the page has measured PAINTED, with it and its parts, without polling (a
# check every frame would be work of the bench's in the frames it measures).
MEASURES = f"""() => new Promise((resolve) => {{
  const durations = () => ['{PAINTED}', 'bucket-fetch', 'bucket-page']
    .map((name) => performance.getEntriesByName(name)[0].duration);
  if (performance.getEntriesByName('{PAINTED}').length) return resolve(durations());
  const observer = new PerformanceObserver((entries) => {{
    if (!entries.getEntriesByName('{PAINTED}').length) return;
    observer.disconnect();
    resolve(durations());
  }});
  observer.observe({{ type: 'measure' }});
}})"""


async def _painted(page: Page, name: str, cells: int | None = PAGE) -> float:
    """The page's measure once painted, its parts kept under `name`; `cells`: the items it
    must show (None: any)."""
    duration, *parts = await page.evaluate(MEASURES)
    PARTS[name].append(parts)
    SHOWN[name] = shown = await page.locator("#item-grid li.item-cell").count()
    assert cells is None or shown == cells, f"a page of {cells} items, not {shown}"
    painted: float = duration
    return painted


async def _open(page: Page, token: str, name: str = "") -> float:
    """The browser opened at `token`, with the filter of a FILTERS position's `name`
    ("<query> start" or "<query> deep"; a new view: the callers never ask for the same
    position twice in a row, so the hash changes every time)."""
    query = name.split(" ")[0] if " " in name else ""
    asked = "&".join(
        part for part in (query, f"page={quote(token, safe='')}" if token else "") if part
    )
    await page.evaluate(
        "(hash) => { performance.clearMeasures(); location.hash = hash; }",
        f"#/buckets/{BUCKET}?{asked}" if asked else f"#/buckets/{BUCKET}",
    )
    return await _painted(page, name, None if query else PAGE)


async def _next(page: Page) -> float:
    await page.evaluate("() => performance.clearMeasures()")
    await page.locator("#next-page").click()
    return await _painted(page, "next")


if __name__ == "__main__":
    sys.exit(main())
