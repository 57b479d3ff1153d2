-- The contract half of 0004_frame_costs (docs/upgrading.md, 0004 and 0006): drops
-- bucket_items' UNIQUE (run_id, job_index, slot_index, step_id), an index every committed
-- item paid for (about 3 us of Postgres CPU an item, bench.item_insert) that nothing reads:
-- no statement of this version or of release 0.1 names it as a conflict target or looks
-- items up by those columns. What it guarded still holds without it: an item's id is a
-- digest of exactly those four values (leases.results.item_id, the same in release 0.1), so
-- two items of one slot and step would share an id, which the primary key refuses; and a
-- job's items are written once, by its one commit (receipts' primary key, under the fences).
-- A post-migration only so that nothing changes under a release-0.1 coordinator while it
-- serves.
-- phase: post
--
-- room: review

ALTER TABLE bucket_items DROP CONSTRAINT bucket_items_run_id_job_index_slot_index_step_id_key;
