-- Workshop coordinator: a commit takes an item's boxes from its preview's record
-- (docs/runs-and-jobs.md#completion-and-slot-accounting).
--
-- A full run's frame is recorded as a preview with its boxes before the job completes;
-- the result then named the preview as the upload and sent every output's boxes again.
-- Now an item whose boxes are NULL (RoutedOutput.boxes_recorded) takes the boxes its
-- upload's preview was recorded with, and an upload staged without boxes answers
-- BOXES_NOT_RECORDED. Callers that send every item's boxes, as the previous version
-- does, see no change. Same name and signature; apply it at any time.

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
        INSERT INTO bucket_items (item_id, bucket_id, run_id, job_index, slot_index, step_id,
                                  camera_id, recording_id, recording_generation, frame_time, boxes,
                                  object_key, sha256, saved_at)
        SELECT u.item_id, u.bucket_id, p_run, p_job, u.slot, u.step_id, j.camera_id, j.recording_id,
               j.recording_generation, u.frame_time, coalesce(u.boxes::jsonb, s.boxes),
               u.object_key, u.sha256, p_now
        FROM unnest(p_item_ids, p_item_buckets, p_item_slots, p_item_steps, p_item_times,
                    p_item_boxes, p_item_keys, p_item_sha256)
             AS u (item_id, bucket_id, slot, step_id, frame_time, boxes, object_key, sha256)
        LEFT JOIN staged_objects s ON u.boxes IS NULL AND s.object_key = u.object_key;
    END IF;
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
