-- Workshop coordinator: saving items writes less (docs/upgrading.md, 0023).
--
-- 1. The index bucket_items_by_bucket (bucket_id, saved_at) is dropped. No query reads
--    it: bucket pages, exports and bucket deletion go through bucket_items_by_bucket_frame
--    (bucket_id, frame_time, item_id), which leads with the same column; every saved item
--    paid for one more index entry.
-- 2. The statement trigger that locks the new items' timelines and counts them reads the
--    inserted rows from its transition table instead of looking each one up again in
--    bucket_items, once per statement (six times per commit): same statements, same
--    order, same locks. review_items_added, which only that trigger called, is dropped by
--    the post-migration 0024.
-- A pre-migration: apply it at any time; a coordinator of the previous version does not
-- use the index.
DROP INDEX bucket_items_by_bucket;

-- Every insert of bucket items locks their timelines (in key order: the lock order every
-- writer of sightings keeps: timelines, then items and boxes, then the counters (class,
-- bucket, run, day), each in key order) and counts them, whichever code inserts them:
-- what committing them into buckets changes for the summary. The rows are read from the
-- statement's transition table (migration 0023). The committing coordinator then adds
-- their boxes grouped (review.group_committed), or bucket_items_boxes adds them ungrouped
-- at commit (also for a coordinator of an older version during a rolling upgrade) and the
-- maintenance pass groups them (migration 0019).
CREATE OR REPLACE FUNCTION bucket_items_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sighting_timelines AS t (run_id, bucket_id, camera_id)
    SELECT DISTINCT a.run_id, a.bucket_id, a.camera_id FROM added a
    ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT sighting_timelines_pkey DO UPDATE SET run_id = t.run_id;

    -- new boxes are pending and not relabelled: their class as detected, no confirmation
    INSERT INTO workflow_class_counts AS c (workflow_id, bucket_id, class_name, detections,
                                            confirmations)
    SELECT r.workflow_id, a.bucket_id, coalesce(b.box ->> 'class_name', ''), count(*), 0
    FROM added a JOIN runs r ON r.run_id = a.run_id
    CROSS JOIN LATERAL jsonb_array_elements(a.boxes) AS b (box)
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT workflow_class_counts_pkey DO UPDATE
    SET detections = c.detections + EXCLUDED.detections,
        confirmations = c.confirmations + EXCLUDED.confirmations;

    INSERT INTO bucket_counts AS c (bucket_id, recording_id, recording_generation, images, pending,
                                    accepted, rejected, last_added_at)
    SELECT a.bucket_id, a.recording_id, a.recording_generation, count(*),
           count(*) FILTER (WHERE a.review_state = 'pending'),
           count(*) FILTER (WHERE a.review_state = 'accepted'),
           count(*) FILTER (WHERE a.review_state = 'rejected'), max(a.saved_at)
    FROM added a
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT bucket_counts_pkey DO UPDATE
    SET images = c.images + EXCLUDED.images, pending = c.pending + EXCLUDED.pending,
        accepted = c.accepted + EXCLUDED.accepted, rejected = c.rejected + EXCLUDED.rejected,
        last_added_at = greatest(c.last_added_at, EXCLUDED.last_added_at);

    INSERT INTO run_review_counts AS c (run_id, pending, accepted, rejected)
    SELECT a.run_id, count(*) FILTER (WHERE a.review_state = 'pending'),
           count(*) FILTER (WHERE a.review_state = 'accepted'),
           count(*) FILTER (WHERE a.review_state = 'rejected')
    FROM added a
    GROUP BY 1 ORDER BY 1
    ON CONFLICT ON CONSTRAINT run_review_counts_pkey DO UPDATE
    SET pending = c.pending + EXCLUDED.pending, accepted = c.accepted + EXCLUDED.accepted,
        rejected = c.rejected + EXCLUDED.rejected;

    INSERT INTO workflow_day_counts AS c (workflow_id, bucket_id, quarter_start, images)
    SELECT r.workflow_id, a.bucket_id,
           date_bin('15 minutes', a.saved_at, timestamptz '2000-01-01 00:00:00+00'), count(*)
    FROM added a JOIN runs r ON r.run_id = a.run_id
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT workflow_day_counts_pkey DO UPDATE SET images = c.images + EXCLUDED.images;
    RETURN NULL;
END;
$$;
