"""The chaos soak's checks (bench/chaos_soak.sql) find what they look for: on a job
committed through the real coordinator they find nothing, and each finds the violation
it names once the test writes one straight into the tables. The soak itself (minutes of
a whole stack under faults) is no test: see docs/reliability.md."""

from __future__ import annotations

from datetime import timedelta

from bench.chaos_checks import QUERIES
from testbed.coordinator_leases import complete_request, frame_result, leased
from testbed.harness.coordinator import CoordinatorHarness

CHECKS = (
    "check_ended_twice",
    "check_receipt_state",
    "check_completed_without_receipt",
    "check_items_without_receipt",
    "check_items_count",
    "check_item_images",
    "check_stale_writes",
    "check_receipt_in_lease",
)


async def found(c: CoordinatorHarness) -> dict[str, list[str]]:
    async with c.db.connection() as connection:
        return {
            name: [str(row["id"]) for row in await connection.fetch(QUERIES[name])]
            for name in CHECKS
        }


async def test_each_check_finds_its_violation_and_nothing_on_a_clean_commit(
    coordinator: CoordinatorHarness,
) -> None:
    c = coordinator
    async with c.db.connection() as connection:
        await connection.execute(QUERIES["install_history"])
    s, job = await leased(c, full=True)
    result = await frame_result(c, s, job, frames=2)
    await c.jobs.Complete(complete_request(job, result), metadata=s.processor)
    async with c.db.connection() as connection:
        # the history is dated by Postgres, the rows by the harness's frozen clock: the
        # claim a second before that clock's now, the commit a second after
        await connection.execute(
            "UPDATE chaos_job_history SET at = $1::timestamptz + CASE WHEN new_state = 'leased' "
            "THEN interval '-1 second' ELSE interval '1 second' END",
            c.clock.now(),
        )
    assert await found(c) == {name: [] for name in CHECKS}
    done = f"{job.lease.run_id}/{job.input.job_index}"

    async with c.db.connection() as connection:
        items = [r["item_id"] for r in await connection.fetch("SELECT item_id FROM bucket_items")]
        assert len(items) == 2
        # a bucket holding part of the job
        await connection.execute("DELETE FROM bucket_items WHERE item_id = $1", items[0])
        # an image recorded after its lease had ended (the history says when it ended)
        ended = await connection.fetchval(
            "SELECT at FROM chaos_job_history WHERE new_state = 'completed'"
        )
        await connection.execute(
            "UPDATE staged_objects SET staged_at = $1 WHERE object_key = "
            "(SELECT object_key FROM bucket_items WHERE item_id = $2)",
            ended + timedelta(seconds=1),
            items[1],
        )
        # another job completed without a receipt
        await connection.execute(
            "UPDATE jobs SET state = 'completed' WHERE run_id = $1 AND job_index <> $2 "
            "AND job_index = (SELECT min(job_index) FROM jobs WHERE job_index <> $2)",
            job.lease.run_id,
            job.input.job_index,
        )
    after = await found(c)
    assert after["check_items_count"] == [done]
    assert len(after["check_stale_writes"]) == 1
    assert len(after["check_completed_without_receipt"]) == 1
    assert after["check_ended_twice"] == []

    async with c.db.connection() as connection:
        # the job taken back out of its final state and leased again: ended twice, its
        # receipt no longer of its last lease, and a commit from that stale lease
        await connection.execute(
            "UPDATE jobs SET state = 'leased', generation = generation + 1 "
            "WHERE run_id = $1 AND job_index = $2",
            job.lease.run_id,
            job.input.job_index,
        )
        await connection.execute(
            "UPDATE jobs SET state = 'completed' WHERE run_id = $1 AND job_index = $2",
            job.lease.run_id,
            job.input.job_index,
        )
        await connection.execute(
            "UPDATE receipts SET generation = generation + 1 WHERE run_id = $1", job.lease.run_id
        )
    after = await found(c)
    assert after["check_ended_twice"] == [done]
    assert done in after["check_receipt_in_lease"]
    assert len(after["check_item_images"]) == 1  # the item's image is of the old lease

    async with c.db.connection() as connection:
        await connection.execute("DELETE FROM receipts WHERE run_id = $1", job.lease.run_id)
    after = await found(c)
    assert after["check_items_without_receipt"] == [items[1]]
