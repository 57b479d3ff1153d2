-- Workshop coordinator: jobs that can never commit end promptly (docs/leases-and-fences.md).
--
-- A job whose recording was replaced or deleted after admission (fence 2), or whose
-- run's creator lost authority or whose policy revision was raised (fence 3), can
-- never commit: the snapshot pins what changed. Claim used to lease such a job all
-- the same; every write under the lease was refused, the lease lapsed, and only the
-- third lapse failed it (attempts_exhausted), 15 minutes and three downloads later.
-- Now Claim checks fences 2 and 3 for the job it picked and, when one fails, ends it
-- failed with failure_reason 'source_changed' or 'authority_lost' and goes on to the
-- next job, in the same statement. A Complete or Fail that the fences refuse for one
-- of those reasons ends the job the same way (the refusal is answered as before).
-- failure_reason is plain text (no constraint to extend).

-- Ends a job that can never commit as failed, as Fail would, so that it does not wait
-- leased or queued for its lease to lapse three times; returns whether it did. The
-- caller holds the job's row lock. It checks fences 2 and 3 (docs/leases-and-fences.md) as
-- workshop_fence does, in one read without locks (the committing calls still check
-- them under locks): the recording at the admitted generation, else failure_reason
-- 'source_changed'; the policy revision and the run creator's authority, else
-- 'authority_lost'; with a message for people. The snapshot pins what failed.
CREATE FUNCTION job_end_unfenced(p_job jobs, p_now timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    f record;
    why text;
    message text;
BEGIN
    SELECT rec.generation AS source_generation, rec.deleted_at AS source_deleted,
           r.policy_revision, pol.revision AS policy_now, r.created_by ->> 'kind' AS kind,
           nullif(r.created_by ->> 'user_id', '') AS creator_user,
           k.key_id IS NOT NULL AS key_ok, s.session_id IS NOT NULL AS session_ok,
           u.user_id IS NOT NULL AS user_ok
    INTO f
    FROM runs r
    CROSS JOIN policy pol
    LEFT JOIN recordings rec ON rec.recording_id = p_job.recording_id
    LEFT JOIN keys k
        ON r.created_by ->> 'kind' = 'key' AND k.key_id = r.created_by ->> 'key_id'
       AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > p_now)
    LEFT JOIN sessions s
        ON r.created_by ->> 'kind' = 'session' AND s.session_id = r.created_by ->> 'session_id'
       AND s.revoked_at IS NULL AND s.expires_at > p_now
    LEFT JOIN users u
        ON u.user_id = nullif(r.created_by ->> 'user_id', '') AND u.disabled_at IS NULL
    WHERE r.run_id = p_job.run_id;
    why := 'source_changed';
    IF f.source_generation IS NULL OR f.source_deleted IS NOT NULL THEN
        message := format('Recording %s was deleted after the run was admitted.',
                          p_job.recording_id);
    ELSIF f.source_generation <> p_job.recording_generation THEN
        message := format('Recording %s was replaced after the run was admitted '
                          '(generation %s → %s).',
                          p_job.recording_id, p_job.recording_generation, f.source_generation);
    ELSE
        why := 'authority_lost';
        IF f.policy_now IS DISTINCT FROM f.policy_revision THEN
            message := format('The policy revision was raised after the run was admitted '
                              '(revision %s → %s).', f.policy_revision, f.policy_now);
        ELSIF f.kind = 'key' AND NOT f.key_ok THEN
            message := 'The key that created the run was revoked or expired.';
        ELSIF f.kind = 'session' AND NOT f.session_ok THEN
            message := 'The session that created the run was revoked or expired.';
        ELSIF f.kind IS NULL OR f.kind NOT IN ('key', 'session', 'scheduler') THEN
            message := 'The run''s creator has no authority.';
        ELSIF f.creator_user IS NOT NULL AND NOT f.user_ok THEN
            message := format('User %s, who created the run, was disabled.', f.creator_user);
        ELSE
            RETURN false;
        END IF;
    END IF;
    UPDATE jobs
    SET state = 'failed', failure_reason = why, failure_message = message,
        lease_token = NULL, lease_expires_at = NULL, updated_at = p_now
    WHERE run_id = p_job.run_id AND job_index = p_job.job_index;
    PERFORM job_objects_abandon(p_job.run_id, p_job.job_index, p_now);
    PERFORM pg_notify('workshop_run', p_job.run_id);
    RETURN true;
END;
$$;

-- Claim as in 0003; a picked job whose fence 2 or 3 fails is failed, not leased.
CREATE OR REPLACE FUNCTION job_claim(
    p_runtime text, p_claimer text, p_cameras text[], p_now timestamptz, p_lease interval
) RETURNS SETOF jobs LANGUAGE plpgsql ROWS 1 AS $$
DECLARE
    head bigint;
    picked jobs%ROWTYPE;
BEGIN
    IF NOT key_live(p_claimer, p_now) THEN
        RAISE EXCEPTION 'the claiming key was revoked or expired, or its user disabled'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    PERFORM runtime_seen(p_runtime, p_now);
    LOOP
        SELECT * INTO picked FROM jobs
        WHERE runtime_id = p_runtime AND state = 'queued' AND is_photo AND expires_at > p_now
          AND (p_cameras IS NULL OR camera_id = ANY (p_cameras))
        ORDER BY run_seq, job_index
        LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            SELECT run_seq INTO head FROM jobs
            WHERE runtime_id = p_runtime AND state IN ('queued', 'leased') AND NOT is_photo
            ORDER BY run_seq
            LIMIT 1;
            IF head IS NULL THEN
                RETURN;
            END IF;
            SELECT * INTO picked FROM jobs
            WHERE runtime_id = p_runtime AND run_seq = head AND state = 'queued'
              AND expires_at > p_now AND (p_cameras IS NULL OR camera_id = ANY (p_cameras))
            ORDER BY job_index
            LIMIT 1 FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                RETURN;
            END IF;
        END IF;
        -- fences 2 and 3 for the picked job only: one that can never commit is failed
        -- (it may have been the head run's last, so the head is looked up again)
        EXIT WHEN NOT job_end_unfenced(picked, p_now);
    END LOOP;
    UPDATE jobs
    SET state = 'leased', generation = generation + 1, lease_token = gen_random_uuid(),
        lease_expires_at = least(p_now + p_lease, expires_at), updated_at = p_now,
        preview_slot = NULL
    WHERE run_id = picked.run_id AND job_index = picked.job_index
    RETURNING * INTO picked;
    PERFORM pg_notify('workshop_run', picked.run_id);
    RETURN NEXT picked;
END;
$$;

-- Complete as in 0003; a refusal by fence 2 or 3 also fails the job.
CREATE OR REPLACE FUNCTION job_complete(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_result_sha256 text, p_decoder text,
    p_slot_count integer, p_first_slot_at timestamptz, p_interval_seconds integer,
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
       OR j.interval_seconds <> p_interval_seconds THEN
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

-- Fail as in 0002; a refusal by fence 2 or 3 fails the job with that reason instead.
CREATE OR REPLACE FUNCTION job_fail(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_message text, p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, NULL, p_now);
    j jobs%ROWTYPE;
BEGIN
    IF fenced <> '' THEN
        IF fenced IN ('SOURCE_CHANGED', 'POLICY_CHANGED', 'AUTHORITY_REVOKED') THEN
            -- the job can never commit: it fails with that reason instead
            SELECT * INTO j FROM jobs WHERE run_id = p_run AND job_index = p_job;
            PERFORM job_end_unfenced(j, p_now);
        END IF;
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
