-- A run's timeline (issue 38; docs/runs-and-jobs.md, "A run's timeline"; docs/upgrading.md,
-- 0011): each job's attempts, one row per lease a claim took, and the trace context of the
-- CreateRun that made a run.
--
-- Pre-migration: two tables, a trigger on jobs and new functions, and the body of
-- workshop_fence_v1 replaced (same answers for every caller; it also counts a refusal on the
-- refused lease's attempt). The trigger records what every coordinator writes, this
-- version's and the one before's: a claim (a new lease generation) inserts the attempt, the
-- end of a lease (completed, failed, lapsed, handed back, cancelled, expired) closes it. One
-- row per attempt, written by the claim and by the lease's end: heartbeats, progress and
-- frames write nothing here. A coordinator of the release before never reads the tables.
-- Attempts that began before this migration are not recorded. Nothing to post-migrate.
--
-- Sections are marked `-- room: <room>` (tests/unit/test_coordinator_sql_ownership.py).

-- room: runs

-- The trace context (W3C traceparent) of the CreateRun or RequestPhoto that made a run,
-- when tracing was on: each job attempt's trace links to it (docs/metrics.md#traces).
CREATE TABLE run_traces (
    run_id      text PRIMARY KEY REFERENCES runs (run_id),
    traceparent text NOT NULL
);

-- A run's creation trace context (NULL: none recorded).
-- public: leases (job_attempt_of, timeline_page: the attempts' trace links)
CREATE FUNCTION run_traceparent_v1(p_run text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT t.traceparent FROM run_traces t WHERE t.run_id = p_run
$$;

-- room: leases

-- One row per lease of a job (its generation): who claimed it, when, for how long, how it
-- ended, and the fence refusals calls under it met. ended_at NULL: the lease is held.
-- outcome: completed, failed (processor_failed, or a fence ended the job: failure_reason),
-- lapsed (maintenance took it back: the job queued again, or failed with
-- attempts_exhausted), handed_back (Release), cancelled, expired.
-- lease_seconds: the lease's length at the claim (capped by the job's expiry);
-- lease_until: when the lease would have lapsed when it ended (a lapse: when it lapsed).
CREATE TABLE job_attempts (
    run_id         text NOT NULL,
    job_index      integer NOT NULL,
    generation     bigint NOT NULL,
    runtime_id     text NOT NULL,
    claimed_by     text,
    claimed_at     timestamptz NOT NULL,
    lease_seconds  double precision NOT NULL,
    ended_at       timestamptz,
    outcome        text CHECK (outcome IN ('completed', 'failed', 'lapsed', 'handed_back',
                                           'cancelled', 'expired')),
    failure_reason text,
    lease_until    timestamptz,
    refusals       jsonb NOT NULL DEFAULT '{}',
    -- no foreign key to jobs (jobs are never deleted): its check would lock the job's row
    -- once more in every claim
    PRIMARY KEY (run_id, job_index, generation)
);

-- Records attempts from jobs' own writes: a claim takes a new generation (an attempt
-- begins); a leased job that leaves `leased` ends its attempt. Fires only on those
-- updates (the trigger's WHEN), not on renewals, progress or previews.
CREATE FUNCTION job_attempts_track_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.generation <> OLD.generation THEN
        INSERT INTO job_attempts (run_id, job_index, generation, runtime_id, claimed_by,
                                  claimed_at, lease_seconds)
        VALUES (NEW.run_id, NEW.job_index, NEW.generation, NEW.runtime_id, NEW.claimed_by,
                NEW.updated_at,
                coalesce(extract(epoch FROM NEW.lease_expires_at - NEW.updated_at), 0));
    ELSE
        UPDATE job_attempts a
        SET ended_at = NEW.updated_at,
            lease_until = OLD.lease_expires_at,
            failure_reason = CASE WHEN NEW.state = 'failed' THEN NEW.failure_reason END,
            outcome = CASE
                WHEN NEW.lapses > OLD.lapses THEN 'lapsed'
                WHEN NEW.state = 'queued' THEN 'handed_back'
                ELSE NEW.state END
        WHERE a.run_id = NEW.run_id AND a.job_index = NEW.job_index
          AND a.generation = OLD.generation;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER job_attempts_tracked
    AFTER UPDATE OF state, generation ON jobs
    FOR EACH ROW
    WHEN (NEW.generation <> OLD.generation
          OR (OLD.state = 'leased' AND NEW.state <> 'leased'))
    EXECUTE FUNCTION job_attempts_track_v1();

-- Counts a fence's refusal on the attempt of the refused lease (no row: a generation
-- never leased, or an attempt before 0011). The caller holds the job's row lock.
CREATE FUNCTION job_attempt_refused_v1(
    p_run text, p_job integer, p_generation bigint, p_reason text
) RETURNS void LANGUAGE sql AS $$
    UPDATE job_attempts a
    SET refusals = a.refusals
        || jsonb_build_object(p_reason, coalesce((a.refusals ->> p_reason)::integer, 0) + 1)
    WHERE a.run_id = p_run AND a.job_index = p_job AND a.generation = p_generation
$$;

-- Release 0.1's workshop_fence_v1 (7_leases.sql), with each refusal counted on its
-- attempt: the same answers and the same permanent ends for every caller.
CREATE OR REPLACE FUNCTION workshop_fence_v1(
    p_run text, p_job integer, p_generation bigint, p_token uuid, p_reporter text,
    p_code text, p_now timestamptz
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    refused text := workshop_fence_reason_v1(p_run, p_job, p_generation, p_token, p_reporter,
                                          p_code, p_now);
    j jobs%ROWTYPE;
BEGIN
    IF refused NOT IN ('', 'NOT_FOUND') THEN
        PERFORM job_attempt_refused_v1(p_run, p_job, p_generation, refused);
    END IF;
    IF refused IN ('SOURCE_CHANGED', 'POLICY_CHANGED', 'AUTHORITY_REVOKED') THEN
        SELECT * INTO j FROM jobs WHERE run_id = p_run AND job_index = p_job;
        PERFORM job_end_unfenced_v1(j, p_now);
    END IF;
    RETURN refused;
END;
$$;
