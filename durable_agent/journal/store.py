"""Named queries on turns, the journal and blobs: one method per query.

Every journal write carries the writer's epoch and succeeds only while that epoch is still
the turn's (the ``fence`` CTE takes a share lock on the turn row, so a concurrent claim
either waits for the write or makes it write nothing). A second intent at the same
(turn, step) is rejected by the primary key.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy import exc as sa_exc

from ..errors import LeaseLost, TurnNotFound
from .codec import digest, dumps
from .db import Database
from .records import Step, Turn

_TURN_COLUMNS = (
    "turn_id, session_id, seq, status, message, reply, error, attempts, crashes, "
    "lease_owner, lease_epoch, lease_expires_at, created_at, updated_at, finished_at"
)

_FENCE = """
WITH fence AS (
    SELECT turn_id FROM turns
    WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
    FOR SHARE
)
"""

_INSERT_STEP = text(
    _FENCE
    + """
INSERT INTO journal (turn_id, step, kind, name, input, replay, status, output, output_blob, epoch,
                     finished_at)
SELECT fence.turn_id, :step, :kind, :name, CAST(:input AS jsonb), :replay, :status,
       CAST(:output AS jsonb), :blob, :epoch, CASE WHEN :status = 'done' THEN now() END
FROM fence
RETURNING step
"""
)

_FINISH_STEP = text(
    _FENCE
    + """
UPDATE journal AS j
SET status = 'done', output = CAST(:output AS jsonb), output_blob = :blob, epoch = :epoch,
    finished_at = now()
FROM fence
WHERE j.turn_id = fence.turn_id AND j.step = :step AND j.status = 'intent'
RETURNING j.step
"""
)

_LOAD_JOURNAL = text(
    """
SELECT j.turn_id, j.step, j.kind, j.name, j.input, j.replay, j.status,
       coalesce(j.output, b.data) AS output, j.epoch, j.created_at, j.finished_at, j.output_blob
FROM journal AS j LEFT JOIN blobs AS b ON b.sha256 = j.output_blob
WHERE j.turn_id = :turn_id
ORDER BY j.step
"""
)

_PUT_BLOB = text(
    """
INSERT INTO blobs (sha256, data, size_bytes) VALUES (:sha256, CAST(:data AS jsonb), :size)
ON CONFLICT (sha256) DO NOTHING
"""
)

_CREATE_TURN = text(
    f"""
INSERT INTO turns (turn_id, session_id, seq, message)
SELECT :turn_id, :session_id, coalesce(max(seq) + 1, 0), :message
FROM turns WHERE session_id = :session_id
RETURNING {_TURN_COLUMNS}
"""
)


def new_turn_id() -> str:
    return "turn_" + uuid.uuid4().hex


class JournalStore:
    """Turns, journal rows and blobs, through one autocommit connection."""

    def __init__(self, db: Database, *, blob_threshold: int = 16 * 1024) -> None:
        self.db = db
        self.blob_threshold = blob_threshold

    # -- turns -----------------------------------------------------------------------------

    def create_turn(self, session_id: str, message: str, turn_id: str | None = None) -> Turn:
        """Record a new turn at the end of its session (queued, not yet enqueued)."""
        turn_id = turn_id or new_turn_id()
        for _ in range(20):
            try:
                row = self.db.execute(
                    _CREATE_TURN,
                    {"turn_id": turn_id, "session_id": session_id, "message": message},
                ).one()
                return Turn(**row._mapping)
            except sa_exc.IntegrityError as error:
                existing = self.find_turn(turn_id)
                if existing is not None:  # the same turn id submitted again: idempotent
                    if existing.session_id != session_id or existing.message != message:
                        raise ValueError(
                            f"turn id {turn_id!r} is already used by another turn"
                        ) from error
                    return existing
                # another turn of this session took the same position: try the next one
        raise RuntimeError(f"could not place a new turn in session {session_id!r}")

    def find_turn(self, turn_id: str) -> Turn | None:
        row = self.db.execute(
            text(f"SELECT {_TURN_COLUMNS} FROM turns WHERE turn_id = :turn_id"),
            {"turn_id": turn_id},
        ).one_or_none()
        return Turn(**row._mapping) if row else None

    def get_turn(self, turn_id: str) -> Turn:
        turn = self.find_turn(turn_id)
        if turn is None:
            raise TurnNotFound(turn_id)
        return turn

    def list_turns(self, session_id: str | None = None, limit: int = 100) -> list[Turn]:
        where = "WHERE session_id = :session_id" if session_id is not None else ""
        order = "ORDER BY seq" if session_id is not None else "ORDER BY created_at DESC"
        rows = self.db.execute(
            text(f"SELECT {_TURN_COLUMNS} FROM turns {where} {order} LIMIT :limit"),
            {"session_id": session_id, "limit": limit},
        ).all()
        return [Turn(**row._mapping) for row in rows]

    def session_history(self, session_id: str, before_seq: int) -> list[tuple[str, str]]:
        """(user message, reply) of the session's earlier finished turns, in order."""
        rows = self.db.execute(
            text(
                "SELECT message, reply FROM turns WHERE session_id = :session_id "
                "AND seq < :seq AND status = 'done' ORDER BY seq"
            ),
            {"session_id": session_id, "seq": before_seq},
        ).all()
        return [(row.message, row.reply or "") for row in rows]

    def mark_enqueued(self, turn_ids: list[str]) -> None:
        self.db.execute(
            text("UPDATE turns SET enqueued_at = now() WHERE turn_id IN :ids").bindparams(
                bindparam("ids", expanding=True)
            ),
            {"ids": turn_ids},
        )

    def next_turn_in_session(self, session_id: str, after_seq: int) -> tuple[str, str] | None:
        """The (session_id, turn_id) of the next unfinished turn after this position."""
        row = self.db.execute(
            text(
                "SELECT session_id, turn_id FROM turns WHERE session_id = :session_id "
                "AND seq > :seq AND status IN ('queued', 'running') ORDER BY seq LIMIT 1"
            ),
            {"session_id": session_id, "seq": after_seq},
        ).one_or_none()
        return (row.session_id, row.turn_id) if row else None

    # -- journal ---------------------------------------------------------------------------

    def load_journal(self, turn_id: str) -> list[Step]:
        """Every journal row of the turn, in step order: one query, blobs joined in."""
        rows = self.db.execute(_LOAD_JOURNAL, {"turn_id": turn_id}).all()
        return [
            Step(
                turn_id=r.turn_id,
                step=r.step,
                kind=r.kind,
                name=r.name,
                input=r.input,
                replay=r.replay,
                status=r.status,
                output=r.output,
                epoch=r.epoch,
                created_at=r.created_at,
                finished_at=r.finished_at,
                blob=r.output_blob,
            )
            for r in rows
        ]

    def insert_intent(
        self,
        turn_id: str,
        epoch: int,
        step: int,
        kind: str,
        name: str,
        input: dict[str, Any],
        replay: str | None,
    ) -> None:
        """Commit the intent of a call before it runs."""
        self._insert_step(turn_id, epoch, step, kind, name, input, replay, "intent", None)

    def insert_done(
        self,
        turn_id: str,
        epoch: int,
        step: int,
        kind: str,
        name: str,
        input: dict[str, Any],
        replay: str | None,
        output: Any,
    ) -> None:
        """Record a step that ran nothing (a refused call) as done in one write."""
        self._insert_step(turn_id, epoch, step, kind, name, input, replay, "done", output)

    def record_outcome(self, turn_id: str, epoch: int, step: int, output: Any) -> None:
        """Mark an intent done with its outcome."""
        stored, blob = self._store_payload(output)
        result = self.db.execute(
            _FINISH_STEP,
            {"turn_id": turn_id, "epoch": epoch, "step": step, "output": stored, "blob": blob},
        )
        if result.first() is None:
            raise self._lost(turn_id, epoch, f"outcome of step {step}")

    def _insert_step(
        self,
        turn_id: str,
        epoch: int,
        step: int,
        kind: str,
        name: str,
        input: dict[str, Any],
        replay: str | None,
        status: str,
        output: Any,
    ) -> None:
        stored, blob = self._store_payload(output) if status == "done" else (None, None)
        params = {
            "turn_id": turn_id,
            "epoch": epoch,
            "step": step,
            "kind": kind,
            "name": name,
            "input": dumps(input),
            "replay": replay,
            "status": status,
            "output": stored,
            "blob": blob,
        }
        try:
            result = self.db.execute(_INSERT_STEP, params)
        except sa_exc.IntegrityError as error:
            raise LeaseLost(
                f"turn {turn_id}: step {step} is already recorded by another writer "
                f"(primary key (turn_id, step) rejected this {status})"
            ) from error
        if result.first() is None:
            raise self._lost(turn_id, epoch, f"{status} of step {step}")

    def _store_payload(self, output: Any) -> tuple[str | None, str | None]:
        """JSON for the row, or (None, sha256) after moving a large payload into blobs."""
        if output is None:
            return "null", None
        encoded = dumps(output)
        if len(encoded) <= self.blob_threshold:
            return encoded, None
        sha = digest(output)
        self.db.execute(_PUT_BLOB, {"sha256": sha, "data": encoded, "size": len(encoded)})
        return None, sha

    def _lost(self, turn_id: str, epoch: int, what: str) -> LeaseLost:
        turn = self.find_turn(turn_id)
        if turn is None:
            return LeaseLost(f"turn {turn_id} no longer exists; {what} not written")
        return LeaseLost(
            f"turn {turn_id}: {what} rejected: this writer holds epoch {epoch}, the turn is "
            f"at epoch {turn.lease_epoch} ({turn.status})"
        )
