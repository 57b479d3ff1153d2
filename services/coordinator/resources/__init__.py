"""The resources room: what runs are made of (docs/concepts.md).

Owns devices, runtimes, cameras, recordings (with their retention), model versions and
buckets: their rows and the `Resources` service (`registry`), and their SQL
(`resources.sql`). It calls identity (who may register or list what) and the platform;
it also answers identity's `GrantTargets` check (`check_grant_targets`: do a key's
devices and cameras exist). Workflows and runs read its rows (docs/architecture.md).
"""
