-- A run's timeline (docs/runs-and-jobs.md, "A run's timeline"): its jobs' attempts, from
-- job_attempts (migration 0011).

-- name: timeline_page
-- Up to $3 jobs of run $1 after job index $2, in job order, each with its attempts in
-- generation order: one row per attempt, or one row without an attempt (generation NULL)
-- for a job never leased since 0011. No row: no such run, or no job after $2.
SELECT j.job_index, j.state, j.camera_id, j.recording_id, j.runtime_id, j.lapses,
       j.failure_reason, j.failure_message, j.updated_at, rt.device_id,
       a.generation, a.claimed_by, a.claimed_at, a.lease_seconds, a.ended_at, a.outcome,
       a.failure_reason AS attempt_failure_reason, a.lease_until, a.refusals
FROM (SELECT * FROM jobs WHERE run_id = $1 AND job_index > $2 ORDER BY job_index LIMIT $3) j
LEFT JOIN LATERAL runtime_identity_v1(j.runtime_id) rt ON true
LEFT JOIN job_attempts a ON a.run_id = j.run_id AND a.job_index = j.job_index
ORDER BY j.job_index, a.generation;

-- name: timeline_run
-- The run (its runtime), and the trace context its creation recorded (NULL: none); no row:
-- no such run.
SELECT r.run_id, r.runtime_id, run_traceparent_v1(r.run_id) AS traceparent
FROM run_facts_v1($1) r;

-- name: job_attempt_of
-- One attempt, as its trace span shows it: of generation $3, or (NULL) the job's latest
-- lapsed one (a maintenance pass's rescue, which names no generation: the job may have
-- been claimed again since); no row: not recorded.
SELECT a.run_id, a.job_index, a.generation, a.runtime_id, a.claimed_by, a.claimed_at,
       a.lease_seconds, a.ended_at, a.outcome, a.failure_reason, a.lease_until, a.refusals,
       run_traceparent_v1(a.run_id) AS traceparent
FROM job_attempts a
WHERE a.run_id = $1 AND a.job_index = $2
  AND (a.generation = $3 OR ($3::bigint IS NULL AND a.outcome = 'lapsed'))
ORDER BY a.generation DESC
LIMIT 1;
