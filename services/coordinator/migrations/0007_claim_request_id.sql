-- Workshop coordinator: a Claim whose answer was lost does not strand its lease.
--
-- Claim was the one write that was not idempotent: when the coordinator committed a
-- lease and its answer never reached the processor (the coordinator stopped mid-call,
-- a reset connection, a deadline), the processor's retry leased another job and the
-- first stayed leased to nobody until its lease lapsed (five minutes, and one of its
-- three attempts). A Claim may now carry a client-chosen request id: the job remembers
-- the key that took its latest lease and that claim's request id, and a Claim by the
-- same key with the same id answers that lease again while it is still held. Nothing
-- clears the memory when a lease ends: job_claim answers it only while the job is
-- leased under a live lease, and forgets it (sets it NULL) when the id comes again
-- after that, so every other function is unchanged. The unique index makes the lookup
-- one probe and guarantees one remembered lease per key and id.
ALTER TABLE jobs ADD COLUMN claimed_by text;
ALTER TABLE jobs ADD COLUMN claim_request_id text;
CREATE UNIQUE INDEX jobs_claim_request ON jobs (claimed_by, claim_request_id)
    WHERE claim_request_id IS NOT NULL;

DROP FUNCTION job_claim(text, text, text[], timestamptz, interval);
CREATE FUNCTION job_claim(
    p_runtime text, p_claimer text, p_cameras text[], p_now timestamptz, p_lease interval,
    p_request_id text
) RETURNS TABLE (
    job jobs, recording_sha256 text, recording_byte_size bigint, recording_object_key text,
    recording_start_at timestamptz, recording_end_at timestamptz,
    recording_fps double precision
) LANGUAGE plpgsql ROWS 1 AS $$
DECLARE
    head bigint;
    picked jobs%ROWTYPE;
    remembered boolean := false;
BEGIN
    IF NOT key_live(p_claimer, p_now) THEN
        RAISE EXCEPTION 'the claiming key was revoked or expired, or its user disabled'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    PERFORM runtime_seen(p_runtime, p_now);
    IF p_request_id IS NOT NULL THEN
        -- Claims of one key with one request id take turns: a retry that arrives while
        -- the call it repeats still runs waits for its commit, then answers its lease.
        PERFORM pg_advisory_xact_lock(hashtext('workshop.job_claim'),
                                      hashtext(p_claimer || '/' || p_request_id));
        SELECT * INTO picked FROM jobs
        WHERE claimed_by = p_claimer AND claim_request_id = p_request_id;
        IF FOUND THEN
            -- answered again only while that lease is held (fence 1 would refuse a lapsed
            -- one); once it ended the id is forgotten and this is a new claim
            remembered := picked.state = 'leased' AND picked.lease_token IS NOT NULL
                          AND picked.lease_expires_at > p_now AND picked.runtime_id = p_runtime;
            IF NOT remembered THEN
                UPDATE jobs SET claim_request_id = NULL
                WHERE run_id = picked.run_id AND job_index = picked.job_index;
            END IF;
        END IF;
    END IF;
    IF NOT remembered THEN
        LOOP
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
            preview_slot = NULL, claimed_by = p_claimer, claim_request_id = p_request_id
        WHERE run_id = picked.run_id AND job_index = picked.job_index
        RETURNING * INTO picked;
    END IF;
    RETURN QUERY
        SELECT picked, sr.sha256, sr.byte_size, sr.object_key, sr.start_at, sr.end_at, sr.fps
        FROM snapshot_recordings sr
        WHERE sr.run_id = picked.run_id AND sr.job_index = picked.job_index;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job %/% has no snapshot recording', picked.run_id, picked.job_index;
    END IF;
    IF NOT remembered THEN
        PERFORM pg_notify('workshop_run', picked.run_id);
    END IF;
END;
$$;
