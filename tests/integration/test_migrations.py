"""Schema migrations on a real Postgres: versioned, idempotent, safe to run concurrently."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import psycopg
import pytest

from durable_agent.errors import ConfigurationError
from durable_agent.journal import Database, migrate, require_current
from durable_agent.journal.migrations import available, current_version, latest_version
from durable_agent.journal.queries import schema


@pytest.fixture
def empty_db(empty_database_url: str) -> Iterator[Database]:
    database = Database(empty_database_url)
    yield database
    database.close()


def _versions(db: Database) -> list[tuple[int, str]]:
    with psycopg.connect(db.conninfo) as conn:
        rows = conn.execute("SELECT version, name FROM schema_version ORDER BY version")
        return [(version, name) for version, name in rows]


def _tables(db: Database) -> set[str]:
    with psycopg.connect(db.conninfo) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {name for (name,) in rows}


def test_migrate_on_empty_database_applies_0001_and_records_it(empty_db: Database) -> None:
    """The first migrate applies every shipped file, starting with 0001, and records each."""
    assert current_version(empty_db) is None

    applied = migrate(empty_db)

    assert [m.version for m in applied] == [m.version for m in available()]
    assert applied[0].version == 1
    assert applied[0].name == "0001_initial.sql"
    assert _versions(empty_db) == [(m.version, m.name) for m in available()]
    assert current_version(empty_db) == latest_version()
    assert _tables(empty_db) == {
        "turns",
        "journal",
        "blobs",
        "schema_version",
        "cancellations",
        "approvals",
        "resolutions",
        "uncertain_notices",
        "waits",
        "events",
        "child_turns",
        "audit_log",
    }
    require_current(empty_db)  # does not raise


def test_second_migrate_applies_nothing(empty_db: Database) -> None:
    """Running migrate again finds every version recorded and changes nothing."""
    migrate(empty_db)
    before = _versions(empty_db)

    assert migrate(empty_db) == []
    assert _versions(empty_db) == before


def test_concurrent_cli_migrate_from_four_processes(empty_database_url: str) -> None:
    """Four `durable-agent migrate` processes at once all succeed; each version is recorded once."""
    env = {**os.environ, "DURABLE_AGENT_DATABASE_URL": empty_database_url}
    command = [sys.executable, "-m", "durable_agent", "migrate"]
    processes = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    results: list[tuple[int, str, str]] = []
    try:
        for process in processes:
            raw_out, raw_err = process.communicate(timeout=60)
            results.append((process.returncode, raw_out.decode(), raw_err.decode()))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    for code, out, err in results:
        assert code == 0, f"migrate exited {code}: {out}\n{err}"
        assert f"schema at version {latest_version()}" in out
    appliers = [out for _, out, _ in results if "applied 0001_initial.sql" in out]
    assert len(appliers) == 1, results

    with psycopg.connect(empty_database_url) as conn:
        rows = conn.execute("SELECT version, count(*) FROM schema_version GROUP BY version")
        assert sorted(rows) == [(m.version, 1) for m in available()]


_CATALOG = {
    "columns": """
        SELECT table_name, column_name, data_type, is_nullable, column_default
        FROM information_schema.columns WHERE table_schema = 'public'
        ORDER BY table_name, ordinal_position""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = 'public'::regnamespace
        ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
        ORDER BY 1, 2""",
    "functions": """
        SELECT proname, pg_get_functiondef(oid) FROM pg_proc
        WHERE pronamespace = 'public'::regnamespace ORDER BY 1""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger
        WHERE NOT tgisinternal ORDER BY 1, 2""",
}


def _catalog(url: str) -> dict[str, list[tuple[object, ...]]]:
    with psycopg.connect(url) as conn:
        return {part: conn.execute(sql).fetchall() for part, sql in _CATALOG.items()}


def test_migrations_build_exactly_schema_sql(
    empty_database_url: str, new_database: Callable[[], str]
) -> None:
    """Applying every migration gives the schema of sql/schema.sql: the same columns (types,
    nullability, defaults), constraints, indexes, functions and triggers."""
    migrated = Database(empty_database_url)
    migrate(migrated)
    migrated.close()
    declared_url = new_database()
    with psycopg.connect(declared_url, autocommit=True) as conn:
        conn.execute(schema().encode())

    declared = _catalog(declared_url)
    applied = _catalog(empty_database_url)
    for part in _CATALOG:
        assert applied[part] == declared[part], part
    tables = {row[0] for row in applied["columns"]}
    assert tables == {
        "turns",
        "journal",
        "blobs",
        "schema_version",
        "cancellations",
        "approvals",
        "resolutions",
        "uncertain_notices",
        "waits",
        "events",
        "child_turns",
        "audit_log",
    }


def test_require_current_on_empty_database_says_to_migrate(empty_db: Database) -> None:
    """An unmigrated database is a configuration error that names the command to run."""
    with pytest.raises(ConfigurationError, match=r"run `durable-agent migrate`"):
        require_current(empty_db)


def test_require_current_sees_a_gap_below_the_newest_version(empty_db: Database) -> None:
    """Versions need not be contiguous (branches add them in parallel): a database at the
    newest version that lacks an older one (merged later) is told to migrate."""
    migrate(empty_db)
    with psycopg.connect(empty_db.conninfo, autocommit=True) as conn:
        conn.execute("DELETE FROM schema_version WHERE version = 2")

    with pytest.raises(ConfigurationError, match=r"lacks schema version\(s\) 2: run `durable"):
        require_current(empty_db)
