"""Migrations (release 0.1's baseline and the rules for later ones) and the immutable
snapshot, on real Postgres."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import asyncpg
import pytest

from services.coordinator.platform.db import Database
from services.coordinator.platform.migrate import (
    ForeignHistory,
    MigrationRefused,
    apply_migrations,
    check_pre_migrations,
    migrate,
)
from services.coordinator.platform.versions import (
    MIGRATIONS_DIR,
    application_name,
    list_migrations,
)
from testbed.harness.postgres import PostgresCluster
from tests.processor_gates import until

# A device, a runtime and run1 on it, as rows (no API): what the schema tests build on.
A_RUN = """
INSERT INTO devices VALUES ('d', '', now());
INSERT INTO runtimes VALUES ('r', 'd', 'e', 'c', '{}', now(), NULL);
INSERT INTO runs (run_id, kind, mode, workflow_id, workflow_revision, runtime_id,
                  image_limit, fingerprint, created_by, policy_revision, created_at,
                  code_sha256)
    VALUES ('run1', 'workflow', 'full', 'w', 1, 'r', 0, 'f', '{}', 1, now(), 'c');
"""


async def _fresh_database(cluster: PostgresCluster, name: str) -> str:
    admin = await asyncpg.connect(cluster.admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return cluster.dsn(name)


def _dump(cluster: PostgresCluster, database: str) -> str:
    result = subprocess.run(
        [
            str(cluster.bin_dir / "pg_dump"),
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            "--exclude-table=schema_migrations",
            cluster.dsn(database),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    # Drop comments, blank lines and the per-dump \restrict keys: they differ every time.
    return "\n".join(
        line
        for line in result.stdout.splitlines()
        if line.strip() and not line.startswith(("--", "\\restrict", "\\unrestrict"))
    )


async def test_a_new_database_takes_the_baseline_one_room_after_another(
    pg_cluster: PostgresCluster,
) -> None:
    dsn = await _fresh_database(pg_cluster, "schema_from_migrations")
    migrations = list_migrations()
    assert migrations[0].label == "0001_release_0_1"
    assert [path.name for path in migrations[0].files()] == [
        "1_platform.sql",
        "2_identity.sql",
        "3_resources.sql",
        "4_workflows.sql",
        "5_runs.sql",
        "6_review.sql",
        "7_leases.sql",
        "8_previews.sql",
    ]
    assert await apply_migrations(dsn) == [m.label for m in migrations]
    assert await apply_migrations(dsn) == []


async def test_a_database_made_before_release_0_1_is_refused(
    pg_cluster: PostgresCluster,
) -> None:
    """A pre-release database recorded migrations 0001_initial ... 0024: neither migrate
    nor a starting coordinator takes it for release 0.1's baseline, and nothing is
    applied."""
    dsn = await _fresh_database(pg_cluster, "schema_pre_release")
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now());"
            "INSERT INTO schema_migrations (version, name) VALUES (1, 'initial'), (2, 'execution')"
        )
        with pytest.raises(ForeignHistory, match=r"migration 0001_initial where this version"):
            await migrate(dsn, "post")
        with pytest.raises(ForeignHistory, match=r"before release 0\.1"):
            await check_pre_migrations(connection)
        assert await connection.fetchval("SELECT count(*) FROM schema_migrations") == 2
        assert await connection.fetchval("SELECT to_regclass('jobs') IS NULL")
    finally:
        await connection.close()


async def test_migrate_is_idempotent_and_safe_concurrently(pg_cluster: PostgresCluster) -> None:
    dsn = await _fresh_database(pg_cluster, "schema_concurrent")
    results = await asyncio.gather(*(apply_migrations(dsn) for _ in range(4)))
    # exactly one replica applied each migration; the others found nothing to do
    applied = [name for names in results for name in names]
    assert sorted(applied) == sorted(f"{m.version:04d}_{m.name}" for m in list_migrations())
    assert await apply_migrations(dsn) == []


def test_migration_files_are_numbered(tmp_path: Path) -> None:
    assert list_migrations(MIGRATIONS_DIR)
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0001_b.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="used twice"):
        list_migrations(tmp_path)
    (tmp_path / "0001_b.sql").unlink()
    (tmp_path / "2-bad.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match=r"NNNN_name\.sql"):
        list_migrations(tmp_path)
    (tmp_path / "2-bad.sql").unlink()
    (tmp_path / "0002_folder").mkdir()
    with pytest.raises(ValueError, match=r"0002_folder: a migration folder holds \.sql files"):
        list_migrations(tmp_path)
    (tmp_path / "0002_folder" / "2_second.sql").write_text("-- phase: post\nSELECT 2;")
    (tmp_path / "0002_folder" / "1_first.sql").write_text("-- first\nSELECT 1;")
    folder = list_migrations(tmp_path)[1]
    assert (folder.label, folder.phase) == ("0002_folder", "pre")  # its first file says
    assert folder.sql() == "-- first\nSELECT 1;\n-- phase: post\nSELECT 2;"


def test_a_migration_is_pre_unless_it_says_post(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("-- adds\nSELECT 1;")
    (tmp_path / "0002_b.sql").write_text("-- phase: post\n-- drops\nSELECT 1;")
    (tmp_path / "0003_c.sql").write_text("-- phase: pre\nSELECT 1;\n-- phase: post\n")
    assert [m.phase for m in list_migrations(tmp_path)] == ["pre", "post", "pre"]
    (tmp_path / "0004_d.sql").write_text("-- phase: later\nSELECT 1;")
    with pytest.raises(ValueError, match=r"0004_d\.sql: at most one '-- phase: pre\|post'"):
        list_migrations(tmp_path)
    (tmp_path / "0004_d.sql").write_text("-- phase: post\n-- phase: post\nSELECT 1;")
    with pytest.raises(ValueError, match=r"0004_d\.sql"):
        list_migrations(tmp_path)


async def test_phase_pre_leaves_post_migrations_pending(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    """The pre phase applies pre-migrations past a pending post-migration (another
    change's) and says what it left; the post phase applies the rest in number order."""
    dsn = await _fresh_database(pg_cluster, "schema_phases")
    (tmp_path / "0001_old.sql").write_text("CREATE FUNCTION f() RETURNS int RETURN 1;")
    (tmp_path / "0002_new.sql").write_text("CREATE FUNCTION f_v2() RETURNS int RETURN 2;")
    (tmp_path / "0003_drop_old.sql").write_text("-- phase: post\nDROP FUNCTION f();")
    (tmp_path / "0004_more.sql").write_text("CREATE TABLE t (a int);")
    before = await migrate(dsn, "pre", tmp_path)
    assert (before.applied, before.pending) == (
        ["0001_old", "0002_new", "0004_more"],
        ["0003_drop_old"],
    )
    again = await migrate(dsn, "pre", tmp_path)
    assert (again.applied, again.pending) == ([], ["0003_drop_old"])
    connection = await asyncpg.connect(dsn)
    try:
        assert await connection.fetchval("SELECT f() + f_v2()") == 3  # both serve
        after = await migrate(dsn, "post", tmp_path)
        assert (after.applied, after.pending) == (["0003_drop_old"], [])
        with pytest.raises(asyncpg.UndefinedFunctionError):
            await connection.fetchval("SELECT f()")
        assert await connection.fetchval("SELECT f_v2()") == 2
        recorded = await connection.fetch("SELECT version FROM schema_migrations ORDER BY 1")
        assert [row["version"] for row in recorded] == [1, 2, 3, 4]
    finally:
        await connection.close()
    assert (await migrate(dsn, "post", tmp_path)).applied == []


async def test_phase_post_waits_while_an_older_coordinator_is_connected(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    """A coordinator names its connections after the newest migration its code knows; the
    post phase refuses while one that predates a pending post-migration is connected, and
    goes ahead once it has left."""
    dsn = await _fresh_database(pg_cluster, "schema_post_waits")
    (tmp_path / "0001_old.sql").write_text("CREATE FUNCTION f() RETURNS int RETURN 1;")
    (tmp_path / "0002_drop_old.sql").write_text("-- phase: post\nDROP FUNCTION f();")
    await migrate(dsn, "pre", tmp_path)

    def named(version: int) -> dict[str, str]:
        return {"application_name": f"workshop-coordinator schema={version:04d}"}

    older = await asyncpg.connect(dsn, server_settings=named(1))  # knows 0001 only
    current = await asyncpg.connect(dsn, server_settings=named(2))
    try:
        pid = older.get_server_pid()
        with pytest.raises(MigrationRefused, match=rf"pid {pid} \(\S+, migrations up to 0001\)"):
            await migrate(dsn, "post", tmp_path, wait_seconds=0)
        assert (await migrate(dsn, "pre", tmp_path)).pending == ["0002_drop_old"]
        assert await older.fetchval("SELECT f()") == 1
        waiting = asyncio.create_task(migrate(dsn, "post", tmp_path, wait_seconds=30))
        await until(lambda: current.fetchval(MIGRATOR_HOLDS_ITS_LOCK), "migrate waiting")
        assert not waiting.done()
        await older.close()  # its rollout finished
        assert (await waiting).applied == ["0002_drop_old"]
    finally:
        await older.close()
        await current.close()


# Another session of this database holds an advisory lock: `migrate`'s, taken before it
# reads what is applied and released only when it ends.
MIGRATOR_HOLDS_ITS_LOCK = (
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND pid <> pg_backend_pid()"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
)


async def test_a_coordinator_names_its_connections_and_runs_them_without_jit(
    pg_dsn: str,
) -> None:
    """Its connections are named after the newest migration its code knows, and run
    without JIT (platform.db.POOL_SETTINGS), also after a session's full reset (RESET ALL
    goes back to what the connection started with)."""
    newest = list_migrations()[-1].version
    assert application_name() == f"workshop-coordinator schema={newest:04d}"
    async with Database.open(pg_dsn, size=1) as db:
        async with db.session() as connection:
            assert await connection.fetchval("SHOW application_name") == application_name()
            assert await connection.fetchval("SHOW jit") == "off"
            await connection.execute("SET jit = on")
        async with db.connection() as connection:
            assert await connection.fetchval("SHOW jit") == "off"


SNAPSHOT_ATTACKS = [
    "UPDATE run_snapshots SET snapshot = '{}'",
    "DELETE FROM run_snapshots",
    "TRUNCATE run_snapshots CASCADE",
    "UPDATE snapshot_recordings SET generation = generation + 1",
    "DELETE FROM snapshot_recordings",
    "TRUNCATE snapshot_recordings CASCADE",
    "DELETE FROM runs",
]


@pytest.mark.parametrize("statement", SNAPSHOT_ATTACKS)
async def test_snapshot_refuses_every_change(pg_dsn: str, statement: str) -> None:
    connection = await asyncpg.connect(pg_dsn)
    try:
        await connection.execute(
            A_RUN
            + """
            INSERT INTO run_snapshots VALUES ('run1', '{"a": 1}');
            INSERT INTO snapshot_recordings VALUES
                ('run1', 0, 'rec', 'cam', 1, 's', 1, 'k', now(), now(), 30, 1);
            """
        )
        with pytest.raises(asyncpg.PostgresError) as caught:
            await connection.execute(statement)
        assert isinstance(
            caught.value, asyncpg.RestrictViolationError | asyncpg.ForeignKeyViolationError
        )
        assert await connection.fetchval("SELECT snapshot FROM run_snapshots") == '{"a": 1}'
        assert await connection.fetchval("SELECT generation FROM snapshot_recordings") == 1
    finally:
        await connection.close()
