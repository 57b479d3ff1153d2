-- Release 0.1, room runs: its tables, indexes, triggers and functions.

-- Runs are never deleted: the row is the tombstone that keeps an id from reuse.
-- `seq` orders runs for "older run first" scheduling.
CREATE TABLE runs (
    run_id            text PRIMARY KEY,
    seq               bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    kind              text NOT NULL CHECK (kind IN ('workflow', 'photo')),
    mode              text NOT NULL CHECK (mode IN ('test', 'full')),
    workflow_id       text NOT NULL,
    workflow_revision bigint NOT NULL,
    runtime_id        text NOT NULL REFERENCES runtimes (runtime_id),
    image_limit       integer NOT NULL CHECK (image_limit >= 0),
    fingerprint       text NOT NULL,
    created_by        jsonb NOT NULL,
    policy_revision   bigint NOT NULL,
    created_at        timestamptz NOT NULL,
    expires_at        timestamptz,
    code_sha256       text NOT NULL
);

CREATE INDEX runs_by_workflow ON runs (workflow_id, seq DESC);

CREATE INDEX runs_by_runtime ON runs (runtime_id, seq);

-- The frozen run snapshot (docs/runs-and-jobs.md). Immutable: see the triggers below.
CREATE TABLE run_snapshots (
    run_id   text PRIMARY KEY REFERENCES runs (run_id),
    snapshot jsonb NOT NULL
);

-- The input recordings of a snapshot, one per job, with the generation and
-- digest they were admitted at. Immutable like the snapshot itself.
CREATE TABLE snapshot_recordings (
    run_id       text NOT NULL REFERENCES runs (run_id),
    job_index    integer NOT NULL,
    recording_id text NOT NULL,
    camera_id    text NOT NULL,
    generation   bigint NOT NULL,
    sha256       text NOT NULL,
    byte_size    bigint NOT NULL,
    object_key   text NOT NULL,
    start_at     timestamptz NOT NULL,
    end_at       timestamptz NOT NULL,
    fps          double precision NOT NULL,
    slot_count   integer NOT NULL,
    PRIMARY KEY (run_id, job_index)
);

CREATE FUNCTION refuse_snapshot_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run snapshots are immutable: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE TRIGGER run_snapshots_immutable
    BEFORE UPDATE OR DELETE ON run_snapshots
    FOR EACH ROW EXECUTE FUNCTION refuse_snapshot_change();

CREATE TRIGGER run_snapshots_no_truncate
    BEFORE TRUNCATE ON run_snapshots
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_snapshot_change();

CREATE TRIGGER snapshot_recordings_immutable
    BEFORE UPDATE OR DELETE ON snapshot_recordings
    FOR EACH ROW EXECUTE FUNCTION refuse_snapshot_change();

CREATE TRIGGER snapshot_recordings_no_truncate
    BEFORE TRUNCATE ON snapshot_recordings
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_snapshot_change();

-- Cancels a run (docs/runs-and-jobs.md): queued and leased jobs become cancelled, so writes
-- under their leases are refused from now on; completed jobs keep their results.
CREATE FUNCTION run_cancel(p_run text, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    cancelled integer := 0;
    job record;
BEGIN
    FOR job IN
        UPDATE jobs SET state = 'cancelled', lease_token = NULL, lease_expires_at = NULL,
                        updated_at = p_now
        WHERE run_id = p_run AND state IN ('queued', 'leased')
        RETURNING job_index
    LOOP
        PERFORM job_objects_abandon(p_run, job.job_index, p_now);
        cancelled := cancelled + 1;
    END LOOP;
    IF cancelled > 0 THEN
        PERFORM pg_notify('workshop_run', p_run);
    END IF;
    RETURN cancelled;
END;
$$;
