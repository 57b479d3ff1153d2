-- Release 0.1, room workflows: its tables, indexes, triggers and functions.

-- A deleted workflow keeps its row (deleted_at) so its id is never reused.
CREATE TABLE workflows (
    workflow_id   text PRIMARY KEY,
    revision      bigint NOT NULL CHECK (revision >= 1),
    spec          jsonb NOT NULL,
    schedule_time time,
    time_zone     text NOT NULL,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    updated_by    jsonb NOT NULL,
    deleted_at    timestamptz
);

CREATE INDEX workflows_scheduled ON workflows (workflow_id)
    WHERE schedule_time IS NOT NULL AND deleted_at IS NULL;

-- The room's public SQL. No other room names workflows.

-- The workflows not deleted, with their names.
-- public: review (summary_workflows)
CREATE FUNCTION workflows_live_v1() RETURNS TABLE (workflow_id text, name text)
LANGUAGE sql STABLE AS $$
    SELECT w.workflow_id, w.spec ->> 'name' FROM workflows w WHERE w.deleted_at IS NULL
$$;
