"""Schema migrations on a real Postgres: versioned, idempotent, safe to run concurrently."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.dialects import postgresql

from durable_agent.errors import ConfigurationError
from durable_agent.journal import Database, migrate, require_current
from durable_agent.journal.migrations import available, current_version, latest_version
from durable_agent.journal.schema import metadata


@pytest.fixture
def empty_db(empty_database_url: str) -> Iterator[Database]:
    database = Database(empty_database_url)
    yield database
    database.close()


def _versions(db: Database) -> list[tuple[int, str]]:
    rows = db.execute(text("SELECT version, name FROM schema_version ORDER BY version")).all()
    return [(row.version, row.name) for row in rows]


def test_migrate_on_empty_database_applies_0001_and_records_it(empty_db: Database) -> None:
    """The first migrate applies every shipped file, starting with 0001, and records each."""
    assert current_version(empty_db) is None

    applied = migrate(empty_db)

    assert [m.version for m in applied] == [m.version for m in available()]
    assert applied[0].version == 1
    assert applied[0].name == "0001_initial.sql"
    assert _versions(empty_db) == [(m.version, m.name) for m in available()]
    assert current_version(empty_db) == latest_version()
    tables = set(inspect(empty_db.engine).get_table_names())
    assert {"turns", "journal", "blobs", "schema_version"} <= tables
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

    db = Database(empty_database_url)
    try:
        rows = db.execute(
            text("SELECT version, count(*) AS n FROM schema_version GROUP BY version")
        ).all()
        assert sorted((r.version, r.n) for r in rows) == [(m.version, 1) for m in available()]
    finally:
        db.close()


def test_migrated_schema_agrees_with_sqlalchemy_metadata(empty_db: Database) -> None:
    """Columns, types, nullability and primary keys of the SQL files match schema.py."""
    migrate(empty_db)
    inspector = inspect(empty_db.engine)
    dialect = postgresql.dialect()
    assert set(inspector.get_table_names()) - {"schema_version"} == set(metadata.tables)

    for name in ("turns", "journal", "blobs"):
        table = metadata.tables[name]
        reflected = {column["name"]: column for column in inspector.get_columns(name)}
        assert list(reflected) == [c.name for c in table.columns], name
        for column in table.columns:
            found = reflected[column.name]
            where = f"{name}.{column.name}"
            assert found["nullable"] == column.nullable, where
            assert found["type"].compile(dialect=dialect) == column.type.compile(dialect=dialect), (
                where
            )
        primary_key = inspector.get_pk_constraint(name)["constrained_columns"]
        assert primary_key == [c.name for c in table.primary_key.columns], name

    journal_fks = {
        (tuple(fk["constrained_columns"]), fk["referred_table"])
        for fk in inspector.get_foreign_keys("journal")
    }
    assert journal_fks == {(("turn_id",), "turns"), (("output_blob",), "blobs")}
    uniques = [tuple(u["column_names"]) for u in inspector.get_unique_constraints("turns")]
    assert ("session_id", "seq") in uniques


def test_require_current_on_empty_database_says_to_migrate(empty_db: Database) -> None:
    """An unmigrated database is a configuration error that names the command to run."""
    with pytest.raises(ConfigurationError, match=r"run `durable-agent migrate`"):
        require_current(empty_db)
