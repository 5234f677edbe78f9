"""durable_agent.schema.metadata is the schema our migrations build, so it cannot drift.

Two checks against a database migrated by our migrations: Alembic's own comparison (what
autogenerate would propose for our tables: nothing), and Postgres' catalog of both, the
migrated database and an empty one our metadata was created in (every column with its type,
nullability, default and comment, every constraint and every index with its predicate).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from durable_agent.schema import TABLES, metadata

_COLUMNS = """
SELECT c.table_name, c.column_name, c.data_type, c.is_nullable, c.column_default,
       c.is_identity, c.identity_generation,
       col_description(format('%%I', c.table_name)::regclass, c.ordinal_position) AS comment
FROM information_schema.columns AS c
WHERE c.table_schema = 'public' AND c.table_name = ANY(%(tables)s)
ORDER BY c.table_name, c.column_name
"""
_CONSTRAINTS = """
SELECT conrelid::regclass::text AS table_name, conname, pg_get_constraintdef(oid) AS def
FROM pg_constraint
WHERE connamespace = 'public'::regnamespace AND conrelid::regclass::text = ANY(%(tables)s)
ORDER BY 1, 2
"""
_INDEXES = """
SELECT tablename, indexname, indexdef FROM pg_indexes
WHERE schemaname = 'public' AND tablename = ANY(%(tables)s)
ORDER BY 1, 2
"""


def _catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    tables = sorted(TABLES)
    with psycopg.connect(url) as conn:
        return {
            name: [tuple(row) for row in conn.execute(sql, {"tables": tables})]
            for name, sql in (
                ("columns", _COLUMNS),
                ("constraints", _CONSTRAINTS),
                ("indexes", _INDEXES),
            )
        }


def _engine_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def test_metadata_names_every_table_our_migrations_make(database_url: str) -> None:
    """A table a new migration adds must be added to the metadata too."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        assert {name for (name,) in rows} == TABLES


def test_alembic_sees_no_difference_from_a_migrated_database(database_url: str) -> None:
    """Alembic's comparison (autogenerate's) of the metadata with the migrated database."""
    engine = create_engine(_engine_url(database_url))
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "compare_server_default": True}
            )
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


def test_the_metadata_creates_exactly_the_migrated_tables(
    database_url: str, empty_database_url: str
) -> None:
    """Columns (type, nullability, default, identity, comment), constraints and indexes
    (with their predicates), as Postgres itself describes them."""
    engine = create_engine(_engine_url(empty_database_url))
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()
    migrated, created = _catalog(database_url), _catalog(empty_database_url)
    for part in ("columns", "constraints", "indexes"):
        assert created[part] == migrated[part], part


def test_a_changed_column_is_seen(database_url: str) -> None:
    """The comparison can fail: a column our migrations made nullable is reported."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE turns ALTER COLUMN reply SET NOT NULL")
    engine = create_engine(_engine_url(database_url))
    try:
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), metadata)
    finally:
        engine.dispose()
    assert [op[0][0] for op in diff if isinstance(op, list)] == ["modify_nullable"]


@pytest.mark.parametrize(
    ("obj_type", "name", "included"),
    [("table", "turns", False), ("table", "orders", True), ("table", "schema_version", False)],
)
def test_include_object_leaves_out_our_tables(obj_type: str, name: str, included: bool) -> None:
    from durable_agent.schema import include_object

    assert include_object(None, name, obj_type, True, None) is included


def test_include_object_leaves_out_what_is_on_our_tables() -> None:
    from durable_agent.schema import include_object

    index = next(iter(metadata.tables["turns"].indexes))
    assert include_object(index, index.name, "index", False, None) is False
    column = metadata.tables["journal"].c.step
    assert include_object(column, "step", "column", False, None) is False
