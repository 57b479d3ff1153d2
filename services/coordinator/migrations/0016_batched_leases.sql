-- Workshop coordinator: batched leases (docs/leases-and-fences.md#batched-leases).
--
-- A processor with room for several jobs claims them in one call, renews all its
-- leases in one call, and a progress report renews its own lease, so a busy
-- processor heartbeats only the jobs that report nothing for 45 s.
--
-- job_claim_many leases up to p_max jobs in one call, in claim order, with the
-- rules job_claim had (photos first, the head run, job order, cameras, a job that
-- can never commit failed instead of leased). With a request id the batch is
-- idempotent: its first job keeps the id as job_claim stored it, the k-th after it
-- '<id>#<k>' ('#' is no request id's character, so the unique index still gives one
-- remembered lease per key and stored id). A Claim that comes again with the id
-- answers every lease of that batch still held, unchanged, and leases nothing new;
-- when none is held the ids are forgotten and it is a new claim. job_claim becomes
-- the one-job case, so a coordinator of the previous version keeps claiming.
--
-- job_heartbeat_many renews a list of leases, each under its own fences, in one
-- statement: a lease that no longer holds answers its reason and the others renew.
--
-- job_progress gains the lease interval and renews the lease it reports under
-- (answering the new lapse time); the previous signature stays as a wrapper that
-- renews for 5 minutes, for coordinators of the previous version.
CREATE FUNCTION job_claim_many(
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
        FOR picked IN
            SELECT * FROM jobs j
            WHERE j.claimed_by = p_claimer AND j.claim_request_id = ANY (ids)
            ORDER BY array_position(ids, j.claim_request_id)
        LOOP
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

-- A leased job as a Claim answers it: with its recording's facts, read after the lease
-- (one primary-key probe). A leased job without its recording is a broken snapshot: the
-- claim fails and its lease is rolled back.
CREATE FUNCTION job_claim_answer(p_job jobs) RETURNS TABLE (
    job jobs, recording_sha256 text, recording_byte_size bigint, recording_object_key text,
    recording_start_at timestamptz, recording_end_at timestamptz,
    recording_fps double precision
) LANGUAGE plpgsql ROWS 1 AS $$
BEGIN
    RETURN QUERY
        SELECT p_job, sr.sha256, sr.byte_size, sr.object_key, sr.start_at, sr.end_at, sr.fps
        FROM snapshot_recordings sr
        WHERE sr.run_id = p_job.run_id AND sr.job_index = p_job.job_index;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job %/% has no snapshot recording', p_job.run_id, p_job.job_index;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION job_claim(
    p_runtime text, p_claimer text, p_cameras text[], p_now timestamptz, p_lease interval,
    p_request_id text
) RETURNS TABLE (
    job jobs, recording_sha256 text, recording_byte_size bigint, recording_object_key text,
    recording_start_at timestamptz, recording_end_at timestamptz,
    recording_fps double precision
) LANGUAGE plpgsql ROWS 1 AS $$
BEGIN
    RETURN QUERY SELECT * FROM job_claim_many(p_runtime, p_claimer, p_cameras, p_now, p_lease,
                                              p_request_id, 1);
END;
$$;

-- Renews each lease of the arrays (in their order: the coordinator sorts them, so two
-- batches lock jobs in one order) under its own fences; ordinal is the lease's
-- 1-based position, reason '' for a renewed one.
CREATE FUNCTION job_heartbeat_many(
    p_runs text[], p_jobs integer[], p_generations bigint[], p_tokens uuid[], p_reporter text,
    p_now timestamptz, p_lease interval
) RETURNS TABLE (ordinal integer, reason text, lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    h record;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_runs), 0) LOOP
        SELECT * INTO h FROM job_heartbeat(p_runs[i], p_jobs[i], p_generations[i], p_tokens[i],
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
CREATE FUNCTION job_progress(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_percent integer, p_phase text, p_now timestamptz, p_lease interval
) RETURNS TABLE (reason text, progress integer, persisted boolean,
                 lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    fenced text := workshop_fence(p_run, p_job, p_generation, p_token, p_reporter, NULL, p_now);
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
    PERFORM runtime_seen(j.runtime_id, p_now);
    IF store THEN
        PERFORM pg_notify('workshop_run', p_run);
    END IF;
    RETURN QUERY SELECT '', j.progress, store, j.lease_expires_at;
END;
$$;

CREATE OR REPLACE FUNCTION job_progress(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_percent integer, p_phase text, p_now timestamptz
) RETURNS TABLE (reason text, progress integer, persisted boolean) LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT p.reason, p.progress, p.persisted
    FROM job_progress(p_run, p_job, p_generation, p_token, p_reporter, p_percent, p_phase,
                      p_now, interval '5 minutes') p;
END;
$$;
