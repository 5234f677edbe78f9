"""The three roles of a durable-agent database: the application, the workers, operators.

Roles belong to the Postgres cluster, grants to one database; so the roles are made by a
command (``durable-agent roles``) and not by a migration: its names take a prefix (two
deployments, or two test databases, on one cluster do not share roles unless they want
to), it needs a login that may create roles (a migration's owner often may not), and a team
that manages roles itself prints the SQL (``--print``) and applies it its own way. Running
it again converges: roles are created only when missing, and the grants of these roles on
our tables are revoked and given again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from psycopg import sql

from ..errors import InvalidArgument
from .db import Database
from .queries import roles_template

DEFAULT_PREFIX = "durable_agent"
KINDS = ("application", "worker", "operator")
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


class RoleNames(NamedTuple):
    application: str
    worker: str
    operator: str


def role_names(prefix: str = DEFAULT_PREFIX) -> RoleNames:
    """``<prefix>_application``, ``<prefix>_worker``, ``<prefix>_operator``."""
    if not _NAME.match(prefix):
        raise InvalidArgument(
            "a role prefix is 1 to 41 lowercase letters, digits or '_', starting with a letter "
            f"or '_' (got {prefix!r})"
        )
    return RoleNames(*(f"{prefix}_{kind}" for kind in KINDS))


def roles_sql(names: RoleNames, schema: str = "public", database: str = "durable_agent") -> str:
    """The SQL that makes the roles and their grants on ``schema`` of ``database``."""
    for value in (schema, database):
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_$-]{0,62}$", value):
            raise InvalidArgument(f"{value!r} is not a name this command quotes")
    return (
        roles_template()
        .replace("{application}", names.application)
        .replace("{worker}", names.worker)
        .replace("{operator}", names.operator)
        .replace("{schema}", schema)
        .replace("{database}", database)
    )


def create_roles(
    db: Database, names: RoleNames, passwords: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """Make the roles and their grants in ``db``'s database (as a login that may create
    roles and owns our tables); a role given a password (by kind) may log in with it.
    The (schema, database) granted on."""
    with db.transaction() as tx:
        row = tx.conn.execute("SELECT current_schema(), current_database()").fetchone()
        assert row is not None
        schema, database = (row["current_schema"], row["current_database"])
        tx.script(roles_sql(names, schema, database))
        for kind, password in (passwords or {}).items():
            role = getattr(names, kind)
            tx.conn.execute(
                sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(password)
                ),
                prepare=False,
            )
    return schema, database
