-- Previews and staged uploads (docs/previews-and-uploads.md): staging an object, recording
-- previews, the preview service's sweeps and deletions, read grants. The functions these
-- call check the job's lease and fences themselves (workshop_fence), so a call is one
-- round trip.

-- name: object_stage
SELECT * FROM object_stage_v1(
    p_run => :run_id::text, p_job => :job_index::integer, p_generation => :generation::bigint,
    p_token => :lease_token::uuid, p_reporter => :reporter::text, p_service => :service::text,
    p_code => :code_sha256::text, p_kind => :kind::text, p_slot => :slot::integer,
    p_sha256 => :sha256::text, p_byte_size => :byte_size::bigint,
    p_content_type => :content_type::text, p_key => :object_key::text,
    p_now => :now::timestamptz);

-- name: previews_record
-- One row per preview, in the order of the per-preview arrays. Each lease (with the code
-- it reports under) is named once: run_ids .. code_sha256s hold one element per lease,
-- lease_positions one per preview (its lease's 1-based position in them), the other
-- arrays one per preview. Notifies nothing: the caller announces the leases' runs.
SELECT * FROM previews_record_v3(
    p_runs => :run_ids::text[], p_jobs => :job_indexes::integer[],
    p_generations => :generations::bigint[], p_tokens => :lease_tokens::uuid[],
    p_codes => :code_sha256s::text[], p_reporter => :reporter::text,
    p_service => :service::text, p_leases => :lease_positions::integer[],
    p_keys => :object_keys::text[],
    p_slots => :slots::integer[], p_sha256 => :sha256s::text[], p_sizes => :byte_sizes::bigint[],
    p_content_types => :content_types::text[], p_frame_times => :frame_times::timestamptz[],
    p_boxes => :boxes::text[], p_item_ids => :item_ids::text[], p_now => :now::timestamptz)
ORDER BY ordinal;

-- name: preview_sweeps_claim
SELECT * FROM preview_sweeps_claim_v1($1, $2, $3, $4);

-- name: preview_sweep_settle
-- The objects found under the job's prefix: one element per object in each array.
SELECT preview_sweep_settle_v1(
    p_run => :run_id::text, p_job => :job_index::integer, p_keys => :object_keys::text[],
    p_sizes => :byte_sizes::bigint[], p_generations => :generations::bigint[],
    p_slots => :slots::integer[], p_content_types => :content_types::text[],
    p_done => :done::boolean, p_now => :now::timestamptz, p_hold => :hold::interval);

-- name: objects_claim_collectable
SELECT * FROM objects_claim_collectable_v1($1, $2, $3, $4) ORDER BY collectable_at, object_key;

-- name: objects_collectable_remaining
SELECT objects_collectable_remaining_v1($1, $2);

-- name: objects_mark_deleted
-- Only objects that were collectable: bytes of a live object are never forgotten.
SELECT object_key FROM objects_mark_deleted_v1($1, $2);

-- name: objects_release_held
-- Ends the cleanup hold of objects a pass could not delete (still collectable, not
-- deleted): the next pass takes them again instead of waiting for the hold to lapse.
SELECT object_key FROM objects_release_held_v1($1, $2);

-- name: image_for_read
-- A preview (by its item id) or a bucket item of a run, with what reading it needs.
-- A full run's preview that became its item's upload expired when the job committed.
-- (runs' run_facts and run_published_previews, which leases implement; review's
-- bucket_item_for_read, its boxes after review; leases' staged_object.)
SELECT 'preview' AS source, so.object_key, so.content_type, so.boxes, so.frame_time,
       so.camera_id, so.sha256,
       CASE WHEN so.kind = 'upload' THEN so.published_at ELSE so.collectable_at END
           AS expires_at,
       r.expires_at AS run_expires_at
FROM run_published_previews_v1($1) so
CROSS JOIN run_facts_v1($1) r
WHERE so.item_id = $2 AND so.deleted_at IS NULL
UNION ALL
SELECT 'item', bi.object_key, upload.content_type, bi.boxes, bi.frame_time, bi.camera_id,
       bi.sha256, NULL, r.expires_at
FROM bucket_item_for_read_v3($1, $2) bi
CROSS JOIN run_facts_v1($1) r
CROSS JOIN LATERAL staged_object_v1(bi.object_key) upload;
