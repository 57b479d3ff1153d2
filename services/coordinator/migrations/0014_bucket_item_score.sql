-- A bucket item's score (issue 36, the bucket browser's score filter): the highest detected
-- score of its boxes, 0 for an item without boxes, as a sighting's score is (0010). One
-- definition for ListBucketItems, exports and dataset versions filtering by score.
--
-- Pre-migration: a new function; a coordinator of the release before never calls it.
-- Nothing to post-migrate.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: review

-- Detected scores, before corrections: the model's certainty, what the score filter of
-- the review queue means too.
CREATE FUNCTION bucket_item_score_v1(p_boxes jsonb)
RETURNS real LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(max(b.score), 0)::real FROM bucket_item_boxes_of_v1(p_boxes) b
$$;
