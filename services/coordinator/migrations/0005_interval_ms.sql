-- Workshop coordinator: sub-second sampling intervals (docs/workflows.md, "interval in seconds").
--
-- A sample step's interval is a double of seconds now (0.5 is two frames a second),
-- checked to be a whole number of milliseconds. Jobs keep it as exact integer
-- milliseconds, so slot k of a job is first_slot_at + k * interval_ms with no float
-- drift: jobs.interval_seconds becomes jobs.interval_ms (seconds * 1000; at most
-- 3,600,000, well inside integer), in place so the column keeps its position, and its
-- CHECK is renamed with it. job_complete's slot-fact parameter follows the column;
-- a parameter cannot be renamed by CREATE OR REPLACE, hence the DROP.
--
-- Nothing stored as JSON changes: workflow specs and run snapshots are proto JSON,
-- which names the field (interval_seconds) rather than numbering it, and a stored
-- whole number such as 6 parses into the double as 6.0.
ALTER TABLE jobs RENAME COLUMN interval_seconds TO interval_ms;
ALTER TABLE jobs DROP CONSTRAINT jobs_interval_seconds_check;
UPDATE jobs SET interval_ms = interval_ms * 1000;
ALTER TABLE jobs ADD CONSTRAINT jobs_interval_ms_check CHECK (interval_ms >= 1);

-- Complete as in 0004, the job's interval compared in milliseconds.
DROP FUNCTION job_complete(
    text, integer, bigint, uuid, text, text, text, text, integer, timestamptz, integer, integer,
    integer, integer, text[], text[], integer[], text[], text[], integer[], text[], timestamptz[],
    text[], text[], text[], timestamptz);
CREATE FUNCTION job_complete(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_result_sha256 text, p_decoder text,
    p_slot_count integer, p_first_slot_at timestamptz, p_interval_ms integer,
    p_frames integer, p_empties integer, p_dropped integer,
    p_upload_keys text[], p_upload_sha256 text[], p_upload_slots integer[],
    p_item_ids text[], p_item_buckets text[], p_item_slots integer[], p_item_steps text[],
    p_item_times timestamptz[], p_item_boxes text[], p_item_keys text[], p_item_sha256 text[],
    p_now timestamptz
) RETURNS TABLE (
    reason text, receipt_generation bigint, receipt_sha256 text,
    receipt_committed_at timestamptz, receipt_items_saved integer
) LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, p_code, p_now);
    staged integer;
    j jobs%ROWTYPE;
    rc receipts%ROWTYPE;
BEGIN
    IF fenced <> '' THEN
        IF fenced IN ('SOURCE_CHANGED', 'POLICY_CHANGED', 'AUTHORITY_REVOKED') THEN
            -- the job can never commit: end it now rather than when its lease lapses
            SELECT * INTO j FROM jobs WHERE run_id = p_run AND job_index = p_job;
            PERFORM job_end_unfenced(j, p_now);
        END IF;
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
    SELECT count(*) INTO staged
    FROM unnest(p_upload_keys, p_upload_sha256, p_upload_slots) AS u (object_key, sha256, slot)
    JOIN staged_objects s ON s.object_key = u.object_key
    WHERE s.kind = 'upload' AND s.run_id = p_run AND s.job_index = p_job
      AND s.generation = p_generation AND s.slot_index = u.slot AND s.sha256 = u.sha256
      AND s.deleted_at IS NULL;
    IF staged <> cardinality(p_upload_keys) THEN
        RETURN QUERY SELECT 'UPLOAD_NOT_STAGED', NULL::bigint, NULL::text, NULL::timestamptz,
                            NULL::integer;
        RETURN;
    END IF;
    INSERT INTO bucket_items (item_id, bucket_id, run_id, job_index, slot_index, step_id,
                              camera_id, recording_id, recording_generation, frame_time, boxes,
                              object_key, sha256, saved_at)
    SELECT u.item_id, u.bucket_id, p_run, p_job, u.slot, u.step_id, j.camera_id, j.recording_id,
           j.recording_generation, u.frame_time, u.boxes::jsonb, u.object_key, u.sha256, p_now
    FROM unnest(p_item_ids, p_item_buckets, p_item_slots, p_item_steps, p_item_times,
                p_item_boxes, p_item_keys, p_item_sha256)
         AS u (item_id, bucket_id, slot, step_id, frame_time, boxes, object_key, sha256);
    UPDATE staged_objects SET published_at = p_now
    WHERE object_key = ANY (p_upload_keys);
    -- What the commit does not keep is garbage now: objects staged but never
    -- published or named (refused previews, unnamed uploads), and a full run's
    -- previews, which its items replace.
    PERFORM job_objects_abandon(p_run, p_job, p_now);
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
