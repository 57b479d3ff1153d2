-- Release 0.1, room leases: its tables, indexes, triggers and functions.

-- One job per input recording. `generation` is the lease generation (0 = never
-- leased); `recording_generation` the source generation it was admitted at.
CREATE TABLE jobs (
    run_id               text NOT NULL REFERENCES runs (run_id),
    job_index            integer NOT NULL,
    run_seq              bigint NOT NULL,
    runtime_id           text NOT NULL,
    camera_id            text NOT NULL,
    recording_id         text NOT NULL,
    recording_generation bigint NOT NULL,
    first_slot_at        timestamptz NOT NULL,
    interval_ms          integer NOT NULL CHECK (interval_ms >= 1),  -- slot length, exact ms
    slot_count           integer NOT NULL CHECK (slot_count >= 1),
    state                text NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'leased', 'completed', 'failed', 'cancelled', 'expired')),
    generation           bigint NOT NULL DEFAULT 0,
    lease_token          uuid,
    lease_expires_at     timestamptz,
    lapses               integer NOT NULL DEFAULT 0,
    progress             integer NOT NULL DEFAULT 0 CHECK (progress BETWEEN 0 AND 100),
    progress_updates     integer NOT NULL DEFAULT 0,
    phase                text,
    decoder              text,
    failure_reason       text,
    failure_message      text,
    input_cleared        boolean NOT NULL DEFAULT false,
    expires_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL,
    is_photo             boolean NOT NULL DEFAULT false,
    result_sha256        text,
    committed_at         timestamptz,
    -- the last slot published as a preview under the current lease (NULL: none yet);
    -- a claim clears it, previews_record_v1 keeps previews in slot order with it
    preview_slot         integer,
    -- the key that took the latest lease and that Claim's request id (NULL: none sent);
    -- a Claim by the same key with the same id answers that lease again while it is held
    claimed_by           text,
    claim_request_id     text,
    -- when the job's preview prefix was swept for bytes never recorded (NULL: not yet;
    -- jobs only need it once they ended), and which cleanup pass holds the sweep until when
    previews_swept_at    timestamptz,
    sweep_claimed_until  timestamptz,
    PRIMARY KEY (run_id, job_index)
);

-- A review item (6_review.sql) names the job that made it.
ALTER TABLE bucket_items ADD FOREIGN KEY (run_id, job_index) REFERENCES jobs (run_id, job_index);

CREATE INDEX jobs_claimable ON jobs (runtime_id, run_seq, job_index) WHERE state = 'queued';

CREATE INDEX jobs_unfinished ON jobs (run_id) WHERE state IN ('queued', 'leased');

-- Execution (docs/runs-and-jobs.md, docs/leases-and-fences.md): leases, fences, receipts, items, staged objects,
-- previews and run events.

-- The head run of a runtime: its oldest run with queued or leased jobs.
CREATE INDEX jobs_unfinished_by_runtime ON jobs (runtime_id, run_seq)
    WHERE state IN ('queued', 'leased');

CREATE INDEX jobs_photos_claimable ON jobs (runtime_id, run_seq, job_index)
    WHERE state = 'queued' AND is_photo;

-- Leased jobs (few: a few per processor), where the rescuer looks for lapsed leases.
-- lease_expires_at is in no index, so a heartbeat's renewal is a HOT update.
CREATE INDEX jobs_leased ON jobs (runtime_id) WHERE state = 'leased';

CREATE INDEX jobs_source_expiry ON jobs (expires_at) WHERE state IN ('queued', 'leased');

-- A remembered Claim, found in one probe; one per key and request id.
CREATE UNIQUE INDEX jobs_claim_request ON jobs (claimed_by, claim_request_id)
    WHERE claim_request_id IS NOT NULL;

CREATE INDEX jobs_preview_sweeps ON jobs (updated_at)
    WHERE previews_swept_at IS NULL AND state IN ('completed', 'failed', 'cancelled', 'expired');

-- A job queued (a run or photo created it, a Release or a rescue queued it again) or
-- ended (which may make its runtime's next run the one Claims lease from) is announced
-- on `workshop_jobs` with its runtime id, so Claims waiting for that runtime try again;
-- identical notifications of one transaction are folded into one.
CREATE FUNCTION jobs_announce_claimable_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('workshop_jobs', NEW.runtime_id);
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_claimable_announced
    AFTER INSERT OR UPDATE OF state ON jobs
    FOR EACH ROW WHEN (NEW.state <> 'leased')
    EXECUTE FUNCTION jobs_announce_claimable_v1();

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

CREATE INDEX staged_objects_recorded_previews ON staged_objects (run_id)
    WHERE item_id IS NOT NULL;

-- The four fences (docs/leases-and-fences.md), checked under row locks; '' when all hold,
-- else the ErrorReason that failed (fenced calls go through workshop_fence, which also
-- ends the job when the refusal is permanent). Locks: the job FOR UPDATE; the recording, the
-- policy, the creator's key/session/user and the reporting key (and its user)
-- FOR SHARE, so a concurrent replacement, revocation or policy raise waits for our
-- commit. Fence 4 also refuses a reporting key whose user was disabled: a principal
-- the coordinator holds in cache must not outlive it.
CREATE FUNCTION workshop_fence_reason_v1(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    j jobs%ROWTYPE;
    run_policy bigint;
    run_creator jsonb;
    run_code text;
    device text;
    refused text;
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
    -- fence 2: the source recording at the admitted generation (resources' lock)
    IF NOT recording_hold_v1(j.recording_id, j.recording_generation) THEN
        RETURN 'SOURCE_CHANGED';
    END IF;
    -- fences 3 and 4 (identity's locks): the policy revision, then the creating
    -- principal's authority; the reporting key is still a workshop:run key for the
    -- runtime's device (or an admin key) of an enabled user; then the code is the snapshot's
    SELECT r.policy_revision, r.created_by, r.code_sha256 INTO run_policy, run_creator, run_code
    FROM run_facts_v1(p_run) r;
    SELECT rt.device_id INTO device FROM runtime_identity_v1(j.runtime_id) rt;
    refused := fence_authority_v1(run_policy, run_creator, p_reporter, device, p_now);
    IF refused <> '' THEN
        RETURN refused;
    END IF;
    IF p_code IS NOT NULL AND p_code <> run_code THEN
        RETURN 'CODE_MISMATCH';
    END IF;
    RETURN '';
END;
$$;

-- The four fences (docs/leases-and-fences.md) as every fenced call meets them
-- (workshop_fence_reason says which failed). A refusal by fence 2 or 3 is permanent for the job: its recording was replaced
-- or deleted, or its run lost its authority or policy revision, so it can never commit.
-- Such a job is ended here, in the refusing transaction, whichever call met the fence
-- (heartbeat, progress, preview, staging, lease check, complete, fail, release): failed
-- with source_changed or authority_lost (job_end_unfenced), so its run does not wait for
-- the lease to lapse. The caller holds the job's row lock (workshop_fence_reason took it).
CREATE FUNCTION workshop_fence_v1(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    refused text := workshop_fence_reason_v1(p_run, p_job, p_generation, p_token, p_reporter,
                                          p_code, p_now);
    j jobs%ROWTYPE;
BEGIN
    IF refused IN ('SOURCE_CHANGED', 'POLICY_CHANGED', 'AUTHORITY_REVOKED') THEN
        SELECT * INTO j FROM jobs WHERE run_id = p_run AND job_index = p_job;
        PERFORM job_end_unfenced_v1(j, p_now);
    END IF;
    RETURN refused;
END;
$$;

-- Ends a job that can never commit as failed, as Fail would, so that it does not wait
-- leased or queued for its lease to lapse three times; returns whether it did. The
-- caller holds the job's row lock. It checks fences 2 and 3 (docs/leases-and-fences.md) as
-- workshop_fence does, in one read without locks (the committing calls still check
-- them under locks): the recording at the admitted generation, else failure_reason
-- 'source_changed'; the policy revision and the run creator's authority, else
-- 'authority_lost'; with a message for people. The snapshot pins what failed.
CREATE FUNCTION job_end_unfenced_v1(p_job jobs, p_now timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    f record;
    why text;
    message text;
BEGIN
    -- runs', identity's and resources' public reads, inlined into this one query
    SELECT rec.generation AS source_generation, rec.deleted_at AS source_deleted,
           r.policy_revision, a.policy_now, r.created_by ->> 'kind' AS kind,
           nullif(r.created_by ->> 'user_id', '') AS creator_user,
           a.key_ok, a.session_ok, a.user_ok
    INTO f
    FROM run_facts_v1(p_job.run_id) r
    CROSS JOIN LATERAL creator_authority_v1(r.created_by, p_now) a
    LEFT JOIN LATERAL recording_state_v1(p_job.recording_id) rec ON true;
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
    PERFORM job_objects_abandon_v1(p_job.run_id, p_job.job_index, p_now);
    PERFORM pg_notify('workshop_run', p_job.run_id);
    RETURN true;
END;
$$;

-- Leases the next claimable job of a runtime (docs/runs-and-jobs.md): photos first, then
-- the head run (the oldest with queued or leased jobs), in job order; only jobs
-- of the cameras in p_cameras (NULL: every camera). One statement, one round trip:
-- the leased job comes back with its recording's facts, read here, after the lease,
-- so both see the same committed runs. (Read by the calling statement instead, they
-- came from that statement's older snapshot: a claim that began before a CreateRun
-- committed and leased one of its jobs found no recording, answered "no job", and left
-- the job leased until its lease lapsed.) A leased job without its recording is a
-- broken snapshot: the claim fails and its lease is rolled back. The claiming key is
-- checked first: a key revoked, expired or of a disabled user leases nothing
-- (SQLSTATE 28000), even while the coordinator still holds its principal in cache.
-- A picked job whose fence 2 or 3 fails (job_end_unfenced) can never commit: it is
-- failed with that reason instead of leased, and the claim goes on to the next.
-- With a request id (p_request_id, NULL: none) the claim is idempotent: the key's
-- earlier claim with that id is answered again, unchanged, while its lease is held
-- (a retry after a lost answer); the id is stored with the lease, and forgotten when
-- it comes again after that lease ended, so no other function has to clear it.
CREATE FUNCTION job_claim_many_v1(
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
    IF NOT key_live_v1(p_claimer, p_now) THEN
        RAISE EXCEPTION 'the claiming key was revoked or expired, or its user disabled'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    PERFORM runtime_seen_v1(p_runtime, p_now);
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
                RETURN QUERY SELECT * FROM job_claim_answer_v1(picked);
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
            CONTINUE WHEN job_end_unfenced_v1(picked, p_now);
            UPDATE jobs
            SET state = 'leased', generation = generation + 1, lease_token = gen_random_uuid(),
                lease_expires_at = least(p_now + p_lease, expires_at), updated_at = p_now,
                preview_slot = NULL, claimed_by = p_claimer,
                claim_request_id = CASE WHEN cardinality(taken_runs) = 0 THEN p_request_id
                                        ELSE p_request_id || '#' || cardinality(taken_runs) END
            WHERE run_id = picked.run_id AND job_index = picked.job_index
            RETURNING * INTO picked;
            RETURN QUERY SELECT * FROM job_claim_answer_v1(picked);
            taken_runs := taken_runs || picked.run_id;
        END LOOP;
        PERFORM pg_notify('workshop_run', r) FROM (SELECT DISTINCT unnest(taken_runs) AS r) t;
    END IF;
END;
$$;

-- A leased job as a Claim answers it: with its recording's facts, read after the lease
-- (one primary-key probe). A leased job without its recording is a broken snapshot: the
-- claim fails and its lease is rolled back.
CREATE FUNCTION job_claim_answer_v1(p_job jobs) RETURNS TABLE (
    job jobs, recording_sha256 text, recording_byte_size bigint, recording_object_key text,
    recording_start_at timestamptz, recording_end_at timestamptz,
    recording_fps double precision
) LANGUAGE plpgsql ROWS 1 AS $$
BEGIN
    RETURN QUERY
        SELECT p_job, sr.sha256, sr.byte_size, sr.object_key, sr.start_at, sr.end_at, sr.fps
        FROM snapshot_recordings_of_v1(p_job.run_id) sr
        WHERE sr.job_index = p_job.job_index;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job %/% has no snapshot recording', p_job.run_id, p_job.job_index;
    END IF;
END;
$$;

-- Renews a lease: min(now + lease, job expiry).
CREATE FUNCTION job_heartbeat_v1(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_now timestamptz, p_lease interval
) RETURNS TABLE (reason text, lease_expires_at timestamptz) LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence_v1(p_run, p_job, p_generation, p_token, p_reporter, NULL, p_now);
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
    PERFORM runtime_seen_v1(runtime, p_now);
    RETURN QUERY SELECT '', renewed;
END;
$$;

-- Renews each lease of the arrays (in their order: the coordinator sorts them, so two
-- batches lock jobs in one order) under its own fences; ordinal is the lease's
-- 1-based position, reason '' for a renewed one.
CREATE FUNCTION job_heartbeat_many_v1(
    p_runs text[], p_jobs integer[], p_generations bigint[], p_tokens uuid[], p_reporter text,
    p_now timestamptz, p_lease interval
) RETURNS TABLE (ordinal integer, reason text, lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    h record;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_runs), 0) LOOP
        SELECT * INTO h FROM job_heartbeat_v1(p_runs[i], p_jobs[i], p_generations[i], p_tokens[i],
                                           p_reporter, p_now, p_lease);
        ordinal := i;
        reason := h.reason;
        lease_expires_at := h.lease_expires_at;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Progress: monotonic; at most 100 persisted updates per job, later ones are
-- coalesced (answered, not stored); a lower value is ignored. Every accepted report
-- renews the lease to min(now + lease, job expiry), persisted or not.
CREATE FUNCTION job_progress_v1(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_percent integer, p_phase text, p_now timestamptz, p_lease interval
) RETURNS TABLE (reason text, progress integer, persisted boolean,
                 lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence_v1(p_run, p_job, p_generation, p_token, p_reporter, NULL, p_now);
    j jobs%ROWTYPE;
    store boolean;
BEGIN
    IF fenced <> '' THEN
        RETURN QUERY SELECT fenced, NULL::integer, false, NULL::timestamptz;
        RETURN;
    END IF;
    -- the fence holds the row's lock: read, decide, write once
    SELECT * INTO j FROM jobs WHERE run_id = p_run AND job_index = p_job;
    store := j.progress_updates < 100
             AND (p_percent > j.progress
                  OR (p_phase IS NOT NULL AND p_phase IS DISTINCT FROM j.phase));
    UPDATE jobs
    SET lease_expires_at = least(p_now + p_lease, j.expires_at),
        progress = CASE WHEN store THEN greatest(j.progress, p_percent) ELSE j.progress END,
        phase = CASE WHEN store THEN coalesce(p_phase, j.phase) ELSE j.phase END,
        progress_updates = j.progress_updates + CASE WHEN store THEN 1 ELSE 0 END
    WHERE run_id = p_run AND job_index = p_job
    RETURNING * INTO j;
    PERFORM runtime_seen_v1(j.runtime_id, p_now);
    IF store THEN
        PERFORM pg_notify('workshop_run', p_run);
    END IF;
    RETURN QUERY SELECT '', j.progress, store, j.lease_expires_at;
END;
$$;

-- Ends a job as failed (processor_failed), without retry. A refusal by fence 2 or 3
-- fails the job with that reason instead (workshop_fence).
CREATE FUNCTION job_fail_v1(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_message text, p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence_v1(p_run, p_job, p_generation, p_token, p_reporter, NULL, p_now);
BEGIN
    IF fenced <> '' THEN
        RETURN fenced;
    END IF;
    UPDATE jobs
    SET state = 'failed', failure_reason = 'processor_failed', failure_message = p_message,
        lease_token = NULL, lease_expires_at = NULL, updated_at = p_now
    WHERE run_id = p_run AND job_index = p_job;
    PERFORM job_objects_abandon_v1(p_run, p_job, p_now);
    PERFORM pg_notify('workshop_run', p_run);
    RETURN '';
END;
$$;

-- Hands a job back without spending an attempt (graceful shutdown).
CREATE FUNCTION job_release_v1(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence_v1(p_run, p_job, p_generation, p_token, p_reporter, NULL, p_now);
BEGIN
    IF fenced <> '' THEN
        RETURN fenced;
    END IF;
    UPDATE jobs SET state = 'queued', lease_token = NULL, lease_expires_at = NULL, updated_at = p_now
    WHERE run_id = p_run AND job_index = p_job;
    PERFORM job_objects_abandon_v1(p_run, p_job, p_now);
    PERFORM pg_notify('workshop_run', p_run);
    RETURN '';
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
CREATE FUNCTION job_complete_v1(
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
    fenced text := workshop_fence_v1(p_run, p_job, p_generation, p_token, p_reporter, p_code, p_now);
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
        -- the items are review's (bucket_items_insert), each with its boxes: as sent, or
        -- those recorded with its upload's preview
        PERFORM bucket_items_insert_v1(
            p_run, p_job, j.camera_id, j.recording_id, j.recording_generation, p_item_ids,
            p_item_buckets, p_item_slots, p_item_steps, p_item_times,
            ARRAY(SELECT coalesce(u.boxes::jsonb, s.boxes)
                  FROM unnest(p_item_boxes, p_item_keys) WITH ORDINALITY AS u (boxes, object_key, o)
                  LEFT JOIN staged_objects s ON u.boxes IS NULL AND s.object_key = u.object_key
                  ORDER BY u.o),
            p_item_keys, p_item_sha256, p_now);
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

COMMENT ON FUNCTION job_complete_v1(text, integer, bigint, uuid, text, text, text, text, integer, timestamptz, integer, integer, integer, integer, text[], text[], integer[], text[], text[], integer[], text[], timestamptz[], text[], text[], text[], timestamptz) IS
    'Takes an item''s boxes from its preview''s record when they are NULL (0021); coordinators answer ClaimedJob.takes_recorded_boxes once 0022 is applied.';

-- Objects of a job that ended become garbage unless kept: unpublished
-- staged objects always, published previews too for full runs (their items
-- never came). Called when a job fails, is cancelled, expires or loses its lease.
CREATE FUNCTION job_objects_abandon_v1(p_run text, p_job integer, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE staged_objects s SET collectable_at = p_now
    WHERE s.run_id = p_run AND s.job_index = p_job AND s.collectable_at IS NULL
      AND (s.published_at IS NULL
           OR (s.kind = 'preview' AND (SELECT r.mode FROM run_facts_v1(p_run) r) = 'full'));
END;
$$;

-- Maintenance (one replica at a time): leases that lapsed return their job to
-- the queue for a new generation, and the third lapse fails it with
-- attempts_exhausted. At most p_batch jobs per call; returns the jobs touched.
CREATE FUNCTION jobs_rescue_lapsed_v1(p_now timestamptz, p_max_lapses integer, p_batch integer)
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
        PERFORM job_objects_abandon_v1(job.run_id, job.job_index, p_now);
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
CREATE FUNCTION jobs_expire_v1(p_now timestamptz, p_batch integer)
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
        PERFORM job_objects_abandon_v1(job.run_id, job.job_index, p_now);
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


-- The room's public SQL and the interfaces it implements. No other room names jobs,
-- receipts or staged_objects.

-- Implements runs' run_cancel_v1 (5_runs.sql): queued and leased jobs of the run become
-- cancelled, so writes under their leases are refused from now on; completed jobs keep
-- their results.
CREATE OR REPLACE FUNCTION run_cancel_v1(p_run text, p_now timestamptz) RETURNS integer
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
        PERFORM job_objects_abandon_v1(p_run, job.job_index, p_now);
        cancelled := cancelled + 1;
    END LOOP;
    IF cancelled > 0 THEN
        PERFORM pg_notify('workshop_run', p_run);
    END IF;
    RETURN cancelled;
END;
$$;

-- Implements runs' run_jobs_enqueue_v1 (5_runs.sql).
CREATE OR REPLACE FUNCTION run_jobs_enqueue_v1(
    p_run text, p_seq bigint, p_runtime text, p_interval_ms integer, p_now timestamptz,
    p_job_indexes integer[], p_cameras text[], p_recordings text[], p_generations bigint[],
    p_first_slots timestamptz[], p_slot_counts integer[], p_expiries timestamptz[]
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO jobs (run_id, job_index, run_seq, runtime_id, camera_id, recording_id,
                      recording_generation, first_slot_at, interval_ms, slot_count, expires_at,
                      updated_at)
    SELECT p_run, u.job_index, p_seq, p_runtime, u.camera_id, u.recording_id, u.generation,
           u.first_slot_at, p_interval_ms, u.slot_count, u.expires_at, p_now
    FROM unnest(p_job_indexes, p_cameras, p_recordings, p_generations, p_first_slots,
                p_slot_counts, p_expiries)
         AS u (job_index, camera_id, recording_id, generation, first_slot_at, slot_count,
               expires_at);
END;
$$;

-- Implements runs' photo_job_enqueue_v1 (5_runs.sql).
CREATE OR REPLACE FUNCTION photo_job_enqueue_v1(
    p_run text, p_seq bigint, p_runtime text, p_camera text, p_recording text,
    p_generation bigint, p_first_slot_at timestamptz, p_interval_ms integer,
    p_expires_at timestamptz, p_now timestamptz
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO jobs (run_id, job_index, run_seq, runtime_id, camera_id, recording_id,
                      recording_generation, first_slot_at, interval_ms, slot_count, expires_at,
                      updated_at, is_photo)
    VALUES (p_run, 0, p_seq, p_runtime, p_camera, p_recording, p_generation, p_first_slot_at,
            p_interval_ms, 1, p_expires_at, p_now, true);
END;
$$;

-- Implements runs' run_jobs_of_v1 (5_runs.sql). Single-SELECT STABLE SQL functions like
-- this one are inlined by the planner where a query uses them.
CREATE OR REPLACE FUNCTION run_jobs_of_v1(p_run text)
RETURNS TABLE (run_id text, job_index integer, camera_id text, recording_id text,
               recording_generation bigint, first_slot_at timestamptz, state text,
               phase text, progress integer, slot_count integer, generation bigint,
               failure_reason text, failure_message text, decoder text,
               updated_at timestamptz, lease_expires_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT j.run_id, j.job_index, j.camera_id, j.recording_id, j.recording_generation,
           j.first_slot_at, j.state, j.phase, j.progress, j.slot_count, j.generation,
           j.failure_reason, j.failure_message, j.decoder, j.updated_at, j.lease_expires_at
    FROM jobs j WHERE j.run_id = p_run
$$;

-- Implements runs' run_unfinished_jobs_v1 (5_runs.sql).
CREATE OR REPLACE FUNCTION run_unfinished_jobs_v1(p_run text) RETURNS TABLE (job_index integer)
LANGUAGE sql STABLE AS $$
    SELECT j.job_index FROM jobs j WHERE j.run_id = p_run AND j.state IN ('queued', 'leased')
$$;

-- Implements runs' jobs_unfinished_count_v1 (5_runs.sql).
CREATE OR REPLACE FUNCTION jobs_unfinished_count_v1() RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM jobs WHERE state IN ('queued', 'leased')
$$;

-- Implements runs' run_job_counts_v1 (5_runs.sql), which its view run_status joins to each run.
CREATE OR REPLACE FUNCTION run_job_counts_v1(p_run text)
RETURNS TABLE (jobs_total bigint, jobs_queued bigint, jobs_leased bigint,
               jobs_completed bigint, jobs_failed bigint, jobs_cancelled bigint,
               jobs_expired bigint, slots_expected bigint, last_job_update timestamptz,
               slots_frame bigint, slots_empty bigint, slots_dropped bigint,
               items_saved bigint, previews_published bigint)
LANGUAGE sql STABLE AS $$
    SELECT c.*, rs.*, pv.*
    FROM (
        SELECT count(*) AS jobs_total,
               count(*) FILTER (WHERE state = 'queued') AS jobs_queued,
               count(*) FILTER (WHERE state = 'leased') AS jobs_leased,
               count(*) FILTER (WHERE state = 'completed') AS jobs_completed,
               count(*) FILTER (WHERE state = 'failed') AS jobs_failed,
               count(*) FILTER (WHERE state = 'cancelled') AS jobs_cancelled,
               count(*) FILTER (WHERE state = 'expired') AS jobs_expired,
               coalesce(sum(slot_count), 0) AS slots_expected,
               max(updated_at) AS last_job_update
        FROM jobs j WHERE j.run_id = p_run
    ) c
    CROSS JOIN (
        SELECT coalesce(sum(frames), 0) AS slots_frame, coalesce(sum(empties), 0) AS slots_empty,
               coalesce(sum(dropped), 0) AS slots_dropped,
               coalesce(sum(items_saved), 0) AS items_saved
        FROM receipts rc WHERE rc.run_id = p_run
    ) rs
    CROSS JOIN (
        -- every preview ever recorded has an item id, also one that became an upload
        SELECT count(*) AS previews_published
        FROM staged_objects so
        WHERE so.run_id = p_run AND so.item_id IS NOT NULL
    ) pv
$$;

-- Implements runs' run_published_previews_v1 (5_runs.sql).
CREATE OR REPLACE FUNCTION run_published_previews_v1(p_run text)
RETURNS TABLE (object_key text, kind text, item_id text, job_index integer,
               slot_index integer, camera_id text, recording_id text,
               recording_generation bigint, frame_time timestamptz, boxes jsonb,
               content_type text, sha256 text, published_at timestamptz,
               collectable_at timestamptz, deleted_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT so.object_key, so.kind, so.item_id, so.job_index, so.slot_index, j.camera_id,
           j.recording_id, j.recording_generation, so.frame_time, so.boxes, so.content_type,
           so.sha256, so.published_at, so.collectable_at, so.deleted_at
    FROM staged_objects so
    JOIN jobs j ON j.run_id = so.run_id AND j.job_index = so.job_index
    WHERE so.run_id = p_run AND so.published_at IS NOT NULL
$$;

-- Implements review's objects_release_v1 (6_review.sql): uploads no item shows any more
-- become collectable.
CREATE OR REPLACE FUNCTION objects_release_v1(p_keys text[], p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE staged_objects SET collectable_at = p_now
    WHERE object_key = ANY (p_keys) AND collectable_at IS NULL;
END;
$$;

-- A staged object by its key (no row: none), as reading an item's upload needs it.
-- public: previews (image_for_read)
CREATE FUNCTION staged_object_v1(p_key text)
RETURNS TABLE (object_key text, content_type text) LANGUAGE sql STABLE AS $$
    SELECT so.object_key, so.content_type FROM staged_objects so WHERE so.object_key = p_key
$$;

-- Staged objects and previews (docs/previews-and-uploads.md): the preview service's
-- writes, each under the job's lease and fences, and its garbage collection. The
-- publication room (previews) calls them; they live here because they write leases'
-- rows: a job's preview slot and sweep, and staged objects, which the commit
-- (job_complete) consumes and every end of a job abandons (job_objects_abandon).

-- Whether collectable objects of a kind are left, not held by a cleanup pass.
-- public: previews (objects_collectable_remaining)
CREATE FUNCTION objects_collectable_remaining_v1(p_kind text, p_now timestamptz)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM staged_objects
        WHERE kind = p_kind AND deleted_at IS NULL AND collectable_at <= p_now
          AND (gc_claimed_until IS NULL OR gc_claimed_until <= p_now))
$$;

-- Records the deletion of objects' bytes; only objects that were collectable: bytes of
-- a live object are never forgotten. Answers the keys it recorded.
-- public: previews (objects_mark_deleted)
CREATE FUNCTION objects_mark_deleted_v1(p_keys text[], p_now timestamptz)
RETURNS TABLE (object_key text) LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    UPDATE staged_objects s SET deleted_at = p_now
    WHERE s.object_key = ANY (p_keys) AND s.deleted_at IS NULL AND s.collectable_at <= p_now
    RETURNING s.object_key;
END;
$$;

-- Ends the cleanup hold of objects a pass could not delete (still collectable, not
-- deleted): the next pass takes them again instead of waiting for the hold to lapse.
-- Answers the keys it released.
-- public: previews (objects_release_held)
CREATE FUNCTION objects_release_held_v1(p_keys text[], p_now timestamptz)
RETURNS TABLE (object_key text) LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    UPDATE staged_objects s SET gc_claimed_until = NULL
    WHERE s.object_key = ANY (p_keys) AND s.deleted_at IS NULL AND s.gc_claimed_until > p_now
    RETURNING s.object_key;
END;
$$;

-- Stages an object for one slot under the fences; the key is unique per run,
-- job, lease generation, slot and kind, so a retry under the same lease reuses it.
-- The calling service's key must still be live (SERVICE_NOT_AUTHORIZED). Answers
-- when the object becomes collectable if nothing commits it: when this lease
-- lapses, unless renewed.
-- public: previews (object_stage)
CREATE FUNCTION object_stage_v1(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_service text, p_code text, p_kind text, p_slot integer, p_sha256 text,
    p_byte_size bigint, p_content_type text, p_key text, p_now timestamptz
) RETURNS TABLE (reason text, collectable_after timestamptz) LANGUAGE plpgsql AS $$
DECLARE
    fenced text;
    j jobs%ROWTYPE;
BEGIN
    IF NOT key_live_v1(p_service, p_now) THEN
        RETURN QUERY SELECT 'SERVICE_NOT_AUTHORIZED', NULL::timestamptz;
        RETURN;
    END IF;
    fenced := workshop_fence_v1(p_run, p_job, p_generation, p_token, p_reporter, p_code, p_now);
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

-- Records a batch of previews for one processor (group commit) in one statement, set
-- based: the fences are checked once per lease of the batch (in (run, job) order, so
-- concurrent batches lock job rows in the same order and never deadlock), then each
-- lease's rows are written with one INSERT per outcome, its job's preview_slot moved
-- once and its run notified once. A row refused (by the lease's fence, SLOT_NOT_EXPECTED,
-- or PREVIEW_OUT_OF_ORDER against the slot the job had before the batch) is still
-- recorded, as collectable. A slot before the job's
-- preview_slot whose key this lease already published with the same digest is a retry
-- whose answer was lost: answered as the first time, its row left as it is. The same
-- key twice in a batch is written once, as its last occurrence. The calling service's key must still
-- be live (SERVICE_NOT_AUTHORIZED for all). p_boxes holds each preview's labels as
-- JSON text. Answers one row per preview with its 1-based position.
-- public: previews (previews_record)
CREATE FUNCTION previews_record_v1(
    p_runs text[], p_jobs integer[], p_generations bigint[], p_tokens uuid[],
    p_reporter text, p_service text, p_codes text[], p_keys text[], p_slots integer[],
    p_sha256 text[], p_sizes bigint[], p_content_types text[], p_frame_times timestamptz[],
    p_boxes text[], p_item_ids text[], p_now timestamptz
) RETURNS TABLE (ordinal integer, reason text, expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    lease record;
    refused text;
    j jobs%ROWTYPE;
    run_expiry timestamptz;
    members integer[];
    newest integer;
BEGIN
    IF NOT key_live_v1(p_service, p_now) THEN
        RETURN QUERY SELECT o::integer, 'SERVICE_NOT_AUTHORIZED', NULL::timestamptz
                     FROM generate_subscripts(p_runs, 1) AS o;
        RETURN;
    END IF;
    FOR lease IN
        SELECT p_runs[o] AS run, p_jobs[o] AS job, p_generations[o] AS generation,
               p_tokens[o] AS token, p_codes[o] AS code, array_agg(o ORDER BY o) AS positions
        FROM generate_subscripts(p_runs, 1) AS o
        GROUP BY 1, 2, 3, 4, 5
        ORDER BY 1, 2, 3, 4, 5
    LOOP
        members := lease.positions;
        refused := workshop_fence_v1(lease.run, lease.job, lease.generation, lease.token,
                                  p_reporter, lease.code, p_now);
        IF refused = 'NOT_FOUND' THEN
            RETURN QUERY SELECT m::integer, refused, NULL::timestamptz FROM unnest(members) AS m;
            CONTINUE;
        END IF;
        SELECT * INTO j FROM jobs WHERE run_id = lease.run AND job_index = lease.job;
        SELECT r.expires_at INTO run_expiry FROM run_facts_v1(lease.run) r;
        RETURN QUERY
        WITH batch AS (
            SELECT m AS o,
                   CASE WHEN refused <> '' THEN refused
                        WHEN p_slots[m] < 0 OR p_slots[m] >= j.slot_count
                            THEN 'SLOT_NOT_EXPECTED'
                        WHEN j.preview_slot > p_slots[m] AND NOT EXISTS (
                            SELECT 1 FROM staged_objects s
                            WHERE s.object_key = p_keys[m] AND s.run_id = lease.run
                              AND s.job_index = lease.job AND s.generation = lease.generation
                              AND s.sha256 = p_sha256[m] AND s.published_at IS NOT NULL
                              AND s.deleted_at IS NULL)
                            THEN 'PREVIEW_OUT_OF_ORDER'
                        ELSE '' END AS why,
                   coalesce(j.preview_slot > p_slots[m], false) AS again
            FROM unnest(members) AS m
        ), last AS (
            SELECT DISTINCT ON (p_keys[b.o]) b.o, b.why, b.again
            FROM batch b ORDER BY p_keys[b.o], b.o DESC
        ), garbage AS (
            INSERT INTO staged_objects (object_key, kind, run_id, job_index, generation,
                                        slot_index, sha256, byte_size, content_type,
                                        staged_at, collectable_at)
            SELECT p_keys[l.o], 'preview', lease.run, lease.job, lease.generation,
                   p_slots[l.o], p_sha256[l.o], p_sizes[l.o], p_content_types[l.o], p_now, p_now
            FROM last l WHERE l.why <> ''
            ON CONFLICT (object_key) DO UPDATE
                SET collectable_at = p_now, gc_claimed_until = NULL, deleted_at = NULL
                WHERE staged_objects.deleted_at IS NOT NULL
            RETURNING 1
        ), published AS (
            INSERT INTO staged_objects (object_key, kind, run_id, job_index, generation,
                                        slot_index, sha256, byte_size, content_type,
                                        staged_at, published_at, item_id, frame_time, boxes,
                                        collectable_at)
            SELECT p_keys[l.o], 'preview', lease.run, lease.job, lease.generation,
                   p_slots[l.o], p_sha256[l.o], p_sizes[l.o], p_content_types[l.o], p_now,
                   p_now, p_item_ids[l.o], p_frame_times[l.o], p_boxes[l.o]::jsonb, run_expiry
            FROM last l WHERE l.why = '' AND NOT l.again
            ON CONFLICT (object_key) DO UPDATE
                SET sha256 = EXCLUDED.sha256, byte_size = EXCLUDED.byte_size,
                    content_type = EXCLUDED.content_type, staged_at = EXCLUDED.staged_at,
                    published_at = EXCLUDED.published_at, item_id = EXCLUDED.item_id,
                    frame_time = EXCLUDED.frame_time, boxes = EXCLUDED.boxes,
                    collectable_at = EXCLUDED.collectable_at, gc_claimed_until = NULL,
                    deleted_at = NULL
            RETURNING 1
        )
        SELECT b.o::integer, b.why, CASE WHEN b.why = '' THEN run_expiry END FROM batch b;
        IF refused = '' THEN
            SELECT max(p_slots[m]) INTO newest FROM unnest(members) AS m
            WHERE p_slots[m] >= 0 AND p_slots[m] < j.slot_count
              AND (j.preview_slot IS NULL OR p_slots[m] >= j.preview_slot);
            IF newest IS NOT NULL THEN
                UPDATE jobs SET preview_slot = newest
                WHERE run_id = lease.run AND job_index = lease.job
                  AND preview_slot IS DISTINCT FROM newest;
                PERFORM pg_notify('workshop_run', lease.run);
            END IF;
        END IF;
    END LOOP;
END;
$$;

-- Jobs whose previews have all expired (a full run's when the job ended, a test run's
-- when its hour passed) and whose preview prefix was never swept, at least p_grace
-- after the job ended (a write still in flight then has long finished); held for the
-- calling pass until p_now + p_hold.
-- public: previews (preview_sweeps_claim)
CREATE FUNCTION preview_sweeps_claim_v1(
    p_limit integer, p_now timestamptz, p_grace interval, p_hold interval
) RETURNS TABLE (run_id text, job_index integer, mode text) LANGUAGE sql AS $$
    UPDATE jobs j SET sweep_claimed_until = p_now + p_hold
    WHERE (j.run_id, j.job_index) IN (
        SELECT l.run_id, l.job_index FROM jobs l CROSS JOIN LATERAL run_facts_v1(l.run_id) lr
        WHERE l.previews_swept_at IS NULL
          AND l.state IN ('completed', 'failed', 'cancelled', 'expired')
          AND l.updated_at <= p_now - p_grace
          AND (lr.mode = 'full' OR lr.expires_at <= p_now)
          AND (l.sweep_claimed_until IS NULL OR l.sweep_claimed_until <= p_now)
        ORDER BY l.updated_at, l.run_id, l.job_index
        LIMIT p_limit
        FOR UPDATE OF l SKIP LOCKED)
    RETURNING j.run_id, j.job_index, (SELECT r.mode FROM run_facts_v1(j.run_id) r);
$$;

-- Settles a sweep: objects found under the job's preview prefix that no row records
-- become collectable previews, and so do rows whose bytes were deleted before this
-- sweep was claimed (p_hold ago from sweep_claimed_until) and are back: a row deleted
-- after that may be one another pass deleted after this one listed the prefix. With
-- p_done the sweep is finished. Answers how many objects it recorded (NULL: no such job).
-- public: previews (preview_sweep_settle)
CREATE FUNCTION preview_sweep_settle_v1(
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

-- Hands a cleanup pass up to p_limit collectable objects of one kind, oldest
-- first, and holds them for p_hold so a second preview replica gets others.
-- public: previews (objects_claim_collectable)
CREATE FUNCTION objects_claim_collectable_v1(
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
