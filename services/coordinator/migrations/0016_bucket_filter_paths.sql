-- Index paths for the bucket browser's sparse filters (issue 36, ListBucketItems; docs/review.md,
-- "Bucket browser"): a class, a score floor or decided states that few of a bucket's items
-- match read the items that may match instead of the bucket until a page is full.
--
-- The items that may match are found through the bucket's sightings (their class as
-- detected, their score and their newest decision, kept by the statements that change
-- them, 0010 and 0015) and two small sets of items: those with an item decision or a
-- correction (which may hold any class or state whatever their sightings say: a partial
-- index, empty at commit) and those no grouping reached yet (bucket_items_ungrouped). A
-- commit inserts nothing into the new indexes of bucket_items (their predicate is false for
-- an item just written) and a sighting decision leaves the item's indexed columns alone,
-- so it stays a HOT update; a sighting's class and first frame never change and a new
-- sighting is undecided, so the sightings' indexes cost a commit one entry per new sighting.
--
-- Pre-migration: new indexes. A coordinator of the release before never reads them. Nothing
-- to post-migrate.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: review

-- The items whose boxes after review may differ from their sightings': an item decision
-- (its own state and relabel) or a correction (boxes added, moved, reclassified).
CREATE INDEX bucket_items_item_reviewed ON bucket_items (bucket_id, frame_time, item_id)
    WHERE item_state IS NOT NULL OR corrected_boxes IS NOT NULL;

-- A bucket's sightings of one detected class, in frame order.
CREATE INDEX sightings_by_class ON sightings (bucket_id, class_name, first_frame_time);

-- A bucket's sightings with a decision on any of their boxes (a relabel, a decided item).
CREATE INDEX sightings_decided ON sightings (bucket_id, first_frame_time)
    WHERE decided_at IS NOT NULL;

-- Whether a bucket item passes a ListBucketItems filter but its class (each argument
-- NULL: any): review states, camera (p_camera, and one of p_cameras, the cameras the reader
-- may see), run, frame time in [p_from, p_to) and score in [p_min, p_max]
-- (bucket_item_score_v1). The one definition the listing's paths share (review.sql,
-- bucket_items_page), an expression the planner inlines (the class test, a subquery, would
-- keep it from that: the statement holds it).
CREATE FUNCTION bucket_item_listed_v1(
    p_states text[], p_camera text, p_cameras text[], p_run text, p_from timestamptz,
    p_to timestamptz, p_min real, p_max real, p_review_state text, p_camera_id text,
    p_run_id text, p_frame_time timestamptz, p_boxes jsonb
) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_states IS NULL OR p_review_state = ANY (p_states))
       AND (p_camera IS NULL OR p_camera_id = p_camera)
       AND (p_cameras IS NULL OR p_camera_id = ANY (p_cameras))
       AND (p_run IS NULL OR p_run_id = p_run)
       AND (p_from IS NULL OR p_frame_time >= p_from)
       AND (p_to IS NULL OR p_frame_time < p_to)
       AND (p_min IS NULL OR bucket_item_score_v1(p_boxes) >= p_min)
       AND (p_max IS NULL OR bucket_item_score_v1(p_boxes) <= p_max)
$$;

-- The sightings of bucket p_bucket that may hold an item of a sparse filter, by one of its
-- conditions (p_driver), from their columns: 'class', of detected class p_class, relabelled
-- p_class, or with a decision and not accepted (a relabel may have made any of their boxes
-- p_class; an accepted sighting's boxes all carry its one relabel); 'score', with score at least p_min
-- (> 0; an item's score is its best box's, and a box's sighting's score is at least the
-- box's); 'decided', with a decision (an item accepted or rejected without an item decision
-- has decided boxes); 'pending', pending (an item pending without an item decision has a
-- pending box, and a sighting with one is pending). One condition only: an item's other
-- conditions may hold through another of its boxes, so another sighting. The sightings
-- that end before p_after are left out.
CREATE FUNCTION bucket_sightings_wanted_v1(
    p_bucket text, p_driver text, p_class text, p_min real, p_after timestamptz
) RETURNS SETOF sightings LANGUAGE sql STABLE AS $$
    SELECT s.* FROM (
        SELECT * FROM sightings  -- (sightings_by_class)
        WHERE p_driver = 'class' AND bucket_id = p_bucket AND class_name = p_class
        UNION ALL
        SELECT * FROM sightings  -- (sightings_decided)
        WHERE p_driver = 'class' AND bucket_id = p_bucket AND decided_at IS NOT NULL
          AND class_name <> p_class
          -- an accepted sighting's boxes all carry its one relabel (sighting_review_v1):
          -- of another class unless that is p_class
          AND (review_state <> 'accepted' OR relabel_class = p_class)
        UNION ALL
        SELECT * FROM sightings  -- (sightings_queue_score, a range per state)
        WHERE p_driver = 'score' AND bucket_id = p_bucket
          AND review_state IN ('pending', 'accepted', 'rejected') AND score >= p_min
        UNION ALL
        SELECT * FROM sightings  -- (sightings_decided)
        WHERE p_driver = 'decided' AND bucket_id = p_bucket AND decided_at IS NOT NULL
        UNION ALL
        SELECT * FROM sightings  -- (sightings_queue_oldest)
        WHERE p_driver = 'pending' AND bucket_id = p_bucket AND review_state = 'pending'
    ) s
    WHERE s.last_frame_time >= p_after
$$;
