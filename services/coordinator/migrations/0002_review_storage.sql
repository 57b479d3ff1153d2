-- Review storage without per-box rows (docs/review.md, "Storage"; docs/upgrading.md, 0002).
-- Pre-migration: adds the per-box review arrays on bucket_items and the sightings table,
-- fills them from sighting_boxes, and keeps the two storages in step while release-0.1
-- coordinators serve beside this version (the sync triggers below, which
-- 0003_drop_sighting_boxes drops with sighting_boxes).
--
-- Sections are marked `-- room: <room>`: what follows belongs to that room
-- (tests/unit/test_coordinator_sql_ownership.py).

-- room: review

-- Per box of an item, in box order (position p holds box p - 1; an item without boxes has
-- one element, its pseudo box -1): the box's sighting, and its review. box_sightings NULL:
-- not grouped yet (an item inserted by anything but a commit; the maintenance pass groups
-- it). A NULL review array, or a NULL element in one, is a box never decided: pending,
-- not relabelled. A commit writes box_sightings only; decisions write the rest.
ALTER TABLE bucket_items
    ADD COLUMN box_sightings text[],
    ADD COLUMN box_states text[],
    ADD COLUMN box_relabels text[],
    ADD COLUMN box_decided_by jsonb[],
    ADD COLUMN box_decided_at timestamptz[];

-- bucket_items_current with the new columns (after its own, as a view may grow).
CREATE OR REPLACE VIEW bucket_items_current AS
SELECT bi.item_id, bi.bucket_id, bi.run_id, bi.job_index, bi.slot_index, bi.step_id,
       bi.camera_id, bi.recording_id, bi.recording_generation, bi.frame_time, bi.boxes,
       bi.object_key, bi.sha256, bi.review_state, bi.relabel_class, bi.saved_at,
       bi.reviewed_at,
       (rec.generation = bi.recording_generation AND rec.deleted_at IS NULL) AS output_current,
       bi.box_sightings, bi.box_states, bi.box_relabels, bi.box_decided_by, bi.box_decided_at
FROM bucket_items bi
CROSS JOIN LATERAL recording_state_v1(bi.recording_id) rec;

-- One row per sighting: its items are those of its timeline (run, bucket, camera) in
-- [first_frame_time, last_frame_time] whose box_sightings hold its id (item_count of
-- them, one box each). Written once per committed job for the sightings the job touches.
CREATE TABLE sightings (
    run_id           text NOT NULL,
    sighting_id      text NOT NULL,
    bucket_id        text NOT NULL,
    camera_id        text NOT NULL,
    class_name       text NOT NULL,  -- as detected ('' for items without boxes)
    first_frame_time timestamptz NOT NULL,
    last_frame_time  timestamptz NOT NULL,
    item_count       integer NOT NULL CHECK (item_count > 0),
    PRIMARY KEY (run_id, sighting_id)
);

CREATE INDEX sightings_by_bucket ON sightings (bucket_id);

-- A timeline's items in frame order: a sighting's items are a range of it (GetReview's
-- sightings, decisions), and a commit reads the range it regroups. (by_run_frame holds
-- every camera's and bucket's items of a run in one range: a 500-item sighting read
-- 5,000 rows there in bench.review --quick.)
CREATE INDEX bucket_items_by_timeline ON bucket_items (run_id, bucket_id, camera_id, frame_time);

-- The items nothing grouped yet (none, once the maintenance pass caught up).
CREATE INDEX bucket_items_ungrouped ON bucket_items (run_id, bucket_id, camera_id)
    WHERE box_sightings IS NULL;

-- The boxes of an item's `boxes` as review reads them, in box order: box_index -1 (one row,
-- class '' and zeros) for an item without boxes; box_position is the element of the
-- item's per-box arrays that holds the box.
-- public: leases (job_commit_boxes)
CREATE FUNCTION bucket_item_boxes_of_v1(p_boxes jsonb)
RETURNS TABLE (box_index integer, box_position integer, class_name text, score real, x real,
               y real, w real, h real, track_id bigint)
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(b.ordinal - 1, -1)::integer, coalesce(b.ordinal, 1)::integer,
           coalesce(b.box ->> 'class_name', ''), coalesce((b.box ->> 'score')::real, 0),
           coalesce((b.box ->> 'x')::real, 0), coalesce((b.box ->> 'y')::real, 0),
           coalesce((b.box ->> 'w')::real, 0), coalesce((b.box ->> 'h')::real, 0),
           (b.box ->> 'track_id')::bigint
    FROM (SELECT 1) one
    LEFT JOIN LATERAL jsonb_array_elements(p_boxes) WITH ORDINALITY AS b (box, ordinal) ON true
$$;

-- Backfill from sighting_boxes: every item's arrays (box_sightings NULL while a box is
-- ungrouped; review arrays only for items with a decided box), then the sightings.
UPDATE bucket_items bi
SET box_sightings = g.sightings, box_states = g.states, box_relabels = g.relabels,
    box_decided_by = g.decided_by, box_decided_at = g.decided_at
FROM (
    SELECT sb.item_id,
           CASE WHEN bool_or(sb.sighting_id = '') THEN NULL
                ELSE array_agg(sb.sighting_id ORDER BY sb.box_index) END AS sightings,
           CASE WHEN bool_or(sb.review_state <> 'pending' OR sb.decided_at IS NOT NULL
                             OR sb.relabel_class IS NOT NULL) THEN
                array_agg(sb.review_state ORDER BY sb.box_index) END AS states,
           CASE WHEN bool_or(sb.relabel_class IS NOT NULL) THEN
                array_agg(sb.relabel_class ORDER BY sb.box_index) END AS relabels,
           CASE WHEN bool_or(sb.decided_at IS NOT NULL) THEN
                array_agg(sb.decided_by ORDER BY sb.box_index) END AS decided_by,
           CASE WHEN bool_or(sb.decided_at IS NOT NULL) THEN
                array_agg(sb.decided_at ORDER BY sb.box_index) END AS decided_at
    FROM sighting_boxes sb
    GROUP BY sb.item_id
) g
WHERE bi.item_id = g.item_id;

INSERT INTO sightings (run_id, sighting_id, bucket_id, camera_id, class_name,
                       first_frame_time, last_frame_time, item_count)
SELECT sb.run_id, sb.sighting_id, min(sb.bucket_id), min(sb.camera_id), min(sb.class_name),
       min(sb.frame_time), max(sb.frame_time), count(*)
FROM sighting_boxes sb
WHERE sb.sighting_id <> ''
GROUP BY sb.run_id, sb.sighting_id;

-- Locks the timeline of the box (p_item, p_box) of run p_run and answers, read after the
-- lock, the sighting the box belongs to now ('' while ungrouped) and whether the timeline
-- has items to group. No row: the run has no such box.
CREATE FUNCTION sighting_lock_v2(p_run text, p_item text, p_box integer)
RETURNS TABLE (bucket_id text, camera_id text, sighting_id text, ungrouped boolean)
LANGUAGE plpgsql AS $$
DECLARE
    found_bucket text;
    found_camera text;
BEGIN
    SELECT bi.bucket_id, bi.camera_id INTO found_bucket, found_camera
    FROM bucket_items bi
    WHERE bi.item_id = p_item AND bi.run_id = p_run
      AND CASE WHEN p_box = -1 THEN jsonb_array_length(bi.boxes) = 0
               ELSE p_box >= 0 AND p_box < jsonb_array_length(bi.boxes) END;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM 1 FROM sighting_timelines t
    WHERE t.run_id = p_run AND t.bucket_id = found_bucket AND t.camera_id = found_camera
    FOR UPDATE;
    RETURN QUERY
    SELECT found_bucket, found_camera,
           (SELECT coalesce(bi.box_sightings[greatest(p_box, 0) + 1], '')
            FROM bucket_items bi WHERE bi.item_id = p_item),
           EXISTS (SELECT 1 FROM bucket_items bi
                   WHERE bi.run_id = p_run AND bi.bucket_id = found_bucket
                     AND bi.camera_id = found_camera AND bi.box_sightings IS NULL);
END;
$$;

-- Sets the review of every box of a sighting, the review of its items, and the counters,
-- under the timeline lock sighting_lock took. An item's state follows its boxes: pending
-- while any box is pending, else accepted when any box is accepted, else rejected; its
-- relabel is its first relabelled box's. Returns the number of items whose box changed.
CREATE FUNCTION sighting_decide_v2(
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
    old_boxes integer[];
    old_buckets text[];
    old_classes text[];
    old_states text[];
    old_relabels text[];
BEGIN
    SELECT r.workflow_id INTO workflow FROM run_facts_v1(p_run) r;
    SELECT * INTO s FROM sightings WHERE run_id = p_run AND sighting_id = p_sighting;
    -- the boxes that change: the sighting's items, each with the box it holds
    SELECT coalesce(array_agg(bi.item_id), '{}'), array_agg(m.position),
           array_agg(jsonb_array_length(bi.boxes)), array_agg(bi.bucket_id),
           array_agg(coalesce(bi.boxes -> (m.position - 1) ->> 'class_name', '')),
           array_agg(coalesce(bi.box_states[m.position], 'pending')),
           array_agg(bi.box_relabels[m.position])
    INTO old_items, old_positions, old_boxes, old_buckets, old_classes, old_states, old_relabels
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

    WITH old AS (
        SELECT * FROM unnest(old_items, old_positions, old_boxes, old_buckets, old_classes,
                             old_states, old_relabels)
            AS o (item_id, box_position, boxes, bucket_id, class_name, review_state,
                  relabel_class)
    ), deltas AS (
        SELECT d.bucket_id, d.class_name, sum(d.detections) AS detections,
               sum(d.confirmations) AS confirmations
        FROM (
            SELECT o.bucket_id, coalesce(o.relabel_class, o.class_name) AS class_name,
                   -1 AS detections, -(o.review_state = 'accepted')::integer AS confirmations
            FROM old o WHERE o.boxes > 0
            UNION ALL
            SELECT o.bucket_id, coalesce(p_relabel, o.class_name), 1,
                   (p_state = 'accepted')::integer
            FROM old o WHERE o.boxes > 0
        ) d
        GROUP BY 1, 2
        HAVING sum(d.detections) <> 0 OR sum(d.confirmations) <> 0
    )
    INSERT INTO workflow_class_counts AS c (workflow_id, bucket_id, class_name, detections,
                                            confirmations)
    SELECT workflow, d.bucket_id, d.class_name, d.detections, d.confirmations
    FROM deltas d ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT workflow_class_counts_pkey DO UPDATE
    SET detections = c.detections + EXCLUDED.detections,
        confirmations = c.confirmations + EXCLUDED.confirmations;

    WITH old AS (
        SELECT * FROM unnest(old_items, old_positions, old_boxes)
            AS o (item_id, box_position, boxes)
    ), arrays AS (
        -- each changed item's review arrays, whole, with the decided box set
        SELECT bi.item_id, bi.bucket_id, bi.recording_id, bi.recording_generation,
               bi.review_state AS was, a.*
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
            FROM generate_series(1, greatest(o.boxes, 1)) AS g
        ) a
    ), review AS (
        SELECT a.*,
               CASE WHEN 'pending' = ANY (a.states) THEN 'pending'
                    WHEN 'accepted' = ANY (a.states) THEN 'accepted'
                    ELSE 'rejected' END AS now,
               (SELECT r FROM unnest(a.relabels) AS r WHERE r IS NOT NULL LIMIT 1) AS relabel,
               (SELECT max(t) FROM unnest(a.decided_at) AS t) AS reviewed_at
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
    -- after the bucket counters (the lock order), and a sighting's items are of one run
    UPDATE run_review_counts c
    SET pending = c.pending + run_pending, accepted = c.accepted + run_accepted,
        rejected = c.rejected + run_rejected
    WHERE c.run_id = p_run;
    RETURN changed;
END;
$$;

-- Inserts a committed job's bucket items (leases' job_complete, in the committing
-- transaction, after its fences): one per element of the arrays, each with its boxes
-- (JSON) and, grouped before they are written, their sightings (p_item_sightings: a text
-- array literal per item, its box_sightings; NULL: ungrouped), of the job's camera and
-- recording at the generation it was admitted at. The statement trigger counts them
-- (bucket_items_review).
-- public: leases (job_complete)
CREATE FUNCTION bucket_items_insert_v2(
    p_run text, p_job integer, p_camera text, p_recording text, p_recording_generation bigint,
    p_item_ids text[], p_item_buckets text[], p_item_slots integer[], p_item_steps text[],
    p_item_times timestamptz[], p_item_boxes jsonb[], p_item_sightings text[],
    p_item_keys text[], p_item_sha256 text[], p_now timestamptz
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bucket_items (item_id, bucket_id, run_id, job_index, slot_index, step_id,
                              camera_id, recording_id, recording_generation, frame_time, boxes,
                              box_sightings, object_key, sha256, saved_at)
    SELECT u.item_id, u.bucket_id, p_run, p_job, u.slot, u.step_id, p_camera, p_recording,
           p_recording_generation, u.frame_time, u.boxes, u.sightings::text[], u.object_key,
           u.sha256, p_now
    FROM unnest(p_item_ids, p_item_buckets, p_item_slots, p_item_steps, p_item_times,
                p_item_boxes, p_item_sightings, p_item_keys, p_item_sha256)
         AS u (item_id, bucket_id, slot, step_id, frame_time, boxes, sightings, object_key,
               sha256);
END;
$$;

-- A run's bucket item by its id, as reading its image needs it: its boxes after review
-- relabels (docs/review.md). No row: the run has no such item.
-- public: previews (image_for_read)
CREATE FUNCTION bucket_item_for_read_v2(p_run text, p_item text)
RETURNS TABLE (object_key text, boxes jsonb, frame_time timestamptz, camera_id text,
               sha256 text)
LANGUAGE sql STABLE AS $$
    SELECT bi.object_key,
           (SELECT coalesce(jsonb_agg(
                       CASE WHEN bi.box_relabels[b.ordinal] IS NULL THEN b.box
                            ELSE jsonb_set(b.box, '{class_name}',
                                           to_jsonb(bi.box_relabels[b.ordinal])) END
                       ORDER BY b.ordinal), '[]'::jsonb)
            FROM jsonb_array_elements(bi.boxes) WITH ORDINALITY AS b (box, ordinal)),
           bi.frame_time, bi.camera_id, bi.sha256
    FROM bucket_items bi
    WHERE bi.run_id = p_run AND bi.item_id = p_item
$$;

-- Implements resources' bucket_items_delete_v1 (3_resources.sql), as the baseline does,
-- and deletes the bucket's sightings too (a body-only change: its callers, release 0.1's
-- included, get the outcomes they expect).
CREATE OR REPLACE FUNCTION bucket_items_delete_v1(p_bucket text, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    deleted integer;
    released text[];
BEGIN
    PERFORM 1 FROM sighting_timelines t WHERE t.bucket_id = p_bucket
    ORDER BY t.run_id, t.bucket_id, t.camera_id FOR UPDATE;
    WITH gone AS (
        DELETE FROM bucket_items WHERE bucket_id = p_bucket
        RETURNING object_key, run_id, review_state
    ), uncounted AS (
        UPDATE run_review_counts c
        SET pending = c.pending - g.pending, accepted = c.accepted - g.accepted,
            rejected = c.rejected - g.rejected
        FROM (SELECT gone.run_id, count(*) FILTER (WHERE review_state = 'pending') AS pending,
                     count(*) FILTER (WHERE review_state = 'accepted') AS accepted,
                     count(*) FILTER (WHERE review_state = 'rejected') AS rejected
              FROM gone GROUP BY gone.run_id) g
        WHERE c.run_id = g.run_id
        RETURNING 1
    )
    -- an upload another bucket still shows stays
    SELECT count(*),
           coalesce(array_agg(DISTINCT gone.object_key) FILTER (
               WHERE NOT EXISTS (SELECT 1 FROM bucket_items other
                                 WHERE other.object_key = gone.object_key
                                   AND other.bucket_id <> p_bucket)), '{}')
    INTO deleted, released
    FROM gone;
    IF cardinality(released) > 0 THEN
        PERFORM objects_release_v1(released, p_now);
    END IF;
    DELETE FROM sightings WHERE bucket_id = p_bucket;
    DELETE FROM sighting_timelines WHERE bucket_id = p_bucket;
    DELETE FROM bucket_counts WHERE bucket_id = p_bucket;
    DELETE FROM workflow_class_counts WHERE bucket_id = p_bucket;
    DELETE FROM workflow_day_counts WHERE bucket_id = p_bucket;
    RETURN deleted;
END;
$$;

-- The rollout's two-way sync (dropped by 0003 with sighting_boxes). Release 0.1 reads and
-- writes sighting_boxes; this version reads and writes the arrays and sightings. Each
-- storage's writes are copied into the other by statement triggers (transition tables);
-- a write the other direction's trigger makes (pg_trigger_depth() > 1) is not copied
-- back.

-- Release 0.1's writes of sighting_boxes (its commits' grouped boxes, regroups and
-- decisions): the items' arrays and the sightings they touch, recomputed from
-- sighting_boxes.
CREATE FUNCTION sighting_boxes_synced_v1() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    items text[];
    run_ids text[];
    old_ids text[];
    new_ids text[];
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(n.item_id), array_agg(n.run_id), array_agg(NULL::text),
               array_agg(n.sighting_id)
        INTO items, run_ids, old_ids, new_ids
        FROM new_boxes n;
    ELSE
        SELECT array_agg(n.item_id), array_agg(n.run_id), array_agg(o.sighting_id),
               array_agg(n.sighting_id)
        INTO items, run_ids, old_ids, new_ids
        FROM new_boxes n JOIN old_boxes o ON o.item_id = n.item_id AND o.box_index = n.box_index;
    END IF;
    IF items IS NULL THEN
        RETURN NULL;
    END IF;
    UPDATE bucket_items bi
    SET box_sightings = g.sightings, box_states = g.states, box_relabels = g.relabels,
        box_decided_by = g.decided_by, box_decided_at = g.decided_at
    FROM (
        SELECT sb.item_id,
               CASE WHEN bool_or(sb.sighting_id = '') THEN NULL
                    ELSE array_agg(sb.sighting_id ORDER BY sb.box_index) END AS sightings,
               array_agg(sb.review_state ORDER BY sb.box_index) AS states,
               array_agg(sb.relabel_class ORDER BY sb.box_index) AS relabels,
               array_agg(sb.decided_by ORDER BY sb.box_index) AS decided_by,
               array_agg(sb.decided_at ORDER BY sb.box_index) AS decided_at
        FROM sighting_boxes sb
        WHERE sb.item_id = ANY (items)
        GROUP BY sb.item_id
    ) g
    WHERE bi.item_id = g.item_id;
    -- the sightings whose boxes changed sighting (not those only decided)
    WITH ids AS (
        SELECT DISTINCT c.run_id, s.sighting_id
        FROM unnest(run_ids, old_ids, new_ids) AS c (run_id, old_sighting, new_sighting)
        CROSS JOIN LATERAL (VALUES (c.old_sighting), (c.new_sighting)) AS s (sighting_id)
        WHERE c.old_sighting IS DISTINCT FROM c.new_sighting AND s.sighting_id <> ''
    ), found AS (
        SELECT ids.run_id, ids.sighting_id, a.*
        FROM ids CROSS JOIN LATERAL (
            SELECT min(sb.bucket_id) AS bucket_id, min(sb.camera_id) AS camera_id,
                   min(sb.class_name) AS class_name, min(sb.frame_time) AS first_frame_time,
                   max(sb.frame_time) AS last_frame_time, count(*) AS item_count
            FROM sighting_boxes sb WHERE sb.sighting_id = ids.sighting_id) a
    ), gone AS (
        DELETE FROM sightings s USING found f
        WHERE f.item_count = 0 AND s.run_id = f.run_id AND s.sighting_id = f.sighting_id
        RETURNING 1
    )
    INSERT INTO sightings AS s (run_id, sighting_id, bucket_id, camera_id, class_name,
                                first_frame_time, last_frame_time, item_count)
    SELECT f.run_id, f.sighting_id, f.bucket_id, f.camera_id, f.class_name,
           f.first_frame_time, f.last_frame_time, f.item_count
    FROM found f WHERE f.item_count > 0
    ORDER BY 1, 2
    ON CONFLICT ON CONSTRAINT sightings_pkey DO UPDATE
    SET first_frame_time = EXCLUDED.first_frame_time,
        last_frame_time = EXCLUDED.last_frame_time, item_count = EXCLUDED.item_count;
    RETURN NULL;
END;
$$;

CREATE TRIGGER sighting_boxes_sync_added
    AFTER INSERT ON sighting_boxes REFERENCING NEW TABLE AS new_boxes
    FOR EACH STATEMENT EXECUTE FUNCTION sighting_boxes_synced_v1();

CREATE TRIGGER sighting_boxes_sync_changed
    AFTER UPDATE ON sighting_boxes REFERENCING OLD TABLE AS old_boxes NEW TABLE AS new_boxes
    FOR EACH STATEMENT EXECUTE FUNCTION sighting_boxes_synced_v1();

-- This version's writes of items: a grouped item's boxes go into sighting_boxes (an
-- ungrouped one's are added by release 0.1's bucket_items_boxes at commit, as before), and
-- changed arrays (regroups, decisions) update them there.
CREATE FUNCTION bucket_items_mirrored_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO sighting_boxes (item_id, box_index, run_id, bucket_id, camera_id,
                                    frame_time, class_name, score, x, y, w, h, track_id,
                                    sighting_id, review_state, relabel_class, decided_by,
                                    decided_at)
        SELECT n.item_id, b.box_index, n.run_id, n.bucket_id, n.camera_id, n.frame_time,
               b.class_name, b.score, b.x, b.y, b.w, b.h, b.track_id,
               n.box_sightings[b.box_position],
               coalesce(n.box_states[b.box_position], 'pending'),
               n.box_relabels[b.box_position], n.box_decided_by[b.box_position],
               n.box_decided_at[b.box_position]
        FROM new_items n CROSS JOIN LATERAL bucket_item_boxes_of_v1(n.boxes) b
        WHERE n.box_sightings IS NOT NULL;
    ELSE
        UPDATE sighting_boxes sb
        SET sighting_id = coalesce(n.box_sightings[greatest(sb.box_index, 0) + 1], ''),
            review_state = coalesce(n.box_states[greatest(sb.box_index, 0) + 1], 'pending'),
            relabel_class = n.box_relabels[greatest(sb.box_index, 0) + 1],
            decided_by = n.box_decided_by[greatest(sb.box_index, 0) + 1],
            decided_at = n.box_decided_at[greatest(sb.box_index, 0) + 1]
        FROM new_items n JOIN old_items o ON o.item_id = n.item_id
        WHERE sb.item_id = n.item_id
          AND (o.box_sightings, o.box_states, o.box_relabels, o.box_decided_by,
               o.box_decided_at)
              IS DISTINCT FROM (n.box_sightings, n.box_states, n.box_relabels,
                                n.box_decided_by, n.box_decided_at);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER bucket_items_mirror_added
    AFTER INSERT ON bucket_items REFERENCING NEW TABLE AS new_items
    FOR EACH STATEMENT EXECUTE FUNCTION bucket_items_mirrored_v1();

CREATE TRIGGER bucket_items_mirror_changed
    AFTER UPDATE ON bucket_items REFERENCING OLD TABLE AS old_items NEW TABLE AS new_items
    FOR EACH STATEMENT EXECUTE FUNCTION bucket_items_mirrored_v1();

-- room: leases

-- Locks a job about to commit (as its fences will) and answers its camera and each item's
-- boxes as the commit will save them (sent as p_item_boxes, JSON text, or, NULL, those
-- recorded with the upload's preview), as review reads them (bucket_item_boxes_of: box
-- -1 for an item without boxes), in item and box order: the committing transaction
-- groups them before job_complete writes them. No row: no such job.
CREATE FUNCTION job_commit_boxes_v1(p_run text, p_job integer, p_item_boxes text[],
                                    p_item_keys text[])
RETURNS TABLE (camera_id text, item_position integer, box_index integer, class_name text,
               x real, y real, w real, h real)
LANGUAGE plpgsql AS $$
DECLARE
    camera text;
BEGIN
    SELECT j.camera_id INTO camera FROM jobs j
    WHERE j.run_id = p_run AND j.job_index = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT camera, u.o::integer, b.box_index, b.class_name, b.x, b.y, b.w, b.h
    FROM unnest(p_item_boxes, p_item_keys) WITH ORDINALITY AS u (boxes, object_key, o)
    LEFT JOIN staged_objects s ON u.boxes IS NULL AND s.object_key = u.object_key
    CROSS JOIN LATERAL bucket_item_boxes_of_v1(coalesce(u.boxes::jsonb, s.boxes, '[]')) b
    ORDER BY u.o, b.box_index;
END;
$$;

-- job_complete_v1 with each item's sightings (p_item_sightings, grouped by the committing
-- transaction before the items are written: review's bucket_items_insert_v2).
CREATE FUNCTION job_complete_v2(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_result_sha256 text, p_decoder text,
    p_slot_count integer, p_first_slot_at timestamptz, p_interval_ms integer,
    p_frames integer, p_empties integer, p_dropped integer,
    p_upload_keys text[], p_upload_sha256 text[], p_upload_slots integer[],
    p_item_ids text[], p_item_buckets text[], p_item_slots integer[], p_item_steps text[],
    p_item_times timestamptz[], p_item_boxes text[], p_item_sightings text[],
    p_item_keys text[], p_item_sha256 text[], p_now timestamptz
) RETURNS TABLE (
    reason text, receipt_generation bigint, receipt_sha256 text,
    receipt_committed_at timestamptz, receipt_items_saved integer
) LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence_v1(p_run, p_job, p_generation, p_token, p_reporter, p_code, p_now);
    staged integer;
    j jobs%ROWTYPE;
    rc receipts%ROWTYPE;
BEGIN
    IF fenced <> '' THEN
        SELECT * INTO rc FROM receipts
        WHERE run_id = p_run AND job_index = p_job AND generation = p_generation;
        RETURN QUERY SELECT fenced, rc.generation, rc.result_sha256, rc.committed_at,
                            rc.items_saved;
        RETURN;
    END IF;
    SELECT * INTO j FROM jobs WHERE run_id = p_run AND job_index = p_job;
    IF j.slot_count <> p_slot_count OR j.first_slot_at <> p_first_slot_at
       OR j.interval_ms <> p_interval_ms THEN
        RETURN QUERY SELECT 'FACTS_MISMATCH', NULL::bigint, NULL::text, NULL::timestamptz,
                            NULL::integer;
        RETURN;
    END IF;
    -- A result that saves nothing (test runs, empty jobs) skips the uploads, the items
    -- and their statement trigger (review_items_added) altogether. An upload is a staged
    -- upload, or a published preview of the same frame (kept rows only: a refused record
    -- is collectable at once).
    IF cardinality(p_upload_keys) > 0 THEN
        SELECT count(*) INTO staged
        FROM unnest(p_upload_keys, p_upload_sha256, p_upload_slots)
             AS u (object_key, sha256, slot)
        JOIN staged_objects s ON s.object_key = u.object_key
        WHERE (s.kind = 'upload' OR s.published_at IS NOT NULL)
          AND s.run_id = p_run AND s.job_index = p_job
          AND s.generation = p_generation AND s.slot_index = u.slot AND s.sha256 = u.sha256
          AND s.collectable_at IS NULL AND s.deleted_at IS NULL;
        IF staged <> cardinality(p_upload_keys) THEN
            RETURN QUERY SELECT 'UPLOAD_NOT_STAGED', NULL::bigint, NULL::text,
                                NULL::timestamptz, NULL::integer;
            RETURN;
        END IF;
        -- An item without boxes (NULL) takes those recorded with its upload's preview
        -- (RoutedOutput.boxes_recorded): a staged upload has none to give.
        IF EXISTS (SELECT 1 FROM unnest(p_item_boxes, p_item_keys) AS u (boxes, object_key)
                   JOIN staged_objects s ON s.object_key = u.object_key
                   WHERE u.boxes IS NULL AND s.boxes IS NULL) THEN
            RETURN QUERY SELECT 'BOXES_NOT_RECORDED', NULL::bigint, NULL::text,
                                NULL::timestamptz, NULL::integer;
            RETURN;
        END IF;
        -- a preview named as an upload becomes one: its item replaces it
        UPDATE staged_objects SET kind = 'upload', published_at = p_now
        WHERE object_key = ANY (p_upload_keys);
    END IF;
    IF cardinality(p_item_ids) > 0 THEN
        -- the items are review's (bucket_items_insert), each with its boxes: as sent, or
        -- those recorded with its upload's preview; and their sightings
        PERFORM bucket_items_insert_v2(
            p_run, p_job, j.camera_id, j.recording_id, j.recording_generation, p_item_ids,
            p_item_buckets, p_item_slots, p_item_steps, p_item_times,
            ARRAY(SELECT coalesce(u.boxes::jsonb, s.boxes)
                  FROM unnest(p_item_boxes, p_item_keys) WITH ORDINALITY AS u (boxes, object_key, o)
                  LEFT JOIN staged_objects s ON u.boxes IS NULL AND s.object_key = u.object_key
                  ORDER BY u.o),
            p_item_sightings, p_item_keys, p_item_sha256, p_now);
    END IF;
    -- What the commit does not keep is garbage now: objects staged but never
    -- published or named (refused previews, unnamed uploads), and a full run's
    -- other previews, which its items replace.
    PERFORM job_objects_abandon_v1(p_run, p_job, p_now);
    INSERT INTO receipts (run_id, job_index, generation, result_sha256, frames, empties, dropped,
                          items_saved, committed_at)
    VALUES (p_run, p_job, p_generation, p_result_sha256, p_frames, p_empties, p_dropped,
            cardinality(p_item_ids), p_now);
    UPDATE jobs
    SET state = 'completed', progress = 100, lease_token = NULL, lease_expires_at = NULL,
        result_sha256 = p_result_sha256, committed_at = p_now, decoder = p_decoder,
        updated_at = p_now
    WHERE run_id = p_run AND job_index = p_job;
    PERFORM pg_notify('workshop_run', p_run);
    RETURN QUERY SELECT '', p_generation, p_result_sha256, p_now, cardinality(p_item_ids);
END;
$$;
