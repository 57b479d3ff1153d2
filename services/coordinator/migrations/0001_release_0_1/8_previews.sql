-- Release 0.1, room previews: its tables, indexes, triggers and functions.

-- Stages an object for one slot under the fences; the key is unique per run,
-- job, lease generation, slot and kind, so a retry under the same lease reuses it.
-- The calling service's key must still be live (SERVICE_NOT_AUTHORIZED). Answers
-- when the object becomes collectable if nothing commits it: when this lease
-- lapses, unless renewed.
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

-- Records a batch of previews for one processor (group commit) in one statement, set
-- based: the fences are checked once per lease of the batch (in (run, job) order, so
-- concurrent batches lock job rows in the same order and never deadlock), then each
-- lease's rows are written with one INSERT per outcome, its job's preview_slot moved
-- once and its run notified once. A row is refused as preview_record would refuse it
-- (the lease's fence, SLOT_NOT_EXPECTED, PREVIEW_OUT_OF_ORDER against the slot the job
-- had before the batch) and still recorded, as collectable. A slot before the job's
-- preview_slot whose key this lease already published with the same digest is a retry
-- whose answer was lost: answered as the first time, its row left as it is. The same
-- key twice in a batch is written once, as its last occurrence. The calling service's key must still
-- be live (SERVICE_NOT_AUTHORIZED for all). p_boxes holds each preview's labels as
-- JSON text. Answers one row per preview with its 1-based position.
CREATE FUNCTION previews_record(
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
    IF NOT key_live(p_service, p_now) THEN
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
        refused := workshop_fence(lease.run, lease.job, lease.generation, lease.token,
                                  p_reporter, lease.code, p_now);
        IF refused = 'NOT_FOUND' THEN
            RETURN QUERY SELECT m::integer, refused, NULL::timestamptz FROM unnest(members) AS m;
            CONTINUE;
        END IF;
        SELECT * INTO j FROM jobs WHERE run_id = lease.run AND job_index = lease.job;
        SELECT r.expires_at INTO run_expiry FROM runs r WHERE r.run_id = lease.run;
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
