-- Workshop coordinator: a Claim may wait for a job (a long poll).
--
-- A job becomes claimable when it is queued (a run or photo creates it, a Release or
-- the rescue of a lapsed lease queues it again) and when the job ahead of it ends:
-- job_claim leases from a runtime's oldest run with unfinished jobs, so the end of
-- that run's last job (Complete, Fail, a cancel, an exhausted or expired job) makes
-- the next run's jobs claimable. This trigger announces every such change, a job
-- entering any state but `leased`, on the channel `workshop_jobs` with the job's
-- runtime id, in the same transaction, so a coordinator holding waiting Claims of
-- that runtime tries them again when there may be something to lease. Postgres folds
-- identical notifications of one transaction, so a run of thousands of jobs sends one
-- per runtime.
CREATE FUNCTION jobs_announce_claimable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('workshop_jobs', NEW.runtime_id);
    RETURN NULL;
END;
$$;
CREATE TRIGGER jobs_claimable_announced
    AFTER INSERT OR UPDATE OF state ON jobs
    FOR EACH ROW WHEN (NEW.state <> 'leased')
    EXECUTE FUNCTION jobs_announce_claimable();
