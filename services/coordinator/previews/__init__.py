"""The previews room (docs/previews-and-uploads.md): what the preview service records.

Owns staged uploads, preview records, the bookkeeping of the preview service's sweeps and
deletions, and read grants for images (`publication.PublicationApi` and its rows), and
their SQL (`previews.sql`). It calls identity, runs' snapshots and the leases' surface
(`leases.jobs.check_lease`, `Lease`, `raise_for`): every write is checked against the job's
lease and fences (docs/architecture.md).
"""
