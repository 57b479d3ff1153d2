-- Workshop coordinator: the processor's and the preview service's hot paths in one
-- round trip each, with the checks that the coordinator's in-process caches rely on
-- made here, in the transaction that writes (see docs/benchmarks.md, claim_cycle).
--
-- The coordinator caches a caller's principal for a few seconds, so every write a
-- cached principal can make re-checks that caller's key under the statement's
-- snapshot: Claim checks the claiming key (key_live), fence 4 checks the reporting
-- key and now its user too, and staging and publishing check the preview service's
-- own key. It also keeps each job's slot facts (immutable) from its Claim, and
-- job_complete verifies them under the job's lock before it commits.

-- A heartbeat changes nothing but lease_expires_at; with that column in no index the
-- renewal is a HOT update (no new entry in each of the jobs indexes, measured: every
-- heartbeat was a non-HOT update before). The rescuer finds lapsed leases among the
-- leased jobs, which are few: a few per processor.
DROP INDEX jobs_lease_lapse;
CREATE INDEX jobs_leased ON jobs (runtime_id) WHERE state = 'leased';

-- Previews of an attempt are published in slot order. preview_publish checked that by
-- looking for a later published slot among the staged objects, which the planner served
-- from the run's recent-previews index: every published preview of the run read again
-- on each publish (0.36-0.47 ms a preview at 250 previews a job, measured). The job row,
-- locked by the fences anyway, now keeps the last slot published under its lease
-- (NULL: none yet; a claim clears it); leases in flight start from what they published.
ALTER TABLE jobs ADD COLUMN preview_slot integer;
UPDATE jobs j SET preview_slot = p.slot
FROM (SELECT so.run_id, so.job_index, max(so.slot_index) AS slot
      FROM staged_objects so
      JOIN jobs l ON l.run_id = so.run_id AND l.job_index = so.job_index
      WHERE l.state = 'leased' AND so.generation = l.generation AND so.kind = 'preview'
        AND so.published_at IS NOT NULL
      GROUP BY so.run_id, so.job_index) p
WHERE j.run_id = p.run_id AND j.job_index = p.job_index;

-- Helpers called from plpgsql are plpgsql themselves: a LANGUAGE sql function called
-- with PERFORM is parsed and planned again on every call (0.15-0.25 ms each, measured
-- with pg_stat_statements), a plpgsql body keeps its plans for the session.
CREATE OR REPLACE FUNCTION runtime_seen(p_runtime text, p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runtimes SET last_seen_at = p_now
    WHERE runtime_id = p_runtime
      AND (last_seen_at IS NULL OR last_seen_at < p_now - interval '1 second');
END;
$$;

CREATE OR REPLACE FUNCTION job_objects_abandon(p_run text, p_job integer, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE staged_objects s SET collectable_at = p_now
    WHERE s.run_id = p_run AND s.job_index = p_job AND s.collectable_at IS NULL
      AND (s.published_at IS NULL
           OR (s.kind = 'preview' AND (SELECT r.mode FROM runs r WHERE r.run_id = p_run) = 'full'));
END;
$$;

-- Whether a key still authenticates: not revoked, not expired, its user (if any) not
-- disabled. The same rules as the coordinator's authentication, read fresh.
CREATE FUNCTION key_live(p_key text, p_now timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM keys k LEFT JOIN users u ON u.user_id = k.user_id
        WHERE k.key_id = p_key AND k.revoked_at IS NULL
          AND (k.expires_at IS NULL OR k.expires_at > p_now) AND u.disabled_at IS NULL);
END;
$$;

-- The four fences (docs/leases-and-fences.md), as in 0002, and fence 4 also refuses a reporting key
-- whose user was disabled (authentication refuses such a key; a cached principal
-- must not outlive it).
CREATE OR REPLACE FUNCTION workshop_fence(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    j jobs%ROWTYPE;
    r runs%ROWTYPE;
    creator_kind text;
    creator_user text;
    device text;
    reporter_user text;
BEGIN
    SELECT * INTO j FROM jobs WHERE run_id = p_run AND job_index = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'NOT_FOUND';
    END IF;
    IF j.state = 'cancelled' THEN
        RETURN 'JOB_CANCELLED';
    END IF;
    IF j.state IN ('completed', 'failed', 'expired') THEN
        RETURN 'JOB_FINISHED';
    END IF;
    -- fence 1: this lease, still live
    IF j.state <> 'leased' OR j.generation <> p_generation
       OR j.lease_token IS DISTINCT FROM p_token OR j.lease_expires_at <= p_now THEN
        RETURN 'LEASE_MISMATCH';
    END IF;
    -- fence 2: the source recording at the admitted generation
    PERFORM 1 FROM recordings
    WHERE recording_id = j.recording_id AND generation = j.recording_generation
      AND deleted_at IS NULL
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN 'SOURCE_CHANGED';
    END IF;
    -- fence 3: the policy revision, then the creating principal's authority
    SELECT * INTO r FROM runs WHERE run_id = p_run;
    PERFORM 1 FROM policy WHERE revision = r.policy_revision FOR SHARE;
    IF NOT FOUND THEN
        RETURN 'POLICY_CHANGED';
    END IF;
    creator_kind := r.created_by ->> 'kind';
    creator_user := nullif(r.created_by ->> 'user_id', '');
    IF creator_kind = 'key' THEN
        PERFORM 1 FROM keys
        WHERE key_id = r.created_by ->> 'key_id' AND revoked_at IS NULL
          AND (expires_at IS NULL OR expires_at > p_now)
        FOR SHARE;
        IF NOT FOUND THEN
            RETURN 'AUTHORITY_REVOKED';
        END IF;
    ELSIF creator_kind = 'session' THEN
        PERFORM 1 FROM sessions
        WHERE session_id = r.created_by ->> 'session_id' AND revoked_at IS NULL
          AND expires_at > p_now
        FOR SHARE;
        IF NOT FOUND THEN
            RETURN 'AUTHORITY_REVOKED';
        END IF;
    ELSIF creator_kind <> 'scheduler' THEN
        RETURN 'AUTHORITY_REVOKED';
    END IF;
    IF creator_user IS NOT NULL THEN
        PERFORM 1 FROM users WHERE user_id = creator_user AND disabled_at IS NULL FOR SHARE;
        IF NOT FOUND THEN
            RETURN 'AUTHORITY_REVOKED';
        END IF;
    END IF;
    -- fence 4: the reporting key is still a workshop:run key for the runtime's
    -- device (or an admin key) of an enabled user, and the code is the snapshot's
    SELECT device_id INTO device FROM runtimes WHERE runtime_id = j.runtime_id;
    SELECT k.user_id INTO reporter_user FROM keys k
    WHERE k.key_id = p_reporter AND k.revoked_at IS NULL
      AND (k.expires_at IS NULL OR k.expires_at > p_now)
      AND (k.scopes @> jsonb_build_array(jsonb_build_object('scope', 'workshop:run',
                                                            'device_id', device))
           OR k.scopes @> '[{"scope": "admin"}]')
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN 'REPORTER_NOT_AUTHORIZED';
    END IF;
    IF reporter_user IS NOT NULL THEN
        PERFORM 1 FROM users WHERE user_id = reporter_user AND disabled_at IS NULL FOR SHARE;
        IF NOT FOUND THEN
            RETURN 'REPORTER_NOT_AUTHORIZED';
        END IF;
    END IF;
    IF p_code IS NOT NULL AND p_code <> r.code_sha256 THEN
        RETURN 'CODE_MISMATCH';
    END IF;
    RETURN '';
END;
$$;

-- Claim as in 0002, with the claiming key checked first: a key revoked, expired or of a
-- disabled user leases nothing (SQLSTATE 28000), even while the coordinator still holds
-- its principal in cache.
DROP FUNCTION job_claim(text, text[], timestamptz, interval);
CREATE FUNCTION job_claim(
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

-- Commits a job's result as in 0002, in the one round trip of Complete:
-- - p_slot_count, p_first_slot_at and p_interval_seconds are the slot facts the caller
--   checked the result against; they must be the job's (FACTS_MISMATCH otherwise);
-- - a refused call of a lease that already committed gets that commit's receipt, so a
--   retry after a lost answer settles without a second read.
DROP FUNCTION job_complete(
    text, integer, bigint, uuid, text, text, text, text, integer, integer, integer, text[],
    text[], integer[], text[], text[], integer[], text[], timestamptz[], text[], text[], text[],
    timestamptz);
CREATE FUNCTION job_complete(
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

-- Stages an object as in 0002, in the one round trip of StageObject: the calling
-- service's key must still be live (SERVICE_NOT_AUTHORIZED), the key is built by the
-- caller from the run's immutable mode, and the answer says when the object becomes
-- collectable if nothing commits it: when this lease lapses, unless renewed.
DROP FUNCTION object_stage(
    text, integer, bigint, uuid, text, text, text, integer, text, bigint, text, text,
    timestamptz);
CREATE FUNCTION object_stage(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_service text, p_code text, p_kind text, p_slot integer, p_sha256 text,
    p_byte_size bigint, p_content_type text, p_key text, p_now timestamptz
) RETURNS TABLE (reason text, collectable_after timestamptz) LANGUAGE plpgsql AS $$
DECLARE
    fenced text;
    j jobs%ROWTYPE;
BEGIN
    IF NOT key_live(p_service, p_now) THEN
        RETURN QUERY SELECT 'SERVICE_NOT_AUTHORIZED', NULL::timestamptz;
        RETURN;
    END IF;
    fenced := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, p_code, p_now);
    IF fenced <> '' THEN
        RETURN QUERY SELECT fenced, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT * INTO j FROM jobs WHERE run_id = p_run AND job_index = p_job;
    IF p_slot < 0 OR p_slot >= j.slot_count THEN
        RETURN QUERY SELECT 'SLOT_NOT_EXPECTED', NULL::timestamptz;
        RETURN;
    END IF;
    INSERT INTO staged_objects (object_key, kind, run_id, job_index, generation, slot_index,
                                sha256, byte_size, content_type, staged_at)
    VALUES (p_key, p_kind, p_run, p_job, p_generation, p_slot, p_sha256, p_byte_size,
            p_content_type, p_now)
    ON CONFLICT (object_key) DO UPDATE
        SET sha256 = EXCLUDED.sha256, byte_size = EXCLUDED.byte_size,
            content_type = EXCLUDED.content_type, staged_at = EXCLUDED.staged_at,
            published_at = NULL, frame_time = NULL, boxes = NULL, item_id = NULL;
    RETURN QUERY SELECT '', j.lease_expires_at;
END;
$$;

-- Publishes a staged preview as in 0002; the calling service's key must still be live,
-- and the slot order is checked against the job's preview_slot.
DROP FUNCTION preview_publish(
    text, integer, bigint, uuid, text, text, text, integer, text, bigint, timestamptz, jsonb,
    text, timestamptz);
CREATE FUNCTION preview_publish(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_service text, p_code text, p_key text, p_slot integer, p_sha256 text, p_byte_size bigint,
    p_frame_time timestamptz, p_boxes jsonb, p_item_id text, p_now timestamptz
) RETURNS TABLE (reason text, expires_at timestamptz) LANGUAGE plpgsql AS $$
DECLARE
    fenced text;
    run_expiry timestamptz;
    published_slot integer;
BEGIN
    IF NOT key_live(p_service, p_now) THEN
        RETURN QUERY SELECT 'SERVICE_NOT_AUTHORIZED', NULL::timestamptz;
        RETURN;
    END IF;
    fenced := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, p_code, p_now);
    IF fenced <> '' THEN
        RETURN QUERY SELECT fenced, NULL::timestamptz;
        RETURN;
    END IF;
    -- previews of an attempt are published in slot order (the same slot again is a retry)
    SELECT j.preview_slot INTO published_slot FROM jobs j
    WHERE j.run_id = p_run AND j.job_index = p_job;
    IF published_slot > p_slot THEN
        RETURN QUERY SELECT 'PREVIEW_OUT_OF_ORDER', NULL::timestamptz;
        RETURN;
    END IF;
    SELECT r.expires_at INTO run_expiry FROM runs r WHERE r.run_id = p_run;
    UPDATE staged_objects
    SET published_at = p_now, frame_time = p_frame_time, boxes = p_boxes, item_id = p_item_id,
        collectable_at = run_expiry
    WHERE object_key = p_key AND kind = 'preview' AND run_id = p_run AND job_index = p_job
      AND generation = p_generation AND slot_index = p_slot AND sha256 = p_sha256
      AND byte_size = p_byte_size AND deleted_at IS NULL;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'PREVIEW_NOT_STAGED', NULL::timestamptz;
        RETURN;
    END IF;
    UPDATE jobs j SET preview_slot = p_slot
    WHERE j.run_id = p_run AND j.job_index = p_job AND j.preview_slot IS DISTINCT FROM p_slot;
    PERFORM pg_notify('workshop_run', p_run);
    RETURN QUERY SELECT '', run_expiry;
END;
$$;
