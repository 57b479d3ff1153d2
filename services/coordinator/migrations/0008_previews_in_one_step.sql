-- Workshop coordinator: a preview is recorded in one fenced step after its bytes are written.
--
-- Before, a preview took two fenced calls: StageObject named the key and recorded the
-- object as staged, the preview service wrote the bytes, then RecordPreview published
-- the staged row. Keys are deterministic (run, job, lease generation, slot), so the
-- preview service now writes the bytes first and records them with one call:
-- preview_record inserts the row and publishes it under the fences. When a fence
-- refuses, the row is still inserted, as collectable now, so the cleanup loop deletes
-- the bytes. previews_record runs a batch of them (group commit) in one statement.
--
-- In a full run every frame that reaches an output has a preview and an upload of the
-- same bytes. job_complete now also takes a published preview of this lease as an
-- upload (same slot and digest) and turns it into one, so the processor writes each
-- frame once.
--
-- Bytes whose record never came (the preview service stopped between the write and
-- the call) have no row. Once every preview of a job has expired, the job's preview
-- prefix is swept: the cleanup loop lists it and preview_sweep_settle records what no
-- row knows as collectable. Jobs that ended before this migration wrote every object
-- under a staged row, so they need no sweep.
ALTER TABLE jobs ADD COLUMN previews_swept_at timestamptz;
ALTER TABLE jobs ADD COLUMN sweep_claimed_until timestamptz;
UPDATE jobs SET previews_swept_at = updated_at
WHERE state IN ('completed', 'failed', 'cancelled', 'expired');
CREATE INDEX jobs_preview_sweeps ON jobs (updated_at)
    WHERE previews_swept_at IS NULL AND state IN ('completed', 'failed', 'cancelled', 'expired');

DROP FUNCTION preview_publish(
    text, integer, bigint, uuid, text, text, text, text, integer, text, bigint, timestamptz,
    jsonb, text, timestamptz);

-- Records one preview whose bytes are written under p_key (the caller checked that the
-- key is this lease's key for the slot). A refusal by a fence, the slot order or the
-- slot range leaves a collectable row for the bytes, unless a live row already holds the key.
CREATE FUNCTION preview_record(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_key text, p_slot integer, p_sha256 text, p_byte_size bigint,
    p_content_type text, p_frame_time timestamptz, p_boxes jsonb, p_item_id text,
    p_now timestamptz
) RETURNS TABLE (reason text, expires_at timestamptz) LANGUAGE plpgsql AS $$
DECLARE
    refused text;
    j jobs%ROWTYPE;
    run_expiry timestamptz;
BEGIN
    refused := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, p_code, p_now);
    IF refused = 'NOT_FOUND' THEN
        RETURN QUERY SELECT refused, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT * INTO j FROM jobs WHERE run_id = p_run AND job_index = p_job;
    IF refused = '' AND (p_slot < 0 OR p_slot >= j.slot_count) THEN
        refused := 'SLOT_NOT_EXPECTED';
    END IF;
    -- previews of an attempt are published in slot order (the same slot again is a retry)
    IF refused = '' AND j.preview_slot > p_slot THEN
        refused := 'PREVIEW_OUT_OF_ORDER';
    END IF;
    IF refused <> '' THEN
        INSERT INTO staged_objects (object_key, kind, run_id, job_index, generation, slot_index,
                                    sha256, byte_size, content_type, staged_at, collectable_at)
        VALUES (p_key, 'preview', p_run, p_job, p_generation, p_slot, p_sha256, p_byte_size,
                p_content_type, p_now, p_now)
        ON CONFLICT (object_key) DO UPDATE
            SET collectable_at = p_now, gc_claimed_until = NULL, deleted_at = NULL
            WHERE staged_objects.deleted_at IS NOT NULL;
        RETURN QUERY SELECT refused, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT r.expires_at INTO run_expiry FROM runs r WHERE r.run_id = p_run;
    INSERT INTO staged_objects (object_key, kind, run_id, job_index, generation, slot_index,
                                sha256, byte_size, content_type, staged_at, published_at,
                                item_id, frame_time, boxes, collectable_at)
    VALUES (p_key, 'preview', p_run, p_job, p_generation, p_slot, p_sha256, p_byte_size,
            p_content_type, p_now, p_now, p_item_id, p_frame_time, p_boxes, run_expiry)
    ON CONFLICT (object_key) DO UPDATE
        SET sha256 = EXCLUDED.sha256, byte_size = EXCLUDED.byte_size,
            content_type = EXCLUDED.content_type, staged_at = EXCLUDED.staged_at,
            published_at = EXCLUDED.published_at, item_id = EXCLUDED.item_id,
            frame_time = EXCLUDED.frame_time, boxes = EXCLUDED.boxes,
            collectable_at = EXCLUDED.collectable_at, gc_claimed_until = NULL,
            deleted_at = NULL;
    UPDATE jobs SET preview_slot = p_slot
    WHERE run_id = p_run AND job_index = p_job AND preview_slot IS DISTINCT FROM p_slot;
    PERFORM pg_notify('workshop_run', p_run);
    RETURN QUERY SELECT '', run_expiry;
END;
$$;

-- Records a batch of previews for one processor (group commit), in (run, job, slot)
-- order so that concurrent batches lock job rows in the same order and never deadlock.
-- The calling service's key must still be live (SERVICE_NOT_AUTHORIZED for all).
-- p_boxes holds each preview's labels as JSON text (a jsonb[] of arrays would be a
-- two-dimensional array). Answers one row per preview with its 1-based position.
CREATE FUNCTION previews_record(
    p_runs text[], p_jobs integer[], p_generations bigint[], p_tokens uuid[],
    p_reporter text, p_service text, p_codes text[], p_keys text[], p_slots integer[],
    p_sha256 text[], p_sizes bigint[], p_content_types text[], p_frame_times timestamptz[],
    p_boxes text[], p_item_ids text[], p_now timestamptz
) RETURNS TABLE (ordinal integer, reason text, expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    outcome record;
BEGIN
    IF NOT key_live(p_service, p_now) THEN
        RETURN QUERY SELECT o::integer, 'SERVICE_NOT_AUTHORIZED', NULL::timestamptz
                     FROM generate_subscripts(p_runs, 1) AS o;
        RETURN;
    END IF;
    FOR i IN SELECT o FROM generate_subscripts(p_runs, 1) AS o
             ORDER BY p_runs[o], p_jobs[o], p_slots[o], o
    LOOP
        SELECT * INTO outcome FROM preview_record(
            p_runs[i], p_jobs[i], p_generations[i], p_tokens[i], p_reporter, p_codes[i],
            p_keys[i], p_slots[i], p_sha256[i], p_sizes[i], p_content_types[i],
            p_frame_times[i], p_boxes[i]::jsonb, p_item_ids[i], p_now);
        ordinal := i;
        reason := outcome.reason;
        expires_at := outcome.expires_at;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Jobs whose previews have all expired (a full run's when the job ended, a test run's
-- when its hour passed) and whose preview prefix was never swept, at least p_grace
-- after the job ended (a write still in flight then has long finished); held for the
-- calling pass until p_now + p_hold.
CREATE FUNCTION preview_sweeps_claim(
    p_limit integer, p_now timestamptz, p_grace interval, p_hold interval
) RETURNS TABLE (run_id text, job_index integer, mode text) LANGUAGE sql AS $$
    UPDATE jobs j SET sweep_claimed_until = p_now + p_hold
    FROM runs r
    WHERE r.run_id = j.run_id AND (j.run_id, j.job_index) IN (
        SELECT l.run_id, l.job_index FROM jobs l JOIN runs lr ON lr.run_id = l.run_id
        WHERE l.previews_swept_at IS NULL
          AND l.state IN ('completed', 'failed', 'cancelled', 'expired')
          AND l.updated_at <= p_now - p_grace
          AND (lr.mode = 'full' OR lr.expires_at <= p_now)
          AND (l.sweep_claimed_until IS NULL OR l.sweep_claimed_until <= p_now)
        ORDER BY l.updated_at, l.run_id, l.job_index
        LIMIT p_limit
        FOR UPDATE OF l SKIP LOCKED)
    RETURNING j.run_id, j.job_index, r.mode;
$$;

-- Settles a sweep: objects found under the job's preview prefix that no row records
-- become collectable previews, and so do rows whose bytes were deleted before this
-- sweep was claimed (p_hold ago from sweep_claimed_until) and are back: a row deleted
-- after that may be one another pass deleted after this one listed the prefix. With
-- p_done the sweep is finished. Answers how many objects it recorded (NULL: no such job).
CREATE FUNCTION preview_sweep_settle(
    p_run text, p_job integer, p_keys text[], p_sizes bigint[], p_generations bigint[],
    p_slots integer[], p_content_types text[], p_done boolean, p_now timestamptz,
    p_hold interval
) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    claimed_at timestamptz;
    recorded integer;
BEGIN
    SELECT j.sweep_claimed_until - p_hold INTO claimed_at
    FROM jobs j WHERE j.run_id = p_run AND j.job_index = p_job;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO staged_objects AS s (object_key, kind, run_id, job_index, generation,
                                     slot_index, sha256, byte_size, content_type, staged_at,
                                     collectable_at)
    SELECT u.object_key, 'preview', p_run, p_job, u.generation, u.slot_index, '', u.byte_size,
           u.content_type, p_now, p_now
    FROM unnest(p_keys, p_sizes, p_generations, p_slots, p_content_types)
         AS u (object_key, byte_size, generation, slot_index, content_type)
    ON CONFLICT (object_key) DO UPDATE
        SET collectable_at = p_now, gc_claimed_until = NULL, deleted_at = NULL
        WHERE s.deleted_at < claimed_at;
    GET DIAGNOSTICS recorded = ROW_COUNT;
    IF p_done THEN
        UPDATE jobs SET previews_swept_at = p_now, sweep_claimed_until = NULL
        WHERE run_id = p_run AND job_index = p_job;
    END IF;
    RETURN recorded;
END;
$$;

-- Commits a job's result in one transaction (docs/leases-and-fences.md): fences, staged
-- uploads, bucket items, receipt, job state and the run event together. Slot
-- accounting is checked by the caller before, against the slot facts it passes
-- (p_slot_count, p_first_slot_at, p_interval_ms), which must be the job's
-- (FACTS_MISMATCH otherwise); uploads are checked here, under the job's lock.
-- Returns '' or the reason it refused, and with a refusal the receipt of this
-- lease's generation if it already committed, so a retry after a lost answer
-- settles in the same round trip.
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

-- A preview that became an upload still counts as published.
CREATE INDEX staged_objects_recorded_previews ON staged_objects (run_id)
    WHERE item_id IS NOT NULL;
-- A run with the counts its status and detail are worked out from (docs/runs-and-jobs.md).
CREATE OR REPLACE VIEW run_status AS
SELECT r.*, c.*, rs.*, pv.*
FROM runs r
CROSS JOIN LATERAL (
    SELECT count(*) AS jobs_total,
           count(*) FILTER (WHERE state = 'queued') AS jobs_queued,
           count(*) FILTER (WHERE state = 'leased') AS jobs_leased,
           count(*) FILTER (WHERE state = 'completed') AS jobs_completed,
           count(*) FILTER (WHERE state = 'failed') AS jobs_failed,
           count(*) FILTER (WHERE state = 'cancelled') AS jobs_cancelled,
           count(*) FILTER (WHERE state = 'expired') AS jobs_expired,
           coalesce(sum(slot_count), 0) AS slots_expected,
           max(updated_at) AS last_job_update
    FROM jobs j WHERE j.run_id = r.run_id
) c
CROSS JOIN LATERAL (
    SELECT coalesce(sum(frames), 0) AS slots_frame, coalesce(sum(empties), 0) AS slots_empty,
           coalesce(sum(dropped), 0) AS slots_dropped, coalesce(sum(items_saved), 0) AS items_saved
    FROM receipts rc WHERE rc.run_id = r.run_id
) rs
CROSS JOIN LATERAL (
    -- every preview ever recorded has an item id, also one that became an upload
    SELECT count(*) AS previews_published
    FROM staged_objects so
    WHERE so.run_id = r.run_id AND so.item_id IS NOT NULL
) pv;
