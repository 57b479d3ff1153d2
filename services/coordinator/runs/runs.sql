-- Runs, snapshots and their jobs (docs/runs-and-jobs.md).

-- name: run_fingerprint
SELECT run_id, fingerprint FROM runs WHERE run_id = $1;

-- name: unfinished_job_count
SELECT jobs_unfinished_count_v1();

-- name: run_insert
-- nullable: expires_at
INSERT INTO runs (run_id, kind, mode, workflow_id, workflow_revision, runtime_id, image_limit,
                  fingerprint, created_by, policy_revision, created_at, expires_at, code_sha256)
VALUES (:run_id::text, :kind::text, :mode::text, :workflow_id::text, :workflow_revision::bigint,
        :runtime_id::text, :image_limit::integer, :fingerprint::text, :created_by::jsonb,
        :policy_revision::bigint, :created_at::timestamptz, :expires_at::timestamptz,
        :code_sha256::text)
ON CONFLICT (run_id) DO NOTHING
RETURNING seq;

-- name: snapshot_insert
INSERT INTO run_snapshots (run_id, snapshot) VALUES ($1, $2);

-- name: snapshot_recordings_insert
-- One row per job: each array holds its column's values, in job order.
INSERT INTO snapshot_recordings (run_id, job_index, recording_id, camera_id, generation, sha256,
                                 byte_size, object_key, start_at, end_at, fps, slot_count)
SELECT :run_id::text, *
FROM unnest(:job_index::integer[], :recording_id::text[], :camera_id::text[],
            :generation::bigint[], :sha256::text[], :byte_size::bigint[], :object_key::text[],
            :start_at::timestamptz[], :end_at::timestamptz[], :fps::double precision[],
            :slot_count::integer[]);

-- name: jobs_insert
-- One row per job: each array holds its column's values, in job order.
-- The jobs are leases' (run_jobs_enqueue: an interface runs declares, 5_runs.sql).
SELECT run_jobs_enqueue_v1(
    :run_id::text, :run_seq::bigint, :runtime_id::text, :interval_ms::integer,
    :updated_at::timestamptz, :job_index::integer[], :camera_id::text[], :recording_id::text[],
    :recording_generation::bigint[], :first_slot_at::timestamptz[], :slot_count::integer[],
    :expires_at::timestamptz[]);

-- name: run_get
SELECT * FROM run_status WHERE run_id = $1;

-- name: run_list
-- Recent runs, newest first; photos are never listed. status: only runs of this status
-- now, by the rule of status.RunCounts.status (a test run past its expiry is expired; then
-- the first of leased, queued, failed, cancelled, expired jobs; else completed), which
-- tests/service/test_coordinator_runs.py holds the two to; mode: only runs of this mode.
-- nullable: workflow_id, before_seq, status, mode
SELECT * FROM run_status
WHERE kind = 'workflow'
  AND (:workflow_id::text IS NULL OR workflow_id = :workflow_id)
  AND (:before_seq::bigint IS NULL OR seq < :before_seq)
  AND (:mode::text IS NULL OR mode = :mode)
  AND (:status::text IS NULL OR :status = CASE
          WHEN expires_at IS NOT NULL AND expires_at <= :now::timestamptz THEN 'expired'
          WHEN jobs_leased > 0 THEN 'running'
          WHEN jobs_queued > 0 THEN 'queued'
          WHEN jobs_failed > 0 THEN 'failed'
          WHEN jobs_cancelled > 0 THEN 'cancelled'
          WHEN jobs_expired > 0 THEN 'expired'
          ELSE 'completed' END)
ORDER BY seq DESC
LIMIT :limit::integer;

-- name: run_jobs
SELECT * FROM run_jobs_of_v1($1) ORDER BY job_index LIMIT $2;

-- name: run_waiting_behind
-- Up to five older runs on the same runtime that still have queued or leased jobs.
SELECT r.run_id
FROM runs r
WHERE r.runtime_id = $1 AND r.seq < $2 AND r.kind = 'workflow'
  AND EXISTS (SELECT 1 FROM run_unfinished_jobs_v1(r.run_id))
ORDER BY r.seq
LIMIT 5;

-- name: run_snapshot_get
SELECT snapshot FROM run_snapshots WHERE run_id = $1;

-- name: snapshot_recordings_page
SELECT * FROM snapshot_recordings WHERE run_id = $1 AND job_index > $2 ORDER BY job_index LIMIT $3;

-- name: run_cancel
SELECT run_cancel_v1($1, $2);

-- name: runs_cancel_for_workflow
-- Cancels the unfinished runs of a workflow; returns those that had jobs to cancel.
SELECT run_id FROM (
    SELECT r.run_id, run_cancel_v1(r.run_id, $2) AS cancelled
    FROM runs r
    WHERE r.workflow_id = $1 AND r.kind = 'workflow'
      AND EXISTS (SELECT 1 FROM run_unfinished_jobs_v1(r.run_id))
    ORDER BY r.run_id
) c
WHERE cancelled > 0;

-- name: runs_cancel_for_bucket
-- Cancels the unfinished runs whose snapshot writes into the bucket.
SELECT run_id FROM (
    SELECT s.run_id, run_cancel_v1(s.run_id, $2) AS cancelled
    FROM run_snapshots s
    WHERE s.snapshot -> 'outputs' @> jsonb_build_array(jsonb_build_object('bucket_id', $1::text))
      AND EXISTS (SELECT 1 FROM run_unfinished_jobs_v1(s.run_id))
    ORDER BY s.run_id
) c
WHERE cancelled > 0;

-- name: run_recent_images
-- Up to $3 newest images of a run: published previews still readable at $2 (a full
-- run's: those of its leased jobs), and its bucket items.
-- (the previews are leases', the items review's: interfaces runs declares, 5_runs.sql and
-- 0019)
SELECT * FROM (
    SELECT p.item_id, 'preview' AS source, p.job_index, p.slot_index, p.camera_id,
           p.frame_time, p.boxes, '' AS bucket_id, p.published_at, p.collectable_at AS expires_at
    FROM run_live_previews_v1($1) p
    WHERE p.deleted_at IS NULL
      AND (p.collectable_at IS NULL OR p.collectable_at > $2)
    UNION ALL
    SELECT * FROM run_recent_items_v1($1)
) images
ORDER BY published_at DESC, item_id
LIMIT $3;

-- name: photo_job_insert
-- Its one job is leases' (photo_job_enqueue: an interface runs declares, 5_runs.sql).
SELECT photo_job_enqueue_v1(
    :run_id::text, :run_seq::bigint, :runtime_id::text, :camera_id::text, :recording_id::text,
    :recording_generation::bigint, :first_slot_at::timestamptz, :interval_ms::integer,
    :expires_at::timestamptz, :updated_at::timestamptz);

-- name: photo_get
-- A photo with its job, and its frame once published.
SELECT r.run_id, r.created_at, r.expires_at, j.camera_id, j.recording_id, j.first_slot_at,
       j.state, so.item_id, so.frame_time
FROM runs r
JOIN run_jobs_of_v1(r.run_id) j ON j.job_index = 0
LEFT JOIN run_published_previews_v1(r.run_id) so ON so.kind = 'preview'
WHERE r.run_id = $1 AND r.kind = 'photo'
ORDER BY so.published_at DESC NULLS LAST
LIMIT 1;

-- name: scheduler_try_lock
-- One scheduler pass at a time across replicas (session lock, released after the pass).
SELECT pg_try_advisory_lock(hashtext('workshop.coordinator.scheduler'));

-- name: scheduler_unlock
SELECT pg_advisory_unlock(hashtext('workshop.coordinator.scheduler'));

-- name: run_trace_insert
-- The trace context of the call that created the run (migration 0011's run_traces).
INSERT INTO run_traces (run_id, traceparent) VALUES ($1, $2) ON CONFLICT (run_id) DO NOTHING;

-- name: run_events_announce
-- Announcements made after their commits (runs/events.py): one notification per element,
-- channel[n] with payload key[n], all in this statement's own transaction.
SELECT pg_notify(u.channel, u.key) FROM unnest($1::text[], $2::text[]) AS u (channel, key);
