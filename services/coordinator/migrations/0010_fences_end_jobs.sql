-- Workshop coordinator: a fence that can never hold again ends its job at once, and a job
-- that runs out of attempts says why.
--
-- Before, only Claim, Complete and Fail ended a job whose recording was replaced or
-- deleted, or whose run lost its authority (fences 2 and 3). A heartbeat, a progress
-- report, a preview, a staged upload or a lease check refused for that reason ended
-- nothing: the processor stopped, the job stayed leased until its lease lapsed (five
-- minutes, one attempt spent), and its run showed running meanwhile. Now every fenced
-- call ends it in the refusing transaction: the check itself is renamed
-- workshop_fence_reason, and workshop_fence, which every fenced function calls, ends the
-- job when the reason is permanent. job_fail and job_complete lose their own copies of
-- that step.
--
-- A job failed with attempts_exhausted had no failure_message; it now says how many
-- leases lapsed and when the last one did.
ALTER FUNCTION workshop_fence(text, integer, bigint, uuid, text, text, timestamptz)
    RENAME TO workshop_fence_reason;

-- The four fences (docs/leases-and-fences.md) as every fenced call meets them
-- (workshop_fence_reason says which failed). A refusal by fence 2 or 3 is permanent for the job: its recording was replaced
-- or deleted, or its run lost its authority or policy revision, so it can never commit.
-- Such a job is ended here, in the refusing transaction, whichever call met the fence
-- (heartbeat, progress, preview, staging, lease check, complete, fail, release): failed
-- with source_changed or authority_lost (job_end_unfenced), so its run does not wait for
-- the lease to lapse. The caller holds the job's row lock (workshop_fence_reason took it).
CREATE FUNCTION workshop_fence(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    refused text := workshop_fence_reason(p_run, p_job, p_generation, p_token, p_reporter,
                                          p_code, p_now);
    j jobs%ROWTYPE;
BEGIN
    IF refused IN ('SOURCE_CHANGED', 'POLICY_CHANGED', 'AUTHORITY_REVOKED') THEN
        SELECT * INTO j FROM jobs WHERE run_id = p_run AND job_index = p_job;
        PERFORM job_end_unfenced(j, p_now);
    END IF;
    RETURN refused;
END;
$$;

CREATE OR REPLACE FUNCTION job_fail(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_message text, p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, NULL, p_now);
BEGIN
    IF fenced <> '' THEN
        RETURN fenced;
    END IF;
    UPDATE jobs
    SET state = 'failed', failure_reason = 'processor_failed', failure_message = p_message,
        lease_token = NULL, lease_expires_at = NULL, updated_at = p_now
    WHERE run_id = p_run AND job_index = p_job;
    PERFORM job_objects_abandon(p_run, p_job, p_now);
    PERFORM pg_notify('workshop_run', p_run);
    RETURN '';
END;
$$;

CREATE OR REPLACE FUNCTION job_complete(
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
    -- an upload is a staged upload, or a published preview of the same frame (kept
    -- rows only: a refused record is collectable at once)
    SELECT count(*) INTO staged
    FROM unnest(p_upload_keys, p_upload_sha256, p_upload_slots) AS u (object_key, sha256, slot)
    JOIN staged_objects s ON s.object_key = u.object_key
    WHERE (s.kind = 'upload' OR s.published_at IS NOT NULL)
      AND s.run_id = p_run AND s.job_index = p_job
      AND s.generation = p_generation AND s.slot_index = u.slot AND s.sha256 = u.sha256
      AND s.collectable_at IS NULL AND s.deleted_at IS NULL;
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
    -- a preview named as an upload becomes one: its item replaces it
    UPDATE staged_objects SET kind = 'upload', published_at = p_now
    WHERE object_key = ANY (p_upload_keys);
    -- What the commit does not keep is garbage now: objects staged but never
    -- published or named (refused previews, unnamed uploads), and a full run's
    -- other previews, which its items replace.
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

CREATE OR REPLACE FUNCTION jobs_rescue_lapsed(p_now timestamptz, p_max_lapses integer, p_batch integer)
RETURNS TABLE (run_id text, job_index integer, state text) LANGUAGE plpgsql AS $$
DECLARE
    job record;
    runs_touched text[] := '{}';
BEGIN
    FOR job IN
        UPDATE jobs j
        SET lapses = j.lapses + 1,
            state = CASE WHEN j.lapses + 1 >= p_max_lapses THEN 'failed' ELSE 'queued' END,
            failure_reason = CASE WHEN j.lapses + 1 >= p_max_lapses
                                  THEN 'attempts_exhausted' ELSE j.failure_reason END,
            failure_message = CASE WHEN j.lapses + 1 >= p_max_lapses
                                   THEN format('%s leases lapsed without a result (no processor '
                                               'reported on the job before its lease ran out); '
                                               'the last lapsed at %s.',
                                               j.lapses + 1,
                                               to_char(j.lease_expires_at AT TIME ZONE 'UTC',
                                                       'YYYY-MM-DD HH24:MI:SS "UTC"'))
                                   ELSE j.failure_message END,
            lease_token = NULL, lease_expires_at = NULL, updated_at = p_now
        WHERE (j.run_id, j.job_index) IN (
            SELECT l.run_id, l.job_index FROM jobs l
            WHERE l.state = 'leased' AND l.lease_expires_at <= p_now AND l.expires_at > p_now
            ORDER BY l.lease_expires_at
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        RETURNING j.run_id, j.job_index, j.state
    LOOP
        PERFORM job_objects_abandon(job.run_id, job.job_index, p_now);
        IF NOT job.run_id = ANY (runs_touched) THEN
            runs_touched := runs_touched || job.run_id;
            PERFORM pg_notify('workshop_run', job.run_id);
        END IF;
        run_id := job.run_id;
        job_index := job.job_index;
        state := job.state;
        RETURN NEXT;
    END LOOP;
END;
$$;
