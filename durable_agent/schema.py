"""durable-agent's tables for an application that uses SQLAlchemy and Alembic (the
``sqlalchemy`` extra: ``pip install 'durable-agent[sqlalchemy]'``).

* :data:`metadata`: our tables as SQLAlchemy Core ``MetaData``, exactly as our migrations
  build them (a test compares them with a migrated database). Give it to Alembic beside your
  own (``target_metadata = [Base.metadata, durable_agent.schema.metadata]``) and autogenerate
  proposes no change to them; or leave it out and pass :func:`include_object` to
  ``context.configure`` so that autogenerate ignores them.
* :func:`upgrade`: our migrations run from a revision of yours (``upgrade(op)``), for a team
  that wants one migration command. ``durable-agent migrate`` remains the way without Alembic;
  the two record what they applied in the same place, so they can be mixed.

Our tables are ours to change: read them, never write them, and create them only with our
migrations (``metadata.create_all`` makes the tables but not the functions and trigger the
workers need).
"""

from __future__ import annotations

from typing import Any

try:
    from sqlalchemy import (
        BigInteger,
        CheckConstraint,
        Column,
        ForeignKeyConstraint,
        Identity,
        Index,
        Integer,
        MetaData,
        PrimaryKeyConstraint,
        Table,
        Text,
        UniqueConstraint,
        text,
    )
    from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP
except ImportError as error:  # pragma: no cover (the extra is installed in the tests)
    raise ImportError(
        "durable_agent.schema needs SQLAlchemy: pip install 'durable-agent[sqlalchemy]'"
    ) from error

import psycopg

from .errors import ConfigurationError
from .journal import Migration, apply_missing, on_connection

__all__ = ["TABLES", "include_object", "metadata", "upgrade"]

metadata = MetaData()
"""durable-agent's tables at the schema version of this release."""

_NOW = text("now()")


def _timestamp(name: str, *, nullable: bool = True, now: bool = False) -> Column[Any]:
    return Column(
        name, TIMESTAMP(timezone=True), nullable=nullable, server_default=_NOW if now else None
    )


def _text(name: str, *, nullable: bool = True, **options: Any) -> Column[Any]:
    return Column(name, Text, nullable=nullable, **options)


def _integer(name: str, *, nullable: bool = False, default: int | None = None) -> Column[Any]:
    server_default = text(str(default)) if default is not None else None
    return Column(name, Integer, nullable=nullable, server_default=server_default)


turns = Table(
    "turns",
    metadata,
    _text("turn_id", nullable=False, primary_key=True),
    _text("session_id", nullable=False),
    _integer("seq"),
    _text("status", nullable=False, server_default=text("'queued'::text")),
    _text("message", nullable=False),
    _text("reply"),
    _text("error"),
    _integer("attempts", default=0),
    _integer("crashes", default=0),
    _text("lease_owner"),
    _integer("lease_epoch", default=0),
    _timestamp("lease_expires_at"),
    _timestamp("not_before"),
    _timestamp("enqueued_at"),
    _timestamp("created_at", nullable=False, now=True),
    _timestamp("updated_at", nullable=False, now=True),
    _timestamp("finished_at"),
    _text(
        "queue",
        nullable=False,
        server_default=text("''::text"),
        comment="the Celery queue its messages go to ('' for turns recorded before version 3: "
        "the sweeping worker's own)",
    ),
    _text("message_id", comment="the task id of the last message sent for the turn"),
    _text(
        "received_message_id",
        comment="the task id of the last message a worker received for it",
    ),
    _timestamp("received_at"),
    _text(
        "received_by",
        comment="the worker process that received it (host:pid:thread#token)",
    ),
    _text(
        "agent",
        nullable=False,
        server_default=text("'default'::text"),
        comment="the agent the turn belongs to ('default': the one configured by the environment)",
    ),
    _text(
        "agent_digest",
        comment="sha256 of the agent's spec when the turn first ran (model, instructions, "
        "parameters, step cap, loop, tools)",
    ),
    Column(
        "agent_spec",
        JSONB,
        nullable=True,
        comment="that spec, to say what changed when the turn resumes under another one",
    ),
    _text(
        "agent_changes",
        comment="what differed from agent_spec the last time the turn was resumed (NULL: nothing)",
    ),
    _text(
        "concurrency_key",
        comment="the turns of one key run at most DURABLE_AGENT_CONCURRENCY_PER_KEY at once, "
        "oldest first (NULL: no limit)",
    ),
    _text(
        "trace_context",
        comment="the traceparent (and tracestate) of the request that started the turn, as "
        "W3C headers in JSON (NULL: not traced)",
    ),
    UniqueConstraint("session_id", "seq", name="turns_session_id_seq_key"),
    CheckConstraint(
        "status IN ('queued', 'running', 'waiting', 'done', 'failed', 'cancelled')",
        name="turns_status_check",
    ),
)
_OPEN = text("status IN ('queued', 'running')")
Index("turns_open_idx", turns.c.lease_expires_at, postgresql_where=_OPEN)
Index(
    "turns_received_sends_idx",
    turns.c.queue,
    turns.c.enqueued_at,
    postgresql_where=text("received_message_id = message_id"),
)
Index("turns_receptions_idx", turns.c.queue, turns.c.received_at)
Index("turns_sends_idx", turns.c.queue, turns.c.enqueued_at)
Index("turns_open_by_queue_idx", turns.c.queue, turns.c.enqueued_at, postgresql_where=_OPEN)
Index(
    "turns_finished_idx",
    turns.c.finished_at,
    postgresql_where=text("status IN ('done', 'failed', 'cancelled')"),
)
Index(
    "turns_open_by_key_idx",
    turns.c.concurrency_key,
    turns.c.created_at,
    turns.c.turn_id,
    postgresql_where=text("concurrency_key IS NOT NULL AND status IN ('queued', 'running')"),
)
Index("turns_newest_idx", turns.c.created_at, turns.c.turn_id)
Index("turns_status_newest_idx", turns.c.status, turns.c.created_at, turns.c.turn_id)

blobs = Table(
    "blobs",
    metadata,
    _text("sha256", nullable=False, primary_key=True),
    Column("data", JSONB, nullable=False),
    _integer("size_bytes"),
    _timestamp("created_at", nullable=False, now=True),
)


journal = Table(
    "journal",
    metadata,
    _text("turn_id", nullable=False),
    _integer("step"),
    _text("kind", nullable=False),
    _text("name", nullable=False),
    Column("input", JSONB, nullable=False),
    _text("replay"),
    _text("status", nullable=False),
    Column("output", JSONB, nullable=True),
    _text("output_blob"),
    _integer("epoch"),
    _timestamp("created_at", nullable=False, now=True),
    _timestamp("finished_at"),
    Column(
        "first_epoch",
        Integer,
        nullable=True,
        comment="the epoch that wrote the intent (NULL for steps recorded before version 6: epoch)",
    ),
    Column(
        "failed_calls",
        Integer,
        nullable=False,
        server_default=text("0"),
        comment="model calls of this step that failed at the API (not billed) before one succeeded",
    ),
    PrimaryKeyConstraint("turn_id", "step", name="journal_pkey"),
    ForeignKeyConstraint(
        ["turn_id"], ["turns.turn_id"], name="journal_turn_id_fkey", ondelete="CASCADE"
    ),
    ForeignKeyConstraint(["output_blob"], ["blobs.sha256"], name="journal_output_blob_fkey"),
    CheckConstraint("step >= 0", name="journal_step_check"),
    CheckConstraint("kind IN ('model', 'tool', 'wait')", name="journal_kind_check"),
    CheckConstraint("replay IN ('safe', 'never')", name="journal_replay_check"),
    CheckConstraint("status IN ('intent', 'done')", name="journal_status_check"),
)
Index(
    "journal_uncertain_idx",
    journal.c.created_at,
    postgresql_where=text(
        "replay = 'never' AND (status = 'intent' OR output @> '{\"uncertain\": true}')"
    ),
)
Index(
    "journal_output_blob_idx",
    journal.c.output_blob,
    postgresql_where=text("output_blob IS NOT NULL"),
)

cancellations = Table(
    "cancellations",
    metadata,
    _text("turn_id", nullable=False, primary_key=True),
    _text("requested_by", nullable=False),
    _text("reason"),
    _timestamp("requested_at", nullable=False, now=True),
    ForeignKeyConstraint(
        ["turn_id"], ["turns.turn_id"], name="cancellations_turn_id_fkey", ondelete="CASCADE"
    ),
)

approvals = Table(
    "approvals",
    metadata,
    _text("turn_id", nullable=False),
    _integer("step"),
    _text("tool", nullable=False),
    Column("arguments", JSONB, nullable=False),
    _text("idempotency_key"),
    _timestamp("requested_at", nullable=False, now=True),
    _text("decision"),
    _text("reason"),
    _text("decided_by"),
    _timestamp("decided_at"),
    PrimaryKeyConstraint("turn_id", "step", name="approvals_pkey"),
    ForeignKeyConstraint(
        ["turn_id"], ["turns.turn_id"], name="approvals_turn_id_fkey", ondelete="CASCADE"
    ),
    CheckConstraint("decision IN ('approved', 'denied')", name="approvals_decision_check"),
)

waits = Table(
    "waits",
    metadata,
    _text("turn_id", nullable=False, primary_key=True),
    _integer("step"),
    _text("kind", nullable=False),
    _text(
        "name",
        nullable=False,
        comment="what it waits for: the tool (approval), the event name, the child turn id "
        "('' for a sleep)",
    ),
    Column(
        "wake_at",
        TIMESTAMP(timezone=True),
        nullable=True,
        comment="when the sweeper wakes it if nothing else did (NULL: never)",
    ),
    _timestamp("parked_at", nullable=False, now=True),
    ForeignKeyConstraint(
        ["turn_id"], ["turns.turn_id"], name="waits_turn_id_fkey", ondelete="CASCADE"
    ),
    CheckConstraint("kind IN ('approval', 'sleep', 'event', 'child')", name="waits_kind_check"),
)
Index("waits_wake_idx", waits.c.wake_at, postgresql_where=text("wake_at IS NOT NULL"))

events = Table(
    "events",
    metadata,
    _text("turn_id", nullable=False),
    _text("event_id", nullable=False),
    _text("name", nullable=False),
    Column("payload", JSONB, nullable=False),
    _timestamp("sent_at", nullable=False, now=True),
    Column("consumed_step", Integer, nullable=True),
    _timestamp("consumed_at"),
    PrimaryKeyConstraint("turn_id", "event_id", name="events_pkey"),
    ForeignKeyConstraint(
        ["turn_id"], ["turns.turn_id"], name="events_turn_id_fkey", ondelete="CASCADE"
    ),
)
Index(
    "events_pending_idx",
    events.c.turn_id,
    events.c.name,
    events.c.sent_at,
    postgresql_where=text("consumed_step IS NULL"),
)
Index(
    "events_consumed_idx",
    events.c.turn_id,
    events.c.consumed_step,
    unique=True,
    postgresql_where=text("consumed_step IS NOT NULL"),
)

child_turns = Table(
    "child_turns",
    metadata,
    _text("turn_id", nullable=False, primary_key=True),
    _text("parent_turn_id", nullable=False),
    _integer("parent_step"),
    _integer("depth"),
    ForeignKeyConstraint(
        ["turn_id"], ["turns.turn_id"], name="child_turns_turn_id_fkey", ondelete="CASCADE"
    ),
    ForeignKeyConstraint(
        ["parent_turn_id"],
        ["turns.turn_id"],
        name="child_turns_parent_turn_id_fkey",
        ondelete="CASCADE",
    ),
    CheckConstraint("depth >= 1", name="child_turns_depth_check"),
    UniqueConstraint("parent_turn_id", "parent_step", name="child_turns_parent_step_key"),
)

resolutions = Table(
    "resolutions",
    metadata,
    Column("resolution_id", BigInteger, Identity(always=True), primary_key=True),
    _text("turn_id", nullable=False),
    _integer("step"),
    _text("verdict", nullable=False),
    _text("note"),
    _text("resolved_by", nullable=False),
    _timestamp("resolved_at", nullable=False, now=True),
    ForeignKeyConstraint(
        ["turn_id", "step"],
        ["journal.turn_id", "journal.step"],
        name="resolutions_turn_id_step_fkey",
        ondelete="CASCADE",
    ),
    CheckConstraint(
        "verdict IN ('happened', 'not_happened', 'ignored')", name="resolutions_verdict_check"
    ),
)
Index(
    "resolutions_step_idx",
    resolutions.c.turn_id,
    resolutions.c.step,
    resolutions.c.resolution_id,
)

uncertain_notices = Table(
    "uncertain_notices",
    metadata,
    _text("turn_id", nullable=False),
    _integer("step"),
    _timestamp("notified_at", nullable=False, now=True),
    _text("hook", nullable=False, server_default=text("'all'::text")),
    _timestamp("told_at"),
    _text("claimed_by"),
    _timestamp("claimed_until"),
    PrimaryKeyConstraint("turn_id", "step", "hook", name="uncertain_notices_pkey"),
    ForeignKeyConstraint(
        ["turn_id", "step"],
        ["journal.turn_id", "journal.step"],
        name="uncertain_notices_turn_id_step_fkey",
        ondelete="CASCADE",
    ),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("audit_id", BigInteger, Identity(always=True), primary_key=True),
    _timestamp("at", nullable=False, now=True),
    _text("actor", nullable=False),
    _text("action", nullable=False),
    _text("interface", nullable=False),
    _text("turn_id"),
    Column("step", Integer, nullable=True),
    Column("before", JSONB, nullable=True),
    Column("after", JSONB, nullable=True),
    CheckConstraint(
        "action IN ('approve', 'deny', 'resolve', 'cancel', 'prune', 'rekey', 'agent_changed')",
        name="audit_log_action_check",
    ),
    CheckConstraint(
        "interface IN ('cli', 'python', 'console', 'worker')", name="audit_log_interface_check"
    ),
)
Index("audit_log_at_idx", audit_log.c.at)
Index(
    "audit_log_turn_idx",
    audit_log.c.turn_id,
    audit_log.c.audit_id,
    postgresql_where=text("turn_id IS NOT NULL"),
)

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    _text("name", nullable=False),
    _timestamp("applied_at", nullable=False, now=True),
)

TABLES = frozenset(metadata.tables)
"""The names of durable-agent's tables."""


def include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """For Alembic's ``context.configure(include_object=...)``: False for durable-agent's
    tables and everything on them (indexes, constraints, columns), True for the rest, so
    that autogenerate neither creates, changes nor drops them."""
    if type_ == "table":
        return name not in TABLES
    table = getattr(obj, "table", None)
    return getattr(table, "name", None) not in TABLES


def upgrade(op_or_connection: Any) -> list[Migration]:
    """Apply durable-agent's missing migrations in the current transaction of an Alembic
    revision (pass its ``op``), of a SQLAlchemy ``Connection``, or of a psycopg 3
    connection; the migrations applied (none when the database is up to date).

    Safe to run again and from several processes: the same advisory lock and version table
    as ``durable-agent migrate``. An Alembic revision that calls it:

    ```python
    from alembic import op
    import durable_agent.schema

    def upgrade() -> None:
        durable_agent.schema.upgrade(op)
    ```

    Run it again from a new revision after upgrading durable-agent (its release notes say
    when a release brings a migration); ``downgrade`` has nothing to undo: our migrations
    only ever add.
    """
    conn = _psycopg_connection(op_or_connection)
    return apply_missing(on_connection(conn))


def _psycopg_connection(value: Any) -> psycopg.Connection[Any]:
    from sqlalchemy.engine import Connection as SAConnection

    if hasattr(value, "get_bind") and not isinstance(value, SAConnection):
        try:
            value = value.get_bind()  # alembic's op
        except Exception:
            value = None
        if not isinstance(value, SAConnection):
            raise ConfigurationError(
                "durable_agent.schema.upgrade needs a live connection: Alembic's offline mode "
                "(--sql) cannot run it; run `durable-agent migrate` against the database"
            )
    if isinstance(value, SAConnection):
        driver = value.connection.driver_connection
        if not isinstance(driver, psycopg.Connection):
            raise ConfigurationError(
                "durable_agent.schema.upgrade needs SQLAlchemy on the psycopg 3 driver "
                f"(postgresql+psycopg://...); this connection uses "
                f"{value.dialect.name}+{value.dialect.driver}"
            )
        return driver
    if isinstance(value, psycopg.Connection):
        return value
    raise TypeError(
        "durable_agent.schema.upgrade takes Alembic's op, a SQLAlchemy Connection or a "
        f"psycopg 3 connection, not {type(value).__qualname__}"
    )
