-- Statements read at scrape time by the metrics endpoint (docs/metrics.md).

-- name: jobs_by_state
-- Unfinished jobs by runtime and state, and (state 'claimable') the queued jobs a Claim
-- for the runtime could take now: its photo jobs and the queued jobs of its head run, one
-- run at a time per runtime as job_claim picks them; (state 'runs') the runs with
-- unfinished jobs. Each part reads the partial indexes of unfinished jobs, so a scrape
-- costs the same however many jobs have ended. Claimable counts neither a key's camera
-- restriction nor sources that expired since the last maintenance pass.
WITH heads AS (
    SELECT runtime_id, min(run_seq) AS head FROM jobs
    WHERE state IN ('queued', 'leased') AND NOT is_photo
    GROUP BY runtime_id
)
SELECT runtime_id, 'queued' AS state, count(*) AS jobs FROM jobs
WHERE state = 'queued' GROUP BY runtime_id
UNION ALL
SELECT runtime_id, 'leased' AS state, count(*) AS jobs FROM jobs
WHERE state = 'leased' GROUP BY runtime_id
UNION ALL
SELECT j.runtime_id, 'claimable' AS state, count(*) AS jobs
FROM jobs j LEFT JOIN heads h ON h.runtime_id = j.runtime_id
WHERE j.state = 'queued' AND (j.is_photo OR j.run_seq = h.head)
GROUP BY j.runtime_id
UNION ALL
SELECT runtime_id, 'runs' AS state, count(DISTINCT run_seq) AS jobs FROM jobs
WHERE state IN ('queued', 'leased') GROUP BY runtime_id
ORDER BY runtime_id, state;
