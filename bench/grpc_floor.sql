-- The durable floor's SQL (bench/grpc_floor.py): a bare table of jobs and the one
-- statement each call of the short-job cycle cannot do without. Benchmark only: no part
-- of the product's schema.

-- name: drop_table
DROP TABLE IF EXISTS floor_jobs;

-- name: create_table
CREATE TABLE floor_jobs (
    id               bigint PRIMARY KEY,
    state            text NOT NULL DEFAULT 'queued',
    token            uuid,
    lease_expires_at timestamptz,
    progress         integer NOT NULL DEFAULT 0
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
