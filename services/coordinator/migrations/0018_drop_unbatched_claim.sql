-- phase: post
-- The single-job `job_claim` and the 8-argument `job_progress` (a report that renews
-- for 5 minutes) that 0016 kept for coordinators of the version before it. The code of
-- 0016 on calls job_claim_many and the 9-argument job_progress only.
DROP FUNCTION job_claim(text, text, text[], timestamptz, interval, text);
DROP FUNCTION job_progress(text, integer, bigint, uuid, text, integer, text, timestamptz);
