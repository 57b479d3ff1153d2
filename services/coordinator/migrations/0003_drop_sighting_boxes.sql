-- Review storage without per-box rows, the contract half of 0002_review_storage
-- (docs/upgrading.md, 0002 and 0003): once no release-0.1 coordinator serves, drops
-- sighting_boxes, the functions only release 0.1 calls, and the triggers that kept the
-- two storages in step.
-- phase: post
--
-- room: review

DROP TRIGGER bucket_items_mirror_added ON bucket_items;
DROP TRIGGER bucket_items_mirror_changed ON bucket_items;
DROP FUNCTION bucket_items_mirrored_v1();
-- release 0.1's deferred trigger that added the boxes of items nothing grouped
DROP TRIGGER bucket_items_boxes ON bucket_items;
DROP FUNCTION bucket_item_boxes_v1();
DROP FUNCTION sighting_lock_v1(text, text, integer);
DROP FUNCTION sighting_decide_v1(text, text, text, text, jsonb, timestamptz);
DROP FUNCTION bucket_items_insert_v1(text, integer, text, text, bigint, text[], text[],
                                     integer[], text[], timestamptz[], jsonb[], text[], text[],
                                     timestamptz);
DROP FUNCTION bucket_item_for_read_v1(text, text);
-- with its sync triggers
DROP TABLE sighting_boxes;
DROP FUNCTION sighting_boxes_synced_v1();

-- room: leases

DROP FUNCTION job_complete_v1(text, integer, bigint, uuid, text, text, text, text, integer,
                              timestamptz, integer, integer, integer, integer, text[], text[],
                              integer[], text[], text[], integer[], text[], timestamptz[],
                              text[], text[], text[], timestamptz);
