-- A record batch names each of its leases once (issue 34; docs/upgrading.md, 0020).
--
-- previews_record_v2 took the lease of every preview as five arrays of one element per
-- preview (run, job, generation, token, code), though a batch's previews are of a few
-- leases: a processor's batch of 90 previews named its 3 leases 90 times, and asyncpg
-- encodes, and Postgres decodes, every element. previews_record_v3 takes each lease (with
-- the code it reports under) once, and per preview the position of its lease in those
-- arrays (p_leases, 1-based). It groups, fences and records exactly as v2 does, in the
-- same lease order (so concurrent batches lock jobs in the same order).
--
-- Pre-migration: a new function. previews_record_v2 stays (a coordinator of the release
-- before calls it). Nothing to post-migrate.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: leases

-- previews_record_v2 (0018), each lease named once: p_runs, p_jobs, p_generations,
-- p_tokens and p_codes hold one element per lease (and code), p_leases one per preview,
-- its lease's position in them; the other arrays one per preview, as before.
-- public: previews (previews_record)
CREATE FUNCTION previews_record_v3(
    p_runs text[], p_jobs integer[], p_generations bigint[], p_tokens uuid[], p_codes text[],
    p_reporter text, p_service text, p_leases integer[], p_keys text[], p_slots integer[],
    p_sha256 text[], p_sizes bigint[], p_content_types text[], p_frame_times timestamptz[],
    p_boxes text[], p_item_ids text[], p_now timestamptz
) RETURNS TABLE (ordinal integer, reason text, expires_at timestamptz)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
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
                     FROM generate_subscripts(p_leases, 1) AS o;
        RETURN;
    END IF;
    FOR lease IN
        SELECT p_runs[l] AS run, p_jobs[l] AS job, p_generations[l] AS generation,
               p_tokens[l] AS token, p_codes[l] AS code, array_agg(o ORDER BY o) AS positions
        FROM unnest(p_leases) WITH ORDINALITY AS u (l, o)
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
            END IF;
        END IF;
    END LOOP;
END;
$$;

