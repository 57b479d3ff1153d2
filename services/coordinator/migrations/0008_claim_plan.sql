-- The Claim planned once per backend (docs/upgrading.md, 0008). Pre-migration: the same
-- answers for every caller, release 0.1's included.
--
-- job_claim_many_v1 ran its statements with a custom plan for each call's values for a
-- backend's first five calls (docs/scaling.md: about 4 ms a Claim in
-- bench.processor_throughput's profile, most of it planning, where a full run claims a
-- few times per job over the pool), as 0004 found for the per-frame functions.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: leases

ALTER FUNCTION job_claim_many_v1(
    text, text, text[], timestamptz, interval, text, integer
) SET plan_cache_mode = force_generic_plan;
