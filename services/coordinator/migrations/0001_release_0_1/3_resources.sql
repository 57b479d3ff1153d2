-- Release 0.1, room resources: its tables, indexes, triggers and functions.

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

-- The room's public SQL: what rooms above read of resources in their own statements and
-- functions. No other room names devices, runtimes, cameras, recordings, model_versions
-- or buckets.

-- Records that a runtime checked in; at most one write a second per runtime,
-- so many processors of one runtime do not queue on its row. Helpers called from
-- plpgsql are plpgsql too: a LANGUAGE sql function called with PERFORM is planned
-- again on every call, a plpgsql body keeps its plans for the session.
-- public: leases (job_claim_many, job_heartbeat, job_progress)
CREATE FUNCTION runtime_seen_v1(p_runtime text, p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runtimes SET last_seen_at = p_now
    WHERE runtime_id = p_runtime
      AND (last_seen_at IS NULL OR last_seen_at < p_now - interval '1 second');
END;
$$;

-- Fence 2 (docs/leases-and-fences.md): whether the recording is still there at the
-- generation a job was admitted at, taken FOR SHARE so a concurrent replacement or
-- deletion waits for the caller's commit.
-- public: leases (workshop_fence_reason)
CREATE FUNCTION recording_hold_v1(p_recording text, p_generation bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM recordings
    WHERE recording_id = p_recording AND generation = p_generation AND deleted_at IS NULL
    FOR SHARE;
    RETURN FOUND;
END;
$$;

-- A recording's generation now and when it was deleted (no row: no such recording),
-- without locks. Single-SELECT STABLE SQL functions like this one are inlined by the
-- planner where a query uses them: the read is the join it replaced.
-- public: review (bucket_items_current, summary_buckets), leases (job_end_unfenced,
-- review's previews of a test run)
CREATE FUNCTION recording_state_v1(p_recording text)
RETURNS TABLE (generation bigint, deleted_at timestamptz) LANGUAGE sql STABLE AS $$
    SELECT rec.generation, rec.deleted_at FROM recordings rec WHERE rec.recording_id = p_recording
$$;

-- A runtime's device and code (no row: no such runtime).
-- public: leases (workshop_fence_reason's fence 4, the runtime_identity statement)
CREATE FUNCTION runtime_identity_v1(p_runtime text)
RETURNS TABLE (runtime_id text, device_id text, code_sha256 text) LANGUAGE sql STABLE AS $$
    SELECT rt.runtime_id, rt.device_id, rt.code_sha256 FROM runtimes rt
    WHERE rt.runtime_id = p_runtime
$$;

-- The buckets not deleted.
-- public: review (bucket_exists, the summary)
CREATE FUNCTION buckets_live_v1() RETURNS TABLE (bucket_id text, name text)
LANGUAGE sql STABLE AS $$
    SELECT b.bucket_id, b.name FROM buckets b WHERE b.deleted_at IS NULL
$$;

-- Deletes a deleted bucket's contents (its items, sightings and counters, and releases
-- their uploads) in the transaction that deletes the bucket; answers how many items
-- went. Those are review's: resources, below review, declares what deleting a bucket
-- needs, and review implements it (6_review.sql), as Resources is given the
-- cancellation of the bucket's runs as a callable.
-- interface: implemented by review
CREATE FUNCTION bucket_items_delete_v1(p_bucket text, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'bucket_items_delete is implemented by review (6_review.sql)';
END;
$$;
