-- Leases, progress and results (docs/leases-and-fences.md). The work is done by the functions
-- of migrations 0002-0015, so each call is one round trip with its fences
-- folded in.

-- name: runtime_identity
SELECT runtime_id, device_id, code_sha256 FROM runtime_identity($1);

-- name: job_claim
-- $6: the Claim's request id (NULL: none); the same one again answers its held leases.
-- $7: how many jobs to lease at most (migration 0015); one row per job, in claim order.
SELECT (c.job).*, c.recording_sha256 AS sha256, c.recording_byte_size AS byte_size,
       c.recording_object_key AS object_key, c.recording_start_at AS start_at,
       c.recording_end_at AS end_at, c.recording_fps AS fps
FROM job_claim_many($1, $2, $3, $4, $5, $6, $7) c;

-- name: job_heartbeat
SELECT * FROM job_heartbeat($1, $2, $3, $4, $5, $6, $7);

-- name: job_heartbeat_many
-- One row per lease of the arrays, by its 1-based ordinal.
SELECT * FROM job_heartbeat_many($1, $2, $3, $4, $5, $6, $7) ORDER BY ordinal;

-- name: job_progress
-- $9: the lease interval: a progress report renews its lease (migration 0015).
SELECT * FROM job_progress($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: job_fail
SELECT job_fail($1, $2, $3, $4, $5, $6, $7);

-- name: job_release
SELECT job_release($1, $2, $3, $4, $5, $6);

-- name: job_facts
-- What Complete checks a result against, and the receipt if the job was committed
-- (when the facts are not cached from this process's Claim, or a result is invalid).
SELECT j.slot_count, j.first_slot_at, j.interval_ms, j.state, r.mode,
       rc.generation AS receipt_generation, rc.result_sha256 AS receipt_sha256,
       rc.committed_at AS receipt_committed_at, rc.items_saved AS receipt_items_saved
FROM jobs j
CROSS JOIN LATERAL run_facts(j.run_id) r
LEFT JOIN receipts rc ON rc.run_id = j.run_id AND rc.job_index = j.job_index
WHERE j.run_id = $1 AND j.job_index = $2;

-- name: job_complete
SELECT * FROM job_complete($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                           $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26);

-- name: job_check_lease
SELECT workshop_fence($1, $2, $3, $4, $5, $6, $7) AS reason;

-- name: job_lease_facts
SELECT j.lease_expires_at, j.camera_id, j.slot_count, r.mode, r.kind
FROM jobs j CROSS JOIN LATERAL run_facts(j.run_id) r
WHERE j.run_id = $1 AND j.job_index = $2;

-- name: maintenance_try_lock
SELECT pg_try_advisory_lock(hashtext('workshop.coordinator.maintenance'));

-- name: maintenance_unlock
SELECT pg_advisory_unlock(hashtext('workshop.coordinator.maintenance'));

-- name: jobs_rescue_lapsed
SELECT * FROM jobs_rescue_lapsed($1, $2, $3);

-- name: jobs_expire
SELECT * FROM jobs_expire($1, $2);
