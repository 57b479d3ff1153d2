-- The busiest transactions announce their changes after they commit (issue 34; docs/upgrading.md,
-- 0018; docs/runs-and-jobs.md, "Run events").
--
-- Every committing function called pg_notify inside its transaction. Postgres serializes
-- the commits of all transactions that notify, cluster-wide: PreCommit_Notify takes one
-- exclusive lock (a Lock of type "object" in pg_stat_activity) and holds it until the
-- transaction has ended, its commit record written (and, with synchronous_commit, flushed).
-- bench.claim_cycle's session phase spent about 40 % of its active backends' samples
-- waiting for that lock (Complete's commit and the Claim after it each notify), and
-- removing the notifications took 0.15-0.2 ms of Postgres CPU off each cycle.
--
-- This version's coordinator calls new versions of the three functions that commit per job
-- or per batch of frames, which notify nothing: job_complete_v5 (job_complete_v4, v3 and v2
-- in one function, the claimable announcement of its job's end deferred, and the job's
-- runtime in its answer), job_claim_many_v2 (v1 without the announcement of the runs it
-- leased from) and previews_record_v2 (v1 without the announcement of the runs it recorded
-- previews of). The coordinator wakes its own waiters at once after the commit and sends
-- the announcements of many commits together on its LISTEN connection, so a notifying
-- transaction is one statement every few tens of milliseconds per replica, not one per
-- commit.
--
-- The trigger that announces claimable jobs (jobs_announce_claimable_v1) announces nothing
-- while the transaction-local setting workshop.announce is 'deferred', which only
-- job_complete_v5 sets, around its own update of the job.
--
-- Pre-migration: new functions, and the trigger function with the same announcements for
-- every transaction that does not set workshop.announce (all of the release before).
-- job_complete_v4, job_claim_many_v1 and previews_record_v1 stay.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: leases

-- Release 0.1's announcement of claimable jobs (7_leases.sql), skipped while the
-- transaction-local setting workshop.announce is 'deferred': the caller announces them
-- itself after its commit.
CREATE OR REPLACE FUNCTION jobs_announce_claimable_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('workshop.announce', true) IS DISTINCT FROM 'deferred' THEN
        PERFORM pg_notify('workshop_jobs', NEW.runtime_id);
    END IF;
    RETURN NULL;
END;
$$;

-- job_complete_v4 (0017), with job_complete_v3 (0009) and job_complete_v2 (0004) in its
-- body, notifying nothing: the caller announces the run (workshop_run) and, when the job
-- ended, its runtime (workshop_jobs, answered in runtime_id) after the commit. The same
-- answers otherwise.
CREATE FUNCTION job_complete_v5(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_result_sha256 text, p_decoder text,
    p_slot_count integer, p_first_slot_at timestamptz, p_interval_ms integer,
    p_frames integer, p_empties integer, p_dropped integer,
    p_upload_keys text[], p_upload_sha256 text[], p_upload_slots integer[],
    p_item_ids text[], p_item_buckets text[], p_item_slots integer[], p_item_steps text[],
    p_item_times timestamptz[], p_item_boxes text[], p_item_sightings text[],
    p_item_keys text[], p_item_sha256 text[],
    p_camera text, p_changed_items text[], p_changed_sightings text[], p_gone text[],
    p_sighting_ids text[], p_sighting_buckets text[], p_sighting_classes text[],
    p_sighting_firsts timestamptz[], p_sighting_lasts timestamptz[],
    p_sighting_counts integer[], p_count_buckets text[], p_count_classes text[],
    p_count_boxes bigint[], p_now timestamptz,
    p_new_sightings text[], p_new_pending integer[], p_new_scores real[]
) RETURNS TABLE (
    reason text, receipt_generation bigint, receipt_sha256 text,
    receipt_committed_at timestamptz, receipt_items_saved integer, runtime_id text
) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    fenced text := workshop_fence_v1(p_run, p_job, p_generation, p_token, p_reporter, p_code, p_now);
    staged integer;
    unrecorded boolean;
    item_boxes jsonb[];
    j jobs%ROWTYPE;
    rc receipts%ROWTYPE;
BEGIN
    IF fenced <> '' THEN
        SELECT * INTO rc FROM receipts
        WHERE receipts.run_id = p_run AND receipts.job_index = p_job
          AND receipts.generation = p_generation;
        RETURN QUERY SELECT fenced, rc.generation, rc.result_sha256, rc.committed_at,
                            rc.items_saved, NULL::text;
        RETURN;
    END IF;
    SELECT * INTO j FROM jobs WHERE jobs.run_id = p_run AND jobs.job_index = p_job;
    IF j.slot_count <> p_slot_count OR j.first_slot_at <> p_first_slot_at
       OR j.interval_ms <> p_interval_ms THEN
        RETURN QUERY SELECT 'FACTS_MISMATCH', NULL::bigint, NULL::text, NULL::timestamptz,
                            NULL::integer, NULL::text;
        RETURN;
    END IF;
    -- A result that saves nothing (test runs, empty jobs) skips the uploads, the items
    -- and their statement trigger altogether. An upload is a staged upload, or a published
    -- preview of the same frame (kept rows only: a refused record is collectable at once).
    IF cardinality(p_upload_keys) > 0 THEN
        SELECT count(*) INTO staged
        FROM unnest(p_upload_keys, p_upload_sha256, p_upload_slots)
             AS u (object_key, sha256, slot)
        CROSS JOIN LATERAL (
            SELECT so.* FROM staged_objects so WHERE so.object_key = u.object_key OFFSET 0
        ) s
        WHERE (s.kind = 'upload' OR s.published_at IS NOT NULL)
          AND s.run_id = p_run AND s.job_index = p_job
          AND s.generation = p_generation AND s.slot_index = u.slot AND s.sha256 = u.sha256
          AND s.collectable_at IS NULL AND s.deleted_at IS NULL;
        IF staged <> cardinality(p_upload_keys) THEN
            RETURN QUERY SELECT 'UPLOAD_NOT_STAGED', NULL::bigint, NULL::text,
                                NULL::timestamptz, NULL::integer, NULL::text;
            RETURN;
        END IF;
    END IF;
    -- Each item's boxes: as sent, or (NULL) those recorded with its upload's preview; and
    -- whether an item leaves its boxes to a staged row that has none (a staged upload).
    IF cardinality(p_item_ids) > 0 OR cardinality(p_upload_keys) > 0 THEN
        SELECT array_agg(coalesce(u.boxes::jsonb, s.boxes) ORDER BY u.o),
               coalesce(bool_or(u.boxes IS NULL AND s.found AND s.boxes IS NULL), false)
        INTO item_boxes, unrecorded
        FROM unnest(p_item_boxes, p_item_keys) WITH ORDINALITY AS u (boxes, object_key, o)
        LEFT JOIN LATERAL (
            SELECT true AS found, so.boxes FROM staged_objects so
            WHERE so.object_key = u.object_key OFFSET 0
        ) s ON u.boxes IS NULL;
    END IF;
    IF cardinality(p_upload_keys) > 0 THEN
        -- An item without boxes (NULL) takes those recorded with its upload's preview
        -- (RoutedOutput.boxes_recorded): a staged upload has none to give.
        IF unrecorded THEN
            RETURN QUERY SELECT 'BOXES_NOT_RECORDED', NULL::bigint, NULL::text,
                                NULL::timestamptz, NULL::integer, NULL::text;
            RETURN;
        END IF;
        -- a preview named as an upload becomes one: its item replaces it
        UPDATE staged_objects s SET kind = 'upload', published_at = p_now
        FROM unnest(p_upload_keys) AS u (object_key)
        WHERE s.object_key = u.object_key;
    END IF;
    IF cardinality(p_item_ids) > 0 THEN
        -- the items are review's, with their boxes and sightings; the commit counts them
        -- itself (bucket_items_count_v1 below), so the insert's counters' trigger does not
        PERFORM set_config('workshop.items_counted', 'on', true);
        PERFORM bucket_items_insert_v2(
            p_run, p_job, j.camera_id, j.recording_id, j.recording_generation, p_item_ids,
            p_item_buckets, p_item_slots, p_item_steps, p_item_times, item_boxes,
            p_item_sightings, p_item_keys, p_item_sha256, p_now);
        PERFORM set_config('workshop.items_counted', 'off', true);
    END IF;
    -- What the commit does not keep is garbage now: objects staged but never
    -- published or named (refused previews, unnamed uploads), and a full run's
    -- other previews, which its items replace.
    PERFORM job_objects_abandon_v1(p_run, p_job, p_now);
    INSERT INTO receipts (run_id, job_index, generation, result_sha256, frames, empties, dropped,
                          items_saved, committed_at)
    VALUES (p_run, p_job, p_generation, p_result_sha256, p_frames, p_empties, p_dropped,
            cardinality(p_item_ids), p_now);
    -- the job's end is announced by the caller after the commit (the trigger skips it)
    PERFORM set_config('workshop.announce', 'deferred', true);
    UPDATE jobs
    SET state = 'completed', progress = 100, lease_token = NULL, lease_expires_at = NULL,
        result_sha256 = p_result_sha256, committed_at = p_now, decoder = p_decoder,
        updated_at = p_now
    WHERE jobs.run_id = p_run AND jobs.job_index = p_job;
    PERFORM set_config('workshop.announce', '', true);
    IF cardinality(p_item_ids) > 0 THEN
        PERFORM bucket_items_count_v1(p_run, j.recording_id, j.recording_generation,
                                      p_item_buckets, p_count_buckets, p_count_classes,
                                      p_count_boxes, p_now);
    END IF;
    IF cardinality(p_changed_items) > 0 OR cardinality(p_gone) > 0
       OR cardinality(p_sighting_ids) > 0 THEN
        PERFORM sightings_apply_v1(
            p_run, p_camera, p_changed_items, p_changed_sightings, p_gone, p_sighting_ids,
            p_sighting_buckets, p_sighting_classes, p_sighting_firsts, p_sighting_lasts,
            p_sighting_counts);
    END IF;
    IF cardinality(p_new_sightings) > 0 THEN
        PERFORM sightings_review_new_v1(p_run, p_new_sightings, p_new_pending, p_new_scores);
    END IF;
    RETURN QUERY SELECT '', p_generation, p_result_sha256, p_now, cardinality(p_item_ids),
                        j.runtime_id;
END;
$$;

-- job_claim_many_v1 (7_leases.sql, planned once per backend as 0008 set it) without its
-- announcement of the runs it leased from: the caller announces them after the commit.
-- A job it fails instead (job_end_unfenced_v1) is still announced by its own transaction.
CREATE FUNCTION job_claim_many_v2(
    p_runtime text, p_claimer text, p_cameras text[], p_now timestamptz, p_lease interval,
    p_request_id text, p_max integer
) RETURNS TABLE (
    job jobs, recording_sha256 text, recording_byte_size bigint, recording_object_key text,
    recording_start_at timestamptz, recording_end_at timestamptz,
    recording_fps double precision
) LANGUAGE plpgsql ROWS 4
SET plan_cache_mode = force_generic_plan AS $$
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
    END IF;
END;
$$;

-- previews_record_v1 (7_leases.sql, planned once per backend as 0004 set it) without its
-- announcement of each lease's run: the caller announces them after the commit.
-- public: previews (previews_record)
CREATE FUNCTION previews_record_v2(
    p_runs text[], p_jobs integer[], p_generations bigint[], p_tokens uuid[],
    p_reporter text, p_service text, p_codes text[], p_keys text[], p_slots integer[],
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
            END IF;
        END IF;
    END LOOP;
END;
$$;
