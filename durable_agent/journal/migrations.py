"""Versioned schema upgrades, safe to run from several processes at once.

Each file ``sql/NNNN_name.sql`` is one version. ``migrate`` applies the missing ones in a
single transaction under a Postgres advisory lock, so concurrent callers queue up and the
second finds nothing left to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from sqlalchemy import text

from ..errors import ConfigurationError
from .db import Database, describe_url

_LOCK_KEY = 0x64757261  # "dura": one advisory lock for schema changes
_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    """Every migration shipped with the package, in version order."""
    folder = resources.files(__package__).joinpath("sql")
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text()))
    return sorted(found, key=lambda m: m.version)


def latest_version() -> int:
    return available()[-1].version


def current_version(db: Database) -> int | None:
    """The schema version of the database, or None before the first migration."""
    exists = db.execute(text("SELECT to_regclass('schema_version') IS NOT NULL")).scalar()
    if not exists:
        return None
    return db.execute(text("SELECT max(version) FROM schema_version")).scalar()


def migrate(db: Database) -> list[Migration]:
    """Apply the missing migrations; return the ones this call applied."""
    applied = []
    with db.transaction() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS schema_version ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
        )
        done = set(conn.execute(text("SELECT version FROM schema_version")).scalars())
        for migration in available():
            if migration.version in done:
                continue
            conn.exec_driver_sql(migration.sql)
            conn.execute(
                text("INSERT INTO schema_version (version, name) VALUES (:v, :n)"),
                {"v": migration.version, "n": migration.name},
            )
            applied.append(migration)
    return applied


def require_current(db: Database) -> None:
    """Raise a clear error unless the database is at the latest schema version."""
    version = current_version(db)
    want = latest_version()
    if version is None:
        raise ConfigurationError(
            f"the database at {describe_url(db.url)} has no durable-agent tables: "
            "run `durable-agent migrate`"
        )
    if version < want:
        raise ConfigurationError(
            f"the database at {describe_url(db.url)} is at schema version {version}, "
            f"this code needs {want}: run `durable-agent migrate`"
        )
    if version > want:
        raise ConfigurationError(
            f"the database at {describe_url(db.url)} is at schema version {version}, newer than "
            f"this code ({want}): upgrade durable-agent"
        )
