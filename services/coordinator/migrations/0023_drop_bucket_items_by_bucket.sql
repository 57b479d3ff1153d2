-- Workshop coordinator: drops the index bucket_items_by_bucket (bucket_id, saved_at)
-- (docs/upgrading.md, 0023).
--
-- No query reads it: bucket pages, exports and bucket deletion go through
-- bucket_items_by_bucket_frame (bucket_id, frame_time, item_id), which has the same
-- leading column; every saved item paid for one more index entry. A pre-migration: a
-- coordinator of the previous version does not need it either.
DROP INDEX bucket_items_by_bucket;
