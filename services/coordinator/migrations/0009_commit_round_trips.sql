-- A full run's commit in two statements instead of five, and less Postgres per committed
-- item (docs/upgrading.md, 0009; docs/scaling.md, "Against issue 34's targets").
-- Pre-migration: new functions, a body-only change of the counters' trigger that counts
-- every insert it counted before except a job_complete_v3's (which counts its own), and
-- three foreign keys dropped whose checks no write of either version can fail. Every
-- function, table and column of the release before stays as it is.
--
-- A commit that saves items used to run, in its transaction: job_commit_boxes (lock the job,
-- read its items' boxes as rows), timelines_lock, timeline_context, job_complete and
-- sightings_apply, each a round trip, with the grouping in the coordinator between the
-- reads and the writes. Now job_commit_prepare does the three reads (the same locks, in
-- the same order) and answers one row of arrays, which asyncpg decodes without a Record
-- per box; job_complete_v3 is job_complete_v2 followed, when it committed, by what
-- sightings_apply wrote.
--
-- Per committed item (bench.item_insert's statement, 2026-12-05: 28 us of Postgres CPU an
-- item, 19 without the foreign keys, 19 without the trigger, 14 without both):
-- - the counters' statement trigger (bucket_items_added_v1) read each item back from the
--   transition table five times and each box from its JSON; job_complete_v3 counts its
--   items from arrays instead (the coordinator sums the boxes by bucket and class from
--   what job_commit_prepare answered), and the trigger skips an insert made while the
--   transaction-local setting workshop.items_counted is 'on', which only job_complete_v3
--   sets, around its insert. Every other insert (release 0.1's commits, tests) is counted
--   by the trigger as before.
-- - bucket_items' foreign keys to buckets and jobs, and staged_objects' to jobs, were a
--   lookup per row (FOR KEY SHARE) that no write can fail: buckets and jobs are never
--   deleted (a bucket is marked deleted_at; neither table has a DELETE in any version),
--   and every writer of those rows holds the job's row lock from its fences (the job
--   exists), and a commit takes its items' buckets from the run's snapshot, whose output
--   buckets were checked to exist when the run was created.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: review

-- Takes the lock rows of the timelines (run p_run, camera p_camera, each bucket of
-- p_buckets, in key order, made if new) and answers, read after the locks, the boxes a
-- regroup of them reads: review.sql's timelines_lock and then timeline_context (its comment
-- says which boxes, and which are fixed), as one row of arrays, one element per box in
-- every array (none: empty arrays).
-- public: leases (job_commit_prepare)
CREATE FUNCTION timelines_context_v1(
    p_run text, p_camera text, p_buckets text[], p_first_new timestamptz[]
) RETURNS TABLE (
    context_buckets text[], context_items text[], context_boxes integer[],
    context_times timestamptz[], context_classes text[], context_xs real[], context_ys real[],
    context_ws real[], context_hs real[], context_sightings text[], context_fixed boolean[],
    context_firsts timestamptz[], context_counts integer[]
) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    INSERT INTO sighting_timelines AS t (run_id, bucket_id, camera_id)
    SELECT DISTINCT p_run, u.bucket_id, p_camera FROM unnest(p_buckets) AS u (bucket_id)
    ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT sighting_timelines_pkey DO UPDATE SET run_id = t.run_id;
    -- (the aggregates read the rows in one pass: their elements line up)
    RETURN QUERY
    WITH wanted AS MATERIALIZED (
        SELECT w.bucket_id,
               least(w.first_new, (SELECT min(u.frame_time) FROM bucket_items u
                                   WHERE u.run_id = p_run AND u.bucket_id = w.bucket_id
                                     AND u.camera_id = p_camera
                                     AND u.box_sightings IS NULL)) AS start
        FROM unnest(p_buckets, p_first_new) AS w (bucket_id, first_new)
    )
    SELECT coalesce(array_agg(w.bucket_id), '{}'), coalesce(array_agg(bi.item_id), '{}'),
           coalesce(array_agg(b.box_index), '{}'), coalesce(array_agg(bi.frame_time), '{}'),
           coalesce(array_agg(b.class_name), '{}'), coalesce(array_agg(b.x), '{}'),
           coalesce(array_agg(b.y), '{}'), coalesce(array_agg(b.w), '{}'),
           coalesce(array_agg(b.h), '{}'),
           coalesce(array_agg(coalesce(bi.box_sightings[b.box_position], '')), '{}'),
           coalesce(array_agg(bi.frame_time < w.start), '{}'),
           coalesce(array_agg(s.first_frame_time), '{}'),
           coalesce(array_agg(s.item_count), '{}')
    FROM wanted w
    JOIN bucket_items bi
        ON bi.run_id = p_run AND bi.frame_time >= w.start - interval '5 seconds'
       AND bi.bucket_id = w.bucket_id AND bi.camera_id = p_camera
    CROSS JOIN LATERAL bucket_item_boxes_of_v1(bi.boxes) b
    LEFT JOIN sightings s
        ON bi.frame_time < w.start AND s.run_id = p_run
       AND s.sighting_id = bi.box_sightings[b.box_position]
    WHERE w.start IS NOT NULL;
END;
$$;

-- What a grouping changed, under the timelines' locks (review.sql's sightings_apply, which
-- calls it): the items already written whose box_sightings changed (p_item_ids, each one's
-- new array as a text array literal), the sightings of run p_run and camera p_camera that
-- lost every item (p_gone), and the sightings made or changed, with their item range and
-- count.
-- public: leases (job_complete)
CREATE FUNCTION sightings_apply_v1(
    p_run text, p_camera text, p_item_ids text[], p_item_sightings text[], p_gone text[],
    p_sighting_ids text[], p_sighting_buckets text[], p_sighting_classes text[],
    p_sighting_firsts timestamptz[], p_sighting_lasts timestamptz[], p_sighting_counts integer[]
) RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    WITH assigned AS (
        UPDATE bucket_items bi SET box_sightings = u.sightings::text[]
        FROM unnest(p_item_ids, p_item_sightings) AS u (item_id, sightings)
        WHERE bi.item_id = u.item_id
        RETURNING 1
    ), gone AS (
        DELETE FROM sightings s
        WHERE s.run_id = p_run AND s.sighting_id = ANY (p_gone)
        RETURNING 1
    )
    INSERT INTO sightings AS s (run_id, sighting_id, bucket_id, camera_id, class_name,
                                first_frame_time, last_frame_time, item_count)
    SELECT p_run, u.sighting_id, u.bucket_id, p_camera, u.class_name, u.first_frame_time,
           u.last_frame_time, u.item_count
    FROM unnest(p_sighting_ids, p_sighting_buckets, p_sighting_classes, p_sighting_firsts,
                p_sighting_lasts, p_sighting_counts)
         AS u (sighting_id, bucket_id, class_name, first_frame_time, last_frame_time,
               item_count)
    ORDER BY 2
    ON CONFLICT ON CONSTRAINT sightings_pkey DO UPDATE
    SET first_frame_time = EXCLUDED.first_frame_time,
        last_frame_time = EXCLUDED.last_frame_time, item_count = EXCLUDED.item_count;
END;
$$;

-- The counters' trigger of the baseline (6_review.sql), with the same counts for every insert
-- but job_complete_v3's, which counts its own items (it sets workshop.items_counted to 'on'
-- for its insert only; see the header).
CREATE OR REPLACE FUNCTION bucket_items_added_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('workshop.items_counted', true) = 'on' THEN
        RETURN NULL;
    END IF;
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

-- Counts a commit's new items (job_complete_v3, after its insert; the trigger above skips
-- it): as the trigger counts them, from arrays instead of the rows. The items are of run
-- p_run and recording p_recording at p_recording_generation, pending, saved at p_now, one
-- element of p_item_buckets each; their boxes by (bucket, class as detected): one element
-- per pair in each p_count_ array (p_count_boxes: how many). The caller made and holds the
-- items' timelines' lock rows, which the trigger would make (job_commit_prepare_v1, before
-- the insert: the lock order is timelines, items, counters).
-- public: leases (job_complete)
CREATE FUNCTION bucket_items_count_v1(
    p_run text, p_recording text, p_recording_generation bigint, p_item_buckets text[],
    p_count_buckets text[], p_count_classes text[], p_count_boxes bigint[], p_now timestamptz
) RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    workflow text := (SELECT r.workflow_id FROM run_facts_v1(p_run) r);
BEGIN
    INSERT INTO workflow_class_counts AS c (workflow_id, bucket_id, class_name, detections,
                                            confirmations)
    SELECT workflow, u.bucket_id, u.class_name, u.boxes, 0
    FROM unnest(p_count_buckets, p_count_classes, p_count_boxes) AS u (bucket_id, class_name, boxes)
    ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT workflow_class_counts_pkey DO UPDATE
    SET detections = c.detections + EXCLUDED.detections,
        confirmations = c.confirmations + EXCLUDED.confirmations;

    INSERT INTO bucket_counts AS c (bucket_id, recording_id, recording_generation, images, pending,
                                    accepted, rejected, last_added_at)
    SELECT u.bucket_id, p_recording, p_recording_generation, count(*), count(*), 0, 0, p_now
    FROM unnest(p_item_buckets) AS u (bucket_id)
    GROUP BY 1 ORDER BY 1
    ON CONFLICT ON CONSTRAINT bucket_counts_pkey DO UPDATE
    SET images = c.images + EXCLUDED.images, pending = c.pending + EXCLUDED.pending,
        accepted = c.accepted + EXCLUDED.accepted, rejected = c.rejected + EXCLUDED.rejected,
        last_added_at = greatest(c.last_added_at, EXCLUDED.last_added_at);

    INSERT INTO run_review_counts AS c (run_id, pending, accepted, rejected)
    VALUES (p_run, cardinality(p_item_buckets), 0, 0)
    ON CONFLICT ON CONSTRAINT run_review_counts_pkey DO UPDATE
    SET pending = c.pending + EXCLUDED.pending, accepted = c.accepted + EXCLUDED.accepted,
        rejected = c.rejected + EXCLUDED.rejected;

    INSERT INTO workflow_day_counts AS c (workflow_id, bucket_id, quarter_start, images)
    SELECT workflow, u.bucket_id,
           date_bin('15 minutes', p_now, timestamptz '2000-01-01 00:00:00+00'), count(*)
    FROM unnest(p_item_buckets) AS u (bucket_id)
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT workflow_day_counts_pkey DO UPDATE SET images = c.images + EXCLUDED.images;
END;
$$;

-- (see the header: no write of either version can fail them; the second is the one
-- 7_leases.sql added)
ALTER TABLE bucket_items DROP CONSTRAINT bucket_items_bucket_id_fkey;
ALTER TABLE bucket_items DROP CONSTRAINT bucket_items_run_id_job_index_fkey;

-- room: leases

-- (see the header: every writer holds the job's row lock, and no job is ever deleted)
ALTER TABLE staged_objects DROP CONSTRAINT staged_objects_run_id_job_index_fkey;

-- Locks a job about to commit (as its fences will) and answers, in one row: its camera;
-- each item's boxes as the commit will save them (sent as p_item_boxes, JSON text, or,
-- NULL, those recorded with the upload's preview), as review reads them
-- (bucket_item_boxes_of: box -1 for an item without boxes), one element per box in every
-- box_ array, box_items its item's 1-based position; and, after locking the items'
-- timelines (the job's camera, each bucket of p_item_buckets), their context
-- (timelines_context, from each bucket's first p_item_times on). The committing
-- transaction groups the items from these before job_complete_v3 writes them. No row: no
-- such job.
CREATE FUNCTION job_commit_prepare_v1(
    p_run text, p_job integer, p_item_boxes text[], p_item_keys text[], p_item_buckets text[],
    p_item_times timestamptz[]
) RETURNS TABLE (
    camera_id text, box_items integer[], box_indexes integer[], box_classes text[],
    box_xs real[], box_ys real[], box_ws real[], box_hs real[],
    context_buckets text[], context_items text[], context_boxes integer[],
    context_times timestamptz[], context_classes text[], context_xs real[], context_ys real[],
    context_ws real[], context_hs real[], context_sightings text[], context_fixed boolean[],
    context_firsts timestamptz[], context_counts integer[]
) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    camera text;
    timelines text[];  -- their buckets, in key order
    firsts timestamptz[];
BEGIN
    SELECT j.camera_id INTO camera FROM jobs j
    WHERE j.run_id = p_run AND j.job_index = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(f.bucket_id ORDER BY f.bucket_id), '{}'),
           coalesce(array_agg(f.first_new ORDER BY f.bucket_id), '{}')
    INTO timelines, firsts
    FROM (SELECT u.bucket_id, min(u.frame_time) AS first_new
          FROM unnest(p_item_buckets, p_item_times) AS u (bucket_id, frame_time)
          GROUP BY u.bucket_id) f;
    -- each key's staged row by primary key alone (as job_complete_v2 reads them, 0004)
    RETURN QUERY
    SELECT camera, n.*, c.*
    FROM (
        SELECT coalesce(array_agg(u.o::integer), '{}'), coalesce(array_agg(b.box_index), '{}'),
               coalesce(array_agg(b.class_name), '{}'), coalesce(array_agg(b.x), '{}'),
               coalesce(array_agg(b.y), '{}'), coalesce(array_agg(b.w), '{}'),
               coalesce(array_agg(b.h), '{}')
        FROM unnest(p_item_boxes, p_item_keys) WITH ORDINALITY AS u (boxes, object_key, o)
        LEFT JOIN LATERAL (
            SELECT so.boxes FROM staged_objects so
            WHERE so.object_key = u.object_key OFFSET 0
        ) s ON u.boxes IS NULL
        CROSS JOIN LATERAL bucket_item_boxes_of_v1(coalesce(u.boxes::jsonb, s.boxes, '[]')) b
    ) n
    CROSS JOIN timelines_context_v1(p_run, camera, timelines, firsts) c;
END;
$$;

-- job_complete_v2, and when it commits, what the grouping changed in the items already
-- written and in the sightings (review's sightings_apply_v1, under the timelines' locks
-- job_commit_prepare took): one statement where there were two. Its items are counted here
-- (review's bucket_items_count_v1; the counters' trigger skips them, see the header): their
-- boxes by bucket and class as detected in the p_count_ arrays (one element per pair).
CREATE FUNCTION job_complete_v3(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_result_sha256 text, p_decoder text,
    p_slot_count integer, p_first_slot_at timestamptz, p_interval_ms integer,
    p_frames integer, p_empties integer, p_dropped integer,
    p_upload_keys text[], p_upload_sha256 text[], p_upload_slots integer[],
    p_item_ids text[], p_item_buckets text[], p_item_slots integer[], p_item_steps text[],
    p_item_times timestamptz[], p_item_boxes text[], p_item_sightings text[],
    p_item_keys text[], p_item_sha256 text[],
    p_camera text, p_changed_items text[], p_changed_sightings text[], p_gone text[],
    p_sighting_ids text[], p_sighting_buckets text[], p_sighting_classes text[],
    p_sighting_firsts timestamptz[], p_sighting_lasts timestamptz[],
    p_sighting_counts integer[], p_count_buckets text[], p_count_classes text[],
    p_count_boxes bigint[], p_now timestamptz
) RETURNS TABLE (
    reason text, receipt_generation bigint, receipt_sha256 text,
    receipt_committed_at timestamptz, receipt_items_saved integer
) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    answer record;
    j jobs%ROWTYPE;
BEGIN
    PERFORM set_config('workshop.items_counted', 'on', true);
    SELECT * INTO answer FROM job_complete_v2(
        p_run, p_job, p_generation, p_token, p_reporter, p_code, p_result_sha256, p_decoder,
        p_slot_count, p_first_slot_at, p_interval_ms, p_frames, p_empties, p_dropped,
        p_upload_keys, p_upload_sha256, p_upload_slots, p_item_ids, p_item_buckets,
        p_item_slots, p_item_steps, p_item_times, p_item_boxes, p_item_sightings, p_item_keys,
        p_item_sha256, p_now) c;
    PERFORM set_config('workshop.items_counted', 'off', true);
    IF answer.reason = '' AND cardinality(p_item_ids) > 0 THEN
        SELECT * INTO j FROM jobs WHERE run_id = p_run AND job_index = p_job;
        PERFORM bucket_items_count_v1(p_run, j.recording_id, j.recording_generation,
                                      p_item_buckets, p_count_buckets, p_count_classes,
                                      p_count_boxes, p_now);
    END IF;
    IF answer.reason = '' AND (cardinality(p_changed_items) > 0 OR cardinality(p_gone) > 0
                               OR cardinality(p_sighting_ids) > 0) THEN
        PERFORM sightings_apply_v1(
            p_run, p_camera, p_changed_items, p_changed_sightings, p_gone, p_sighting_ids,
            p_sighting_buckets, p_sighting_classes, p_sighting_firsts, p_sighting_lasts,
            p_sighting_counts);
    END IF;
    RETURN QUERY SELECT answer.reason, answer.receipt_generation, answer.receipt_sha256,
                        answer.receipt_committed_at, answer.receipt_items_saved;
END;
$$;
