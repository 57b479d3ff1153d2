-- Workshop coordinator: a repeated preview record answers as the first (docs/previews-and-uploads.md).
--
-- A record whose answer was lost (a coordinator killed between its commit and its
-- answer) is asked again by the processor. When a later slot of the same lease had been
-- recorded meanwhile (the same batch, or a later one), the repeat was refused
-- PREVIEW_OUT_OF_ORDER and the processor, taking INVALID_ARGUMENT for a refusal, failed
-- the job (found by bench.chaos_soak, seed 3). Now a slot before the job's preview_slot
-- whose key this lease already published with the same SHA-256 is answered as recorded,
-- its row untouched. Same name and signature; apply it at any time.

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
CREATE OR REPLACE FUNCTION previews_record(
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
