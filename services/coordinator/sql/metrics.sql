-- Statements read at scrape time by the metrics endpoint (docs/metrics.md).

-- name: jobs_by_state
-- Unfinished jobs by runtime and state; each state is counted from its partial index
-- (jobs_claimable, jobs_leased), so a scrape costs the same however many jobs have ended.
SELECT runtime_id, 'queued' AS state, count(*) AS jobs FROM jobs
WHERE state = 'queued' GROUP BY runtime_id
UNION ALL
SELECT runtime_id, 'leased' AS state, count(*) AS jobs FROM jobs
WHERE state = 'leased' GROUP BY runtime_id
ORDER BY runtime_id, state;
