-- Workflow documents (docs/workflows.md). Revisions only grow; deleted ids stay reserved.

-- name: workflow_get
SELECT * FROM workflows WHERE workflow_id = $1;

-- name: workflow_insert
-- nullable: schedule_time
INSERT INTO workflows (workflow_id, revision, spec, schedule_time, time_zone, created_at,
                       updated_at, updated_by)
VALUES (:workflow_id::text, 1, :spec::jsonb, :schedule_time::time, :time_zone::text,
        :saved_at::timestamptz, :saved_at, :saved_by::jsonb)
ON CONFLICT (workflow_id) DO NOTHING
RETURNING *;

-- name: workflow_update
-- nullable: schedule_time
UPDATE workflows
SET revision = revision + 1, spec = :spec::jsonb, schedule_time = :schedule_time::time,
    time_zone = :time_zone::text, updated_at = :saved_at::timestamptz,
    updated_by = :saved_by::jsonb
WHERE workflow_id = :workflow_id::text AND revision = :expected_revision::bigint
  AND deleted_at IS NULL
RETURNING *;

-- name: workflow_list
SELECT * FROM workflows
WHERE deleted_at IS NULL
  AND ($1::timestamptz IS NULL OR (updated_at, workflow_id) < ($1, $2::text))
ORDER BY updated_at DESC, workflow_id DESC
LIMIT $3;

-- name: workflow_delete
UPDATE workflows SET deleted_at = $3
WHERE workflow_id = $1 AND deleted_at IS NULL AND ($2::bigint IS NULL OR revision = $2)
RETURNING *;

-- name: workflow_lock
-- Inside CreateRun's transaction: the revision must still be the one admitted.
SELECT revision, deleted_at FROM workflows WHERE workflow_id = $1 FOR SHARE;

-- name: workflow_scheduled_list
SELECT workflow_id, revision, spec, schedule_time, time_zone
FROM workflows
WHERE schedule_time IS NOT NULL AND deleted_at IS NULL
ORDER BY workflow_id;
