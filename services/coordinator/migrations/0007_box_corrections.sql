-- Box corrections and single-item decisions (issue 36; docs/review.md, "Corrections" and
-- "Item decisions").
--
-- Pre-migration: nullable columns and a revision with a default on bucket_items, two log
-- tables and new functions. A coordinator of the release before reads bucket items by column
-- name and never writes the new columns, so it keeps serving unchanged; its
-- sighting_decide_v2 counts an item's boxes as detected, so a sighting it decides during the
-- rollout that holds a corrected or item-decided item leaves that item's class counts off
-- (docs/upgrading.md, 0007). Nothing to post-migrate.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: review

-- revision: counts the item's corrections, undos and item decisions (expected_revision).
-- corrected_boxes: the item's boxes as corrected (NULL: as detected, in `boxes`, which a
-- correction never changes), a JSON array of {"source": index of the detected box it
-- replaces or -1 for a box added, "class_name", "x", "y", "w", "h"}; a detected box no
-- element names was deleted. corrected_by, corrected_at: who made the correction in force.
-- item_state, item_relabel, item_decided_by, item_decided_at: a decision on this item alone,
-- which overrides its sightings' for its boxes (item_state NULL: none).
ALTER TABLE bucket_items
    ADD COLUMN revision integer NOT NULL DEFAULT 0,
    ADD COLUMN corrected_boxes jsonb,
    ADD COLUMN corrected_by jsonb,
    ADD COLUMN corrected_at timestamptz,
    ADD COLUMN item_state text,
    ADD COLUMN item_relabel text,
    ADD COLUMN item_decided_by jsonb,
    ADD COLUMN item_decided_at timestamptz;

-- bucket_items_current with the new columns (after its own, as a view may grow).
CREATE OR REPLACE VIEW bucket_items_current AS
SELECT bi.item_id, bi.bucket_id, bi.run_id, bi.job_index, bi.slot_index, bi.step_id,
       bi.camera_id, bi.recording_id, bi.recording_generation, bi.frame_time, bi.boxes,
       bi.object_key, bi.sha256, bi.review_state, bi.relabel_class, bi.saved_at,
       bi.reviewed_at,
       (rec.generation = bi.recording_generation AND rec.deleted_at IS NULL) AS output_current,
       bi.box_sightings, bi.box_states, bi.box_relabels, bi.box_decided_by, bi.box_decided_at,
       bi.revision, bi.corrected_boxes, bi.corrected_by, bi.corrected_at, bi.item_state,
       bi.item_relabel, bi.item_decided_by, bi.item_decided_at
FROM bucket_items bi
CROSS JOIN LATERAL recording_state_v1(bi.recording_id) rec;

-- Every correction and undo of an item's boxes, for provenance and undo: the boxes before
-- (`previous`, NULL: as detected) and after (NULL: back to as detected), who and when; an
-- undone correction has undone_at (its item is back to its `previous`).
CREATE TABLE box_corrections (
    item_id      text NOT NULL REFERENCES bucket_items (item_id) ON DELETE CASCADE,
    revision     integer NOT NULL,  -- the item's revision the correction made
    previous     jsonb,
    boxes        jsonb,
    corrected_by jsonb NOT NULL,
    corrected_at timestamptz NOT NULL,
    undone_by    jsonb,
    undone_at    timestamptz,
    PRIMARY KEY (item_id, revision)
);

-- Every decision on a single item (review_state NULL: the item decision was cleared).
CREATE TABLE item_decisions (
    item_id       text NOT NULL REFERENCES bucket_items (item_id) ON DELETE CASCADE,
    revision      integer NOT NULL,
    review_state  text,
    relabel_class text,
    decided_by    jsonb NOT NULL,
    decided_at    timestamptz NOT NULL,
    PRIMARY KEY (item_id, revision)
);

-- An item's boxes after review, the one definition reads, exports, the class filter and the
-- counters share: as corrected (or as detected), each with its class after relabels and its
-- review state. A box that a correction left (source >= 0) with its detected class takes its
-- relabel; one whose class the correction changed, or one added (source -1), keeps the
-- correction's class. Review state: the item decision's when there is one, else the box's
-- sighting's (pending while undecided); a box added is accepted (a person drew it) unless the
-- item is decided otherwise. The relabel of the item decision replaces the sightings'. No
-- rows for an item without boxes.
CREATE FUNCTION bucket_item_reviewed_boxes_v1(
    p_boxes jsonb, p_corrected jsonb, p_states text[], p_relabels text[], p_item_state text,
    p_item_relabel text
) RETURNS TABLE (box_index integer, source_index integer, class_name text, score real,
                 x real, y real, w real, h real, track_id bigint, review_state text,
                 relabel_class text)
LANGUAGE sql IMMUTABLE AS $$
    SELECT b.box_index, b.box_index, coalesce(r.relabel, b.class_name), b.score, b.x, b.y, b.w,
           b.h, b.track_id, coalesce(p_item_state, p_states[b.box_position], 'pending'),
           r.relabel
    FROM bucket_item_boxes_of_v1(p_boxes) b
    CROSS JOIN LATERAL (
        SELECT CASE WHEN p_item_state IS NOT NULL THEN p_item_relabel
                    ELSE p_relabels[b.box_position] END AS relabel
    ) r
    WHERE p_corrected IS NULL AND b.box_index >= 0
    UNION ALL
    SELECT (c.ordinal - 1)::integer, s.source,
           CASE WHEN s.kept THEN coalesce(r.relabel, c.box ->> 'class_name')
                ELSE c.box ->> 'class_name' END,
           coalesce((o.box ->> 'score')::real, 1), (c.box ->> 'x')::real, (c.box ->> 'y')::real,
           (c.box ->> 'w')::real, (c.box ->> 'h')::real, (o.box ->> 'track_id')::bigint,
           CASE WHEN s.source < 0 THEN coalesce(p_item_state, 'accepted')
                ELSE coalesce(p_item_state, p_states[s.source + 1], 'pending') END,
           CASE WHEN s.kept THEN r.relabel END
    FROM jsonb_array_elements(p_corrected) WITH ORDINALITY AS c (box, ordinal)
    CROSS JOIN LATERAL (SELECT coalesce((c.box ->> 'source')::integer, -1) AS source) src
    CROSS JOIN LATERAL (
        SELECT CASE WHEN src.source >= 0 THEN p_boxes -> src.source END AS box
    ) o
    CROSS JOIN LATERAL (
        SELECT src.source,
               coalesce(o.box ->> 'class_name', '') = (c.box ->> 'class_name')
               AND o.box IS NOT NULL AS kept
    ) s
    CROSS JOIN LATERAL (
        SELECT CASE WHEN p_item_state IS NOT NULL THEN p_item_relabel
                    ELSE p_relabels[s.source + 1] END AS relabel
    ) r
    WHERE p_corrected IS NOT NULL
$$;

-- An item's review state from its boxes' (sightings') states: pending while any box is
-- pending, else accepted when any is, else rejected (an item without boxes: its pseudo box).
CREATE FUNCTION bucket_item_boxes_state_v1(p_boxes jsonb, p_states text[])
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN bool_or(s = 'pending') THEN 'pending'
                WHEN bool_or(s = 'accepted') THEN 'accepted'
                ELSE 'rejected' END
    FROM generate_series(1, greatest(jsonb_array_length(p_boxes), 1)) AS g
    CROSS JOIN LATERAL (SELECT coalesce(p_states[g], 'pending') AS s) x
$$;

-- Sets an item's correction (p_correct: to p_corrected, NULL as detected, made by
-- p_corrected_by at p_corrected_at) and/or its item decision (p_decide: to p_state and
-- p_relabel by p_by at p_now; p_state NULL clears it), raises its revision, derives its
-- review state (the item decision's, else its boxes') and relabel, and moves the counters by
-- what changed: class counts from its boxes after review before and after, bucket and run
-- counts when its state changed. The caller holds the item's timeline lock (the lock order:
-- timelines, items, counters). Returns the new revision; NULL: no such item.
CREATE FUNCTION bucket_item_revise_v1(
    p_item text, p_correct boolean, p_corrected jsonb, p_corrected_by jsonb,
    p_corrected_at timestamptz, p_decide boolean, p_state text, p_relabel text, p_by jsonb,
    p_now timestamptz
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    old bucket_items%ROWTYPE;
    new bucket_items%ROWTYPE;
    workflow text;
BEGIN
    SELECT * INTO old FROM bucket_items WHERE item_id = p_item FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT r.workflow_id INTO workflow FROM run_facts_v1(old.run_id) r;
    UPDATE bucket_items bi
    SET revision = bi.revision + 1,
        corrected_boxes = CASE WHEN p_correct THEN p_corrected ELSE bi.corrected_boxes END,
        corrected_by = CASE WHEN p_correct THEN p_corrected_by ELSE bi.corrected_by END,
        corrected_at = CASE WHEN p_correct THEN p_corrected_at ELSE bi.corrected_at END,
        item_state = CASE WHEN p_decide THEN p_state ELSE bi.item_state END,
        item_relabel = CASE WHEN p_decide THEN p_relabel ELSE bi.item_relabel END,
        item_decided_by = CASE WHEN p_decide THEN
                               CASE WHEN p_state IS NULL THEN NULL ELSE p_by END
                          ELSE bi.item_decided_by END,
        item_decided_at = CASE WHEN p_decide THEN
                               CASE WHEN p_state IS NULL THEN NULL ELSE p_now END
                          ELSE bi.item_decided_at END
    WHERE bi.item_id = p_item
    RETURNING * INTO new;
    UPDATE bucket_items bi
    SET review_state = coalesce(new.item_state, bucket_item_boxes_state_v1(new.boxes, new.box_states)),
        relabel_class = CASE WHEN new.item_state IS NOT NULL THEN new.item_relabel
                             ELSE (SELECT r FROM unnest(new.box_relabels) AS r
                                   WHERE r IS NOT NULL LIMIT 1) END,
        reviewed_at = greatest(new.item_decided_at,
                               (SELECT max(t) FROM unnest(new.box_decided_at) AS t))
    WHERE bi.item_id = p_item
    RETURNING * INTO new;

    INSERT INTO workflow_class_counts AS c (workflow_id, bucket_id, class_name, detections,
                                            confirmations)
    SELECT workflow, old.bucket_id, d.class_name, sum(d.detections), sum(d.confirmations)
    FROM (
        SELECT r.class_name, -1 AS detections,
               -(r.review_state = 'accepted')::integer AS confirmations
        FROM bucket_item_reviewed_boxes_v1(old.boxes, old.corrected_boxes, old.box_states,
                                           old.box_relabels, old.item_state, old.item_relabel) r
        UNION ALL
        SELECT r.class_name, 1, (r.review_state = 'accepted')::integer
        FROM bucket_item_reviewed_boxes_v1(new.boxes, new.corrected_boxes, new.box_states,
                                           new.box_relabels, new.item_state, new.item_relabel) r
    ) d
    GROUP BY d.class_name
    HAVING sum(d.detections) <> 0 OR sum(d.confirmations) <> 0
    ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT workflow_class_counts_pkey DO UPDATE
    SET detections = c.detections + EXCLUDED.detections,
        confirmations = c.confirmations + EXCLUDED.confirmations;

    IF new.review_state <> old.review_state THEN
        INSERT INTO bucket_counts AS c (bucket_id, recording_id, recording_generation, images,
                                        pending, accepted, rejected, last_added_at)
        VALUES (old.bucket_id, old.recording_id, old.recording_generation, 0,
                (new.review_state = 'pending')::integer - (old.review_state = 'pending')::integer,
                (new.review_state = 'accepted')::integer
                - (old.review_state = 'accepted')::integer,
                (new.review_state = 'rejected')::integer
                - (old.review_state = 'rejected')::integer,
                p_now)
        ON CONFLICT ON CONSTRAINT bucket_counts_pkey DO UPDATE
        SET pending = c.pending + EXCLUDED.pending, accepted = c.accepted + EXCLUDED.accepted,
            rejected = c.rejected + EXCLUDED.rejected;
        UPDATE run_review_counts c
        SET pending = c.pending + (new.review_state = 'pending')::integer
                      - (old.review_state = 'pending')::integer,
            accepted = c.accepted + (new.review_state = 'accepted')::integer
                       - (old.review_state = 'accepted')::integer,
            rejected = c.rejected + (new.review_state = 'rejected')::integer
                       - (old.review_state = 'rejected')::integer
        WHERE c.run_id = old.run_id;
    END IF;
    RETURN new.revision;
END;
$$;

-- sighting_decide_v2 for items that may be corrected or decided alone: the same decision on
-- the sighting's boxes, but an item's state is its item decision's when it has one, and the
-- class counts move by the item's boxes after review (bucket_item_reviewed_boxes) before and
-- after, so a box deleted by a correction is not counted, a box whose class a correction
-- changed keeps it, and an item decided alone counts as decided.
CREATE FUNCTION sighting_decide_v3(
    p_run text, p_sighting text, p_state text, p_relabel text, p_by jsonb, p_now timestamptz
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    workflow text;
    s sightings%ROWTYPE;
    changed integer;
    run_pending bigint;
    run_accepted bigint;
    run_rejected bigint;
    old_items text[];
    old_positions integer[];
BEGIN
    SELECT r.workflow_id INTO workflow FROM run_facts_v1(p_run) r;
    SELECT * INTO s FROM sightings WHERE run_id = p_run AND sighting_id = p_sighting;
    -- the boxes that change: the sighting's items, each with the box it holds
    SELECT coalesce(array_agg(bi.item_id ORDER BY bi.item_id), '{}'),
           array_agg(m.position ORDER BY bi.item_id)
    INTO old_items, old_positions
    FROM bucket_items bi
    CROSS JOIN LATERAL (SELECT array_position(bi.box_sightings, p_sighting) AS position) m
    WHERE bi.run_id = p_run AND bi.frame_time >= s.first_frame_time
      AND bi.frame_time <= s.last_frame_time AND bi.bucket_id = s.bucket_id
      AND bi.camera_id = s.camera_id AND m.position IS NOT NULL
      AND (coalesce(bi.box_states[m.position], 'pending'), bi.box_relabels[m.position])
          IS DISTINCT FROM (p_state, p_relabel);
    changed := cardinality(old_items);
    INSERT INTO sighting_decisions (run_id, sighting_id, review_state, relabel_class, decided_by,
                                    decided_at, items_updated)
    VALUES (p_run, p_sighting, p_state, p_relabel, p_by, p_now, changed);
    IF changed = 0 THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM bucket_items WHERE item_id = ANY (old_items) ORDER BY item_id FOR UPDATE;

    WITH old AS (
        SELECT * FROM unnest(old_items, old_positions) AS o (item_id, box_position)
    ), arrays AS (
        -- each changed item's review arrays, whole, with the decided box set
        SELECT bi.item_id, a.*
        FROM old o
        JOIN bucket_items bi ON bi.item_id = o.item_id
        CROSS JOIN LATERAL (
            SELECT array_agg(CASE WHEN g = o.box_position THEN p_state
                                  ELSE coalesce(bi.box_states[g], 'pending') END ORDER BY g)
                       AS states,
                   array_agg(CASE WHEN g = o.box_position THEN p_relabel
                                  ELSE bi.box_relabels[g] END ORDER BY g) AS relabels,
                   array_agg(CASE WHEN g = o.box_position THEN p_by
                                  ELSE bi.box_decided_by[g] END ORDER BY g) AS decided_by,
                   array_agg(CASE WHEN g = o.box_position THEN p_now
                                  ELSE bi.box_decided_at[g] END ORDER BY g) AS decided_at
            FROM generate_series(1, greatest(jsonb_array_length(bi.boxes), 1)) AS g
        ) a
    ), class_deltas AS (
        SELECT d.bucket_id, d.class_name, sum(d.detections) AS detections,
               sum(d.confirmations) AS confirmations
        FROM (
            SELECT bi.bucket_id, r.class_name, -1 AS detections,
                   -(r.review_state = 'accepted')::integer AS confirmations
            FROM arrays a JOIN bucket_items bi ON bi.item_id = a.item_id
            CROSS JOIN LATERAL bucket_item_reviewed_boxes_v1(
                bi.boxes, bi.corrected_boxes, bi.box_states, bi.box_relabels, bi.item_state,
                bi.item_relabel) r
            UNION ALL
            SELECT bi.bucket_id, r.class_name, 1, (r.review_state = 'accepted')::integer
            FROM arrays a JOIN bucket_items bi ON bi.item_id = a.item_id
            CROSS JOIN LATERAL bucket_item_reviewed_boxes_v1(
                bi.boxes, bi.corrected_boxes, a.states, a.relabels, bi.item_state,
                bi.item_relabel) r
        ) d
        GROUP BY 1, 2
        HAVING sum(d.detections) <> 0 OR sum(d.confirmations) <> 0
    )
    INSERT INTO workflow_class_counts AS c (workflow_id, bucket_id, class_name, detections,
                                            confirmations)
    SELECT workflow, d.bucket_id, d.class_name, d.detections, d.confirmations
    FROM class_deltas d ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT workflow_class_counts_pkey DO UPDATE
    SET detections = c.detections + EXCLUDED.detections,
        confirmations = c.confirmations + EXCLUDED.confirmations;

    WITH old AS (
        SELECT * FROM unnest(old_items, old_positions) AS o (item_id, box_position)
    ), arrays AS (
        SELECT bi.item_id, bi.bucket_id, bi.recording_id, bi.recording_generation,
               bi.review_state AS was, bi.item_state, bi.item_relabel, bi.item_decided_at,
               a.*
        FROM old o
        JOIN bucket_items bi ON bi.item_id = o.item_id
        CROSS JOIN LATERAL (
            SELECT array_agg(CASE WHEN g = o.box_position THEN p_state
                                  ELSE coalesce(bi.box_states[g], 'pending') END ORDER BY g)
                       AS states,
                   array_agg(CASE WHEN g = o.box_position THEN p_relabel
                                  ELSE bi.box_relabels[g] END ORDER BY g) AS relabels,
                   array_agg(CASE WHEN g = o.box_position THEN p_by
                                  ELSE bi.box_decided_by[g] END ORDER BY g) AS decided_by,
                   array_agg(CASE WHEN g = o.box_position THEN p_now
                                  ELSE bi.box_decided_at[g] END ORDER BY g) AS decided_at
            FROM generate_series(1, greatest(jsonb_array_length(bi.boxes), 1)) AS g
        ) a
    ), review AS (
        SELECT a.*,
               coalesce(a.item_state,
                        CASE WHEN 'pending' = ANY (a.states) THEN 'pending'
                             WHEN 'accepted' = ANY (a.states) THEN 'accepted'
                             ELSE 'rejected' END) AS now,
               CASE WHEN a.item_state IS NOT NULL THEN a.item_relabel
                    ELSE (SELECT r FROM unnest(a.relabels) AS r WHERE r IS NOT NULL LIMIT 1)
               END AS relabel,
               greatest(a.item_decided_at, (SELECT max(t) FROM unnest(a.decided_at) AS t))
                   AS reviewed_at
        FROM arrays a
    ), updated AS (
        UPDATE bucket_items bi
        SET box_states = review.states, box_relabels = review.relabels,
            box_decided_by = review.decided_by, box_decided_at = review.decided_at,
            review_state = review.now, relabel_class = review.relabel,
            reviewed_at = review.reviewed_at
        FROM review WHERE bi.item_id = review.item_id
        RETURNING 1
    ), deltas AS (
        SELECT r.bucket_id, r.recording_id, r.recording_generation,
               sum((r.now = 'pending')::integer - (r.was = 'pending')::integer) AS pending,
               sum((r.now = 'accepted')::integer - (r.was = 'accepted')::integer) AS accepted,
               sum((r.now = 'rejected')::integer - (r.was = 'rejected')::integer) AS rejected
        FROM review r WHERE r.now <> r.was GROUP BY 1, 2, 3
    ), counted AS (
        INSERT INTO bucket_counts AS c (bucket_id, recording_id, recording_generation, images,
                                        pending, accepted, rejected, last_added_at)
        SELECT d.bucket_id, d.recording_id, d.recording_generation, 0, d.pending, d.accepted,
               d.rejected, p_now
        FROM deltas d ORDER BY 1, 2, 3
        ON CONFLICT ON CONSTRAINT bucket_counts_pkey DO UPDATE
        SET pending = c.pending + EXCLUDED.pending, accepted = c.accepted + EXCLUDED.accepted,
            rejected = c.rejected + EXCLUDED.rejected
        RETURNING 1
    )
    SELECT coalesce(sum(d.pending), 0), coalesce(sum(d.accepted), 0),
           coalesce(sum(d.rejected), 0)
    INTO run_pending, run_accepted, run_rejected
    FROM deltas d;
    UPDATE run_review_counts c
    SET pending = c.pending + run_pending, accepted = c.accepted + run_accepted,
        rejected = c.rejected + run_rejected
    WHERE c.run_id = p_run;
    RETURN changed;
END;
$$;
