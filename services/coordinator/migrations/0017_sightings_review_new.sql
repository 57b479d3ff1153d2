-- A commit sets the review queue's columns of the sightings it makes from its own items
-- itself (issue 34; docs/upgrading.md, 0017; docs/review.md, "Review queue").
--
-- A sighting that a commit's grouping made from the items it adds alone (no box of it was
-- written before) has the review sighting_review_v1 (0010) computes from those items, and
-- the coordinator knows it before anything is written: pending, every one of its items
-- pending, no relabel, no decision, and the highest score of its boxes. sightings_refresh_v2
-- (0015) read every added item back, parsed each box's score and then updated these rows;
-- job_complete_v4 sets them from the arrays the coordinator sends (by primary key, in the
-- commit's own statement), and the refresh round trip is left only for the sightings a
-- commit appends to or regroups, or a new one whose highest score is not above 0 (or is
-- NaN): the coordinator reads scores as bucket_item_boxes_of_v1 does (a missing score is
-- 0), while sighting_review_v1 takes the highest score as written (a sighting whose boxes
-- have no score gets 0 too, but one with a negative score and a missing one gets the
-- negative), so only a highest score above 0 is the same for both. job_commit_prepare_v2
-- answers those scores (box_scores) beside the boxes v1 answers.
--
-- Pre-migration: new functions. job_commit_prepare_v1, job_complete_v3 and
-- sightings_refresh_v2 stay (a coordinator of the release before calls them). Nothing to
-- post-migrate.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: review

-- Sets the review columns of run p_run's sightings p_sightings, each made in the caller's
-- transaction from items it just wrote, as sighting_review_v1 would find them: pending,
-- p_pending[n] items pending, no relabel, no decision, score p_scores[n] (the highest of its
-- boxes', above 0). Called under their timelines' locks. (PL/pgSQL: its plan is kept per
-- backend, where an SQL function's statement is planned again at every call.)
-- public: leases (job_complete)
CREATE FUNCTION sightings_review_new_v1(
    p_run text, p_sightings text[], p_pending integer[], p_scores real[]
) RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    UPDATE sightings s
    SET review_state = 'pending', pending_items = u.pending_items, relabel_class = NULL,
        score = u.score, decided_by = NULL, decided_at = NULL
    FROM unnest(p_sightings, p_pending, p_scores) AS u (sighting_id, pending_items, score)
    WHERE s.run_id = p_run AND s.sighting_id = u.sighting_id;
END;
$$;

-- room: leases

-- job_commit_prepare_v1 (0009), with each box's score as review reads it (box_scores;
-- bucket_item_boxes_of: 0 when the box has none, and for an item without boxes).
CREATE FUNCTION job_commit_prepare_v2(
    p_run text, p_job integer, p_item_boxes text[], p_item_keys text[], p_item_buckets text[],
    p_item_times timestamptz[]
) RETURNS TABLE (
    camera_id text, box_items integer[], box_indexes integer[], box_classes text[],
    box_scores real[], box_xs real[], box_ys real[], box_ws real[], box_hs real[],
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
               coalesce(array_agg(b.class_name), '{}'), coalesce(array_agg(b.score), '{}'),
               coalesce(array_agg(b.x), '{}'), coalesce(array_agg(b.y), '{}'),
               coalesce(array_agg(b.w), '{}'), coalesce(array_agg(b.h), '{}')
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

-- job_complete_v3 (0009), and when it commits, the review columns of the new sightings
-- p_new_sightings it made (review's sightings_review_new_v1: p_new_pending[n] items
-- pending, score p_new_scores[n]); each of them is one of p_sighting_ids.
CREATE FUNCTION job_complete_v4(
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
    p_count_boxes bigint[], p_now timestamptz,
    p_new_sightings text[], p_new_pending integer[], p_new_scores real[]
) RETURNS TABLE (
    reason text, receipt_generation bigint, receipt_sha256 text,
    receipt_committed_at timestamptz, receipt_items_saved integer
) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    answer record;
BEGIN
    SELECT * INTO answer FROM job_complete_v3(
        p_run, p_job, p_generation, p_token, p_reporter, p_code, p_result_sha256, p_decoder,
        p_slot_count, p_first_slot_at, p_interval_ms, p_frames, p_empties, p_dropped,
        p_upload_keys, p_upload_sha256, p_upload_slots, p_item_ids, p_item_buckets,
        p_item_slots, p_item_steps, p_item_times, p_item_boxes, p_item_sightings, p_item_keys,
        p_item_sha256, p_camera, p_changed_items, p_changed_sightings, p_gone,
        p_sighting_ids, p_sighting_buckets, p_sighting_classes, p_sighting_firsts,
        p_sighting_lasts, p_sighting_counts, p_count_buckets, p_count_classes, p_count_boxes,
        p_now) c;
    IF answer.reason = '' AND cardinality(p_new_sightings) > 0 THEN
        PERFORM sightings_review_new_v1(p_run, p_new_sightings, p_new_pending, p_new_scores);
    END IF;
    RETURN QUERY SELECT answer.reason, answer.receipt_generation, answer.receipt_sha256,
                        answer.receipt_committed_at, answer.receipt_items_saved;
END;
$$;
