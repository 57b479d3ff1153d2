"""The Postgres harness against the real server: isolation, clone time, restarts."""

from __future__ import annotations

import asyncpg  # type: ignore[import-untyped,unused-ignore]
import pytest

from testbed.harness.postgres import (
    TIMINGS,
    PostgresCluster,
    PostgresDatabase,
    StopMode,
)

_SEEN_DATABASES: set[str] = set()


@pytest.mark.parametrize("turn", [1, 2])
async def test_each_test_gets_its_own_database(pg_database: PostgresDatabase, turn: int) -> None:
    # Both turns expect a clean slate and then dirty it: whichever runs second
    # would fail if the first one's table leaked into its database.
    assert pg_database.name not in _SEEN_DATABASES
    _SEEN_DATABASES.add(pg_database.name)
    connection = await asyncpg.connect(pg_database.dsn)
    try:
        assert await connection.fetchval("SELECT current_database()") == pg_database.name
        assert await connection.fetchval("SELECT to_regclass('harness_marker')") is None
        await connection.execute("CREATE TABLE harness_marker (turn int NOT NULL)")
        await connection.execute("INSERT INTO harness_marker VALUES ($1)", turn)
        assert await connection.fetchval("SELECT count(*) FROM harness_marker") == 1
    finally:
        await connection.close()


def test_clone_from_template_is_fast(pg_database: PostgresDatabase) -> None:
    # No timer assertion (shared CI machines are noisy); the figures go to the log.
    print(
        f"cluster initdb {TIMINGS.initdb_s:.2f} s, start {TIMINGS.start_s:.2f} s, "
        f"template {TIMINGS.template_s * 1000:.0f} ms, clone {pg_database.clone_s * 1000:.1f} ms"
    )
    assert pg_database.clone_s > 0


@pytest.mark.parametrize(
    ("mode", "synchronous_commit"),
    [
        pytest.param("fast", "off", id="clean-restart"),
        # A crash: only commits that reached the WAL survive, so this one waits for it.
        pytest.param("immediate", "on", id="crash-restart"),
    ],
)
async def test_restart_keeps_committed_rows(
    pg_database: PostgresDatabase, mode: StopMode, synchronous_commit: str
) -> None:
    cluster: PostgresCluster = pg_database.cluster
    connection = await asyncpg.connect(pg_database.dsn)
    try:
        await connection.execute("CREATE TABLE harness_kept (id int PRIMARY KEY)")
        async with connection.transaction():
            await connection.execute(f"SET LOCAL synchronous_commit = {synchronous_commit}")
            await connection.execute("INSERT INTO harness_kept SELECT generate_series(1, 100)")
    finally:
        await connection.close()

    elapsed = cluster.restart(mode)
    print(f"{mode} restart took {elapsed:.2f} s")

    connection = await asyncpg.connect(pg_database.dsn)
    try:
        assert await connection.fetchval("SELECT count(*) FROM harness_kept") == 100
    finally:
        await connection.close()
