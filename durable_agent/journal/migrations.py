"""Versioned schema upgrades, safe to run from several processes at once.

Each file ``sql/migrations/NNNN_name.sql`` is one version. ``migrate`` applies the missing
ones in a single transaction under a Postgres advisory lock, so concurrent callers queue up
and the second finds nothing left to do.
"""

from __future__ import annotations

from ..errors import ConfigurationError
from .db import Database, _Connected, describe_url
from .queries import Migration, migrations

_LOCK_KEY = 0x64757261  # "dura": one advisory lock for schema changes


def available() -> list[Migration]:
    """Every migration shipped with the package, in version order."""
    return list(migrations())


def latest_version() -> int:
    return migrations()[-1].version


def current_version(db: Database) -> int | None:
    """The schema version of the database, or None before the first migration."""
    if not db.value("schema_version_exists"):
        return None
    version = db.value("max_schema_version")
    return int(version) if version is not None else None


def applied_versions(db: Database) -> set[int]:
    """The versions recorded in the database (gaps allowed)."""
    return {row["version"] for row in db.run("applied_versions")}


def migrate(db: Database) -> list[Migration]:
    """Apply the missing migrations; return the ones this call applied."""
    with db.transaction() as tx:
        return apply_missing(tx)


def apply_missing(tx: _Connected) -> list[Migration]:
    """Apply the missing migrations in the transaction of ``tx`` (ours, or an Alembic
    revision's: ``durable_agent.schema.upgrade``); the ones applied."""
    applied = []
    tx.run("lock_migrations", key=_LOCK_KEY)
    tx.run("create_schema_version")
    done = {row["version"] for row in tx.run("applied_versions")}
    for migration in migrations():
        if migration.version in done:
            continue
        tx.script(migration.sql)
        tx.run("record_version", version=migration.version, name=migration.name)
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
    # versions need not be contiguous, nor applied in order: a database may have a later
    # version and miss an earlier one (built on a branch before the earlier one existed)
    applied = applied_versions(db)
    missing = sorted(m.version for m in available() if m.version not in applied)
    if missing and version <= want:
        raise ConfigurationError(
            f"the database at {describe_url(db.url)} lacks schema version(s) "
            f"{', '.join(map(str, missing))}: run `durable-agent migrate`"
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
