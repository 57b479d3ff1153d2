-- Runs, snapshots and their jobs (docs/runs-and-jobs.md).

-- name: run_fingerprint
SELECT run_id, fingerprint FROM runs WHERE run_id = $1;

-- name: unfinished_job_count
SELECT count(*) FROM jobs WHERE state IN ('queued', 'leased');

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
INSERT INTO jobs (run_id, job_index, run_seq, runtime_id, camera_id, recording_id,
                  recording_generation, first_slot_at, interval_ms, slot_count, expires_at,
                  updated_at)
SELECT :run_id::text, u.job_index, :run_seq::bigint, :runtime_id::text, u.camera_id,
       u.recording_id, u.generation, u.first_slot_at, :interval_ms::integer, u.slot_count,
       u.expires_at, :updated_at::timestamptz
FROM unnest(:job_index::integer[], :camera_id::text[], :recording_id::text[],
            :recording_generation::bigint[], :first_slot_at::timestamptz[],
            :slot_count::integer[], :expires_at::timestamptz[])
     AS u (job_index, camera_id, recording_id, generation, first_slot_at, slot_count, expires_at);

-- name: run_get
SELECT * FROM run_status WHERE run_id = $1;

-- name: run_list
-- Recent runs, newest first; photos are never listed.
SELECT * FROM run_status
WHERE kind = 'workflow'
  AND ($1::text IS NULL OR workflow_id = $1)
  AND ($2::bigint IS NULL OR seq < $2)
ORDER BY seq DESC
LIMIT $3;

-- name: run_jobs
SELECT * FROM jobs WHERE run_id = $1 ORDER BY job_index LIMIT $2;

-- name: run_waiting_behind
-- Up to five older runs on the same runtime that still have queued or leased jobs.
SELECT r.run_id
FROM runs r
WHERE r.runtime_id = $1 AND r.seq < $2 AND r.kind = 'workflow'
  AND EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = r.run_id AND j.state IN ('queued', 'leased'))
ORDER BY r.seq
LIMIT 5;

-- name: run_snapshot_get
SELECT snapshot FROM run_snapshots WHERE run_id = $1;

-- name: snapshot_recordings_page
SELECT * FROM snapshot_recordings WHERE run_id = $1 AND job_index > $2 ORDER BY job_index LIMIT $3;

-- name: run_cancel
SELECT run_cancel($1, $2);

-- name: runs_cancel_for_workflow
-- Cancels the unfinished runs of a workflow; returns those that had jobs to cancel.
SELECT run_id FROM (
    SELECT r.run_id, run_cancel(r.run_id, $2) AS cancelled
    FROM runs r
    WHERE r.workflow_id = $1 AND r.kind = 'workflow'
      AND EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = r.run_id AND j.state IN ('queued', 'leased'))
    ORDER BY r.run_id
) c
WHERE cancelled > 0;

-- name: runs_cancel_for_bucket
-- Cancels the unfinished runs whose snapshot writes into the bucket.
SELECT run_id FROM (
    SELECT s.run_id, run_cancel(s.run_id, $2) AS cancelled
    FROM run_snapshots s
    WHERE s.snapshot -> 'outputs' @> jsonb_build_array(jsonb_build_object('bucket_id', $1::text))
      AND EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = s.run_id AND j.state IN ('queued', 'leased'))
    ORDER BY s.run_id
) c
WHERE cancelled > 0;

-- name: run_recent_images
-- Up to $3 newest images of a run: published previews still readable at $2, and
-- its bucket items.
SELECT * FROM (
    SELECT so.item_id, 'preview' AS source, so.job_index, so.slot_index, j.camera_id,
           so.frame_time, so.boxes, '' AS bucket_id, so.published_at, so.collectable_at AS expires_at
    FROM staged_objects so
    JOIN jobs j ON j.run_id = so.run_id AND j.job_index = so.job_index
    WHERE so.run_id = $1 AND so.kind = 'preview' AND so.published_at IS NOT NULL
      AND so.deleted_at IS NULL AND (so.collectable_at IS NULL OR so.collectable_at > $2)
    UNION ALL
    SELECT bi.item_id, 'item', bi.job_index, bi.slot_index, bi.camera_id, bi.frame_time,
           bi.boxes, bi.bucket_id, bi.saved_at, NULL
    FROM bucket_items bi
    WHERE bi.run_id = $1
) images
ORDER BY published_at DESC, item_id
LIMIT $3;

-- name: photo_job_insert
INSERT INTO jobs (run_id, job_index, run_seq, runtime_id, camera_id, recording_id,
                  recording_generation, first_slot_at, interval_ms, slot_count, expires_at,
                  updated_at, is_photo)
VALUES (:run_id::text, 0, :run_seq::bigint, :runtime_id::text, :camera_id::text,
        :recording_id::text, :recording_generation::bigint, :first_slot_at::timestamptz,
        :interval_ms::integer, 1, :expires_at::timestamptz, :updated_at::timestamptz, true);

-- name: photo_get
-- A photo with its job, and its frame once published.
SELECT r.run_id, r.created_at, r.expires_at, j.camera_id, j.recording_id, j.first_slot_at,
       j.state, so.item_id, so.frame_time
FROM runs r
JOIN jobs j ON j.run_id = r.run_id AND j.job_index = 0
LEFT JOIN staged_objects so
       ON so.run_id = r.run_id AND so.kind = 'preview' AND so.published_at IS NOT NULL
WHERE r.run_id = $1 AND r.kind = 'photo'
ORDER BY so.published_at DESC NULLS LAST
LIMIT 1;

-- name: scheduler_try_lock
-- One scheduler pass at a time across replicas (session lock, released after the pass).
SELECT pg_try_advisory_lock(hashtext('workshop.coordinator.scheduler'));

-- name: scheduler_unlock
SELECT pg_advisory_unlock(hashtext('workshop.coordinator.scheduler'));
