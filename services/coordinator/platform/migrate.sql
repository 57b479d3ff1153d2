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
SELECT version, name FROM schema_migrations ORDER BY version;

-- name: migration_record
INSERT INTO schema_migrations (version, name) VALUES ($1, $2);

-- name: migration_coordinators
-- Connections of coordinators whose code knows migrations only below $1 (their
-- application_name, services/coordinator/migrate.py application_name()).
SELECT pid, coalesce(host(client_addr), 'local') AS address, knows
FROM (SELECT pid, client_addr,
             substring(application_name FROM '^workshop-coordinator schema=(\d+)$')::integer
                 AS knows
      FROM pg_stat_activity
      WHERE datname = current_database()) coordinators
WHERE knows < $1
ORDER BY pid;
