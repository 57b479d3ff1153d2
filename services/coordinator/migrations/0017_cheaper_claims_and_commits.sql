-- Workshop coordinator: cheaper claims and commits (docs/benchmarks.md, "Claim cycle").
--
-- job_claim_many looked up a Claim's request ids with claim_request_id = ANY (ids): the
-- generic plan used jobs_claim_request by claimed_by alone and filtered every job the key
-- had ever claimed (a cost that grew with the key's history). It now probes the index
-- once per id. job_complete skips the uploads, the bucket items and their statement trigger
-- when a result saves nothing. Same names, signatures and answers: coordinators of the
-- previous version call them unchanged; apply it at any time.
CREATE OR REPLACE FUNCTION job_claim_many(
    p_runtime text, p_claimer text, p_cameras text[], p_now timestamptz, p_lease interval,
    p_request_id text, p_max integer
) RETURNS TABLE (
    job jobs, recording_sha256 text, recording_byte_size bigint, recording_object_key text,
    recording_start_at timestamptz, recording_end_at timestamptz,
    recording_fps double precision
) LANGUAGE plpgsql ROWS 4 AS $$
DECLARE
    head bigint;
    picked jobs%ROWTYPE;
    ids text[];
    one_id text;
    taken_runs text[] := '{}';
    ended boolean := false;
BEGIN
    IF NOT key_live(p_claimer, p_now) THEN
        RAISE EXCEPTION 'the claiming key was revoked or expired, or its user disabled'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    PERFORM runtime_seen(p_runtime, p_now);
    IF p_request_id IS NOT NULL THEN
        ids := ARRAY[p_request_id]
               || ARRAY(SELECT p_request_id || '#' || k FROM generate_series(1, p_max - 1) k);
        -- Claims of one key with one request id take turns: a retry that arrives while
        -- the call it repeats still runs waits for its commit, then answers its leases.
        PERFORM pg_advisory_xact_lock(hashtext('workshop.job_claim'),
                                      hashtext(p_claimer || '/' || p_request_id));
        -- One index probe per id, both columns of jobs_claim_request by equality: with
        -- claim_request_id = ANY (ids), even joined to unnest(ids), the generic plan used
        -- the index by claimed_by alone and filtered every job the key ever claimed.
        FOREACH one_id IN ARRAY ids LOOP
            SELECT * INTO picked FROM jobs
            WHERE claimed_by = p_claimer AND claim_request_id = one_id;
            CONTINUE WHEN NOT FOUND;
            -- answered again only while held (fence 1 would refuse a lapsed lease)
            IF picked.state = 'leased' AND picked.lease_token IS NOT NULL
               AND picked.lease_expires_at > p_now AND picked.runtime_id = p_runtime THEN
                RETURN QUERY SELECT * FROM job_claim_answer(picked);
                taken_runs := taken_runs || picked.run_id;
            ELSE
                ended := true;
            END IF;
        END LOOP;
        IF cardinality(taken_runs) = 0 AND ended THEN
            -- every lease of that claim ended: the id is forgotten, this is a new claim
            UPDATE jobs SET claim_request_id = NULL
            WHERE claimed_by = p_claimer AND claim_request_id = ANY (ids);
        END IF;
    END IF;
    IF cardinality(taken_runs) = 0 THEN
        WHILE cardinality(taken_runs) < p_max LOOP
            -- jobs this call leased are no longer queued, so each pick is the next one
            SELECT * INTO picked FROM jobs
            WHERE runtime_id = p_runtime AND state = 'queued' AND is_photo
              AND expires_at > p_now AND (p_cameras IS NULL OR camera_id = ANY (p_cameras))
            ORDER BY run_seq, job_index
            LIMIT 1 FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                SELECT run_seq INTO head FROM jobs
                WHERE runtime_id = p_runtime AND state IN ('queued', 'leased') AND NOT is_photo
                ORDER BY run_seq
                LIMIT 1;
                EXIT WHEN head IS NULL;
                SELECT * INTO picked FROM jobs
                WHERE runtime_id = p_runtime AND run_seq = head AND state = 'queued'
                  AND expires_at > p_now AND (p_cameras IS NULL OR camera_id = ANY (p_cameras))
                ORDER BY job_index
                LIMIT 1 FOR UPDATE SKIP LOCKED;
                EXIT WHEN NOT FOUND;
            END IF;
            -- fences 2 and 3 for the picked job only: one that can never commit is failed
            -- (it may have been the head run's last, so the head is looked up again)
            CONTINUE WHEN job_end_unfenced(picked, p_now);
            UPDATE jobs
            SET state = 'leased', generation = generation + 1, lease_token = gen_random_uuid(),
                lease_expires_at = least(p_now + p_lease, expires_at), updated_at = p_now,
                preview_slot = NULL, claimed_by = p_claimer,
                claim_request_id = CASE WHEN cardinality(taken_runs) = 0 THEN p_request_id
                                        ELSE p_request_id || '#' || cardinality(taken_runs) END
            WHERE run_id = picked.run_id AND job_index = picked.job_index
            RETURNING * INTO picked;
            RETURN QUERY SELECT * FROM job_claim_answer(picked);
            taken_runs := taken_runs || picked.run_id;
        END LOOP;
        PERFORM pg_notify('workshop_run', r) FROM (SELECT DISTINCT unnest(taken_runs) AS r) t;
    END IF;
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
        -- a preview named as an upload becomes one: its item replaces it
        UPDATE staged_objects SET kind = 'upload', published_at = p_now
        WHERE object_key = ANY (p_upload_keys);
    END IF;
    IF cardinality(p_item_ids) > 0 THEN
        INSERT INTO bucket_items (item_id, bucket_id, run_id, job_index, slot_index, step_id,
                                  camera_id, recording_id, recording_generation, frame_time, boxes,
                                  object_key, sha256, saved_at)
        SELECT u.item_id, u.bucket_id, p_run, p_job, u.slot, u.step_id, j.camera_id, j.recording_id,
               j.recording_generation, u.frame_time, u.boxes::jsonb, u.object_key, u.sha256, p_now
        FROM unnest(p_item_ids, p_item_buckets, p_item_slots, p_item_steps, p_item_times,
                    p_item_boxes, p_item_keys, p_item_sha256)
             AS u (item_id, bucket_id, slot, step_id, frame_time, boxes, object_key, sha256);
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
