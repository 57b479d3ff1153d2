-- Leases, progress and results (docs/leases-and-fences.md). The work is done by the functions
-- of migrations 0002-0015, so each call is one round trip with its fences
-- folded in.

-- name: runtime_identity
SELECT runtime_id, device_id, code_sha256 FROM runtime_identity_v1($1);

-- name: job_claim
-- request_id: the Claim's request id (NULL: none); the same one again answers its held
-- leases. max_jobs: how many jobs to lease at most; one row per job, in claim order.
-- cameras: those the key may claim (NULL: all). Notifies nothing: the caller announces
-- the runs it leased from.
-- nullable: cameras, request_id
-- Only the columns a claim answers (ClaimedJob), not the whole job row: asyncpg decodes
-- every column sent.
SELECT (c.job).run_id, (c.job).job_index, (c.job).generation, (c.job).lease_token,
       (c.job).lease_expires_at, (c.job).expires_at, (c.job).camera_id,
       (c.job).recording_id, (c.job).recording_generation, (c.job).slot_count,
       (c.job).first_slot_at, (c.job).interval_ms,
       c.recording_sha256 AS sha256, c.recording_byte_size AS byte_size,
       c.recording_object_key AS object_key, c.recording_start_at AS start_at,
       c.recording_end_at AS end_at, c.recording_fps AS fps
FROM job_claim_many_v2(
    p_runtime => :runtime_id::text, p_claimer => :claimer::text, p_cameras => :cameras::text[],
    p_now => :now::timestamptz, p_lease => :lease::interval, p_request_id => :request_id::text,
    p_max => :max_jobs::integer) c;

-- name: job_heartbeat
SELECT * FROM job_heartbeat_v1(
    p_run => :run_id::text, p_job => :job_index::integer,
    p_generation => :generation::bigint, p_token => :lease_token::uuid,
    p_reporter => :reporter::text,
    p_now => :now::timestamptz, p_lease => :lease::interval);

-- name: job_heartbeat_many
-- One row per lease of the arrays (one element per lease each), by its 1-based ordinal.
SELECT * FROM job_heartbeat_many_v1(
    p_runs => :run_ids::text[], p_jobs => :job_indexes::integer[],
    p_generations => :generations::bigint[], p_tokens => :lease_tokens::uuid[],
    p_reporter => :reporter::text, p_now => :now::timestamptz, p_lease => :lease::interval)
ORDER BY ordinal;

-- name: job_progress
-- lease: the lease interval: a progress report renews its lease.
-- nullable: phase
SELECT * FROM job_progress_v1(
    p_run => :run_id::text, p_job => :job_index::integer,
    p_generation => :generation::bigint, p_token => :lease_token::uuid,
    p_reporter => :reporter::text,
    p_percent => :percent::integer, p_phase => :phase::text, p_now => :now::timestamptz,
    p_lease => :lease::interval);

-- name: job_fail
SELECT job_fail_v1(
    p_run => :run_id::text, p_job => :job_index::integer,
    p_generation => :generation::bigint, p_token => :lease_token::uuid,
    p_reporter => :reporter::text,
    p_message => :message::text, p_now => :now::timestamptz);

-- name: job_release
SELECT job_release_v1(
    p_run => :run_id::text, p_job => :job_index::integer,
    p_generation => :generation::bigint, p_token => :lease_token::uuid,
    p_reporter => :reporter::text,
    p_now => :now::timestamptz);

-- name: job_facts
-- What Complete checks a result against, and the receipt if the job was committed
-- (when the facts are not cached from this process's Claim, or a result is invalid).
SELECT j.slot_count, j.first_slot_at, j.interval_ms, j.state, r.mode,
       rc.generation AS receipt_generation, rc.result_sha256 AS receipt_sha256,
       rc.committed_at AS receipt_committed_at, rc.items_saved AS receipt_items_saved
FROM jobs j
CROSS JOIN LATERAL run_facts_v1(j.run_id) r
LEFT JOIN receipts rc ON rc.run_id = j.run_id AND rc.job_index = j.job_index
WHERE j.run_id = $1 AND j.job_index = $2;

-- name: job_commit_prepare
-- Locks the job about to commit, then its items' timelines (job_commit_prepare_v2, given
-- no boxes of its own to read), and answers in one row its camera, the timelines' context
-- and, read after those locks, for each of :recorded_keys (the uploads whose previews
-- hold their items' boxes): its staged row's staged_at, which tells the coordinator
-- whether the boxes it remembers recording there are still the row's (leases.recorded),
-- and, when :read_boxes, the row's boxes as stored (jsonb as text; all NULL otherwise;
-- NULL for a key with no staged row). The committing transaction reads the boxes itself
-- (leases.boxes.stored_boxes, the twin of bucket_item_boxes_of_v1) to group the items
-- before job_complete writes them: Postgres' decomposing every box into a row was three
-- quarters of this statement's time. No row: no such job.
SELECT p.camera_id, p.context_buckets, p.context_items, p.context_boxes, p.context_times,
       p.context_classes, p.context_xs, p.context_ys, p.context_ws, p.context_hs,
       p.context_sightings, p.context_fixed, p.context_firsts, p.context_counts,
       r.recorded_boxes, r.recorded_staged_at
FROM job_commit_prepare_v2(
    p_run => :run_id::text, p_job => :job_index::integer, p_item_boxes => '{}'::text[],
    p_item_keys => '{}'::text[], p_item_buckets => :item_buckets::text[],
    p_item_times => :item_times::timestamptz[]) p
CROSS JOIN LATERAL (
    SELECT coalesce(array_agg(CASE WHEN :read_boxes::boolean THEN s.boxes::text END
                              ORDER BY u.o), '{}') AS recorded_boxes,
           coalesce(array_agg(s.staged_at ORDER BY u.o), '{}') AS recorded_staged_at
    FROM unnest(:recorded_keys::text[]) WITH ORDINALITY AS u (object_key, o)
    -- (p.camera_id: read once the function has locked, as it read them itself)
    LEFT JOIN LATERAL (
        SELECT so.boxes, so.staged_at FROM staged_objects so
        WHERE so.object_key = u.object_key AND p.camera_id IS NOT NULL OFFSET 0
    ) s ON true
) r;

-- name: job_complete
-- The slot facts the result was checked against (job_complete verifies them), the
-- result's counts, its uploads and its items: one element per upload, per item, in each
-- array. An item's boxes NULL: those recorded with its upload's preview; its sightings
-- (a text array literal, grouped by the committing transaction), NULL: ungrouped. Then
-- what that grouping changed besides (review's sightings_apply, written only when the
-- commit is): the items already written whose sightings changed, the sightings gone, and
-- those made or changed, of the job's camera (:camera_id; '' when nothing was grouped).
-- The items' boxes by bucket and class as detected, one element per pair in each count_
-- array (the commit counts its items from them for the summary). The review columns of
-- the sightings made from the items alone, when the commit knows them (review's
-- sightings_review_new): each new_sightings[n] (one of sighting_ids) pending, with
-- new_pending[n] items pending and score new_scores[n]. Notifies nothing: the caller
-- announces the run, and the job's runtime (runtime_id, answered when it commits).
-- nullable: item_boxes[], item_sightings[]
SELECT * FROM job_complete_v6(
    p_run => :run_id::text, p_job => :job_index::integer,
    p_generation => :generation::bigint, p_token => :lease_token::uuid,
    p_reporter => :reporter::text,
    p_code => :code_sha256::text, p_result_sha256 => :result_sha256::text,
    p_decoder => :decoder::text, p_slot_count => :slot_count::integer,
    p_first_slot_at => :first_slot_at::timestamptz, p_interval_ms => :interval_ms::integer,
    p_frames => :frames::integer, p_empties => :empties::integer, p_dropped => :dropped::integer,
    p_upload_keys => :upload_keys::text[], p_upload_sha256 => :upload_sha256s::text[],
    p_upload_slots => :upload_slots::integer[], p_item_ids => :item_ids::text[],
    p_item_buckets => :item_buckets::text[], p_item_slots => :item_slots::integer[],
    p_item_steps => :item_steps::text[], p_item_times => :item_times::timestamptz[],
    p_item_boxes => :item_boxes::text[], p_item_sightings => :item_sightings::text[],
    p_item_keys => :item_keys::text[], p_item_sha256 => :item_sha256s::text[],
    p_camera => :camera_id::text, p_changed_items => :changed_items::text[],
    p_changed_sightings => :changed_sightings::text[], p_gone => :gone::text[],
    p_sighting_ids => :sighting_ids::text[], p_sighting_buckets => :sighting_buckets::text[],
    p_sighting_classes => :sighting_classes::text[],
    p_sighting_firsts => :sighting_firsts::timestamptz[],
    p_sighting_lasts => :sighting_lasts::timestamptz[],
    p_sighting_counts => :sighting_counts::integer[],
    p_count_buckets => :count_buckets::text[], p_count_classes => :count_classes::text[],
    p_count_boxes => :count_boxes::bigint[], p_now => :now::timestamptz,
    p_new_sightings => :new_sightings::text[], p_new_pending => :new_pending::integer[],
    p_new_scores => :new_scores::real[]);

-- name: job_complete_bare
-- job_complete for a result that saves nothing (no upload, no item: a test run's job, an
-- empty or all-dropped one): its arrays written here empty instead of sent. asyncpg
-- encodes each of the statement's 27 array parameters even when it is empty, 18 us of
-- the coordinator's CPU a commit, on the cycle of short jobs that its one event loop
-- bounds (bench.claim_cycle's session phase).
SELECT * FROM job_complete_v6(
    p_run => :run_id::text, p_job => :job_index::integer,
    p_generation => :generation::bigint, p_token => :lease_token::uuid,
    p_reporter => :reporter::text,
    p_code => :code_sha256::text, p_result_sha256 => :result_sha256::text,
    p_decoder => :decoder::text, p_slot_count => :slot_count::integer,
    p_first_slot_at => :first_slot_at::timestamptz, p_interval_ms => :interval_ms::integer,
    p_frames => :frames::integer, p_empties => :empties::integer, p_dropped => :dropped::integer,
    p_upload_keys => '{}'::text[], p_upload_sha256 => '{}'::text[],
    p_upload_slots => '{}'::integer[], p_item_ids => '{}'::text[],
    p_item_buckets => '{}'::text[], p_item_slots => '{}'::integer[],
    p_item_steps => '{}'::text[], p_item_times => '{}'::timestamptz[],
    p_item_boxes => '{}'::text[], p_item_sightings => '{}'::text[],
    p_item_keys => '{}'::text[], p_item_sha256 => '{}'::text[],
    p_camera => '', p_changed_items => '{}'::text[],
    p_changed_sightings => '{}'::text[], p_gone => '{}'::text[],
    p_sighting_ids => '{}'::text[], p_sighting_buckets => '{}'::text[],
    p_sighting_classes => '{}'::text[],
    p_sighting_firsts => '{}'::timestamptz[],
    p_sighting_lasts => '{}'::timestamptz[],
    p_sighting_counts => '{}'::integer[],
    p_count_buckets => '{}'::text[], p_count_classes => '{}'::text[],
    p_count_boxes => '{}'::bigint[], p_now => :now::timestamptz,
    p_new_sightings => '{}'::text[], p_new_pending => '{}'::integer[],
    p_new_scores => '{}'::real[]);

-- name: job_complete_bare_then_claim
-- job_complete_bare and then, in the same statement, job_claim: Complete's next claim (its
-- then_claim) for a result that saves nothing, in one round trip and one transaction
-- instead of two (the cycle of short jobs, which the coordinator's one event loop bounds:
-- bench.claim_cycle's session phase). One row per job claimed, each with the commit's
-- answer; one row with claimed (and the job's columns) NULL when none was. The claim
-- runs only after a commit that committed (reason ''; OFFSET 0 keeps the condition on
-- the claim's side of the join, where it gates the call): a refusal, or a retry answered
-- with its receipt, claims nothing here, and the caller claims after it as it would
-- have. The claim sees the commit (the functions are volatile: each of their statements
-- reads with the statement before it applied). Should the claim raise, the commit rolls
-- back with it; the caller then commits and claims in two statements, so a claim's
-- failure never hides a receipt.
-- nullable: cameras, request_id
SELECT d.*, c.*
FROM job_complete_v6(
    p_run => :run_id::text, p_job => :job_index::integer,
    p_generation => :generation::bigint, p_token => :lease_token::uuid,
    p_reporter => :reporter::text,
    p_code => :code_sha256::text, p_result_sha256 => :result_sha256::text,
    p_decoder => :decoder::text, p_slot_count => :slot_count::integer,
    p_first_slot_at => :first_slot_at::timestamptz, p_interval_ms => :interval_ms::integer,
    p_frames => :frames::integer, p_empties => :empties::integer, p_dropped => :dropped::integer,
    p_upload_keys => '{}'::text[], p_upload_sha256 => '{}'::text[],
    p_upload_slots => '{}'::integer[], p_item_ids => '{}'::text[],
    p_item_buckets => '{}'::text[], p_item_slots => '{}'::integer[],
    p_item_steps => '{}'::text[], p_item_times => '{}'::timestamptz[],
    p_item_boxes => '{}'::text[], p_item_sightings => '{}'::text[],
    p_item_keys => '{}'::text[], p_item_sha256 => '{}'::text[],
    p_camera => '', p_changed_items => '{}'::text[],
    p_changed_sightings => '{}'::text[], p_gone => '{}'::text[],
    p_sighting_ids => '{}'::text[], p_sighting_buckets => '{}'::text[],
    p_sighting_classes => '{}'::text[],
    p_sighting_firsts => '{}'::timestamptz[],
    p_sighting_lasts => '{}'::timestamptz[],
    p_sighting_counts => '{}'::integer[],
    p_count_buckets => '{}'::text[], p_count_classes => '{}'::text[],
    p_count_boxes => '{}'::bigint[], p_now => :now::timestamptz,
    p_new_sightings => '{}'::text[], p_new_pending => '{}'::integer[],
    p_new_scores => '{}'::real[]) d
LEFT JOIN LATERAL (
    SELECT true AS claimed, (n.job).run_id, (n.job).job_index, (n.job).generation,
           (n.job).lease_token, (n.job).lease_expires_at, (n.job).expires_at,
           (n.job).camera_id, (n.job).recording_id, (n.job).recording_generation,
           (n.job).slot_count, (n.job).first_slot_at, (n.job).interval_ms,
           n.recording_sha256 AS sha256, n.recording_byte_size AS byte_size,
           n.recording_object_key AS object_key, n.recording_start_at AS start_at,
           n.recording_end_at AS end_at, n.recording_fps AS fps
    FROM job_claim_many_v2(
        p_runtime => :runtime_id::text, p_claimer => :claimer::text,
        p_cameras => :cameras::text[], p_now => :now::timestamptz,
        p_lease => :lease::interval, p_request_id => :request_id::text,
        p_max => :max_jobs::integer) n
    WHERE d.reason = ''
    OFFSET 0
) c ON true;

-- name: job_check_lease
-- CheckLease in one statement (the statement is its own transaction): the calling
-- service's key still live, then the fences (a permanent refusal ends the job inside
-- workshop_fence_v1, committed with the statement), then, only when both hold, the
-- lease's facts. The fence writes nothing to a held lease, so the facts read in the
-- statement's snapshot are the ones it checked.
WITH checked AS MATERIALIZED (
    SELECT CASE WHEN NOT key_live_v1(:service::text, :now::timestamptz)
                THEN 'SERVICE_NOT_AUTHORIZED'
                ELSE workshop_fence_v1(
                    p_run => :run_id::text, p_job => :job_index::integer,
                    p_generation => :generation::bigint, p_token => :lease_token::uuid,
                    p_reporter => :reporter::text,
                    p_code => :code_sha256::text, p_now => :now::timestamptz)
           END AS reason
)
SELECT c.reason, f.lease_expires_at, f.camera_id, f.slot_count, f.mode, f.kind
FROM checked c
LEFT JOIN LATERAL (
    SELECT j.lease_expires_at, j.camera_id, j.slot_count, r.mode, r.kind
    FROM jobs j CROSS JOIN LATERAL run_facts_v1(j.run_id) r
    WHERE c.reason = '' AND j.run_id = :run_id::text AND j.job_index = :job_index::integer
) f ON true;

-- name: maintenance_try_lock
SELECT pg_try_advisory_lock(hashtext('workshop.coordinator.maintenance'));

-- name: maintenance_unlock
SELECT pg_advisory_unlock(hashtext('workshop.coordinator.maintenance'));

-- name: jobs_rescue_lapsed
SELECT * FROM jobs_rescue_lapsed_v1($1, $2, $3);

-- name: jobs_expire
SELECT * FROM jobs_expire_v1($1, $2);
