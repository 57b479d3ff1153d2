-- Statements of `coordinator migrate` (services/coordinator/migrate.py).

-- name: migration_lock
-- One migrator at a time across replicas; released when the session ends.
SELECT pg_advisory_lock(hashtext('workshop.coordinator.migrate'));

-- name: migration_unlock
SELECT pg_advisory_unlock(hashtext('workshop.coordinator.migrate'));

-- name: migration_table_create
CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_list_applied
SELECT version FROM schema_migrations ORDER BY version;

-- name: migration_record
INSERT INTO schema_migrations (version, name) VALUES ($1, $2);
