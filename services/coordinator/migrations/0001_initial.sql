-- Workshop coordinator: the first schema (docs/concepts.md, docs/workflows.md, docs/runs-and-jobs.md).
-- Times are timestamptz written from the coordinator's injected clock, never now().

CREATE TABLE devices (
    device_id     text PRIMARY KEY,
    description   text NOT NULL DEFAULT '',
    registered_at timestamptz NOT NULL
);

CREATE TABLE runtimes (
    runtime_id    text PRIMARY KEY,
    device_id     text NOT NULL REFERENCES devices (device_id),
    engine        text NOT NULL,
    code_sha256   text NOT NULL,
    capabilities  text[] NOT NULL DEFAULT '{}',
    registered_at timestamptz NOT NULL,
    last_seen_at  timestamptz
);
CREATE INDEX runtimes_newest_seen ON runtimes (last_seen_at DESC NULLS LAST, runtime_id);

CREATE TABLE cameras (
    camera_id  text PRIMARY KEY,
    name       text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

-- One row per recording id; every put bumps `generation`, even with identical bytes.
CREATE TABLE recordings (
    recording_id text PRIMARY KEY,
    camera_id    text NOT NULL REFERENCES cameras (camera_id),
    generation   bigint NOT NULL CHECK (generation >= 1),
    start_at     timestamptz NOT NULL,
    end_at       timestamptz NOT NULL,
    fps          double precision NOT NULL CHECK (fps > 0),
    object_key   text NOT NULL,
    sha256       text NOT NULL,
    byte_size    bigint NOT NULL CHECK (byte_size >= 0),
    put_at       timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    deleted_at   timestamptz,
    CHECK (end_at > start_at)
);
CREATE INDEX recordings_camera_time ON recordings (camera_id, start_at, end_at)
    WHERE deleted_at IS NULL;

CREATE TABLE model_versions (
    name           text NOT NULL,
    version        bigint NOT NULL CHECK (version >= 1),
    weights_sha256 text NOT NULL,
    classes        text[] NOT NULL,
    input_shape    bigint[] NOT NULL,
    published_at   timestamptz NOT NULL,
    PRIMARY KEY (name, version)
);

-- A deleted bucket keeps its row (deleted_at) so its id is never reused.
CREATE TABLE buckets (
    bucket_id  text PRIMARY KEY,
    name       text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    deleted_at timestamptz
);

CREATE TABLE users (
    user_id      text PRIMARY KEY,
    display_name text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL,
    disabled_at  timestamptz
);

-- Secrets are random 256-bit values; only their SHA-256 is stored.
CREATE TABLE sessions (
    session_id  text PRIMARY KEY,
    user_id     text NOT NULL REFERENCES users (user_id),
    secret_hash text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);

-- scopes: [{"scope": "workshop"}, {"scope": "footage:read", "camera_ids": [..]},
--          {"scope": "workshop:run", "device_id": ".."}, {"scope": "admin"}, {"scope": "service"}]
CREATE TABLE keys (
    key_id       text PRIMARY KEY,
    name         text NOT NULL DEFAULT '',
    user_id      text REFERENCES users (user_id),
    secret_hash  text NOT NULL UNIQUE,
    scopes       jsonb NOT NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz,
    revoked_at   timestamptz,
    last_used_at timestamptz
);

-- The policy revision (docs/concepts.md): one row; raising it retires in-flight authority.
CREATE TABLE policy (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    revision  bigint NOT NULL CHECK (revision >= 1)
);
INSERT INTO policy (singleton, revision) VALUES (true, 1);

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
    expires_at        timestamptz
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

-- One job per input recording. `generation` is the lease generation (0 = never
-- leased); `recording_generation` the source generation it was admitted at.
CREATE TABLE jobs (
    run_id               text NOT NULL REFERENCES runs (run_id),
    job_index            integer NOT NULL,
    run_seq              bigint NOT NULL,
    runtime_id           text NOT NULL,
    camera_id            text NOT NULL,
    recording_id         text NOT NULL,
    recording_generation bigint NOT NULL,
    first_slot_at        timestamptz NOT NULL,
    interval_seconds     integer NOT NULL CHECK (interval_seconds >= 1),
    slot_count           integer NOT NULL CHECK (slot_count >= 1),
    state                text NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'leased', 'completed', 'failed', 'cancelled', 'expired')),
    generation           bigint NOT NULL DEFAULT 0,
    lease_token          uuid,
    lease_expires_at     timestamptz,
    lapses               integer NOT NULL DEFAULT 0,
    progress             integer NOT NULL DEFAULT 0 CHECK (progress BETWEEN 0 AND 100),
    progress_updates     integer NOT NULL DEFAULT 0,
    phase                text,
    decoder              text,
    failure_reason       text,
    failure_message      text,
    input_cleared        boolean NOT NULL DEFAULT false,
    expires_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL,
    PRIMARY KEY (run_id, job_index)
);
CREATE INDEX jobs_claimable ON jobs (runtime_id, run_seq, job_index) WHERE state = 'queued';
CREATE INDEX jobs_unfinished ON jobs (run_id) WHERE state IN ('queued', 'leased');
