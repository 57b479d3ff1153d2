-- The review queue per bucket and bulk decisions (issue 36; docs/review.md, "Review queue"
-- and "Bulk decisions").
--
-- Pre-migration: each sighting gets its review as columns (state, pending items, relabel,
-- score, who decided it last and when), kept by the statements that change a sighting's
-- items or their decisions (sightings_refresh_v1), filled here from the items, and indexed
-- per bucket and state in each order the queue offers; two tables log bulk decisions for
-- their undo; new functions. A coordinator of the release before never writes the new
-- columns: a sighting it commits into or decides during the rollout keeps the queue columns
-- of before until this version commits into it or decides it (docs/upgrading.md, 0010).
-- Nothing to post-migrate.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: review

-- A sighting's review, as its items' boxes say it (sighting_review_v1): review_state the
-- state they share ('pending' while any is undecided, or while decided differently),
-- pending_items those undecided, relabel_class the class they were relabelled to while
-- accepted, score the highest detected score of its boxes (0 for a sighting of frames
-- without boxes), decided_by and decided_at the newest decision of its boxes.
ALTER TABLE sightings
    ADD COLUMN review_state text NOT NULL DEFAULT 'pending',
    ADD COLUMN pending_items integer NOT NULL DEFAULT 0,
    ADD COLUMN relabel_class text,
    ADD COLUMN score real NOT NULL DEFAULT 0,
    ADD COLUMN decided_by jsonb,
    ADD COLUMN decided_at timestamptz;

-- The review of one sighting from its items (those of its timeline in its frame range whose
-- box_sightings hold it), the rule GetReview's sightings follow.
CREATE FUNCTION sighting_review_v1(
    p_run text, p_sighting text, p_bucket text, p_camera text, p_first timestamptz,
    p_last timestamptz
) RETURNS TABLE (review_state text, pending_items integer, relabel_class text, score real,
                 decided_by jsonb, decided_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN count(*) FILTER (WHERE b.state = 'accepted') = count(*)
                     AND count(DISTINCT coalesce(b.relabel, '')) = 1 THEN 'accepted'
                WHEN count(*) FILTER (WHERE b.state = 'rejected') = count(*) THEN 'rejected'
                ELSE 'pending' END,
           (count(*) FILTER (WHERE b.state = 'pending'))::integer,
           CASE WHEN count(*) FILTER (WHERE b.state = 'accepted') = count(*)
                     AND count(DISTINCT coalesce(b.relabel, '')) = 1 THEN max(b.relabel) END,
           coalesce(max(b.score), 0)::real,
           (array_agg(b.decided_by ORDER BY b.decided_at DESC NULLS LAST))[1],
           max(b.decided_at)
    FROM bucket_items bi
    CROSS JOIN LATERAL (SELECT array_position(bi.box_sightings, p_sighting) AS position) p
    CROSS JOIN LATERAL (
        SELECT coalesce(bi.box_states[p.position], 'pending') AS state,
               bi.box_relabels[p.position] AS relabel,
               (bi.boxes -> (p.position - 1) ->> 'score')::real AS score,
               bi.box_decided_by[p.position] AS decided_by,
               bi.box_decided_at[p.position] AS decided_at
    ) b
    WHERE bi.run_id = p_run AND bi.bucket_id = p_bucket AND bi.camera_id = p_camera
      AND bi.frame_time >= p_first AND bi.frame_time <= p_last AND p.position IS NOT NULL
$$;

-- Sets the review columns of the sightings (p_runs[n], p_sightings[n]) from their items;
-- called by whatever changed their items or decisions, under their timelines' locks.
-- Returns how many rows it refreshed.
CREATE FUNCTION sightings_refresh_v1(p_runs text[], p_sightings text[]) RETURNS integer
LANGUAGE sql AS $$
    WITH refreshed AS (
        UPDATE sightings s
        SET (review_state, pending_items, relabel_class, score, decided_by, decided_at) = (
            SELECT r.review_state, r.pending_items, r.relabel_class, r.score, r.decided_by,
                   r.decided_at
            FROM sighting_review_v1(s.run_id, s.sighting_id, s.bucket_id, s.camera_id,
                                    s.first_frame_time, s.last_frame_time) r)
        FROM (SELECT DISTINCT * FROM unnest(p_runs, p_sightings)) AS u (run_id, sighting_id)
        WHERE s.run_id = u.run_id AND s.sighting_id = u.sighting_id
        RETURNING 1
    )
    SELECT count(*)::integer FROM refreshed
$$;

UPDATE sightings s
SET (review_state, pending_items, relabel_class, score, decided_by, decided_at) = (
    SELECT r.review_state, r.pending_items, r.relabel_class, r.score, r.decided_by, r.decided_at
    FROM sighting_review_v1(s.run_id, s.sighting_id, s.bucket_id, s.camera_id,
                            s.first_frame_time, s.last_frame_time) r);

-- The queue's orders, each a range of one bucket's sightings of one state, so the next
-- page is an index range after the last key (keyset; GetReviewQueue).
CREATE INDEX sightings_queue_oldest
    ON sightings (bucket_id, review_state, first_frame_time, run_id, sighting_id);
CREATE INDEX sightings_queue_score
    ON sightings (bucket_id, review_state, score, first_frame_time, run_id, sighting_id);
CREATE INDEX sightings_queue_camera
    ON sightings (bucket_id, review_state, camera_id, first_frame_time, run_id, sighting_id);

-- The boxes of the sightings (p_runs[n], p_sightings[n]): each item of each with the
-- position of its box in the item's review arrays and that box's review as stored (a NULL
-- state: never decided, pending).
CREATE FUNCTION sightings_boxes_v1(p_runs text[], p_sightings text[])
RETURNS TABLE (run_id text, sighting_id text, item_id text, box_position integer,
               review_state text, relabel_class text, decided_by jsonb,
               decided_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT s.run_id, s.sighting_id, bi.item_id, p.position, bi.box_states[p.position],
           bi.box_relabels[p.position], bi.box_decided_by[p.position],
           bi.box_decided_at[p.position]
    FROM (SELECT DISTINCT * FROM unnest(p_runs, p_sightings)) AS u (run_id, sighting_id)
    JOIN sightings s ON s.run_id = u.run_id AND s.sighting_id = u.sighting_id
    JOIN bucket_items bi
        ON bi.run_id = s.run_id AND bi.bucket_id = s.bucket_id AND bi.camera_id = s.camera_id
       AND bi.frame_time >= s.first_frame_time AND bi.frame_time <= s.last_frame_time
    CROSS JOIN LATERAL (SELECT array_position(bi.box_sightings, s.sighting_id) AS position) p
    WHERE p.position IS NOT NULL
$$;

-- Sets the review of boxes of items, each (p_items[n], its box at p_positions[n]) to
-- (p_states[n] (NULL: never decided), p_relabels[n], p_by[n], p_at[n]), derives each
-- item's review state (its item decision's, else its boxes'), relabel and reviewed_at, and
-- moves the counters by what changed (class counts from the items' boxes after review
-- before and after; bucket and run counts where an item's state changed), in one statement
-- after locking the items in key order. The caller holds their timelines' locks (the lock
-- order: timelines, items, counters). The items may belong to several runs and buckets.
-- Returns how many items it rewrote.
CREATE FUNCTION bucket_item_boxes_set_v1(
    p_items text[], p_positions integer[], p_states text[], p_relabels text[], p_by jsonb[],
    p_at timestamptz[], p_now timestamptz
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    changed integer;
BEGIN
    PERFORM 1 FROM bucket_items WHERE item_id = ANY (p_items) ORDER BY item_id FOR UPDATE;
    WITH changes AS (
        SELECT u.item_id, array_agg(u.position) AS positions, array_agg(u.state) AS states,
               array_agg(u.relabel) AS relabels, array_agg(u.decider) AS decided_by,
               array_agg(u.moment) AS decided_at
        FROM unnest(p_items, p_positions, p_states, p_relabels, p_by, p_at)
             AS u (item_id, position, state, relabel, decider, moment)
        GROUP BY u.item_id
    ), arrays AS (
        SELECT bi.item_id, bi.run_id, bi.bucket_id, bi.recording_id, bi.recording_generation,
               bi.review_state AS was, bi.boxes, bi.corrected_boxes, bi.item_state,
               bi.item_relabel, bi.item_decided_at, bi.box_states AS old_states,
               bi.box_relabels AS old_relabels, a.*
        FROM changes c
        JOIN bucket_items bi ON bi.item_id = c.item_id
        CROSS JOIN LATERAL (
            SELECT array_agg(CASE WHEN k.k IS NOT NULL THEN c.states[k.k]
                                  ELSE bi.box_states[g] END ORDER BY g) AS states,
                   array_agg(CASE WHEN k.k IS NOT NULL THEN c.relabels[k.k]
                                  ELSE bi.box_relabels[g] END ORDER BY g) AS relabels,
                   array_agg(CASE WHEN k.k IS NOT NULL THEN c.decided_by[k.k]
                                  ELSE bi.box_decided_by[g] END ORDER BY g) AS new_by,
                   array_agg(CASE WHEN k.k IS NOT NULL THEN c.decided_at[k.k]
                                  ELSE bi.box_decided_at[g] END ORDER BY g) AS new_at
            FROM generate_series(1, greatest(jsonb_array_length(bi.boxes), 1)) AS g
            CROSS JOIN LATERAL (SELECT array_position(c.positions, g) AS k) k
        ) a
    ), review AS (
        SELECT a.*,
               coalesce(a.item_state, bucket_item_boxes_state_v1(a.boxes, a.states)) AS now,
               CASE WHEN a.item_state IS NOT NULL THEN a.item_relabel
                    ELSE (SELECT r FROM unnest(a.relabels) AS r WHERE r IS NOT NULL LIMIT 1)
               END AS relabel,
               greatest(a.item_decided_at, (SELECT max(t) FROM unnest(a.new_at) AS t))
                   AS reviewed_at
        FROM arrays a
    ), class_deltas AS (
        SELECT f.workflow_id, d.bucket_id, d.class_name, sum(d.detections) AS detections,
               sum(d.confirmations) AS confirmations
        FROM (
            SELECT a.run_id, a.bucket_id, r.class_name, -1 AS detections,
                   -(r.review_state = 'accepted')::integer AS confirmations
            FROM arrays a
            CROSS JOIN LATERAL bucket_item_reviewed_boxes_v1(
                a.boxes, a.corrected_boxes, a.old_states, a.old_relabels, a.item_state,
                a.item_relabel) r
            UNION ALL
            SELECT a.run_id, a.bucket_id, r.class_name, 1, (r.review_state = 'accepted')::integer
            FROM arrays a
            CROSS JOIN LATERAL bucket_item_reviewed_boxes_v1(
                a.boxes, a.corrected_boxes, a.states, a.relabels, a.item_state,
                a.item_relabel) r
        ) d
        CROSS JOIN LATERAL run_facts_v1(d.run_id) f
        GROUP BY 1, 2, 3
        HAVING sum(d.detections) <> 0 OR sum(d.confirmations) <> 0
    ), classes AS (
        INSERT INTO workflow_class_counts AS c (workflow_id, bucket_id, class_name, detections,
                                                confirmations)
        SELECT d.workflow_id, d.bucket_id, d.class_name, d.detections, d.confirmations
        FROM class_deltas d ORDER BY 1, 2, 3
        ON CONFLICT ON CONSTRAINT workflow_class_counts_pkey DO UPDATE
        SET detections = c.detections + EXCLUDED.detections,
            confirmations = c.confirmations + EXCLUDED.confirmations
        RETURNING 1
    ), updated AS (
        UPDATE bucket_items bi
        -- (an array of none but NULLs is stored NULL, as never decided: what an undo
        -- brings back)
        SET box_states = nullif(review.states,
                                array_fill(NULL::text, ARRAY[cardinality(review.states)])),
            box_relabels = nullif(review.relabels,
                                  array_fill(NULL::text, ARRAY[cardinality(review.relabels)])),
            box_decided_by = nullif(review.new_by,
                                    array_fill(NULL::jsonb, ARRAY[cardinality(review.new_by)])),
            box_decided_at = nullif(review.new_at, array_fill(NULL::timestamptz,
                                                              ARRAY[cardinality(review.new_at)])),
            review_state = review.now, relabel_class = review.relabel,
            reviewed_at = review.reviewed_at
        FROM review WHERE bi.item_id = review.item_id
        RETURNING 1
    ), counted AS (
        INSERT INTO bucket_counts AS c (bucket_id, recording_id, recording_generation, images,
                                        pending, accepted, rejected, last_added_at)
        SELECT r.bucket_id, r.recording_id, r.recording_generation, 0,
               sum((r.now = 'pending')::integer - (r.was = 'pending')::integer),
               sum((r.now = 'accepted')::integer - (r.was = 'accepted')::integer),
               sum((r.now = 'rejected')::integer - (r.was = 'rejected')::integer), p_now
        FROM review r WHERE r.now <> r.was
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT ON CONSTRAINT bucket_counts_pkey DO UPDATE
        SET pending = c.pending + EXCLUDED.pending, accepted = c.accepted + EXCLUDED.accepted,
            rejected = c.rejected + EXCLUDED.rejected
        RETURNING 1
    ), runs_counted AS (
        UPDATE run_review_counts c
        SET pending = c.pending + d.pending, accepted = c.accepted + d.accepted,
            rejected = c.rejected + d.rejected
        FROM (
            SELECT r.run_id,
                   sum((r.now = 'pending')::integer - (r.was = 'pending')::integer) AS pending,
                   sum((r.now = 'accepted')::integer - (r.was = 'accepted')::integer)
                       AS accepted,
                   sum((r.now = 'rejected')::integer - (r.was = 'rejected')::integer)
                       AS rejected
            FROM review r WHERE r.now <> r.was GROUP BY 1
        ) d
        WHERE c.run_id = d.run_id
        RETURNING 1
    )
    SELECT count(*) INTO changed FROM updated;
    RETURN changed;
END;
$$;

-- A bulk decision (BulkDecideSightings): one decision on every sighting a filter selected
-- in a bucket, undone as one (undone_by, undone_at).
CREATE TABLE bulk_decisions (
    action_id          text PRIMARY KEY,
    bucket_id          text NOT NULL,
    filter             jsonb NOT NULL,  -- the selection as asked (SightingFilter's JSON)
    review_state       text NOT NULL,
    relabel_class      text,
    decided_by         jsonb NOT NULL,
    decided_at         timestamptz NOT NULL,
    sightings_selected integer NOT NULL DEFAULT 0,
    sightings_changed  integer NOT NULL DEFAULT 0,
    items_changed      integer NOT NULL DEFAULT 0,
    undone_by          jsonb,
    undone_at          timestamptz
);

-- Each box a bulk decision changed, with its review before (what the undo brings back). No
-- foreign key to the item: a bucket deleted since takes its items; the undo skips them.
CREATE TABLE bulk_decision_boxes (
    action_id     text NOT NULL REFERENCES bulk_decisions (action_id) ON DELETE CASCADE,
    item_id       text NOT NULL,
    box_position  integer NOT NULL,
    run_id        text NOT NULL,
    sighting_id   text NOT NULL,  -- the sighting the box was decided as part of
    review_state  text,           -- before (NULL: never decided)
    relabel_class text,
    decided_by    jsonb,
    decided_at    timestamptz,
    PRIMARY KEY (action_id, item_id, box_position)
);

-- Applies bulk decision p_action (its row written, its sightings' timelines locked by the
-- caller) to the sightings (p_runs[n], p_sightings[n]): logs each box whose review differs
-- from (p_state, p_relabel) with its review before, sets them (bucket_item_boxes_set_v1),
-- logs a decision per sighting (sighting_decisions, as DecideSighting does), refreshes
-- the sightings and records the counts on the action.
CREATE FUNCTION sightings_bulk_decide_v1(
    p_action text, p_runs text[], p_sightings text[], p_state text, p_relabel text,
    p_by jsonb, p_now timestamptz
) RETURNS TABLE (changed_sightings integer, changed_items integer)
LANGUAGE plpgsql AS $$
DECLARE
    n_sightings integer;
    n_items integer;
    boxes_items text[];
    boxes_positions integer[];
BEGIN
    INSERT INTO bulk_decision_boxes (action_id, item_id, box_position, run_id, sighting_id,
                                     review_state, relabel_class, decided_by, decided_at)
    SELECT p_action, b.item_id, b.box_position, b.run_id, b.sighting_id, b.review_state,
           b.relabel_class, b.decided_by, b.decided_at
    FROM sightings_boxes_v1(p_runs, p_sightings) b
    WHERE (coalesce(b.review_state, 'pending'), b.relabel_class)
          IS DISTINCT FROM (p_state, p_relabel)
    ON CONFLICT DO NOTHING;  -- (a box is in one sighting)
    SELECT coalesce(array_agg(l.item_id), '{}'), coalesce(array_agg(l.box_position), '{}'),
           count(DISTINCT (l.run_id, l.sighting_id)), count(DISTINCT l.item_id)
    INTO boxes_items, boxes_positions, n_sightings, n_items
    FROM bulk_decision_boxes l WHERE l.action_id = p_action;
    IF n_items > 0 THEN
        PERFORM bucket_item_boxes_set_v1(
            boxes_items, boxes_positions, array_fill(p_state, ARRAY[cardinality(boxes_items)]),
            array_fill(p_relabel, ARRAY[cardinality(boxes_items)]),
            array_fill(p_by, ARRAY[cardinality(boxes_items)]),
            array_fill(p_now, ARRAY[cardinality(boxes_items)]), p_now);
    END IF;
    INSERT INTO sighting_decisions (run_id, sighting_id, review_state, relabel_class, decided_by,
                                    decided_at, items_updated)
    SELECT u.run_id, u.sighting_id, p_state, p_relabel, p_by, p_now, coalesce(n.boxes, 0)
    FROM (SELECT DISTINCT * FROM unnest(p_runs, p_sightings)) AS u (run_id, sighting_id)
    LEFT JOIN (
        SELECT l.run_id, l.sighting_id, count(*) AS boxes
        FROM bulk_decision_boxes l WHERE l.action_id = p_action
        GROUP BY 1, 2
    ) n ON n.run_id = u.run_id AND n.sighting_id = u.sighting_id;
    PERFORM sightings_refresh_v1(p_runs, p_sightings);
    UPDATE bulk_decisions
    SET sightings_selected = (SELECT count(*) FROM (SELECT DISTINCT * FROM
                                                    unnest(p_runs, p_sightings)) u),
        sightings_changed = n_sightings, items_changed = n_items
    WHERE action_id = p_action;
    RETURN QUERY SELECT n_sightings, n_items;
END;
$$;

-- Undoes bulk decision p_action (the caller holds the timelines' locks and checked that no
-- box it changed was decided since): each logged box of an item that still exists goes
-- back to its review before, the sightings holding them now are refreshed, and the action
-- is marked undone. Returns how many items it rewrote.
CREATE FUNCTION bulk_decision_undo_v1(p_action text, p_by jsonb, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    rewritten integer := 0;
    l_items text[];
    l_positions integer[];
    l_states text[];
    l_relabels text[];
    l_by jsonb[];
    l_at timestamptz[];
    s_runs text[];
    s_ids text[];
BEGIN
    SELECT coalesce(array_agg(l.item_id), '{}'), array_agg(l.box_position),
           array_agg(l.review_state), array_agg(l.relabel_class), array_agg(l.decided_by),
           array_agg(l.decided_at)
    INTO l_items, l_positions, l_states, l_relabels, l_by, l_at
    FROM bulk_decision_boxes l
    JOIN bucket_items bi ON bi.item_id = l.item_id
    WHERE l.action_id = p_action;
    IF cardinality(l_items) > 0 THEN
        rewritten := bucket_item_boxes_set_v1(l_items, l_positions, l_states, l_relabels, l_by,
                                              l_at, p_now);
    END IF;
    SELECT coalesce(array_agg(x.run_id), '{}'), coalesce(array_agg(x.sighting_id), '{}')
    INTO s_runs, s_ids
    FROM (
        SELECT DISTINCT bi.run_id, bi.box_sightings[l.box_position] AS sighting_id
        FROM bulk_decision_boxes l
        JOIN bucket_items bi ON bi.item_id = l.item_id
        WHERE l.action_id = p_action AND bi.box_sightings[l.box_position] IS NOT NULL
    ) x;
    PERFORM sightings_refresh_v1(s_runs, s_ids);
    UPDATE bulk_decisions SET undone_by = p_by, undone_at = p_now WHERE action_id = p_action;
    RETURN rewritten;
END;
$$;
