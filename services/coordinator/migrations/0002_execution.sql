-- Workshop coordinator: execution (docs/runs-and-jobs.md, docs/leases-and-fences.md): leases, fences, receipts, items,
-- staged objects, previews and run events.

ALTER TABLE runs ADD COLUMN code_sha256 text NOT NULL DEFAULT '';
UPDATE runs r SET code_sha256 = s.snapshot ->> 'code_sha256'
FROM run_snapshots s WHERE s.run_id = r.run_id;
ALTER TABLE runs ALTER COLUMN code_sha256 DROP DEFAULT;

ALTER TABLE jobs ADD COLUMN is_photo boolean NOT NULL DEFAULT false;
ALTER TABLE jobs ADD COLUMN result_sha256 text;
ALTER TABLE jobs ADD COLUMN committed_at timestamptz;

-- The head run of a runtime: its oldest run with queued or leased jobs.
CREATE INDEX jobs_unfinished_by_runtime ON jobs (runtime_id, run_seq)
    WHERE state IN ('queued', 'leased');
CREATE INDEX jobs_photos_claimable ON jobs (runtime_id, run_seq, job_index)
    WHERE state = 'queued' AND is_photo;
CREATE INDEX jobs_lease_lapse ON jobs (lease_expires_at) WHERE state = 'leased';
CREATE INDEX jobs_source_expiry ON jobs (expires_at) WHERE state IN ('queued', 'leased');

-- One receipt per committed completion (docs/leases-and-fences.md).
CREATE TABLE receipts (
    run_id        text NOT NULL,
    job_index     integer NOT NULL,
    generation    bigint NOT NULL,
    result_sha256 text NOT NULL,
    frames        integer NOT NULL,
    empties       integer NOT NULL,
    dropped       integer NOT NULL,
    items_saved   integer NOT NULL,
    committed_at  timestamptz NOT NULL,
    PRIMARY KEY (run_id, job_index),
    FOREIGN KEY (run_id, job_index) REFERENCES jobs (run_id, job_index)
);

-- Objects whose bytes the preview service writes: staged before the fenced
-- commit, one key per run, job, lease generation, slot and kind.
CREATE TABLE staged_objects (
    object_key     text PRIMARY KEY,
    kind           text NOT NULL CHECK (kind IN ('preview', 'upload')),
    run_id         text NOT NULL,
    job_index      integer NOT NULL,
    generation     bigint NOT NULL,
    slot_index     integer NOT NULL,
    sha256         text NOT NULL,
    byte_size      bigint NOT NULL,
    content_type   text NOT NULL,
    staged_at      timestamptz NOT NULL,
    -- previews: when published, with their labels and the item id of their image
    -- URL; uploads: when committed as items
    published_at   timestamptz,
    item_id        text UNIQUE,
    frame_time     timestamptz,
    boxes          jsonb,
    -- when the bytes may be deleted (NULL: kept); which cleanup pass holds them
    -- until when (so two preview replicas never delete the same object); when
    -- they were deleted
    collectable_at timestamptz,
    gc_claimed_until timestamptz,
    deleted_at     timestamptz,
    FOREIGN KEY (run_id, job_index) REFERENCES jobs (run_id, job_index)
);
CREATE INDEX staged_objects_by_job ON staged_objects (run_id, job_index, kind);
CREATE INDEX staged_objects_collectable ON staged_objects (kind, collectable_at)
    WHERE deleted_at IS NULL AND collectable_at IS NOT NULL;
CREATE INDEX staged_objects_recent_previews ON staged_objects (run_id, published_at DESC)
    WHERE kind = 'preview' AND published_at IS NOT NULL;

-- A full run's labeled frames, committed a whole job at a time.
CREATE TABLE bucket_items (
    item_id              text PRIMARY KEY,
    bucket_id            text NOT NULL REFERENCES buckets (bucket_id),
    run_id               text NOT NULL,
    job_index            integer NOT NULL,
    slot_index           integer NOT NULL,
    step_id              text NOT NULL,
    camera_id            text NOT NULL,
    recording_id         text NOT NULL,
    recording_generation bigint NOT NULL,
    frame_time           timestamptz NOT NULL,
    boxes                jsonb NOT NULL,
    object_key           text NOT NULL,
    sha256               text NOT NULL,
    review_state         text NOT NULL DEFAULT 'pending'
        CHECK (review_state IN ('pending', 'accepted', 'rejected')),
    relabel_class        text,
    saved_at             timestamptz NOT NULL,
    reviewed_at          timestamptz,
    UNIQUE (run_id, job_index, slot_index, step_id),
    FOREIGN KEY (run_id, job_index) REFERENCES jobs (run_id, job_index)
);
CREATE INDEX bucket_items_by_bucket ON bucket_items (bucket_id, saved_at);
CREATE INDEX bucket_items_by_recording ON bucket_items (recording_id);

-- The four fences (docs/leases-and-fences.md), checked under row locks; '' when all hold, else
-- the ErrorReason that failed. Locks: the job FOR UPDATE; the recording, the
-- policy, the creator's key/session/user and the reporting key FOR SHARE, so a
-- concurrent replacement, revocation or policy raise waits for our commit.
CREATE FUNCTION workshop_fence(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    j jobs%ROWTYPE;
    r runs%ROWTYPE;
    creator_kind text;
    creator_user text;
    device text;
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
    -- device (or an admin key), and the code is the snapshot's
    SELECT device_id INTO device FROM runtimes WHERE runtime_id = j.runtime_id;
    PERFORM 1 FROM keys
    WHERE key_id = p_reporter AND revoked_at IS NULL
      AND (expires_at IS NULL OR expires_at > p_now)
      AND (scopes @> jsonb_build_array(jsonb_build_object('scope', 'workshop:run',
                                                          'device_id', device))
           OR scopes @> '[{"scope": "admin"}]')
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN 'REPORTER_NOT_AUTHORIZED';
    END IF;
    IF p_code IS NOT NULL AND p_code <> r.code_sha256 THEN
        RETURN 'CODE_MISMATCH';
    END IF;
    RETURN '';
END;
$$;

-- Records that a runtime checked in; at most one write a second per runtime,
-- so many processors of one runtime do not queue on its row.
CREATE FUNCTION runtime_seen(p_runtime text, p_now timestamptz) RETURNS void
LANGUAGE sql AS $$
    UPDATE runtimes SET last_seen_at = p_now
    WHERE runtime_id = p_runtime
      AND (last_seen_at IS NULL OR last_seen_at < p_now - interval '1 second');
$$;

-- Leases the next claimable job of a runtime (docs/runs-and-jobs.md): photos first, then
-- the head run (the oldest with queued or leased jobs), in job order; only jobs
-- of the cameras in p_cameras (NULL: every camera). One statement, one round trip.
-- ROWS 1 tells the planner so: the join to snapshot_recordings then probes its
-- index instead of hashing the whole table on every claim.
CREATE FUNCTION job_claim(
    p_runtime text, p_cameras text[], p_now timestamptz, p_lease interval
) RETURNS SETOF jobs LANGUAGE plpgsql ROWS 1 AS $$
DECLARE
    head bigint;
    picked jobs%ROWTYPE;
BEGIN
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
        lease_expires_at = least(p_now + p_lease, expires_at), updated_at = p_now
    WHERE run_id = picked.run_id AND job_index = picked.job_index
    RETURNING * INTO picked;
    PERFORM pg_notify('workshop_run', picked.run_id);
    RETURN NEXT picked;
END;
$$;

-- Renews a lease: min(now + lease, job expiry).
CREATE FUNCTION job_heartbeat(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_now timestamptz, p_lease interval
) RETURNS TABLE (reason text, lease_expires_at timestamptz) LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, NULL, p_now);
    renewed timestamptz;
    runtime text;
BEGIN
    IF fenced <> '' THEN
        RETURN QUERY SELECT fenced, NULL::timestamptz;
        RETURN;
    END IF;
    -- updated_at tells when the job last changed state: a renewal is not a change
    UPDATE jobs j SET lease_expires_at = least(p_now + p_lease, j.expires_at)
    WHERE j.run_id = p_run AND j.job_index = p_job
    RETURNING j.lease_expires_at, j.runtime_id INTO renewed, runtime;
    PERFORM runtime_seen(runtime, p_now);
    RETURN QUERY SELECT '', renewed;
END;
$$;

-- Progress: monotonic; at most 100 persisted updates per job, later ones are
-- coalesced (answered, not stored); a lower value is ignored.
CREATE FUNCTION job_progress(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_percent integer, p_phase text, p_now timestamptz
) RETURNS TABLE (reason text, progress integer, persisted boolean) LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, NULL, p_now);
    stored integer;
BEGIN
    IF fenced <> '' THEN
        RETURN QUERY SELECT fenced, NULL::integer, false;
        RETURN;
    END IF;
    UPDATE jobs j
    SET progress = greatest(j.progress, p_percent), phase = coalesce(p_phase, j.phase),
        progress_updates = j.progress_updates + 1
    WHERE j.run_id = p_run AND j.job_index = p_job AND j.progress_updates < 100
      AND (p_percent > j.progress OR (p_phase IS NOT NULL AND p_phase IS DISTINCT FROM j.phase))
    RETURNING j.progress INTO stored;
    IF FOUND THEN
        PERFORM pg_notify('workshop_run', p_run);
        RETURN QUERY SELECT '', stored, true;
        RETURN;
    END IF;
    RETURN QUERY SELECT '', j.progress, false FROM jobs j
    WHERE j.run_id = p_run AND j.job_index = p_job;
END;
$$;

-- Ends a job as failed (processor_failed), without retry.
CREATE FUNCTION job_fail(
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

-- Hands a job back without spending an attempt (graceful shutdown).
CREATE FUNCTION job_release(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, NULL, p_now);
BEGIN
    IF fenced <> '' THEN
        RETURN fenced;
    END IF;
    UPDATE jobs SET state = 'queued', lease_token = NULL, lease_expires_at = NULL, updated_at = p_now
    WHERE run_id = p_run AND job_index = p_job;
    PERFORM job_objects_abandon(p_run, p_job, p_now);
    PERFORM pg_notify('workshop_run', p_run);
    RETURN '';
END;
$$;

-- Commits a job's result in one transaction (docs/leases-and-fences.md): fences, staged
-- uploads, bucket items, receipt, job state and the run event together. Slot
-- accounting is checked by the caller before; uploads are checked here, under
-- the job's lock. Returns '' or the reason it refused.
CREATE FUNCTION job_complete(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_result_sha256 text, p_decoder text,
    p_frames integer, p_empties integer, p_dropped integer,
    p_upload_keys text[], p_upload_sha256 text[], p_upload_slots integer[],
    p_item_ids text[], p_item_buckets text[], p_item_slots integer[], p_item_steps text[],
    p_item_times timestamptz[], p_item_boxes text[], p_item_keys text[], p_item_sha256 text[],
    p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, p_code, p_now);
    staged integer;
    j jobs%ROWTYPE;
BEGIN
    IF fenced <> '' THEN
        RETURN fenced;
    END IF;
    SELECT count(*) INTO staged
    FROM unnest(p_upload_keys, p_upload_sha256, p_upload_slots) AS u (object_key, sha256, slot)
    JOIN staged_objects s ON s.object_key = u.object_key
    WHERE s.kind = 'upload' AND s.run_id = p_run AND s.job_index = p_job
      AND s.generation = p_generation AND s.slot_index = u.slot AND s.sha256 = u.sha256
      AND s.deleted_at IS NULL;
    IF staged <> cardinality(p_upload_keys) THEN
        RETURN 'UPLOAD_NOT_STAGED';
    END IF;
    SELECT * INTO j FROM jobs WHERE run_id = p_run AND job_index = p_job;
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
    RETURN '';
END;
$$;

-- Objects of a job that ended become garbage unless kept: unpublished
-- staged objects always, published previews too for full runs (their items
-- never came). Called when a job fails, is cancelled, expires or loses its lease.
CREATE FUNCTION job_objects_abandon(p_run text, p_job integer, p_now timestamptz) RETURNS void
LANGUAGE sql AS $$
    UPDATE staged_objects s SET collectable_at = p_now
    WHERE s.run_id = p_run AND s.job_index = p_job AND s.collectable_at IS NULL
      AND (s.published_at IS NULL
           OR (s.kind = 'preview' AND (SELECT mode FROM runs WHERE run_id = p_run) = 'full'));
$$;

-- Stages an object for one slot under the fences; the key is unique per run,
-- job, lease generation, slot and kind, so a retry under the same lease reuses it.
CREATE FUNCTION object_stage(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_kind text, p_slot integer, p_sha256 text, p_byte_size bigint,
    p_content_type text, p_key text, p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, p_code, p_now);
BEGIN
    IF fenced <> '' THEN
        RETURN fenced;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM jobs WHERE run_id = p_run AND job_index = p_job
                   AND p_slot >= 0 AND p_slot < slot_count) THEN
        RETURN 'SLOT_NOT_EXPECTED';
    END IF;
    INSERT INTO staged_objects (object_key, kind, run_id, job_index, generation, slot_index,
                                sha256, byte_size, content_type, staged_at)
    VALUES (p_key, p_kind, p_run, p_job, p_generation, p_slot, p_sha256, p_byte_size,
            p_content_type, p_now)
    ON CONFLICT (object_key) DO UPDATE
        SET sha256 = EXCLUDED.sha256, byte_size = EXCLUDED.byte_size,
            content_type = EXCLUDED.content_type, staged_at = EXCLUDED.staged_at,
            published_at = NULL, frame_time = NULL, boxes = NULL, item_id = NULL;
    RETURN '';
END;
$$;

-- Publishes a staged preview with its labels under the fences. A test run's
-- preview lives until the test's hour ends; a full run's until its job ends.
CREATE FUNCTION preview_publish(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_key text, p_slot integer, p_sha256 text, p_byte_size bigint,
    p_frame_time timestamptz, p_boxes jsonb, p_item_id text, p_now timestamptz
) RETURNS TABLE (reason text, expires_at timestamptz) LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, p_code, p_now);
    run_expiry timestamptz;
BEGIN
    IF fenced <> '' THEN
        RETURN QUERY SELECT fenced, NULL::timestamptz;
        RETURN;
    END IF;
    -- previews of an attempt are published in slot order
    IF EXISTS (SELECT 1 FROM staged_objects
               WHERE run_id = p_run AND job_index = p_job AND generation = p_generation
                 AND kind = 'preview' AND published_at IS NOT NULL AND slot_index > p_slot) THEN
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
    PERFORM pg_notify('workshop_run', p_run);
    RETURN QUERY SELECT '', run_expiry;
END;
$$;

-- Cancels a run (docs/runs-and-jobs.md): queued and leased jobs become cancelled, so writes
-- under their leases are refused from now on; completed jobs keep their results.
CREATE FUNCTION run_cancel(p_run text, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    cancelled integer := 0;
    job record;
BEGIN
    FOR job IN
        UPDATE jobs SET state = 'cancelled', lease_token = NULL, lease_expires_at = NULL,
                        updated_at = p_now
        WHERE run_id = p_run AND state IN ('queued', 'leased')
        RETURNING job_index
    LOOP
        PERFORM job_objects_abandon(p_run, job.job_index, p_now);
        cancelled := cancelled + 1;
    END LOOP;
    IF cancelled > 0 THEN
        PERFORM pg_notify('workshop_run', p_run);
    END IF;
    RETURN cancelled;
END;
$$;

-- Maintenance (one replica at a time): leases that lapsed return their job to
-- the queue for a new generation, and the third lapse fails it with
-- attempts_exhausted. At most p_batch jobs per call; returns the jobs touched.
CREATE FUNCTION jobs_rescue_lapsed(p_now timestamptz, p_max_lapses integer, p_batch integer)
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

-- Maintenance: jobs expire with their source (the recording's 40 days, the
-- test's hour) and their input is cleared. At most p_batch jobs per call.
CREATE FUNCTION jobs_expire(p_now timestamptz, p_batch integer)
RETURNS TABLE (run_id text, job_index integer) LANGUAGE plpgsql AS $$
DECLARE
    job record;
    runs_touched text[] := '{}';
BEGIN
    FOR job IN
        UPDATE jobs j
        SET state = 'expired', input_cleared = true, lease_token = NULL, lease_expires_at = NULL,
            updated_at = p_now
        WHERE (j.run_id, j.job_index) IN (
            SELECT e.run_id, e.job_index FROM jobs e
            WHERE e.state IN ('queued', 'leased') AND e.expires_at <= p_now
            ORDER BY e.expires_at
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        RETURNING j.run_id, j.job_index
    LOOP
        PERFORM job_objects_abandon(job.run_id, job.job_index, p_now);
        IF NOT job.run_id = ANY (runs_touched) THEN
            runs_touched := runs_touched || job.run_id;
            PERFORM pg_notify('workshop_run', job.run_id);
        END IF;
        run_id := job.run_id;
        job_index := job.job_index;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Bucket items with `output_current`: false once the source recording was
-- replaced (a newer generation) or deleted since the item was made (docs/leases-and-fences.md).
CREATE VIEW bucket_items_current AS
SELECT bi.*,
       (rec.generation = bi.recording_generation AND rec.deleted_at IS NULL) AS output_current
FROM bucket_items bi
JOIN recordings rec ON rec.recording_id = bi.recording_id;

-- Deletes a bucket's items and releases their uploads to garbage collection.
CREATE FUNCTION bucket_items_delete(p_bucket text, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    deleted integer;
BEGIN
    WITH gone AS (
        DELETE FROM bucket_items WHERE bucket_id = p_bucket RETURNING object_key
    ), released AS (
        -- an upload another bucket still shows stays
        UPDATE staged_objects s SET collectable_at = p_now
        FROM gone
        WHERE s.object_key = gone.object_key AND s.collectable_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM bucket_items other
                          WHERE other.object_key = s.object_key AND other.bucket_id <> p_bucket)
        RETURNING 1
    )
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END;
$$;

-- A run with the counts its status and detail are worked out from (docs/runs-and-jobs.md).
CREATE VIEW run_status AS
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
    SELECT count(*) AS previews_published
    FROM staged_objects so
    WHERE so.run_id = r.run_id AND so.kind = 'preview' AND so.published_at IS NOT NULL
) pv;

-- Hands a cleanup pass up to p_limit collectable objects of one kind, oldest
-- first, and holds them for p_hold so a second preview replica gets others.
CREATE FUNCTION objects_claim_collectable(
    p_kind text, p_limit integer, p_now timestamptz, p_hold interval
) RETURNS TABLE (object_key text, byte_size bigint, collectable_at timestamptz)
LANGUAGE sql AS $$
    UPDATE staged_objects s SET gc_claimed_until = p_now + p_hold
    WHERE s.object_key IN (
        SELECT c.object_key FROM staged_objects c
        WHERE c.kind = p_kind AND c.deleted_at IS NULL AND c.collectable_at <= p_now
          AND (c.gc_claimed_until IS NULL OR c.gc_claimed_until <= p_now)
        ORDER BY c.collectable_at, c.object_key
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED)
    RETURNING s.object_key, s.byte_size, s.collectable_at;
$$;
