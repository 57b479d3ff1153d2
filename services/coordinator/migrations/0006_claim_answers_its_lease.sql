-- Workshop coordinator: a claim answers the lease it took (docs/leases-and-fences.md).
--
-- job_claim leased a job in its own (fresh) snapshot, and the statement calling it
-- joined the job to its snapshot recording in the statement's (older) snapshot. A
-- claim that began before a CreateRun committed and leased one of its jobs after
-- found no recording row: the statement returned nothing, the processor was told
-- "no job", and the job stayed leased until the lease lapsed (five minutes, and one
-- of its three attempts). The function now reads the recording itself, after the
-- lease, and returns it with the job; a leased job without one raises, so its lease
-- is rolled back instead of stranded.
DROP FUNCTION job_claim(text, text, text[], timestamptz, interval);
CREATE FUNCTION job_claim(
    p_runtime text, p_claimer text, p_cameras text[], p_now timestamptz, p_lease interval
) RETURNS TABLE (
    job jobs, recording_sha256 text, recording_byte_size bigint, recording_object_key text,
    recording_start_at timestamptz, recording_end_at timestamptz,
    recording_fps double precision
) LANGUAGE plpgsql ROWS 1 AS $$
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
    RETURN QUERY
        SELECT picked, sr.sha256, sr.byte_size, sr.object_key, sr.start_at, sr.end_at, sr.fps
        FROM snapshot_recordings sr
        WHERE sr.run_id = picked.run_id AND sr.job_index = picked.job_index;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job %/% has no snapshot recording', picked.run_id, picked.job_index;
    END IF;
    PERFORM pg_notify('workshop_run', picked.run_id);
END;
$$;
