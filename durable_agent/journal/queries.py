"""The SQL files of ``sql/``, read once: the one module that reads SQL.

* ``sql/queries.sql``: every query durable-agent sends, each in a block that starts with
  ``-- name: <name>``; parameters are written ``:name``.
* ``sql/schema.sql``: the whole schema at its latest version, to read.
* ``sql/migrations/NNNN_<name>.sql``: the versioned steps that build it.
* ``sql/roles.sql``: the three roles and their grants (``durable-agent roles``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$")
_PARAMETER = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True, slots=True)
class Query:
    """One named query: its text in psycopg's ``%(name)s`` form and its parameters."""

    name: str
    sql: str
    parameters: frozenset[str]
    doc: str


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema version: ``sql/migrations/NNNN_name.sql``."""

    version: int
    name: str
    sql: str


def parse_queries(text: str) -> dict[str, Query]:
    """Split a queries file into its named blocks."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _NAME.match(line.strip())
        if match:
            name = match.group(1)
            if name in blocks:
                raise ValueError(f"query {name!r} is defined twice")
            current = blocks[name] = []
        elif current is not None:
            current.append(line)
    return {name: _query(name, lines) for name, lines in blocks.items()}


def _query(name: str, lines: list[str]) -> Query:
    doc = [line.strip()[2:].strip() for line in lines if line.strip().startswith("--")]
    body = "\n".join(line for line in lines if not line.strip().startswith("--")).strip()
    body = body.rstrip(";").strip()
    if not body:
        raise ValueError(f"query {name!r} has no SQL")
    parameters = frozenset(_PARAMETER.findall(body))
    # psycopg reads % as the start of a placeholder: double the literal ones first.
    converted = _PARAMETER.sub(r"%(\1)s", body.replace("%", "%%"))
    return Query(name, converted, parameters, " ".join(doc))


def _sql_folder() -> resources.abc.Traversable:
    return resources.files(__package__).joinpath("sql")


@functools.cache
def queries() -> dict[str, Query]:
    """Every named query of ``sql/queries.sql``."""
    return parse_queries(_sql_folder().joinpath("queries.sql").read_text())


def query(name: str) -> Query:
    try:
        return queries()[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in sql/queries.sql") from None


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Every migration shipped with the package, in version order."""
    found = []
    for entry in _sql_folder().joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text()))
    return tuple(sorted(found, key=lambda m: m.version))


def schema() -> str:
    """The whole schema at the latest version (``sql/schema.sql``)."""
    return _sql_folder().joinpath("schema.sql").read_text()


def roles_template() -> str:
    """The roles and their grants, with ``{application}``, ``{worker}``, ``{operator}``,
    ``{schema}`` and ``{database}`` to fill in (``sql/roles.sql``)."""
    return _sql_folder().joinpath("roles.sql").read_text()
