"""The tables, described once for SQLAlchemy Core.

The DDL that creates them lives in ``sql/NNNN_*.sql`` (applied by :mod:`.migrations`);
a test checks that a migrated database has exactly these columns.
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()

TURN_STATUSES = ("queued", "running", "done", "failed")
STEP_KINDS = ("model", "tool")
REPLAY_LABELS = ("safe", "never")
STEP_STATUSES = ("intent", "done")

turns = Table(
    "turns",
    metadata,
    Column("turn_id", Text, primary_key=True),
    Column("session_id", Text, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("status", Text, nullable=False),
    Column("message", Text, nullable=False),
    Column("reply", Text),
    Column("error", Text),
    Column("attempts", Integer, nullable=False),
    Column("crashes", Integer, nullable=False),
    Column("lease_owner", Text),
    Column("lease_epoch", Integer, nullable=False),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("not_before", DateTime(timezone=True)),
    Column("enqueued_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    UniqueConstraint("session_id", "seq"),
    CheckConstraint(f"status IN {TURN_STATUSES}"),
)

blobs = Table(
    "blobs",
    metadata,
    Column("sha256", Text, primary_key=True),
    Column("data", JSONB, nullable=False),
    Column("size_bytes", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

journal = Table(
    "journal",
    metadata,
    Column("turn_id", Text, ForeignKey("turns.turn_id", ondelete="CASCADE"), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("input", JSONB, nullable=False),
    Column("replay", Text),
    Column("status", Text, nullable=False),
    Column("output", JSONB),
    Column("output_blob", Text, ForeignKey("blobs.sha256")),
    Column("epoch", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True)),
)
