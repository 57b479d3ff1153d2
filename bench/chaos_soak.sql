-- The chaos soak's own SQL (bench/chaos_soak.py): a history of job transitions that the
-- soak installs in its throwaway database, and the checks it runs afterwards. Each check
-- answers one row per violation; its first column is the offending id.

-- name: install_history
-- Every change of a job's state or lease generation, with the lease holder before and
-- after and the instant (clock_timestamp, inside the writing transaction). Soak only:
-- this is no part of the product's schema.
CREATE TABLE chaos_job_history (
    id              bigserial PRIMARY KEY,
    run_id          text NOT NULL,
    job_index       integer NOT NULL,
    old_state       text NOT NULL,
    new_state       text NOT NULL,
    old_generation  bigint NOT NULL,
    new_generation  bigint NOT NULL,
    old_claimed_by  text,
    new_claimed_by  text,
    old_lapses      integer NOT NULL,
    new_lapses      integer NOT NULL,
    at              timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION chaos_job_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_job_history (run_id, job_index, old_state, new_state, old_generation,
        new_generation, old_claimed_by, new_claimed_by, old_lapses, new_lapses)
    VALUES (NEW.run_id, NEW.job_index, OLD.state, NEW.state, OLD.generation, NEW.generation,
        OLD.claimed_by, NEW.claimed_by, OLD.lapses, NEW.lapses);
    RETURN NULL;
END;
$$;
CREATE TRIGGER chaos_job_history AFTER UPDATE ON jobs FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.generation IS DISTINCT FROM NEW.generation)
    EXECUTE FUNCTION chaos_job_history();

-- name: terminate_connections
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend';

-- name: live_jobs
SELECT count(*) FROM jobs WHERE state IN ('queued', 'leased');

-- name: job_counts
SELECT state, is_photo, coalesce(failure_reason, '') AS reason, count(*) AS jobs
FROM jobs GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;

-- name: check_ended_twice
-- A job that entered a final state more than once, or left one.
SELECT run_id || '/' || job_index AS id,
       string_agg(old_state || '>' || new_state || '@g' || new_generation, ' ' ORDER BY id) AS what
FROM chaos_job_history h
WHERE (old_state IN ('completed', 'failed', 'cancelled', 'expired') AND new_state <> old_state)
   OR new_state IN ('completed', 'failed', 'cancelled', 'expired')
GROUP BY run_id, job_index
HAVING count(*) FILTER (WHERE old_state IN ('completed', 'failed', 'cancelled', 'expired')) > 0
    OR count(*) FILTER (WHERE new_state IN ('completed', 'failed', 'cancelled', 'expired')) > 1;

-- name: check_receipt_state
-- A receipt for a job that is not completed, or from another lease than the job's last.
SELECT r.run_id || '/' || r.job_index AS id,
       'state ' || j.state || ', receipt g' || r.generation || ', job g' || j.generation AS what
FROM receipts r JOIN jobs j USING (run_id, job_index)
WHERE j.state <> 'completed' OR r.generation <> j.generation;

-- name: check_completed_without_receipt
SELECT j.run_id || '/' || j.job_index AS id, 'completed g' || j.generation AS what
FROM jobs j
WHERE j.state = 'completed'
  AND NOT EXISTS (SELECT 1 FROM receipts r WHERE r.run_id = j.run_id AND r.job_index = j.job_index);

-- name: check_items_without_receipt
SELECT b.item_id AS id, b.run_id || '/' || b.job_index || ' (job ' || j.state || ')' AS what
FROM bucket_items b JOIN jobs j USING (run_id, job_index)
WHERE NOT EXISTS (SELECT 1 FROM receipts r WHERE r.run_id = b.run_id AND r.job_index = b.job_index);

-- name: check_items_count
-- A bucket holding part of a job: the receipt's item count differs from the items kept.
SELECT r.run_id || '/' || r.job_index AS id,
       'receipt items_saved ' || r.items_saved || ', bucket_items ' || count(b.item_id) AS what
FROM receipts r LEFT JOIN bucket_items b USING (run_id, job_index)
GROUP BY r.run_id, r.job_index, r.items_saved
HAVING count(b.item_id) <> r.items_saved;

-- name: check_item_images
-- An item whose image is not an object of the receipt's lease, or is collectable or gone.
SELECT b.item_id AS id,
       b.object_key || ': ' || CASE
           WHEN s.object_key IS NULL THEN 'no staged object'
           WHEN s.generation <> r.generation THEN 'object of g' || s.generation || ', receipt g' || r.generation
           WHEN s.deleted_at IS NOT NULL THEN 'deleted'
           ELSE 'collectable' END AS what
FROM bucket_items b
JOIN receipts r USING (run_id, job_index)
LEFT JOIN staged_objects s ON s.object_key = b.object_key
WHERE s.object_key IS NULL OR s.generation <> r.generation OR s.deleted_at IS NOT NULL
   OR s.collectable_at IS NOT NULL;

-- name: check_stale_writes
-- An object recorded (published, or staged as an upload) after its lease generation had
-- ended: the first history row that took the job off that generation is earlier.
WITH ends AS (
    SELECT run_id, job_index, old_generation AS generation, min(at) AS ended_at
    FROM chaos_job_history
    WHERE old_state = 'leased' AND (new_state <> 'leased' OR new_generation <> old_generation)
    GROUP BY 1, 2, 3
), starts AS (
    SELECT run_id, job_index, new_generation AS generation, min(at) AS began_at
    FROM chaos_job_history
    WHERE new_state = 'leased' AND new_generation <> old_generation
    GROUP BY 1, 2, 3
)
SELECT s.object_key AS id,
       CASE WHEN s.kind = 'preview' THEN 'published ' ELSE 'staged ' END
       || to_char(coalesce(s.published_at, s.staged_at), 'HH24:MI:SS.MS')
       || ', lease g' || s.generation || ' '
       || coalesce(to_char(st.began_at, 'HH24:MI:SS.MS'), '?') || '..'
       || coalesce(to_char(e.ended_at, 'HH24:MI:SS.MS'), 'open') AS what
FROM staged_objects s
LEFT JOIN ends e USING (run_id, job_index, generation)
LEFT JOIN starts st USING (run_id, job_index, generation)
WHERE (s.kind = 'preview' AND s.published_at IS NOT NULL
       AND (s.published_at > e.ended_at OR s.published_at < st.began_at))
   OR (s.kind = 'upload' AND (s.staged_at > e.ended_at OR s.staged_at < st.began_at));

-- name: check_receipt_in_lease
-- A receipt committed under a generation other than the one the completing transition
-- ended (the completion came from a stale lease).
SELECT r.run_id || '/' || r.job_index AS id,
       'receipt g' || r.generation || ', completed from g' || h.old_generation AS what
FROM receipts r
JOIN chaos_job_history h ON h.run_id = r.run_id AND h.job_index = r.job_index
    AND h.new_state = 'completed'
WHERE h.old_generation <> r.generation;

-- name: failed_jobs
SELECT run_id || '/' || job_index AS id, failure_reason, coalesce(failure_message, '') AS message,
       lapses, claimed_by
FROM jobs WHERE state IN ('failed', 'expired') ORDER BY run_id, job_index;

-- name: lapses
-- Each lapse: the lease generation that lapsed, its holder, when it was taken and when it
-- lapsed (seconds since the epoch).
SELECT h.run_id || '/' || h.job_index AS id, h.old_generation AS generation,
       h.old_claimed_by AS holder,
       extract(epoch FROM (SELECT min(c.at) FROM chaos_job_history c
                           WHERE c.run_id = h.run_id AND c.job_index = h.job_index
                             AND c.new_generation = h.old_generation
                             AND c.new_state = 'leased'))::float8 AS claimed_at,
       extract(epoch FROM h.at)::float8 AS lapsed_at
FROM chaos_job_history h
WHERE h.new_lapses > h.old_lapses
ORDER BY h.at;

-- name: run_states
-- Each run's jobs by state, for the status check (services/coordinator/runs/status.py's order).
SELECT r.run_id, r.kind,
       count(*) FILTER (WHERE j.state = 'leased') AS leased,
       count(*) FILTER (WHERE j.state = 'queued') AS queued,
       count(*) FILTER (WHERE j.state = 'failed') AS failed,
       count(*) FILTER (WHERE j.state = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE j.state = 'expired') AS expired,
       count(*) FILTER (WHERE j.state = 'completed') AS completed,
       count(rc.run_id) AS receipts
FROM runs r
JOIN jobs j USING (run_id)
LEFT JOIN receipts rc ON rc.run_id = j.run_id AND rc.job_index = j.job_index
GROUP BY r.run_id, r.kind ORDER BY r.run_id;

-- name: known_objects
-- What the database knows of each object key (for the S3 listing).
SELECT s.object_key, s.run_id, s.job_index, s.generation,
       s.deleted_at IS NOT NULL AS deleted,
       s.collectable_at IS NOT NULL AND s.collectable_at <= $1 AS collectable_due,
       CASE WHEN s.gc_claimed_until > clock_timestamp() THEN s.gc_claimed_until END AS held_until,
       EXISTS (SELECT 1 FROM bucket_items b WHERE b.object_key = s.object_key) AS item
FROM staged_objects s;

-- name: job_sweeps
-- Each job's end and whether its preview prefix was swept (for unknown objects).
SELECT run_id, job_index, state, previews_swept_at IS NOT NULL AS swept
FROM jobs;

-- name: item_keys
SELECT DISTINCT object_key FROM bucket_items;
