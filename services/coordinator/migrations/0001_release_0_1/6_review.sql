-- Release 0.1, room review: its tables, indexes, triggers and functions.

-- A full run's labeled frames, committed a whole job at a time.
CREATE TABLE bucket_items (
    item_id              text PRIMARY KEY,
    bucket_id            text NOT NULL REFERENCES buckets (bucket_id),
    run_id               text NOT NULL,
    job_index            integer NOT NULL,
    slot_index           integer NOT NULL,
    step_id              text NOT NULL,
    camera_id            text NOT NULL,
    recording_id         text NOT NULL,
    recording_generation bigint NOT NULL,
    frame_time           timestamptz NOT NULL,
    boxes                jsonb NOT NULL,
    object_key           text NOT NULL,
    sha256               text NOT NULL,
    review_state         text NOT NULL DEFAULT 'pending'
        CHECK (review_state IN ('pending', 'accepted', 'rejected')),
    relabel_class        text,
    saved_at             timestamptz NOT NULL,
    reviewed_at          timestamptz,
    UNIQUE (run_id, job_index, slot_index, step_id)
    -- and the job that made it (run_id, job_index) exists: 7_leases.sql, where jobs is made
);

CREATE INDEX bucket_items_by_recording ON bucket_items (recording_id);

-- Bucket items with `output_current`: false once the source recording was
-- replaced (a newer generation) or deleted since the item was made (docs/leases-and-fences.md).
CREATE VIEW bucket_items_current AS
SELECT bi.*,
       (rec.generation = bi.recording_generation AND rec.deleted_at IS NULL) AS output_current
FROM bucket_items bi
CROSS JOIN LATERAL recording_state_v1(bi.recording_id) rec;

-- Review, sightings and the summary's counters (docs/review.md).

CREATE TABLE sighting_timelines (
    run_id    text NOT NULL,
    bucket_id text NOT NULL,
    camera_id text NOT NULL,
    PRIMARY KEY (run_id, bucket_id, camera_id)
);

CREATE TABLE sighting_boxes (
    item_id       text NOT NULL REFERENCES bucket_items (item_id) ON DELETE CASCADE,
    box_index     integer NOT NULL CHECK (box_index >= -1),
    run_id        text NOT NULL,
    bucket_id     text NOT NULL,
    camera_id     text NOT NULL,
    frame_time    timestamptz NOT NULL,
    -- the box as detected (a copy of bucket_items.boxes[box_index], which review pages
    -- read from here); class '' and zeros for an item without boxes
    class_name    text NOT NULL,
    score         real NOT NULL,
    x             real NOT NULL,
    y             real NOT NULL,
    w             real NOT NULL,
    h             real NOT NULL,
    track_id      bigint,
    sighting_id   text NOT NULL,  -- '' until grouped
    review_state  text NOT NULL DEFAULT 'pending'
        CHECK (review_state IN ('pending', 'accepted', 'rejected')),
    relabel_class text,
    decided_by    jsonb,
    decided_at    timestamptz,
    PRIMARY KEY (item_id, box_index)
) WITH (fillfactor = 70);

CREATE INDEX sighting_boxes_by_sighting ON sighting_boxes (sighting_id, frame_time, item_id);

CREATE INDEX sighting_boxes_by_timeline
    ON sighting_boxes (run_id, bucket_id, camera_id, frame_time, item_id);

CREATE INDEX sighting_boxes_by_run_frame ON sighting_boxes (run_id, frame_time, item_id);

CREATE INDEX sighting_boxes_ungrouped ON sighting_boxes (run_id, bucket_id, camera_id)
    WHERE sighting_id = '';

-- Every decision as it was asked, also one that changed nothing.
CREATE TABLE sighting_decisions (
    decision_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id        text NOT NULL,
    sighting_id   text NOT NULL,
    review_state  text NOT NULL,
    relabel_class text,
    decided_by    jsonb NOT NULL,
    decided_at    timestamptz NOT NULL,
    items_updated integer NOT NULL
);

CREATE INDEX sighting_decisions_by_sighting ON sighting_decisions (run_id, sighting_id);

CREATE TABLE bucket_counts (
    bucket_id            text NOT NULL,
    recording_id         text NOT NULL,
    recording_generation bigint NOT NULL,
    images               bigint NOT NULL,
    pending              bigint NOT NULL,
    accepted             bigint NOT NULL,
    rejected             bigint NOT NULL,
    last_added_at        timestamptz NOT NULL,
    PRIMARY KEY (bucket_id, recording_id, recording_generation)
);

-- A run's items by review state (ListRuns' review_counts).
CREATE TABLE run_review_counts (
    run_id   text PRIMARY KEY,
    pending  bigint NOT NULL,
    accepted bigint NOT NULL,
    rejected bigint NOT NULL
);

CREATE TABLE workflow_class_counts (
    workflow_id   text NOT NULL,
    bucket_id     text NOT NULL,
    class_name    text NOT NULL,  -- after relabels
    detections    bigint NOT NULL,
    confirmations bigint NOT NULL,
    PRIMARY KEY (workflow_id, bucket_id, class_name)
);

-- Items saved per quarter hour (UTC): every time zone in use is a whole number of
-- quarter hours from UTC, so any zone's days are sums of whole quarters.
CREATE TABLE workflow_day_counts (
    workflow_id   text NOT NULL,
    bucket_id     text NOT NULL,
    quarter_start timestamptz NOT NULL,
    images        bigint NOT NULL,
    PRIMARY KEY (workflow_id, bucket_id, quarter_start)
);

-- Room in every page for a decision's new row versions: review columns are not indexed,
-- so with free space an update stays on its page and touches no index (a HOT update).
ALTER TABLE bucket_items SET (fillfactor = 80);

CREATE INDEX bucket_items_by_run_frame ON bucket_items (run_id, frame_time, item_id);

CREATE INDEX bucket_items_by_bucket_frame ON bucket_items (bucket_id, frame_time, item_id);

-- Every insert of bucket items locks their timelines (in key order: the lock order every
-- writer of sightings keeps: timelines, then items and boxes, then the counters (class,
-- bucket, run, day), each in key order) and counts them, whichever code inserts them:
-- what committing them into buckets changes for the summary. The rows are read from the
-- statement's transition table (migration 0023). The committing coordinator then adds
-- their boxes grouped (review.group_committed), or bucket_items_boxes adds them ungrouped
-- at commit (also for a coordinator of an older version during a rolling upgrade) and the
-- maintenance pass groups them (migration 0019).
CREATE FUNCTION bucket_items_added_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sighting_timelines AS t (run_id, bucket_id, camera_id)
    SELECT DISTINCT a.run_id, a.bucket_id, a.camera_id FROM added a
    ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT sighting_timelines_pkey DO UPDATE SET run_id = t.run_id;

    -- new boxes are pending and not relabelled: their class as detected, no confirmation
    INSERT INTO workflow_class_counts AS c (workflow_id, bucket_id, class_name, detections,
                                            confirmations)
    SELECT r.workflow_id, a.bucket_id, coalesce(b.box ->> 'class_name', ''), count(*), 0
    FROM added a CROSS JOIN LATERAL run_facts_v1(a.run_id) r
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
    FROM added a CROSS JOIN LATERAL run_facts_v1(a.run_id) r
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT workflow_day_counts_pkey DO UPDATE SET images = c.images + EXCLUDED.images;
    RETURN NULL;
END;
$$;

CREATE TRIGGER bucket_items_review
    AFTER INSERT ON bucket_items REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION bucket_items_added_v1();

-- At commit, for each inserted item: its boxes (sighting_id '', ungrouped) if nothing
-- added them in the transaction (group_committed does, grouped) and the item is still there.
CREATE FUNCTION bucket_item_boxes_v1() RETURNS trigger LANGUAGE plpgsql AS $$
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
    FOR EACH ROW EXECUTE FUNCTION bucket_item_boxes_v1();

-- Locks the timeline of the box (p_item, p_box) of run p_run and answers, read after the
-- lock, the sighting the box belongs to now and whether the timeline has boxes to group.
-- No row: the run has no such box.
CREATE FUNCTION sighting_lock_v1(p_run text, p_item text, p_box integer)
RETURNS TABLE (bucket_id text, camera_id text, sighting_id text, ungrouped boolean)
LANGUAGE plpgsql AS $$
DECLARE
    b sighting_boxes%ROWTYPE;
BEGIN
    SELECT * INTO b FROM sighting_boxes sb
    WHERE sb.item_id = p_item AND sb.box_index = p_box AND sb.run_id = p_run;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM 1 FROM sighting_timelines t
    WHERE t.run_id = p_run AND t.bucket_id = b.bucket_id AND t.camera_id = b.camera_id
    FOR UPDATE;
    RETURN QUERY
    SELECT b.bucket_id, b.camera_id,
           (SELECT sb.sighting_id FROM sighting_boxes sb
            WHERE sb.item_id = p_item AND sb.box_index = p_box),
           EXISTS (SELECT 1 FROM sighting_boxes sb
                   WHERE sb.run_id = p_run AND sb.bucket_id = b.bucket_id
                     AND sb.camera_id = b.camera_id AND sb.sighting_id = '');
END;
$$;

-- Sets the review of every box of a sighting, the review state of its items that it
-- changes, and the counters, under the timeline lock sighting_lock took. An item's state
-- follows its boxes: pending while any box is pending, else accepted when any box is
-- accepted, else rejected. Returns the number of items whose review changed.
CREATE FUNCTION sighting_decide_v1(
    p_run text, p_sighting text, p_state text, p_relabel text, p_by jsonb, p_now timestamptz
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    workflow text;
    changed integer;
    run_pending bigint;
    run_accepted bigint;
    run_rejected bigint;
BEGIN
    SELECT r.workflow_id INTO workflow FROM run_facts_v1(p_run) r;
    SELECT count(DISTINCT sb.item_id) INTO changed FROM sighting_boxes sb
    WHERE sb.sighting_id = p_sighting
      AND (sb.review_state, sb.relabel_class) IS DISTINCT FROM (p_state, p_relabel);
    INSERT INTO sighting_decisions (run_id, sighting_id, review_state, relabel_class, decided_by,
                                    decided_at, items_updated)
    VALUES (p_run, p_sighting, p_state, p_relabel, p_by, p_now, changed);
    IF changed = 0 THEN
        RETURN 0;
    END IF;

    WITH old AS (
        SELECT sb.item_id, sb.box_index, sb.bucket_id, sb.class_name, sb.review_state,
               sb.relabel_class
        FROM sighting_boxes sb
        WHERE sb.sighting_id = p_sighting
          AND (sb.review_state, sb.relabel_class) IS DISTINCT FROM (p_state, p_relabel)
    ), updated AS (
        UPDATE sighting_boxes sb
        SET review_state = p_state, relabel_class = p_relabel, decided_by = p_by, decided_at = p_now
        FROM old WHERE sb.item_id = old.item_id AND sb.box_index = old.box_index
        RETURNING 1
    ), deltas AS (
        SELECT d.bucket_id, d.class_name, sum(d.detections) AS detections,
               sum(d.confirmations) AS confirmations
        FROM (
            SELECT o.bucket_id, coalesce(o.relabel_class, o.class_name) AS class_name,
                   -1 AS detections, -(o.review_state = 'accepted')::integer AS confirmations
            FROM old o WHERE o.box_index >= 0
            UNION ALL
            SELECT o.bucket_id, coalesce(p_relabel, o.class_name), 1,
                   (p_state = 'accepted')::integer
            FROM old o WHERE o.box_index >= 0
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

    WITH review AS (
        SELECT sb.item_id,
               CASE WHEN bool_or(sb.review_state = 'pending') THEN 'pending'
                    WHEN bool_or(sb.review_state = 'accepted') THEN 'accepted'
                    ELSE 'rejected' END AS review_state,
               (array_agg(sb.relabel_class ORDER BY sb.box_index)
                   FILTER (WHERE sb.relabel_class IS NOT NULL))[1] AS relabel_class,
               max(sb.decided_at) AS reviewed_at
        FROM sighting_boxes sb
        WHERE sb.item_id IN (SELECT s.item_id FROM sighting_boxes s WHERE s.sighting_id = p_sighting)
        GROUP BY sb.item_id
    ), old AS (
        SELECT bi.item_id, bi.bucket_id, bi.recording_id, bi.recording_generation,
               bi.review_state AS was, review.review_state AS now
        FROM bucket_items bi JOIN review ON review.item_id = bi.item_id
        WHERE bi.review_state <> review.review_state
    ), updated AS (
        UPDATE bucket_items bi
        SET review_state = review.review_state, relabel_class = review.relabel_class,
            reviewed_at = review.reviewed_at
        FROM review WHERE bi.item_id = review.item_id
        RETURNING 1
    ), deltas AS (
        SELECT o.bucket_id, o.recording_id, o.recording_generation,
               sum((o.now = 'pending')::integer - (o.was = 'pending')::integer) AS pending,
               sum((o.now = 'accepted')::integer - (o.was = 'accepted')::integer) AS accepted,
               sum((o.now = 'rejected')::integer - (o.was = 'rejected')::integer) AS rejected
        FROM old o GROUP BY 1, 2, 3
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

-- The room's public SQL and its interfaces. No other room names bucket_items,
-- sighting_timelines, sighting_boxes, sighting_decisions or the counters.

-- Inserts a committed job's bucket items (leases' job_complete, in the committing
-- transaction, after its fences): one per element of the arrays, each with its boxes
-- (JSON), of the job's camera and recording at the generation it was admitted at. The
-- statement trigger counts them (bucket_items_review), the commit adds their boxes
-- (bucket_items_boxes) unless group_committed did.
-- public: leases (job_complete)
CREATE FUNCTION bucket_items_insert_v1(
    p_run text, p_job integer, p_camera text, p_recording text, p_recording_generation bigint,
    p_item_ids text[], p_item_buckets text[], p_item_slots integer[], p_item_steps text[],
    p_item_times timestamptz[], p_item_boxes jsonb[], p_item_keys text[],
    p_item_sha256 text[], p_now timestamptz
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bucket_items (item_id, bucket_id, run_id, job_index, slot_index, step_id,
                              camera_id, recording_id, recording_generation, frame_time, boxes,
                              object_key, sha256, saved_at)
    SELECT u.item_id, u.bucket_id, p_run, p_job, u.slot, u.step_id, p_camera, p_recording,
           p_recording_generation, u.frame_time, u.boxes, u.object_key, u.sha256, p_now
    FROM unnest(p_item_ids, p_item_buckets, p_item_slots, p_item_steps, p_item_times,
                p_item_boxes, p_item_keys, p_item_sha256)
         AS u (item_id, bucket_id, slot, step_id, frame_time, boxes, object_key, sha256);
END;
$$;

-- A run's bucket item by its id, as reading its image needs it: its boxes after review
-- relabels (docs/review.md). No row: the run has no such item.
-- public: previews (image_for_read)
CREATE FUNCTION bucket_item_for_read_v1(p_run text, p_item text)
RETURNS TABLE (object_key text, boxes jsonb, frame_time timestamptz, camera_id text,
               sha256 text)
LANGUAGE sql STABLE AS $$
    SELECT bi.object_key,
           (SELECT coalesce(jsonb_agg(
                       CASE WHEN sb.relabel_class IS NULL THEN b.box
                            ELSE jsonb_set(b.box, '{class_name}', to_jsonb(sb.relabel_class)) END
                       ORDER BY b.ordinal), '[]'::jsonb)
            FROM jsonb_array_elements(bi.boxes) WITH ORDINALITY AS b (box, ordinal)
            LEFT JOIN sighting_boxes sb
                ON sb.item_id = bi.item_id AND sb.box_index = b.ordinal - 1),
           bi.frame_time, bi.camera_id, bi.sha256
    FROM bucket_items bi
    WHERE bi.run_id = p_run AND bi.item_id = p_item
$$;

-- Implements runs' run_recent_items_v1 (5_runs.sql): a run's bucket items as its recent
-- images show them.
CREATE OR REPLACE FUNCTION run_recent_items_v1(p_run text)
RETURNS TABLE (item_id text, source text, job_index integer, slot_index integer,
               camera_id text, frame_time timestamptz, boxes jsonb, bucket_id text,
               published_at timestamptz, expires_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT bi.item_id, 'item', bi.job_index, bi.slot_index, bi.camera_id, bi.frame_time,
           bi.boxes, bi.bucket_id, bi.saved_at, NULL::timestamptz
    FROM bucket_items bi
    WHERE bi.run_id = p_run
$$;

-- Releases uploads to garbage collection (bucket_items_delete: those no item shows any
-- more). The uploads are staged objects, leases'.
-- interface: implemented by leases
CREATE FUNCTION objects_release_v1(p_keys text[], p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'objects_release is implemented by leases (7_leases.sql)';
END;
$$;

-- Implements resources' bucket_items_delete_v1 (3_resources.sql): deletes a bucket's items
-- and releases their uploads to garbage collection (objects_release); its sightings and
-- its share of the counters go with them. Takes the bucket's timelines first, like every
-- other writer of sightings.
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
    DELETE FROM sighting_timelines WHERE bucket_id = p_bucket;
    DELETE FROM bucket_counts WHERE bucket_id = p_bucket;
    DELETE FROM workflow_class_counts WHERE bucket_id = p_bucket;
    DELETE FROM workflow_day_counts WHERE bucket_id = p_bucket;
    RETURN deleted;
END;
$$;
