"""The review storage's rollout (migrations 0002 and 0003, docs/upgrading.md): while
release-0.1 coordinators serve beside this version, the database holds both storages, and
the sync triggers keep them in step in both directions.

On a database at release 0.1 plus 0002 (0003 pending):

(a) items committed, grouped and decided the 0.1 way, by release 0.1's own SQL (its
    `review.sql` and `sightings.py` read from tag v0.1, its functions still in the
    database: bucket_items_insert_v1, sighting_lock_v1, sighting_decide_v1) are read right
    by this version;
(b) items committed (also out of time order, so earlier items are regrouped) and decided
    by this version are read right through sighting_boxes by release 0.1's statements;

"read right" meaning the two versions' statements (items_boxes, sightings_get) answer the
same rows from their own storage, and the sightings table agrees with the items. Then the
post-migration 0003 drops sighting_boxes and GetReview answers exactly as before.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import types
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from services.coordinator.leases.jobs import parse_job_id
from services.coordinator.platform import queries
from services.coordinator.platform.db import Connection, sql
from services.coordinator.platform.migrate import migrate
from services.coordinator.platform.versions import list_migrations
from testbed.harness.coordinator import CoordinatorHarness, running_coordinator
from testbed.harness.postgres import PostgresCluster, quote_ident
from testbed.harness.processes import REPO
from testbed.review_world import (
    SIGHTINGS_MISMATCHED,
    Frame,
    box,
    commit,
    review_world,
    start_run,
)
from workshop.v1 import common_pb2, run_pb2
from workshop.v1 import workshop_pb2 as ws

# Release 0.1's commit (tag v0.1): named by its hash, which every full clone holds, where
# a checkout may lack the tag.
RELEASE = "c35cbd8de328f78aaa5bd7c7e8a8fdd3ba030eb5"
# The boxes of an item as release 0.1 stored them (jsonb): `box` as the commit saves it.
V01_BOX_FIELDS = ("class_name", "score", "x", "y", "w", "h")


def release_file(path: str) -> str:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed: release 0.1's SQL cannot be read")
    shown = subprocess.run(
        [git, "-C", str(REPO), "show", f"{RELEASE}:{path}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if shown.returncode != 0:
        pytest.skip(f"this checkout lacks release 0.1's commit {RELEASE} (a shallow clone?)")
    return shown.stdout


@pytest.fixture(scope="module")
def v01() -> dict[str, str]:
    """Release 0.1's named review statements."""
    return queries.parse_queries(release_file("services/coordinator/review/review.sql"))


@pytest.fixture(scope="module")
def v01_sightings() -> types.ModuleType:
    """Release 0.1's grouping (`review/sightings.py`), as its own module."""
    name = f"v01_sightings_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    exec(release_file("services/coordinator/review/sightings.py"), module.__dict__)
    return module


@pytest.fixture
async def rollout_dsn(pg_cluster: PostgresCluster) -> AsyncIterator[str]:
    """A new database at release 0.1 plus this tree's pre-migrations (0003 pending, and
    the later post-migrations: 0006 drops an index that nothing here reads)."""
    name = f"rollout_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_cluster.admin_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {quote_ident(name)}")
    finally:
        await admin.close()
    dsn = pg_cluster.dsn(name)
    outcome = await migrate(dsn, "pre")
    # every pre-migration (0004, 0005 and 0007 too: they need no post step)
    assert outcome.applied[:2] == ["0001_release_0_1", "0002_review_storage"]
    assert outcome.applied == [m.label for m in list_migrations() if m.phase == "pre"]
    assert outcome.pending == [m.label for m in list_migrations() if m.phase == "post"]
    assert outcome.pending[0] == "0003_drop_sighting_boxes"
    try:
        yield dsn
    finally:
        admin = await asyncpg.connect(pg_cluster.admin_dsn)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
        finally:
            await admin.close()


def frames(slots: Sequence[int], shift: float = 0.0) -> list[Frame]:
    """Two people far apart in every frame, a vehicle in every third."""
    found = []
    for slot in slots:
        boxes = [box("person", 0.1 + shift, 0.1, 0.05), box("person", 0.7, 0.5 + shift, 0.05)]
        if slot % 3 == 0:
            boxes.append(box("vehicle", 0.4, 0.4, 0.1))
        found.append(Frame(slot, "save", tuple(boxes)))
    return found


async def commit_as_v01(
    c: CoordinatorHarness,
    v01: dict[str, str],
    grouping: types.ModuleType,
    run_id: str,
    job_id: str,
    saved: Sequence[Frame],
) -> None:
    """Commits frames of job `job_id` as a release-0.1 coordinator does after its fences:
    bucket_items_insert_v1, then its group_committed (items_new_boxes, a regroup of each
    timeline from timeline_rows_from, timeline_assign, sighting_boxes_add_grouped), in one
    transaction, with release 0.1's SQL and grouping."""
    async with c.db.transaction() as connection:
        job = await connection.fetchrow(
            "SELECT job_index, camera_id, recording_id, recording_generation, first_slot_at, "
            "interval_ms FROM jobs WHERE run_id = $1 AND job_index = $2",
            run_id,
            parse_job_id(job_id),
        )
        interval = timedelta(milliseconds=job["interval_ms"])
        ids = [f"{run_id}-{job_id}-{frame.slot}-v01" for frame in saved]
        await connection.execute(
            "SELECT bucket_items_insert_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, "
            "$11::text[]::jsonb[], $12, $13, $14)",
            run_id,
            job["job_index"],
            job["camera_id"],
            job["recording_id"],
            job["recording_generation"],
            ids,
            ["yard"] * len(saved),
            [frame.slot for frame in saved],
            ["save"] * len(saved),
            [job["first_slot_at"] + frame.slot * interval for frame in saved],
            [
                json.dumps(
                    [{field: getattr(b, field) for field in V01_BOX_FIELDS} for b in frame.boxes]
                )
                for frame in saved
            ],
            [f"uploads/{item}.jpg" for item in ids],
            ["ab" * 32] * len(saved),
            c.clock.now(),
        )
        await group_committed_v01(connection, v01, grouping, ids)


async def group_committed_v01(
    connection: Connection, v01: dict[str, str], grouping: types.ModuleType, ids: list[str]
) -> None:
    """Release 0.1's reviews.group_committed and _regroup, over its statements."""
    new = await connection.fetch(v01["items_new_boxes"], ids)
    by_timeline: dict[tuple[str, str, str], list[Any]] = {}
    for row in new:
        by_timeline.setdefault((row["run_id"], row["bucket_id"], row["camera_id"]), []).append(
            grouping.Detection(
                row["item_id"],
                row["box_index"],
                row["frame_time"],
                row["class_name"],
                row["x"],
                row["y"],
                row["w"],
                row["h"],
            )
        )
    items: list[str] = []
    indices: list[int] = []
    sighting_ids: list[str] = []
    for key in sorted(by_timeline):
        added = by_timeline[key]
        start = min(box.frame_time for box in added)
        rows = await connection.fetch(v01["timeline_rows_from"], *key, start)
        last_fixed: dict[str, Any] = {}
        replay: list[Any] = []
        for row in rows:
            detection = grouping.Detection(
                *(row[f] for f in ("item_id", "box_index", "frame_time", "class_name")),
                *(row[f] for f in ("x", "y", "w", "h")),
            )
            if not row["fixed"]:
                replay.append(detection)
                continue
            seen = last_fixed.get(row["sighting_id"])
            if seen is None or (seen.frame_time, seen.item_id) < (
                row["frame_time"],
                row["item_id"],
            ):
                last_fixed[row["sighting_id"]] = detection
        replay.extend(added)
        assigned = grouping.group(replay, sorted(last_fixed.items()))
        before = {(r["item_id"], r["box_index"]): r["sighting_id"] for r in rows if not r["fixed"]}
        changed = [(k, sid) for k, sid in assigned.items() if k in before and before[k] != sid]
        if changed:
            await connection.execute(
                v01["timeline_assign"],
                [k[0] for k, _ in changed],
                [k[1] for k, _ in changed],
                [sid for _, sid in changed],
            )
        for detection in added:
            items.append(detection.item_id)
            indices.append(detection.box_index)
            sighting_ids.append(assigned[detection.key])
    await connection.execute(v01["sighting_boxes_add_grouped"], items, indices, sighting_ids)


async def decide_as_v01(
    c: CoordinatorHarness, run_id: str, sighting_id: str, state: str, relabel: str | None
) -> int:
    """Release 0.1's DecideSighting after its checks: sighting_lock_v1, sighting_decide_v1."""
    item, _, index = sighting_id.rpartition("~")
    async with c.db.transaction() as connection:
        locked = await connection.fetchrow(
            "SELECT * FROM sighting_lock_v1($1, $2, $3)", run_id, item, int(index)
        )
        assert locked is not None
        assert not locked["ungrouped"]
        changed: int = await connection.fetchval(
            "SELECT sighting_decide_v1($1, $2, $3, $4, $5::jsonb, $6)",
            run_id,
            locked["sighting_id"],
            state,
            relabel,
            {"kind": "key", "key_id": "release-0.1"},
            c.clock.now(),
        )
        return changed


async def both_storages(c: CoordinatorHarness, v01: dict[str, str], run_id: str) -> None:
    """Release 0.1's statements over sighting_boxes and this version's over the items'
    arrays and the sightings answer the same rows; the sightings table is exact."""
    async with c.db.connection() as connection:
        item_ids = [
            row[0]
            for row in await connection.fetch(
                "SELECT item_id FROM bucket_items WHERE run_id = $1 ORDER BY 1", run_id
            )
        ]
        old_boxes = await connection.fetch(v01["items_boxes"], item_ids)
        new_boxes = await connection.fetch(sql("review", "items_boxes"), item_ids)
        assert [dict(row) for row in new_boxes] == [dict(row) for row in old_boxes]
        assert all(row["sighting_id"] for row in new_boxes), "every box grouped"
        ids = sorted({row["sighting_id"] for row in new_boxes})
        old = await connection.fetch(v01["sightings_get"], ids)
        new = await connection.fetch(sql("review", "sightings_get"), run_id, ids)
        assert [dict(row) for row in new] == [dict(row) for row in old]
        assert await connection.fetch(SIGHTINGS_MISMATCHED) == []
        counts = await connection.fetchrow(
            "SELECT pending, accepted, rejected FROM run_review_counts WHERE run_id = $1", run_id
        )
        raw = await connection.fetchrow(
            "SELECT count(*) FILTER (WHERE review_state = 'pending') AS pending, "
            "count(*) FILTER (WHERE review_state = 'accepted') AS accepted, "
            "count(*) FILTER (WHERE review_state = 'rejected') AS rejected "
            "FROM bucket_items WHERE run_id = $1",
            run_id,
        )
        assert dict(counts) == dict(raw)


async def review(c: CoordinatorHarness, run_id: str) -> list[ws.GetReviewResponse]:
    """Every page of GetReview (page size 7)."""
    pages = []
    token = ""
    while True:
        page: ws.GetReviewResponse = await c.workshop.GetReview(
            ws.GetReviewRequest(run_id=run_id, page_size=7, page_token=token), metadata=c.admin
        )
        pages.append(page)
        if not page.has_more:
            return pages
        token = page.next_page_token


def sightings_of(pages: Sequence[ws.GetReviewResponse]) -> dict[str, run_pb2.Sighting]:
    return {s.sighting_id: s for page in pages for s in page.sightings}


async def test_both_versions_read_each_others_review_writes_through_the_rollout(
    rollout_dsn: str, v01: dict[str, str], v01_sightings: types.ModuleType
) -> None:
    async with running_coordinator(rollout_dsn) as c:
        s = await review_world(c)
        jobs = await start_run(c, s, "r1")  # cam-a j0..j2 (08:00, 08:01, 08:02), then cam-b

        # (a) release 0.1 commits cam-a's first minute and the start of the second (its
        # sightings continue across the jobs), and decides
        await commit_as_v01(c, v01, v01_sightings, "r1", jobs[1].lease.job_id, frames(range(0, 4)))
        await commit_as_v01(
            c, v01, v01_sightings, "r1", jobs[0].lease.job_id, frames(range(55, 60))
        )
        await both_storages(c, v01, "r1")
        found = sightings_of(await review(c, "r1"))
        assert len(found) == 3  # two people and a vehicle, each over both jobs
        person, vehicle = (
            next(sid for sid, f in found.items() if f.class_name == name)
            for name in ("person", "vehicle")
        )
        assert len(found[person].item_ids) == 9
        assert await decide_as_v01(c, "r1", person, "accepted", None) == 9
        assert await decide_as_v01(c, "r1", vehicle, "accepted", "truck") == 3
        await both_storages(c, v01, "r1")
        found = sightings_of(await review(c, "r1"))
        assert found[person].review_state == common_pb2.REVIEW_STATE_ACCEPTED
        assert found[vehicle].relabel_class == "truck"

        # (b) this version commits cam-a's third minute, then cam-b's first job, and a late
        # commit of cam-a's second minute (its slots 57.. join sightings of the third)
        await commit(c, s, jobs[2], frames(range(0, 3)))
        await commit(c, s, jobs[3], frames(range(10, 14), shift=0.2))
        await both_storages(c, v01, "r1")
        await commit(c, s, jobs[1], frames(range(57, 60)))
        await both_storages(c, v01, "r1")
        found = sightings_of(await review(c, "r1"))
        # the late commit extended a sighting of the third minute backwards: regrouped
        joined = next(
            f for f in found.values() if f.class_name == "person" and len(f.item_ids) == 6
        )
        decided = await c.workshop.DecideSighting(
            ws.DecideSightingRequest(
                run_id="r1",
                sighting_id=joined.sighting_id,
                decision=ws.REVIEW_DECISION_RELABEL,
                class_name="walker",
            ),
            metadata=c.admin,
        )
        assert decided.items_updated == len(joined.item_ids)
        await both_storages(c, v01, "r1")
        # and release 0.1 again, after this version's writes: it groups from what this
        # version wrote (mirrored into sighting_boxes) and decides a sighting this version
        # made
        await commit_as_v01(
            c, v01, v01_sightings, "r1", jobs[3].lease.job_id, frames(range(14, 17), shift=0.2)
        )
        await both_storages(c, v01, "r1")
        cam_b = next(
            sid
            for sid, f in sightings_of(await review(c, "r1")).items()
            if f.camera_id == "cam-b" and f.class_name == "person" and len(f.item_ids) == 7
        )
        assert await decide_as_v01(c, "r1", cam_b, "rejected", None) > 0
        await both_storages(c, v01, "r1")

        before = await review(c, "r1")
        summary = await c.workshop.GetSummary(ws.GetSummaryRequest(), metadata=c.admin)

        # post-migrate: sighting_boxes and the sync go; nothing this version reads is lost
        outcome = await migrate(rollout_dsn, "post")
        assert outcome.applied == [m.label for m in list_migrations() if m.phase == "post"]
        async with c.db.connection() as connection:
            assert await connection.fetchval("SELECT to_regclass('sighting_boxes')") is None
            assert await connection.fetch(SIGHTINGS_MISMATCHED) == []
        assert await review(c, "r1") == before
        assert await c.workshop.GetSummary(ws.GetSummaryRequest(), metadata=c.admin) == summary
        confirmed = await c.workshop.DecideSighting(
            ws.DecideSightingRequest(
                run_id="r1", sighting_id=cam_b, decision=ws.REVIEW_DECISION_CONFIRM
            ),
            metadata=c.admin,
        )
        assert confirmed.items_updated > 0
