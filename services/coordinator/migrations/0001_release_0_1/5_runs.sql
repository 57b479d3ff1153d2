-- Release 0.1, room runs: its tables, indexes, triggers and functions.

-- Runs are never deleted: the row is the tombstone that keeps an id from reuse.
-- `seq` orders runs for "older run first" scheduling.
CREATE TABLE runs (
    run_id            text PRIMARY KEY,
    seq               bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    kind              text NOT NULL CHECK (kind IN ('workflow', 'photo')),
    mode              text NOT NULL CHECK (mode IN ('test', 'full')),
    workflow_id       text NOT NULL,
    workflow_revision bigint NOT NULL,
    runtime_id        text NOT NULL REFERENCES runtimes (runtime_id),
    image_limit       integer NOT NULL CHECK (image_limit >= 0),
    fingerprint       text NOT NULL,
    created_by        jsonb NOT NULL,
    policy_revision   bigint NOT NULL,
    created_at        timestamptz NOT NULL,
    expires_at        timestamptz,
    code_sha256       text NOT NULL
);

CREATE INDEX runs_by_workflow ON runs (workflow_id, seq DESC);

CREATE INDEX runs_by_runtime ON runs (runtime_id, seq);

-- The frozen run snapshot (docs/runs-and-jobs.md). Immutable: see the triggers below.
CREATE TABLE run_snapshots (
    run_id   text PRIMARY KEY REFERENCES runs (run_id),
    snapshot jsonb NOT NULL
);

-- The input recordings of a snapshot, one per job, with the generation and
-- digest they were admitted at. Immutable like the snapshot itself.
CREATE TABLE snapshot_recordings (
    run_id       text NOT NULL REFERENCES runs (run_id),
    job_index    integer NOT NULL,
    recording_id text NOT NULL,
    camera_id    text NOT NULL,
    generation   bigint NOT NULL,
    sha256       text NOT NULL,
    byte_size    bigint NOT NULL,
    object_key   text NOT NULL,
    start_at     timestamptz NOT NULL,
    end_at       timestamptz NOT NULL,
    fps          double precision NOT NULL,
    slot_count   integer NOT NULL,
    PRIMARY KEY (run_id, job_index)
);

CREATE FUNCTION refuse_snapshot_change_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run snapshots are immutable: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE TRIGGER run_snapshots_immutable
    BEFORE UPDATE OR DELETE ON run_snapshots
    FOR EACH ROW EXECUTE FUNCTION refuse_snapshot_change_v1();

CREATE TRIGGER run_snapshots_no_truncate
    BEFORE TRUNCATE ON run_snapshots
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_snapshot_change_v1();

CREATE TRIGGER snapshot_recordings_immutable
    BEFORE UPDATE OR DELETE ON snapshot_recordings
    FOR EACH ROW EXECUTE FUNCTION refuse_snapshot_change_v1();

CREATE TRIGGER snapshot_recordings_no_truncate
    BEFORE TRUNCATE ON snapshot_recordings
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_snapshot_change_v1();

-- The room's public SQL: what rooms above read of a run in their own statements and
-- functions (no other room names runs, run_snapshots or snapshot_recordings), and the
-- interfaces runs declares for what it needs of the rooms above it (its jobs are leases',
-- its items review's): each is implemented, with this signature, by the room it names
-- (CREATE OR REPLACE in that room's file), as a Python room is given a callable by
-- app.py. A stub here raises until then; the baseline applies every room's file in one
-- transaction, so no caller ever meets one.

-- A run's facts (no row: no such run). Single-SELECT STABLE SQL functions like this one
-- are inlined by the planner where a query uses them: the read is the join it replaced.
-- public: review (bucket_items_added, sighting_decide, review_run), leases (fences,
-- job_objects_abandon, job_facts, job_lease_facts, previews' functions), previews
-- (image_for_read)
CREATE FUNCTION run_facts_v1(p_run text)
RETURNS TABLE (run_id text, kind text, mode text, workflow_id text, runtime_id text,
               policy_revision bigint, created_by jsonb, code_sha256 text,
               expires_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT r.run_id, r.kind, r.mode, r.workflow_id, r.runtime_id, r.policy_revision,
           r.created_by, r.code_sha256, r.expires_at
    FROM runs r WHERE r.run_id = p_run
$$;

-- A run's snapshot (no row: no such run).
-- public: review (review_run)
CREATE FUNCTION run_snapshot_v1(p_run text) RETURNS TABLE (snapshot jsonb)
LANGUAGE sql STABLE AS $$
    SELECT s.snapshot FROM run_snapshots s WHERE s.run_id = p_run
$$;

-- The input recordings of a run's snapshot, one per job.
-- public: leases (job_claim_answer), review (review_recordings)
CREATE FUNCTION snapshot_recordings_of_v1(p_run text) RETURNS SETOF snapshot_recordings
LANGUAGE sql STABLE AS $$
    SELECT * FROM snapshot_recordings sr WHERE sr.run_id = p_run
$$;

-- A workflow's runs (photos are not workflow runs): how many, and the newest.
-- public: review (summary_workflows)
CREATE FUNCTION workflow_run_stats_v1(p_workflow text)
RETURNS TABLE (runs bigint, last_run_id text) LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM runs r WHERE r.workflow_id = p_workflow AND r.kind = 'workflow'),
           (SELECT r.run_id FROM runs r WHERE r.workflow_id = p_workflow AND r.kind = 'workflow'
            ORDER BY r.seq DESC LIMIT 1)
$$;

-- Queues a run's jobs (admission, in the transaction that inserts the run), one per
-- element of the arrays.
-- interface: implemented by leases
CREATE FUNCTION run_jobs_enqueue_v1(
    p_run text, p_seq bigint, p_runtime text, p_interval_ms integer, p_now timestamptz,
    p_job_indexes integer[], p_cameras text[], p_recordings text[], p_generations bigint[],
    p_first_slots timestamptz[], p_slot_counts integer[], p_expiries timestamptz[]
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run_jobs_enqueue is implemented by leases (7_leases.sql)';
END;
$$;

-- Queues a photo's one job (index 0, one slot).
-- interface: implemented by leases
CREATE FUNCTION photo_job_enqueue_v1(
    p_run text, p_seq bigint, p_runtime text, p_camera text, p_recording text,
    p_generation bigint, p_first_slot_at timestamptz, p_interval_ms integer,
    p_expires_at timestamptz, p_now timestamptz
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'photo_job_enqueue is implemented by leases (7_leases.sql)';
END;
$$;

-- A run's jobs as its detail shows them.
-- interface: implemented by leases
CREATE FUNCTION run_jobs_of_v1(p_run text)
RETURNS TABLE (run_id text, job_index integer, camera_id text, recording_id text,
               recording_generation bigint, first_slot_at timestamptz, state text,
               phase text, progress integer, slot_count integer, generation bigint,
               failure_reason text, failure_message text, decoder text,
               updated_at timestamptz, lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run_jobs_of is implemented by leases (7_leases.sql)';
END;
$$;

-- A run's queued and leased jobs (no row: the run has none unfinished).
-- interface: implemented by leases
CREATE FUNCTION run_unfinished_jobs_v1(p_run text) RETURNS TABLE (job_index integer)
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run_unfinished_jobs is implemented by leases (7_leases.sql)';
END;
$$;

-- How many jobs of every run are queued or leased (admission's capacity check).
-- interface: implemented by leases
CREATE FUNCTION jobs_unfinished_count_v1() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'jobs_unfinished_count is implemented by leases (7_leases.sql)';
END;
$$;

-- Cancels a run (docs/runs-and-jobs.md): queued and leased jobs become cancelled, so
-- writes under their leases are refused from now on; completed jobs keep their results.
-- Answers how many jobs it cancelled.
-- interface: implemented by leases
CREATE FUNCTION run_cancel_v1(p_run text, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run_cancel is implemented by leases (7_leases.sql)';
END;
$$;

-- The counts a run's status and detail are worked out from (docs/runs-and-jobs.md): its
-- jobs by state and slots expected, its receipts' slots and items, its previews. One row.
-- interface: implemented by leases
CREATE FUNCTION run_job_counts_v1(p_run text)
RETURNS TABLE (jobs_total bigint, jobs_queued bigint, jobs_leased bigint,
               jobs_completed bigint, jobs_failed bigint, jobs_cancelled bigint,
               jobs_expired bigint, slots_expected bigint, last_job_update timestamptz,
               slots_frame bigint, slots_empty bigint, slots_dropped bigint,
               items_saved bigint, previews_published bigint)
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run_job_counts is implemented by leases (7_leases.sql)';
END;
$$;

-- A run's published objects: its previews (kind 'preview'), and those that became a
-- committed item's upload (kind 'upload'), with their job's camera and recording.
-- interface: implemented by leases
-- public: review (review_previews_page), previews (image_for_read)
CREATE FUNCTION run_published_previews_v1(p_run text)
RETURNS TABLE (object_key text, kind text, item_id text, job_index integer,
               slot_index integer, camera_id text, recording_id text,
               recording_generation bigint, frame_time timestamptz, boxes jsonb,
               content_type text, sha256 text, published_at timestamptz,
               collectable_at timestamptz, deleted_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run_published_previews is implemented by leases (7_leases.sql)';
END;
$$;

-- A full run's bucket items as its recent images show them.
-- interface: implemented by review
CREATE FUNCTION run_recent_items_v1(p_run text)
RETURNS TABLE (item_id text, source text, job_index integer, slot_index integer,
               camera_id text, frame_time timestamptz, boxes jsonb, bucket_id text,
               published_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run_recent_items is implemented by review (6_review.sql)';
END;
$$;

-- A run with the counts its status and detail are worked out from (docs/runs-and-jobs.md).
-- public: review (runs_by_ids)
CREATE VIEW run_status AS
SELECT r.*, c.*
FROM runs r
CROSS JOIN LATERAL run_job_counts_v1(r.run_id) c;
