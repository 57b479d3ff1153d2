"""The leases room (docs/leases-and-fences.md): the processor's side of jobs.

Owns claim, heartbeat, progress, complete, fail and release, every write under its lease
and the four fences (`jobs.JobsApi`, `Lease`, `check_lease` for the previews room), the
result checks (`results`, pure), maintenance (rescue lapsed leases, expire jobs; it also
asks identity to forget old failed logins and review to group its backlog), the jobs
gauges (`gauges`), and their SQL (`jobs.sql`, `metrics.sql`). It calls identity, runs'
snapshots and review (grouping committed items inside the committing transaction)
(docs/architecture.md).
"""
