-- What Postgres spends per published frame of a full run (docs/upgrading.md, 0004;
-- docs/scaling.md figures from bench.frame_costs and bench.processor_throughput).
-- Pre-migration: every change keeps what each caller gets, release 0.1's included.
--
-- Plans. A statement of a PL/pgSQL function is planned for the values of each call (a
-- custom plan) for its first five calls in a backend, and only then may switch to one
-- plan for all values (a generic plan). A full run records a job's previews in a few
-- batches and commits it once, spread over the coordinator's pool: most calls of
-- previews_record and job_complete met a backend that had planned them fewer than five
-- times, and planning their statements cost more than running them (bench.frame_costs
-- with plan_cache_mode = force_custom_plan: 60 us a frame of record and 98 of commit,
-- against 30 and 66 with plans kept). Both now plan once per backend (a generic plan,
-- `SET plan_cache_mode = force_generic_plan`: the setting holds during the call,
-- functions they call included, and is restored after it), and their statements are
-- written so that the one plan is the per-key index lookup whatever the arrays hold.
--
-- Sections are marked `-- room: <room>`: what follows belongs to that room
-- (tests/unit/test_coordinator_sql_ownership.py).

-- room: leases

-- previews_record_v1 as it was: its statements' generic plans are those it used after
-- five calls already (the batch CTE's inserts go by the key's primary key; its retry
-- check, run only for a slot before the job's preview_slot, may walk the job's rows in
-- staged_objects_by_job). Not `enable_seqscan = off` as well: tried, and under three jobs
-- in flight the fences' `FOR SHARE` of the policy row then waited 23 ms a call
-- (bench.processor_throughput --profile-control; Postgres went from 0.2 to 0.6-0.8 ms a
-- frame), for a reason not found.
ALTER FUNCTION previews_record_v1(
    text[], integer[], bigint[], uuid[], text, text, text[], text[], integer[], text[],
    bigint[], text[], timestamptz[], text[], text[], timestamptz
) SET plan_cache_mode = force_generic_plan;

-- job_commit_boxes_v1 as it was (one statement: each key's staged row by primary key).
ALTER FUNCTION job_commit_boxes_v1(text, integer, text[], text[])
    SET plan_cache_mode = force_generic_plan;

-- job_complete_v2 with the same outcomes for every call, planned once per backend. Its
-- reads of staged_objects look up each key by primary key alone, in a LATERAL subquery
-- that the planner neither flattens nor pushes conditions into (OFFSET 0): a generic plan
-- is made without the call's values, and one made while the table was small walked the
-- job's rows in staged_objects_by_job for every key (O(frames^2): 2-3 ms a commit of 120;
-- v2's join checking recorded boxes went to a scan of the table, 8 ms). The check for
-- recorded boxes and the boxes the items take are one statement instead of two.
CREATE OR REPLACE FUNCTION job_complete_v2(
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
) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    fenced text := workshop_fence_v1(p_run, p_job, p_generation, p_token, p_reporter, p_code, p_now);
    staged integer;
    unrecorded boolean;
    item_boxes jsonb[];
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
        CROSS JOIN LATERAL (
            SELECT so.* FROM staged_objects so WHERE so.object_key = u.object_key OFFSET 0
        ) s
        WHERE (s.kind = 'upload' OR s.published_at IS NOT NULL)
          AND s.run_id = p_run AND s.job_index = p_job
          AND s.generation = p_generation AND s.slot_index = u.slot AND s.sha256 = u.sha256
          AND s.collectable_at IS NULL AND s.deleted_at IS NULL;
        IF staged <> cardinality(p_upload_keys) THEN
            RETURN QUERY SELECT 'UPLOAD_NOT_STAGED', NULL::bigint, NULL::text,
                                NULL::timestamptz, NULL::integer;
            RETURN;
        END IF;
    END IF;
    -- Each item's boxes: as sent, or (NULL) those recorded with its upload's preview; and
    -- whether an item leaves its boxes to a staged row that has none (a staged upload).
    IF cardinality(p_item_ids) > 0 OR cardinality(p_upload_keys) > 0 THEN
        SELECT array_agg(coalesce(u.boxes::jsonb, s.boxes) ORDER BY u.o),
               coalesce(bool_or(u.boxes IS NULL AND s.found AND s.boxes IS NULL), false)
        INTO item_boxes, unrecorded
        FROM unnest(p_item_boxes, p_item_keys) WITH ORDINALITY AS u (boxes, object_key, o)
        LEFT JOIN LATERAL (
            SELECT true AS found, so.boxes FROM staged_objects so
            WHERE so.object_key = u.object_key OFFSET 0
        ) s ON u.boxes IS NULL;
    END IF;
    IF cardinality(p_upload_keys) > 0 THEN
        -- An item without boxes (NULL) takes those recorded with its upload's preview
        -- (RoutedOutput.boxes_recorded): a staged upload has none to give.
        IF unrecorded THEN
            RETURN QUERY SELECT 'BOXES_NOT_RECORDED', NULL::bigint, NULL::text,
                                NULL::timestamptz, NULL::integer;
            RETURN;
        END IF;
        -- a preview named as an upload becomes one: its item replaces it
        UPDATE staged_objects s SET kind = 'upload', published_at = p_now
        FROM unnest(p_upload_keys) AS u (object_key)
        WHERE s.object_key = u.object_key;
    END IF;
    IF cardinality(p_item_ids) > 0 THEN
        -- the items are review's (bucket_items_insert), with their boxes and sightings
        PERFORM bucket_items_insert_v2(
            p_run, p_job, j.camera_id, j.recording_id, j.recording_generation, p_item_ids,
            p_item_buckets, p_item_slots, p_item_steps, p_item_times, item_boxes,
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
