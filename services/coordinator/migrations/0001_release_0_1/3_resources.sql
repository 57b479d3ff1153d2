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

-- Records that a runtime checked in; at most one write a second per runtime,
-- so many processors of one runtime do not queue on its row. Helpers called from
-- plpgsql are plpgsql too: a LANGUAGE sql function called with PERFORM is planned
-- again on every call, a plpgsql body keeps its plans for the session.
CREATE FUNCTION runtime_seen(p_runtime text, p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runtimes SET last_seen_at = p_now
    WHERE runtime_id = p_runtime
      AND (last_seen_at IS NULL OR last_seen_at < p_now - interval '1 second');
END;
$$;
