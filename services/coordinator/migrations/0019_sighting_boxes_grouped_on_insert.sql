-- Workshop coordinator: a commit's boxes are written once, already grouped (docs/review.md).
--
-- Until now the insert of bucket items added every box to sighting_boxes ungrouped
-- (sighting_id '') and the committing coordinator then grouped them with an UPDATE of
-- every one of those rows: each box was written twice, and since sighting_id is indexed
-- the update was never HOT (a new row version and an entry in every index). Together
-- the two were about half of Postgres' time per committed frame (bench.processor_throughput
-- --profile-control). Now the statement trigger locks the timelines and counts the items
-- (class counts from the items' boxes), and the boxes are added by whoever groups them:
--
-- - the committing coordinator (review.group_committed, same transaction) reads the new
--   items' boxes, groups them and inserts them with their sighting ids;
-- - a deferred row trigger adds, at commit, the boxes of any item that still has none
--   (an insert by anything else, or a coordinator of an earlier version during a rolling
--   upgrade), ungrouped as before; the maintenance pass groups those.
--
-- Same names and signatures; apply it at any time.

-- Locks the timelines of the items `p_items` (in key order: the lock order every writer
-- of sightings keeps: timelines, then items and boxes, then the counters (class, bucket,
-- run, day), each in key order) and counts the items: what committing them into buckets
-- changes for the summary. Their boxes are added by review.group_committed, grouped, or
-- at commit by bucket_item_boxes (ungrouped). Returns the timelines.
CREATE OR REPLACE FUNCTION review_items_added(p_items text[])
RETURNS TABLE (run_id text, bucket_id text, camera_id text)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sighting_timelines AS t (run_id, bucket_id, camera_id)
    SELECT DISTINCT bi.run_id, bi.bucket_id, bi.camera_id
    FROM bucket_items bi WHERE bi.item_id = ANY (p_items)
    ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT sighting_timelines_pkey DO UPDATE SET run_id = t.run_id;

    -- new boxes are pending and not relabelled: their class as detected, no confirmation
    INSERT INTO workflow_class_counts AS c (workflow_id, bucket_id, class_name, detections,
                                            confirmations)
    SELECT r.workflow_id, bi.bucket_id, coalesce(b.box ->> 'class_name', ''), count(*), 0
    FROM bucket_items bi JOIN runs r ON r.run_id = bi.run_id
    CROSS JOIN LATERAL jsonb_array_elements(bi.boxes) AS b (box)
    WHERE bi.item_id = ANY (p_items)
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT workflow_class_counts_pkey DO UPDATE
    SET detections = c.detections + EXCLUDED.detections,
        confirmations = c.confirmations + EXCLUDED.confirmations;

    INSERT INTO bucket_counts AS c (bucket_id, recording_id, recording_generation, images, pending,
                                    accepted, rejected, last_added_at)
    SELECT bi.bucket_id, bi.recording_id, bi.recording_generation, count(*),
           count(*) FILTER (WHERE bi.review_state = 'pending'),
           count(*) FILTER (WHERE bi.review_state = 'accepted'),
           count(*) FILTER (WHERE bi.review_state = 'rejected'), max(bi.saved_at)
    FROM bucket_items bi WHERE bi.item_id = ANY (p_items)
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT bucket_counts_pkey DO UPDATE
    SET images = c.images + EXCLUDED.images, pending = c.pending + EXCLUDED.pending,
        accepted = c.accepted + EXCLUDED.accepted, rejected = c.rejected + EXCLUDED.rejected,
        last_added_at = greatest(c.last_added_at, EXCLUDED.last_added_at);

    INSERT INTO run_review_counts AS c (run_id, pending, accepted, rejected)
    SELECT bi.run_id, count(*) FILTER (WHERE bi.review_state = 'pending'),
           count(*) FILTER (WHERE bi.review_state = 'accepted'),
           count(*) FILTER (WHERE bi.review_state = 'rejected')
    FROM bucket_items bi WHERE bi.item_id = ANY (p_items)
    GROUP BY 1 ORDER BY 1
    ON CONFLICT ON CONSTRAINT run_review_counts_pkey DO UPDATE
    SET pending = c.pending + EXCLUDED.pending, accepted = c.accepted + EXCLUDED.accepted,
        rejected = c.rejected + EXCLUDED.rejected;

    INSERT INTO workflow_day_counts AS c (workflow_id, bucket_id, quarter_start, images)
    SELECT r.workflow_id, bi.bucket_id,
           date_bin('15 minutes', bi.saved_at, timestamptz '2000-01-01 00:00:00+00'), count(*)
    FROM bucket_items bi JOIN runs r ON r.run_id = bi.run_id
    WHERE bi.item_id = ANY (p_items)
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT workflow_day_counts_pkey DO UPDATE SET images = c.images + EXCLUDED.images;

    RETURN QUERY
    SELECT DISTINCT bi.run_id, bi.bucket_id, bi.camera_id
    FROM bucket_items bi WHERE bi.item_id = ANY (p_items) ORDER BY 1, 2, 3;
END;
$$;

-- At commit, for each inserted item: its boxes (sighting_id '', ungrouped) if nothing
-- added them in the transaction (group_committed does, grouped) and the item is still there.
CREATE FUNCTION bucket_item_boxes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM sighting_boxes sb WHERE sb.item_id = NEW.item_id) THEN
        INSERT INTO sighting_boxes (item_id, box_index, run_id, bucket_id, camera_id,
                                    frame_time, class_name, score, x, y, w, h, track_id,
                                    sighting_id)
        SELECT bi.item_id, coalesce(b.ordinal - 1, -1)::integer, bi.run_id, bi.bucket_id,
               bi.camera_id, bi.frame_time, coalesce(b.box ->> 'class_name', ''),
               coalesce((b.box ->> 'score')::real, 0),
               coalesce((b.box ->> 'x')::real, 0), coalesce((b.box ->> 'y')::real, 0),
               coalesce((b.box ->> 'w')::real, 0), coalesce((b.box ->> 'h')::real, 0),
               (b.box ->> 'track_id')::bigint, ''
        FROM bucket_items bi
        LEFT JOIN LATERAL jsonb_array_elements(bi.boxes) WITH ORDINALITY AS b (box, ordinal)
            ON true
        WHERE bi.item_id = NEW.item_id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER bucket_items_boxes
    AFTER INSERT ON bucket_items DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION bucket_item_boxes();
