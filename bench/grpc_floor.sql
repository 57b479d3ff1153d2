-- The durable floor's SQL (bench/grpc_floor.py): a bare table of jobs and the one
-- statement each call of the short-job cycle cannot do without; for the session stream's
-- per-frame floor (bench/stream_floor.py) also a table of published frames (one row per
-- frame until commit) and one of items. Benchmark only: no part of the product's schema.

-- name: drop_table
DROP TABLE IF EXISTS floor_jobs;

-- name: create_table
CREATE TABLE floor_jobs (
    id               bigint PRIMARY KEY,
    state            text NOT NULL DEFAULT 'queued',
    token            uuid,
    lease_expires_at timestamptz,
    progress         integer NOT NULL DEFAULT 0,
    run_id           bigint NOT NULL DEFAULT 1,
    frames           integer NOT NULL DEFAULT 0  -- frames recorded under the lease
);

-- name: create_index
CREATE INDEX floor_jobs_queued ON floor_jobs (id) WHERE state = 'queued';

-- name: queue
INSERT INTO floor_jobs (id) SELECT generate_series(1, $1::bigint);

-- name: claim
-- The next queued job, leased for 5 minutes under a new token.
UPDATE floor_jobs SET state = 'leased', token = gen_random_uuid(),
                      lease_expires_at = now() + interval '5 minutes'
WHERE id = (SELECT id FROM floor_jobs WHERE state = 'queued' ORDER BY id
            LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, token;

-- name: progress
-- The fence (this token, a lease that holds) and the report, which renews the lease.
UPDATE floor_jobs SET progress = $3, lease_expires_at = now() + interval '5 minutes'
WHERE id = $1 AND token = $2 AND state = 'leased' AND lease_expires_at > now()
RETURNING id, token;

-- name: complete
-- Ends the job under its token and claims the next queued one, in one statement.
WITH done AS (
    UPDATE floor_jobs SET state = 'completed', progress = 100, token = NULL
    WHERE id = $1 AND token = $2 AND state = 'leased' AND lease_expires_at > now()
    RETURNING id
), next AS (
    UPDATE floor_jobs SET state = 'leased', token = gen_random_uuid(),
                          lease_expires_at = now() + interval '5 minutes'
    WHERE id = (SELECT id FROM floor_jobs WHERE state = 'queued' ORDER BY id
                LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING id, token
)
SELECT (SELECT count(*) FROM done) AS done, next.id, next.token
FROM (SELECT 1) AS one LEFT JOIN next ON true;

-- name: completed
SELECT count(*) FROM floor_jobs WHERE state = 'completed';

-- The per-frame floor (bench/stream_floor.py) ----------------------------------------

-- name: drop_frame_tables
DROP TABLE IF EXISTS floor_frames, floor_items;

-- name: create_frames
-- A published frame while its job runs (what a preview shows): one row per frame.
CREATE TABLE floor_frames (
    job_id     bigint NOT NULL,
    slot       integer NOT NULL,
    run_id     bigint NOT NULL,
    object_key text NOT NULL,
    sha256     bytea NOT NULL,
    boxes      jsonb NOT NULL,
    PRIMARY KEY (job_id, slot)
);

-- name: create_items
-- A committed frame: an item of the run, its boxes an array on the row.
CREATE TABLE floor_items (
    run_id     bigint NOT NULL,
    job_id     bigint NOT NULL,
    slot       integer NOT NULL,
    object_key text NOT NULL,
    sha256     bytea NOT NULL,
    boxes      jsonb NOT NULL,
    PRIMARY KEY (run_id, job_id, slot)
);

-- name: record_frames
-- K frame records of a held lease in one statement: the fence (this token, a lease that
-- holds) renews the lease and counts the frames, then the K rows from the arrays.
-- Refused (0 rows) when the lease does not hold.
WITH fence AS (
    UPDATE floor_jobs SET frames = frames + cardinality($3::integer[]),
                          lease_expires_at = now() + interval '5 minutes'
    WHERE id = $1 AND token = $2 AND state = 'leased' AND lease_expires_at > now()
    RETURNING id, run_id
)
INSERT INTO floor_frames (job_id, slot, run_id, object_key, sha256, boxes)
SELECT fence.id, f.slot, fence.run_id, f.object_key, f.sha256, f.boxes::jsonb
FROM fence, unnest($3::integer[], $4::text[], $5::bytea[], $6::text[])
    AS f (slot, object_key, sha256, boxes);

-- name: commit_frames
-- The commit: ends the job under its token when all `$3` frames it published are
-- recorded, moves them into items and claims the next queued job, in one statement
-- whatever the number of frames.
WITH done AS (
    UPDATE floor_jobs SET state = 'completed', progress = 100, token = NULL
    WHERE id = $1 AND token = $2 AND state = 'leased' AND lease_expires_at > now()
      AND frames = $3
    RETURNING id
), moved AS (
    DELETE FROM floor_frames USING done WHERE floor_frames.job_id = done.id
    RETURNING floor_frames.*
), saved AS (
    INSERT INTO floor_items (run_id, job_id, slot, object_key, sha256, boxes)
    SELECT run_id, job_id, slot, object_key, sha256, boxes FROM moved
    RETURNING 1
), next AS (
    UPDATE floor_jobs SET state = 'leased', token = gen_random_uuid(),
                          lease_expires_at = now() + interval '5 minutes'
    WHERE id = (SELECT id FROM floor_jobs WHERE state = 'queued' ORDER BY id
                LIMIT 1 FOR UPDATE SKIP LOCKED)
      AND EXISTS (SELECT FROM done)  -- a refused commit claims nothing
    RETURNING id, token
)
SELECT (SELECT count(*) FROM done) AS done, (SELECT count(*) FROM saved) AS saved,
       next.id, next.token
FROM (SELECT 1) AS one LEFT JOIN next ON true;

-- name: items_saved
SELECT count(*) FROM floor_items;
