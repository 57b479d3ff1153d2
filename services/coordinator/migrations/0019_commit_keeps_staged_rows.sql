-- A commit leaves the staged rows of the uploads it names as they are (issue 34;
-- docs/upgrading.md, 0019; docs/previews-and-uploads.md, "Uploads").
--
-- job_complete_v5 turned every named upload's staged row into an upload (kind 'upload',
-- published_at the commit's time): one more row version a frame, never a HOT update (kind
-- and published_at are indexed), with an entry in four indexes. It was the largest single
-- part of a full run's commit, about 10 us of Postgres a frame of the 80
-- (bench.frame_costs). Nothing needs it written: a full run's published preview whose job
-- completed and that its commit did not make garbage is an upload, and the job's
-- committed_at is when it became one. run_published_previews_v1, through which every
-- reader tells a preview from an upload, now derives both from the job; readers of the
-- release before get the same answers for rows either release wrote.
--
-- The index staged_objects_recorded_previews (run_id, for the rows with an item id) is
-- dropped: every reader of a run's published objects finds them by run through
-- staged_objects_by_job or staged_objects_recent_previews, or by item id through the
-- unique index; keeping it cost each record and commit an entry a frame (about 4 us).
--
-- Pre-migration: new functions job_complete_v6 (v5 without the update, its abandon step
-- sparing the named uploads: job_objects_abandon_v2) and run_live_previews_v1 (the run's
-- recent images' previews, which runs declares and leases implements: for a full run
-- those of its leased jobs); run_published_previews_v1 and objects_release_v1 keep their
-- names with new bodies (the first derives an upload from its job, the second marks a
-- released upload as one, so the cleanup still counts it as an upload). job_complete_v5
-- stays (a coordinator of the release before calls it, and its rows read the same).
-- Nothing to post-migrate.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: runs

-- The previews a run's recent images show: published, kind 'preview' as
-- run_published_previews_v1 answers it (not an upload), with their job's camera and
-- recording. A full run's previews of jobs that ended are uploads or garbage, so for a
-- full run only its leased jobs' are answered, found through those jobs: its finished
-- jobs' thousands of uploads are never scanned.
-- interface: implemented by leases
CREATE FUNCTION run_live_previews_v1(p_run text)
RETURNS TABLE (object_key text, kind text, item_id text, job_index integer,
               slot_index integer, camera_id text, recording_id text,
               recording_generation bigint, frame_time timestamptz, boxes jsonb,
               content_type text, sha256 text, published_at timestamptz,
               collectable_at timestamptz, deleted_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run_live_previews is implemented by leases (0019)';
END;
$$;

-- room: leases

-- Implements runs' run_published_previews_v1 (5_runs.sql), as 7_leases.sql did, and
-- tells an upload from a preview by its job as well as by its kind: a full run's
-- published preview that its job's commit kept (the job completed, the preview not
-- collectable) is an upload since that commit (job_complete_v6 leaves the row as it was
-- published; job_complete_v5 wrote kind 'upload' and the commit's time).
CREATE OR REPLACE FUNCTION run_published_previews_v1(p_run text)
RETURNS TABLE (object_key text, kind text, item_id text, job_index integer,
               slot_index integer, camera_id text, recording_id text,
               recording_generation bigint, frame_time timestamptz, boxes jsonb,
               content_type text, sha256 text, published_at timestamptz,
               collectable_at timestamptz, deleted_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT so.object_key, CASE WHEN kept.upload THEN 'upload' ELSE so.kind END, so.item_id,
           so.job_index, so.slot_index, j.camera_id, j.recording_id, j.recording_generation,
           so.frame_time, so.boxes, so.content_type, so.sha256,
           CASE WHEN kept.upload THEN coalesce(j.committed_at, so.published_at)
                ELSE so.published_at END,
           so.collectable_at, so.deleted_at
    FROM staged_objects so
    JOIN jobs j ON j.run_id = so.run_id AND j.job_index = so.job_index
    CROSS JOIN LATERAL (
        SELECT so.kind = 'preview' AND j.state = 'completed' AND so.collectable_at IS NULL
               AND (SELECT r.mode FROM run_facts_v1(p_run) r) = 'full' AS upload
    ) kept
    WHERE so.run_id = p_run AND so.published_at IS NOT NULL
$$;

-- Implements runs' run_live_previews_v1 (above). Two branches, one of which the run's
-- mode turns off before it reads anything: a full run's leased jobs (by the run's runtime:
-- few), each with its previews (staged_objects_by_job); any other run's published
-- previews, newest first (staged_objects_recent_previews), which stay after their job.
CREATE OR REPLACE FUNCTION run_live_previews_v1(p_run text)
RETURNS TABLE (object_key text, kind text, item_id text, job_index integer,
               slot_index integer, camera_id text, recording_id text,
               recording_generation bigint, frame_time timestamptz, boxes jsonb,
               content_type text, sha256 text, published_at timestamptz,
               collectable_at timestamptz, deleted_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT so.object_key, so.kind, so.item_id, so.job_index, so.slot_index, j.camera_id,
           j.recording_id, j.recording_generation, so.frame_time, so.boxes,
           so.content_type, so.sha256, so.published_at, so.collectable_at, so.deleted_at
    FROM jobs j
    JOIN staged_objects so ON so.run_id = j.run_id AND so.job_index = j.job_index
    WHERE j.runtime_id = (SELECT r.runtime_id FROM run_facts_v1(p_run) r)
      AND j.state = 'leased' AND j.run_id = p_run
      AND so.kind = 'preview' AND so.published_at IS NOT NULL
      AND (SELECT r.mode FROM run_facts_v1(p_run) r) = 'full'
    UNION ALL
    SELECT so.object_key, so.kind, so.item_id, so.job_index, so.slot_index, j.camera_id,
           j.recording_id, j.recording_generation, so.frame_time, so.boxes,
           so.content_type, so.sha256, so.published_at, so.collectable_at, so.deleted_at
    FROM staged_objects so
    JOIN jobs j ON j.run_id = so.run_id AND j.job_index = so.job_index
    WHERE so.run_id = p_run AND so.kind = 'preview' AND so.published_at IS NOT NULL
      AND (SELECT r.mode FROM run_facts_v1(p_run) r) IS DISTINCT FROM 'full'
$$;

-- Implements review's objects_release_v1 (6_review.sql), as 7_leases.sql did: uploads no
-- item shows any more become collectable; a published preview a commit kept is marked
-- an upload here (job_complete_v6 leaves it as published), so the cleanup deletes it
-- with the uploads.
CREATE OR REPLACE FUNCTION objects_release_v1(p_keys text[], p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE staged_objects SET collectable_at = p_now, kind = 'upload'
    WHERE object_key = ANY (p_keys) AND collectable_at IS NULL;
END;
$$;

-- job_objects_abandon_v1 (7_leases.sql) for a commit: the uploads it names (p_uploads)
-- are kept, whether staged as uploads (never published) or published as previews.
CREATE FUNCTION job_objects_abandon_v2(
    p_run text, p_job integer, p_uploads text[], p_now timestamptz
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE staged_objects s SET collectable_at = p_now
    WHERE s.run_id = p_run AND s.job_index = p_job AND s.collectable_at IS NULL
      AND (s.published_at IS NULL
           OR (s.kind = 'preview' AND (SELECT r.mode FROM run_facts_v1(p_run) r) = 'full'))
      AND s.object_key NOT IN (SELECT unnest(p_uploads));
END;
$$;

-- Every reader finds a run's published objects by run and job (staged_objects_by_job),
-- newest first (staged_objects_recent_previews) or by item id (the unique index).
DROP INDEX staged_objects_recorded_previews;

-- job_complete_v5 (0018) without its update of the named uploads' staged rows: they stay
-- as they were staged or published (run_published_previews_v1 reads a full run's kept
-- preview as an upload), and its abandon step spares them (job_objects_abandon_v2). The
-- same answers.
CREATE FUNCTION job_complete_v6(
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
    -- other previews, which its items replace. What it keeps, the named uploads, is
    -- left as it was staged or published (run_published_previews_v1 tells them apart).
    PERFORM job_objects_abandon_v2(p_run, p_job, p_upload_keys, p_now);
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

