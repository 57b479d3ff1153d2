-- Workflow documents (docs/workflows.md). Revisions only grow; deleted ids stay reserved.

-- name: workflow_get
SELECT * FROM workflows WHERE workflow_id = $1;

-- name: workflow_insert
INSERT INTO workflows (workflow_id, revision, spec, schedule_time, time_zone, created_at,
                       updated_at, updated_by)
VALUES ($1, 1, $2, $3, $4, $5, $5, $6)
ON CONFLICT (workflow_id) DO NOTHING
RETURNING *;

-- name: workflow_update
UPDATE workflows
SET revision = revision + 1, spec = $3, schedule_time = $4, time_zone = $5, updated_at = $6,
    updated_by = $7
WHERE workflow_id = $1 AND revision = $2 AND deleted_at IS NULL
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
