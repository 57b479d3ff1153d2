-- Release 0.1, room previews: its tables, indexes, triggers and functions.

-- None: what the preview service writes (staged objects, a job's preview slot and its
-- sweep) are leases' rows, written under the job's lease and fences by leases' public
-- functions (object_stage, previews_record, preview_sweeps_claim, preview_sweep_settle,
-- objects_claim_collectable, ... in 7_leases.sql), which the publication room's statements
-- (previews/previews.sql) call: the commit that consumes staged uploads (job_complete)
-- and every end of a job that abandons them (job_objects_abandon) are leases'.
